"""What `longctx stage run` does with each step: plan the launch, then (unless a dry run) check a megatron-lm
argv with the checkout's Megatron-LM, run it, and evaluate a stage it finished.

    steps = run_steps(resolve, RunOptions(backend="local", until_done=True),
                      launcher=LocalLauncher, facts=lambda rp: facts, report=printer)
    steps.result.exit_code   # 0, or the failed launch's (see `run_until_done`)
    steps.planned            # --dry-run: the launch plans, nothing run

The policy decides; `report` hears what happened, step by step, and renders it (the CLI prints it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from longctx.errors import StageError
from longctx.launch.local import Launcher
from longctx.launch.stop import requested
from longctx.plan.derive import ResolvedPlan
from longctx.plan.rope_sweep import SweepChoice
from longctx.plan.rope_sweep import describe as describe_sweep
from longctx.stage.preflight import DeviceFacts, PreflightReport
from longctx.stage.run import Backend, LaunchOutcome, LaunchPlan, execute, launch_plan
from longctx.stage.state import NextStep, branch_step, stage_state
from longctx.stage.until_done import (
    Resolve,
    UntilDone,
    evaluate_finished,
    evaluates_after,
    preflight_launch,
    run_until_done,
)

BACKENDS: tuple[Backend, ...] = ("local", "megatron-lm")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The switches of `stage run`."""

    backend: str = "local"
    """local (the embedded trainer) or megatron-lm."""
    dry_run: bool = False
    """Plan each launch and report it; run nothing."""
    force: bool = False
    """Launch although inputs differ from the ledger, resume across a changed LR schedule."""
    until_done: bool = False
    """Keep launching steps until the plan is done (else one step)."""
    eval_after: bool = True
    """Evaluate each stage a local launch finishes."""
    preflight: bool = True
    """Put a megatron-lm launch's argv through the checkout's Megatron-LM first."""
    sweep_of: str | None = None
    """Run only this stage's RoPE sweep (its branches, then the choice) and stop once it has chosen."""
    branch: str | None = None
    """Run only this sweep branch, until it is done (a task of a Slurm job array)."""
    branches_elsewhere: bool = False
    """Stop at a sweep branch instead of training it (a Slurm chain: a job array trains the branches)."""


class StepReport(Protocol):
    """Who hears what each step does (the CLI prints it)."""

    def launching(self, lp: LaunchPlan) -> None:
        """A launch is planned (and, unless a dry run, about to start)."""

    def planned(self, lp: LaunchPlan) -> None:
        """A dry run: the launch that would start."""

    def preflight_passed(self, lp: LaunchPlan, report: PreflightReport) -> None:
        """Megatron-LM accepted the launch's argv."""

    def finished(self, outcome: LaunchOutcome) -> None:
        """The launch ended (any way)."""

    def warning(self, text: str) -> None:
        """Something went wrong that does not fail the step (an evaluation)."""

    def chose(self, stage: str, choice: SweepChoice | None) -> None:
        """A sweep's branches were evaluated and its base chosen (None: a dry run, nothing evaluated)."""

    def sweep_starts(self, lines: list[str]) -> None:
        """A sweep's first branch is about to train: its candidates and cost."""


@dataclasses.dataclass
class StageRun:
    """Why the steps stopped, and with --dry-run what each would have launched."""

    result: UntilDone
    planned: list[LaunchPlan]


