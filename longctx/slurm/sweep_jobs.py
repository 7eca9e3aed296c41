"""A RoPE sweep on Slurm: its branches as one job array, one choose job after it, and the chain waiting.

When a chain job's `stage run --sweep-branches array` stops at a sweep's branches, its `slurm job-end`
calls `submit_sweep`: it queues the branches not done yet as a job array (task N trains branch N,
`sweep-STAGE.sbatch`), the choose job with `--dependency=afterany:<array>` (`choose-STAGE.sbatch`:
finish any branch a task left unfinished, then evaluate and choose), and points the chain's next
queued job at the choose job (`scontrol update … Dependency=afterany:<choose>`), so the stage starts
only with its base chosen. A task that dies (time limit, node failure, scancel) loses nothing: its
branch keeps its saves, and the choose job resumes it before it evaluates. A second job-end while the
array or the choose job is still queued or running submits nothing again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from longctx.errors import SlurmError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.slurm import commands
from longctx.slurm.records import job_id_of, submitted
from longctx.slurm.script import sweep_script_name
from longctx.stage import ledger
from longctx.stage.ledger_events import ChainWait, Submit
from longctx.stage.state import stage_state

ARRAY_KIND = "sweep-array"
CHOOSE_KIND = "sweep-choose"


@dataclasses.dataclass(frozen=True)
class SweepJobs:
    stage: str
    array_job: str
    tasks: list[int]
    choose_job: str
    waiting: str | None  # the chain job now waiting for the choose job (None: none was queued)


def active_with_tasks(job_ids: list[str]) -> list[str]:
    """Which of `job_ids` are queued or running, a job array counted by its tasks (squeue names them
    `ID_N`, or `ID_[N-M]` while pending)."""
    wanted = set(job_ids)
    if not wanted:
        return []
    proc = commands.run(["squeue", "-h", "--states=all", "-o", commands.SQUEUE_FORMAT])
    live = {k.split("_", 1)[0] for k, v in commands.parse_squeue(proc.stdout).items() if v.active}
    return sorted(wanted & live, key=int)


def _live_sweep_jobs(rp: ResolvedPlan, stage: str) -> list[str]:
    ids = [
        job_id_of(r)
        for r in submitted(rp.run_dir)
        if r.kind in (ARRAY_KIND, CHOOSE_KIND) and r.stage == stage
    ]
    return active_with_tasks([i for i in ids if i is not None])


def _next_chain_job(rp: ResolvedPlan, job: str | None) -> str | None:
    """The chain job queued right behind `job` (the one whose dependency is `job`), if still pending."""
    behind = [
        job_id_of(r) for r in submitted(rp.run_dir, "chain") if job is not None and str(r.dependency) == job
    ]
    live = commands.active_jobs([b for b in behind if b is not None])
    pending = [j for j, info in live.items() if info.state == "PENDING"]
    return pending[0] if pending else None


def submit_sweep(
    rp: ResolvedPlan, st: ResolvedStage, scripts_dir: Path, *, job: str | None
) -> SweepJobs | None:
    """Queue `st`'s unfinished branches as a job array and the choose job after it, and make the chain's next
    job wait for the choice. None when the sweep's jobs are already queued or running."""
    if _live_sweep_jobs(rp, st.name):
        return None
    tasks = [i for i, b in enumerate(st.branches) if stage_state(b).status != "done"]
    branches, choose = (Path(scripts_dir) / sweep_script_name(st.name, r) for r in ("branches", "choose"))
    for script in (branches, choose):
        if not script.is_file():
            raise SlurmError(
                f"the sweep's batch script {script} is missing",
                where=str(scripts_dir),
                fix="render the plan's scripts again (`longctx slurm render` / `slurm submit`)",
            )
    array = ""
    if tasks:
        argv = commands.sbatch_argv(branches, extra=[f"--array={','.join(map(str, tasks))}"])
        array = commands.parse_parsable(commands.run(argv).stdout)
        ledger.append(
            rp.run_dir,
            Submit(
                kind=ARRAY_KIND,
                slurm_job_id=array,
                stage=st.name,
                tasks=tasks,
                branches=[st.branches[i].name for i in tasks],
                script=str(branches),
            ),
        )
    chosen = commands.sbatch(choose, dependency=array or None)
    ledger.append(
        rp.run_dir,
        Submit(
            kind=CHOOSE_KIND, slurm_job_id=chosen, stage=st.name, dependency=array or None, script=str(choose)
        ),
    )
    waiting = _next_chain_job(rp, job)
    if waiting is not None:
        commands.run(["scontrol", "update", f"JobId={waiting}", f"Dependency=afterany:{chosen}"])
        ledger.append(rp.run_dir, ChainWait(slurm_job_id=waiting, waits_for=chosen, stage=st.name))
    return SweepJobs(st.name, array, tasks, chosen, waiting)


__all__ = ["ARRAY_KIND", "CHOOSE_KIND", "SweepJobs", "active_with_tasks", "submit_sweep"]
