"""A RoPE sweep on the real local Slurm: the branches as a job array, one choose job after it, the chain
waiting for the choice and going on with the chosen base; a branch task killed mid-run is resumed by the
choose job, not lost and not restarted."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm import commands
from longctx.slurm.chain import submit
from longctx.slurm.script import render
from longctx.slurm.sweep_jobs import ARRAY_KIND, CHOOSE_KIND, active_with_tasks
from longctx.stage import ledger
from longctx.stage.state import plan_state, stage_state
from tests.fixtures.slurm import write_chain_plan

pytestmark = pytest.mark.slurm

BRANCH_ITERS = 60
BASES = (40_000, 80_000, 160_000)


def _sweep_plan(tmp_path: Path, artefacts: Path) -> Path:
    # stage b as long as its branches together (a sweep may cost up to the stage it chooses for)
    path = write_chain_plan(
        tmp_path / "sweep.toml", tmp_path / "run", artefacts, b_iters=len(BASES) * BRANCH_ITERS
    )
    text = path.read_text().replace("tokens = 51_200", "tokens = 10_240")  # stage a: 40 iterations
    sweep = ", ".join(f"{b:_}" for b in BASES)
    text = text.replace(
        "rope = { base = 40000 }", f"rope = {{ sweep = [{sweep}], tokens = {BRANCH_ITERS * 2 * 256} }}"
    )
    text += "\n[eval]\nkeys_per_cell = 2\ndepths = [0.0, 0.5, 1.0]\n"
    path.write_text(text)
    return path


def _metrics_last(save_dir: Path) -> int:
    f = save_dir.parent / "metrics.jsonl"
    if not f.exists():
        return 0
    its = [json.loads(x).get("iteration", 0) for x in f.read_text().splitlines() if x.strip()]
    return max(its, default=0)


def _array_task_id(array: str, task: int) -> str:
    return f"{array}_{task}"


def test_sweep_runs_as_a_job_array_and_the_chain_waits_for_the_choice(
    slurm_cluster: None, tmp_path: Path, tiny_chain_artefacts: Path
) -> None:
    rp = resolve_plan(load_plan(_sweep_plan(tmp_path, tiny_chain_artefacts)))
    run_dir = rp.run_dir
    b = rp.stage("b")
    assert b.sweep is not None and b.sweep.pending and len(b.branches) == 3
    rendered = render(rp, overrides={"time": "10"}, longctx_command=[sys.executable, "-m", "longctx"])
    assert {s.name for s in rendered.scripts} >= {"sweep-b.sbatch", "choose-b.sbatch"}
    res = submit(rendered, rp, chain=4)
    ids = res.job_ids

    killed: str | None = None
    deadline = time.monotonic() + 900
    try:
        while True:
            records = ledger.read(run_dir)
            arrays = [r for r in records if r.event == "submit" and r.kind == ARRAY_KIND]
            sweep_ids = [
                str(r.slurm_job_id)
                for r in records
                if r.event == "submit" and r.kind in (ARRAY_KIND, CHOOSE_KIND)
            ]
            if not active_with_tasks(ids + sweep_ids):
                break
            assert time.monotonic() < deadline, "the chain and its sweep did not finish"
            if killed is None and arrays:
                # the branch of task 1, mid-run past its first save: kill that array task
                branch = rp.stage(arrays[0].branches[1])
                if _metrics_last(branch.save_dir) >= 15 and stage_state(branch).status != "done":
                    killed = _array_task_id(str(arrays[0].slurm_job_id), 1)
                    commands.scancel([killed], signal="KILL")
            time.sleep(0.3)
    finally:
        commands.scancel(active_with_tasks(ids + sweep_ids))

    records = ledger.read(run_dir)
    rp = resolve_plan(load_plan(rp.source))  # the plan as it resolves now, the choice on disk
    b = rp.stage("b")

    # the branches ran as one job array (all three tasks), and one choose job after it
    arrays = [r for r in records if r.event == "submit" and r.kind == ARRAY_KIND]
    chooses = [r for r in records if r.event == "submit" and r.kind == CHOOSE_KIND]
    assert len(arrays) == 1 and arrays[0].tasks == [0, 1, 2], arrays
    assert len(chooses) == 1 and chooses[0].dependency == str(arrays[0].slurm_job_id), chooses
    launches = [r for r in records if r.event == "launch"]
    branch_jobs = {r.stage: str(r.job_id) for r in launches if r.stage.startswith("b.")}
    assert sorted(branch_jobs) == sorted(x.name for x in b.branches)

    # the killed task's branch was resumed from its save by the choose job, not started over
    assert killed is not None, "no branch task ran long enough to be killed"
    victim = arrays[0].branches[1]
    runs = [r for r in launches if r.stage == victim]
    assert runs[0].action == "first-launch", runs
    # (the killed task's own loop may try a resume before Slurm ends it)
    assert all(r.action == "resume" and r.start_iteration >= 10 for r in runs[1:]), runs
    assert str(runs[-1].job_id) == str(chooses[0].slurm_job_id), runs
    ends = [r for r in records if r.event == "end" and r.stage == victim]
    assert ends[-1].end_iteration == BRANCH_ITERS and ends[-1].exit_code == 0, ends

    # the choice is recorded and the stage ran with it, started only after the choose job ended
    assert b.sweep is not None and b.sweep.chosen is not None
    choice = [r for r in records if r.event == "rope-sweep"]
    assert len(choice) == 1 and choice[0].base == b.rotary_base and b.rotary_base in BASES
    assert [e["base"] for e in choice[0].evidence] == list(BASES)
    waits = [r for r in records if r.event == "chain-wait"]
    assert waits and waits[0].waits_for == str(chooses[0].slurm_job_id), waits
    first_b = next(r for r in launches if r.stage == "b")
    assert first_b.action == "first-launch" and str(first_b.job_id) == waits[0].slurm_job_id
    assert [s.status for s in plan_state(rp)] == ["done", "done"]
    binding = next(r for r in launches if r.stage == "b").binding
    assert binding.rotary_base == b.rotary_base

    # the killed task's launch ended short of the branch's target, in the array task's own job
    first_end = next(r for r in records if r.event == "end" and r.stage == victim)
    assert first_end.end_iteration < BRANCH_ITERS and str(first_end.job_id) == str(runs[0].job_id)
    assert str(runs[0].job_id) not in [*ids, str(chooses[0].slurm_job_id)]  # an array task's job
