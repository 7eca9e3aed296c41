"""A split Megatron-LM cannot start, against the real Megatron-LM (`$LONGCTX_MEGATRON_LM`, on the CPU).

With no evaluation (eval_iters = 0) pretrain_gpt.py still builds a loader for the validation part of
`split`; for a weighted blend that part is asked for 0 samples and is empty, and Megatron-LM stops at
start-up with `AssertionError: no sample to consume: 0` (on a cluster: after the queue wait). longctx
refuses such a stage before anything starts: `plan check --check-data` and `stage run --backend
megatron-lm`. The same plan with evaluation switched on starts and trains.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.cli.main import app
from longctx.stage import ledger
from longctx.stage import run as stage_run
from tests.fixtures.slurm import CHAIN_PLAN

# Megatron-LM cannot load its own saves under a Python that pickles enum members by name (3.11.0-3.11.4);
# longctx refuses to launch it there (tests/stage/test_megatron_python.py)
pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)

ITERS = 2  # global batch 2 of 128 tokens


def _plan(path: Path, run_dir: Path, artefacts: Path, data: Path, *, eval_iters: int) -> Path:
    text = CHAIN_PLAN.format(run_dir=run_dir, artefacts=artefacts, save_interval=10)
    for old, new in [
        (
            f'prefixes = ["{artefacts}/data/corpus_text_document"]',
            f'blend = [[0.5, "{data}/corpus_text_document"], [0.5, "{data}/other_text_document"]]',
        ),
        ("tokens = 51_200", f"tokens = {ITERS * 2 * 128}"),
        ("gpus_per_node = 1", "gpus_per_node = 2"),
        ("log_interval = 20", f"log_interval = 1\neval_iters = {eval_iters}\neval_interval = {ITERS}"),
        ("[defaults]", '[megatron]\nversion = "0.16.1"\n\n[defaults]'),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _two_datasets(artefacts: Path, out: Path) -> Path:
    """The corpus under two prefixes, so the stage trains on a weighted blend."""
    out.mkdir()
    for name in ("corpus", "other"):
        for suffix in (".bin", ".idx", ".longctx.json"):
            src = artefacts / "data" / f"corpus_text_document{suffix}"
            if src.exists():
                shutil.copyfile(src, out / f"{name}_text_document{suffix}")
    return out


def test_no_eval_with_a_validation_part_is_refused_and_would_stop_megatron_lm(
    megatron_lm: Path, tiny_chain_artefacts: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(megatron_lm))
    monkeypatch.delenv("LONGCTX_MEGATRON_CPU", raising=False)
    data = _two_datasets(tiny_chain_artefacts, tmp_path / "data")
    run_dir = tmp_path / "run"
    plan = _plan(tmp_path / "plan.toml", run_dir, tiny_chain_artefacts, data, eval_iters=0)

    # 1. refused before anything starts, with the numbers
    checked = CliRunner().invoke(app, ["plan", "check", str(plan), "--check-data", "--json"])
    assert checked.exit_code == 2, checked.output[-3000:]
    found = [f for f in json.loads(checked.stdout)["findings"] if f["code"] == "split-no-eval-samples"]
    assert found and found[0]["level"] == "error" and "no sample to consume: 0" in found[0]["message"]
    assert "eval_iters >= 1" in found[0]["fix"]
    refused = CliRunner().invoke(
        app, ["stage", "run", str(plan), "--backend", "megatron-lm", "--no-preflight"]
    )
    assert refused.exit_code == 2 and "no sample to consume: 0" in refused.output, refused.output[-3000:]
    assert not (run_dir / "stages" / "a" / "logs").exists()

    # 2. past that refusal (lifted in this process: Megatron-LM is still its own launch), the real
    # Megatron-LM stops exactly there
    with monkeypatch.context() as m:
        m.setattr(stage_run, "require_startable", lambda *a, **k: None)
        done = CliRunner().invoke(
            app, ["stage", "run", str(plan), "--backend", "megatron-lm", "--no-preflight"]
        )
    assert done.exit_code != 0
    launch = next(x for x in ledger.read(run_dir) if x.event == "launch")
    log = Path(launch.log).read_text(errors="replace")
    assert "AssertionError: no sample to consume: 0" in log, log[-4000:]

    # 3. with evaluation on, the same data and split start and train
    run_ok = tmp_path / "run-eval"
    fixed = _plan(tmp_path / "fixed.toml", run_ok, tiny_chain_artefacts, data, eval_iters=1)
    ok = CliRunner().invoke(app, ["plan", "check", str(fixed), "--check-data", "--json"])
    assert not [f for f in json.loads(ok.stdout)["findings"] if f["code"].startswith("split-")]
    ran = CliRunner().invoke(app, ["stage", "run", str(fixed), "--backend", "megatron-lm", "--no-preflight"])
    assert ran.exit_code == 0, ran.output[-4000:]
    end = [x for x in ledger.read(run_ok) if x.event == "end"][-1]
    assert end.stage == "a" and end.end_iteration == ITERS