def run_steps(
    resolve: Resolve,
    options: RunOptions,
    *,
    launcher: Callable[[], Launcher],
    facts: Callable[[ResolvedPlan], DeviceFacts],
    report: StepReport,
) -> StageRun:
    """Launch the plan's next step (every step with `until_done`), deciding from disk before each one.

    `launcher()` is called for each launch that runs; `facts(rp)` gives the target's devices for the
    preflight of a megatron-lm launch."""
    if options.backend not in BACKENDS:
        raise StageError(
            f"unknown backend {options.backend!r}", fix="use --backend local or --backend megatron-lm"
        )
    backend: Backend = options.backend  # type: ignore[assignment]
    planned: list[LaunchPlan] = []

    def launch(rp: ResolvedPlan, step: NextStep) -> LaunchOutcome | None:
        lp = launch_plan(rp, step, backend, check_megatron=not options.dry_run, force=options.force)
        if lp.stage.branch_of is not None:
            main = rp.stage(lp.stage.branch_of)
            if main.sweep is not None and all(stage_state(b).status == "pending" for b in main.branches):
                report.sweep_starts(describe_sweep(main.sweep, lp.stage.tokens_realized))
        report.launching(lp)
        if options.dry_run:
            report.planned(lp)
            planned.append(lp)
            return None
        if options.preflight and backend == "megatron-lm":
            checked = preflight_launch(lp, facts(rp))
            if checked is not None:
                report.preflight_passed(lp, checked)
        outcome = execute(rp, lp, launcher(), force=options.force)
        report.finished(outcome)
        if requested() is not None:
            return outcome  # asked to stop: no evaluation starts (`run_until_done` stops here)
        if evaluates_after(rp, outcome, backend=backend, enabled=options.eval_after):
            warning = evaluate_finished(rp, outcome.stage)
            if warning:
                report.warning(warning)
        return outcome

    def choose(rp: ResolvedPlan, step: NextStep) -> bool:
        if options.dry_run:
            report.chose(step.stage or "", None)
            return False
        # choosing evaluates the branches (torch, megatron-core): a launch that chooses nothing does not
        # pay their import, seconds at every `stage run` and every chain job's start
        from longctx.stage.sweep_choice import record_choice

        report.chose(step.stage or "", record_choice(rp, rp.stage(step.stage or "")))
        return True

    until = sweep_until(options.sweep_of) if options.sweep_of else None
    if options.branches_elsewhere:
        until = _at_branch
    next_of = None
    if options.branch is not None:
        name = options.branch
        next_of = lambda rp: branch_step(rp, rp.stage(name))  # noqa: E731
    result = run_until_done(
        resolve, launch, until_done=options.until_done, choose=choose, until=until, next_of=next_of
    )
    return StageRun(result, planned)


def _at_branch(rp: ResolvedPlan, step: NextStep) -> str | None:
    if step.stage is None or rp.stage(step.stage).branch_of is None or step.action == "blocked":
        return None
    return f"{step.reason}: the sweep's branches run as a job array (`slurm job-end` submits it)"


def sweep_until(stage: str) -> Callable[[ResolvedPlan, NextStep], str | None]:
    """`rope sweep`'s stop: the stage has its choice (reached), or the next step belongs to another stage
    (StageError: its branches load what the stages before it finish)."""

    def until(rp: ResolvedPlan, step: NextStep) -> str | None:
        st = rp.stage(stage)
        if st.sweep is None:
            raise StageError(
                f"stage {stage} has no RoPE sweep",
                where=rp.where,
                fix="give it rope = { sweep = [...], tokens = N }, or name a stage that has one",
            )
        if not st.sweep.pending:
            return f"stage {stage}: RoPE {st.sweep.chosen.reason if st.sweep.chosen else ''}"
        if step.stage in {b.name for b in st.branches} or (step.action == "choose" and step.stage == stage):
            return None
        if step.stage == stage:
            raise StageError(
                f"stage {stage} has started without a choice on disk: its sweep is over",
                where=str(st.sweep.choice_path),
                fix="`longctx stage status PLAN` shows the stage",
            )
        raise StageError(
            f"stage {stage}'s sweep branches start from what the stages before it finish, and the next "
            f"step is {step.action} of {step.stage}",
            where=rp.where,
            fix="run the stages before it first: `longctx stage run PLAN --until-done` runs them, then the "
            "sweep, then the stage",
        )
        return None

    return until
