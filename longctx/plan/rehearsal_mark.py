"""The mark of a rehearsal's run directory, and the guard that keeps a real plan out of one.

A rehearsal (`longctx rehearse`) trains micro models under its plan's stage names; its run directory
holds `rehearsal.json`. A plan that is not a rehearsal never resolves into such a directory, so its
stages can never resume from, or evaluate, a rehearsal's checkpoints."""

from __future__ import annotations

from pathlib import Path

from longctx.errors import PlanError

REHEARSAL_MARK = "rehearsal.json"
NAME_SUFFIX = "-rehearsal"


def is_rehearsal_dir(run_dir: Path) -> bool:
    return (run_dir / REHEARSAL_MARK).exists()


def refuse_rehearsal_dir(plan_name: str, run_dir: Path, where: str) -> None:
    """PlanError when `run_dir` is a rehearsal's and `plan_name` is no rehearsal plan."""
    if is_rehearsal_dir(run_dir) and not plan_name.endswith(NAME_SUFFIX):
        raise PlanError(
            f"{run_dir} holds a rehearsal ({REHEARSAL_MARK}): its checkpoints are micro models, never the "
            f"real run's, and plan {plan_name!r} is no rehearsal",
            where=where,
            fix="point the plan's run_dir (or --run-dir) at the real run's directory",
        )
