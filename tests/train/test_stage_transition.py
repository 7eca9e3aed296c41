"""`stage run` through both stages with the local backend: the transition applies the new RoPE base and
length (read back from the saved args), restarts the iteration count and starts a fresh optimizer."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage import ledger
from tests.fixtures.run import write_plan


def _common(iter_dir: Path) -> dict:
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load_common_state_dict(str(iter_dir))


def test_two_stages_until_done(fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run, s1_tokens=4 * 4 * 128, s2_tokens=2 * 2 * 256)
    rp = resolve_plan(load_plan(plan))
    s1, s2 = rp.stages
    assert (s1.train_iters, s2.train_iters, s2.cp) == (4, 2, 2)
    r = CliRunner().invoke(
        app, ["stage", "run", str(plan), "--backend", "local", "--until-done", "--no-eval"]
    )
    assert r.exit_code == 0, r.output

    a1 = _common(s1.save_dir / "iter_0000004")
    a2 = _common(s2.save_dir / "iter_0000002")
    assert (a1["args"].seq_length, a1["args"].rotary_base) == (128, s1.rotary_base)
    assert (a2["args"].seq_length, a2["args"].rotary_base, a2["args"].context_parallel_size) == (
        256,
        s2.rotary_base,
        2,
    )
    assert s2.rotary_base > s1.rotary_base
    # the iteration count restarts: the second stage's saves are numbered from its own start
    assert a2["iteration"] == 2 and sorted(p.name for p in s2.save_dir.glob("iter_*")) == ["iter_0000002"]
    # a fresh optimizer: its step count and scheduler cover only this stage's iterations
    steps = [{g["step"] for g in a["optimizer"]["optimizer"]["param_groups"]} for a in (a1, a2)]
    assert steps == [{4.0}, {2.0}]
    assert a2["opt_param_scheduler"]["num_steps"] == 2 * s2.global_batch_size
    assert a2["args"].consumed_train_samples == 2 * s2.global_batch_size

    launches = [(x.stage, x.action) for x in ledger.read(fresh_run) if x.event == "launch"]
    assert launches == [("s1", "first-launch"), ("s2", "first-launch")]
    ends = [x for x in ledger.read(fresh_run) if x.event == "end"]
    assert [(e.stage, e.exit_code, e.status) for e in ends] == [("s1", 0, "done"), ("s2", 0, "done")]

    r = CliRunner().invoke(app, ["stage", "status", str(plan), "--json"])
    assert json.loads(r.output)["next"]["action"] == "all-done"
