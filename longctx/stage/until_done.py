"""Launch the steps of a plan until it is done, deciding from disk before each one.

    result = run_until_done(resolve, launch, until_done=True)
    result.stop        # all-done | dry-run | failed | stalled | one-step
    result.exit_code   # 0, or the failed launch's exit code

`resolve()` re-reads the plan before every step and `next_step` reads its save dirs, so any step may
die and the next decision still comes from disk (never from an exit code). A blocked step raises
StageError. `launch(rp, step)` starts one step and returns its LaunchOutcome, or None when it launched
nothing (a dry run). `longctx stage run [--until-done]` launches in this process; `longctx demo`
launches each step as a `longctx stage run` subprocess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

from longctx.plan.derive import ResolvedPlan
from longctx.stage.run import Backend, LaunchOutcome
from longctx.stage.state import NextStep, next_step, plan_state, require_runnable

Stop = Literal["all-done", "dry-run", "failed", "stalled", "one-step"]
Resolve = Callable[[], ResolvedPlan]
LaunchStep = Callable[[ResolvedPlan, NextStep], LaunchOutcome | None]


@dataclasses.dataclass
class UntilDone:
    """Why the loop stopped, and what every launch did."""

    stop: Stop
    reason: str
    outcomes: list[LaunchOutcome]

    @property
    def done(self) -> bool:
        return self.stop == "all-done"

    @property
    def exit_code(self) -> int:
        """0 unless a launch failed: then its exit code (a signal's negative code becomes 1)."""
        if self.stop != "failed":
            return 0
        code = self.outcomes[-1].exit_code
        return code if code > 0 else 1


def after_step(outcome: LaunchOutcome, *, until_done: bool) -> tuple[Stop, str] | None:
    """Whether to stop after a launch, and why; None: launch the next step."""
    if outcome.exit_code != 0:
        return "failed", f"stage {outcome.stage} exited with {outcome.exit_code}"
    if not until_done:
        return "one-step", f"stage {outcome.stage}: one step launched"
    if outcome.end_iteration == outcome.start_iteration and outcome.status != "done":
        return "stalled", f"stage {outcome.stage} made no progress (iteration {outcome.end_iteration})"
    return None


def run_until_done(resolve: Resolve, launch: LaunchStep, *, until_done: bool = True) -> UntilDone:
    """Launch the next step until the plan is done (or, without `until_done`, one step)."""
    outcomes: list[LaunchOutcome] = []
    while True:
        rp = resolve()
        step = next_step(rp, plan_state(rp))
        if step.action == "all-done":
            return UntilDone("all-done", step.reason, outcomes)
        require_runnable(step)
        outcome = launch(rp, step)
        if outcome is None:
            return UntilDone("dry-run", step.reason, outcomes)
        outcomes.append(outcome)
        stop = after_step(outcome, until_done=until_done)
        if stop is not None:
            return UntilDone(stop[0], stop[1], outcomes)


def evaluates_after(rp: ResolvedPlan, outcome: LaunchOutcome, *, backend: Backend, enabled: bool) -> bool:
    """A finished stage is evaluated right away on the local backend (unless disabled by option or plan);
    on a cluster the chain job submits the eval job instead."""
    return outcome.status == "done" and backend == "local" and enabled and rp.plan.local.eval_after_stage


def evaluate_finished(rp: ResolvedPlan, stage: str) -> str | None:
    """Evaluate a stage that just finished; a failed evaluation is a warning (returned), never a failed
    training step: the stage is done on disk, and `longctx eval run` can be repeated."""
    # the evaluator loads torch and megatron-core; `stage run --no-eval` and cluster steps do not need them
    from longctx.eval.runner import evaluate_finished_stage

    try:
        evaluate_finished_stage(rp, stage)
    except Exception as err:
        return (
            f"warning: evaluation of stage {stage} failed: {err} — rerun it with "
            f"`longctx eval run <checkpoint> --plan PLAN --stage {stage}`"
        )
    return None
