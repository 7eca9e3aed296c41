"""`longctx rope sweep --backend megatron-lm` with the real Megatron-LM (`$LONGCTX_MEGATRON_LM`) on the CPU:
each branch is a real Megatron-LM launch from the previous stage's save at its candidate base, the choice
evaluates Megatron-LM's own saves, and the stage then starts with the chosen base (its saved args say so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint import inspect_checkpoint
from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.cli.main import app
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage import ledger
from tests.fixtures.slurm import CHAIN_PLAN

pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)

RUN = ["--backend", "megatron-lm", "--no-preflight"]
BASES = (40_000, 160_000)


def _plan(path: Path, run_dir: Path, artefacts: Path) -> Path:
    text = CHAIN_PLAN.format(run_dir=run_dir, artefacts=artefacts, save_interval=10)
    for old, new in [
        ("tokens = 51_200", f"tokens = {4 * 2 * 128}"),
        ("tokens = 512_000", f"tokens = {2 * 2 * 256}"),
        ("rope = { base = 40000 }", f"rope = {{ sweep = [{BASES[0]}, {BASES[1]}], tokens = {2 * 256} }}"),
        ("gpus_per_node = 1", "gpus_per_node = 2"),
    ]:
        assert old in text
        text = text.replace(old, new)
    path.write_text(text + "\n[eval]\nkeys_per_cell = 1\ndepths = [0.0, 1.0]\ndistractors = 1\n")
    return path


def test_real_megatron_lm_sweep_branches_choice_and_stage(
    megatron_lm: Path, tiny_chain_artefacts: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(megatron_lm))
    monkeypatch.delenv("LONGCTX_MEGATRON_CPU", raising=False)
    plan = _plan(tmp_path / "plan.toml", tmp_path / "run", tiny_chain_artefacts)
    runner = CliRunner()

    # before stage a is done the sweep has nothing to start from
    r = runner.invoke(app, ["rope", "sweep", str(plan), *RUN])
    assert r.exit_code == 2 and "start from what the stages before it finish" in r.output, r.output
    r = runner.invoke(app, ["stage", "run", str(plan), *RUN])
    assert r.exit_code == 0, r.output[-4000:]

    r = runner.invoke(app, ["rope", "sweep", str(plan), *RUN, "--json"])
    assert r.exit_code == 0, r.output[-4000:]
    doc = json.loads(r.stdout)
    assert doc["stop"] == "reached" and doc["sweep"]["choice"]["base"] in BASES
    rp = resolve_plan(load_plan(plan))
    b = rp.stage("b")
    save_a = rp.stage("a").save_dir
    for branch, base in zip(b.branches, BASES, strict=True):
        info = inspect_checkpoint(branch.save_dir)
        assert info.ok and info.iteration == branch.train_iters, info.findings
        assert (info.args["rotary_base"], info.args["seq_length"]) == (base, 256)
        launch = next(x for x in ledger.read(rp.run_dir) if x.event == "launch" and x.stage == branch.name)
        assert launch.argv[0] == str(megatron_lm / "pretrain_gpt.py")
        log = Path(launch.log).read_text()
        assert f"attempting to finetune with checkpoint in {save_a}" in log
    assert b.rotary_base == doc["sweep"]["choice"]["base"] and not b.sweep.pending

    # the stage itself: from a's save, with the chosen base
    r = runner.invoke(app, ["stage", "run", str(plan), *RUN])
    assert r.exit_code == 0, r.output[-4000:]
    info = inspect_checkpoint(b.save_dir)
    assert info.ok and info.args["rotary_base"] == b.rotary_base, info.findings
    launch = [x for x in ledger.read(rp.run_dir) if x.event == "launch"][-1]
    assert (launch.stage, launch.action) == ("b", "first-launch")
    assert f"attempting to finetune with checkpoint in {save_a}" in Path(launch.log).read_text()
