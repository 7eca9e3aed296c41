"""Launch the steps of a plan until it is done, deciding from disk before each one.

    result = run_until_done(resolve, launch, until_done=True)
    result.stop        # all-done | dry-run | failed | interrupted | one-step
    result.exit_code   # 0, or the failed launch's exit code (1 for a launch that exited 0 but failed)

`resolve()` re-reads the plan before every step and `next_step` reads its save dirs, so any step may
die and the next decision still comes from disk (never from an exit code). A blocked step raises
StageError. `launch(rp, step)` starts one step and returns its LaunchOutcome, or None when it launched
nothing (a dry run). `longctx stage run [--until-done]` launches in this process; `longctx demo`
launches each step as a `longctx stage run` subprocess.

Before a megatron-lm launch, `preflight_launch(lp, facts)` puts its exact argv through the checkout's
Megatron-LM (parser, validator, TransformerConfig, the model's rotary base) in a child process, with the
launch's own environment; a refusal raises PreflightError and nothing is launched (opt out:
`stage run --no-preflight`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Literal

from longctx.errors import Interrupted
from longctx.launch.stop import raise_if_requested
from longctx.plan.derive import ResolvedPlan
from longctx.stage.preflight import DeviceFacts, PreflightReport, StageJob, require_passed, run_preflight
from longctx.stage.run import Backend, LaunchOutcome, LaunchPlan
from longctx.stage.state import NextStep, next_step, plan_state, require_runnable

Stop = Literal["all-done", "dry-run", "failed", "interrupted", "one-step", "reached"]
Resolve = Callable[[], ResolvedPlan]
LaunchStep = Callable[[ResolvedPlan, NextStep], LaunchOutcome | None]
# a `choose` step (a RoPE sweep's branches are done): evaluate them and record the choice; False: a dry run
ChooseStep = Callable[[ResolvedPlan, NextStep], bool]
# before each step: why to stop there (None: take it), e.g. `rope sweep` stops once its stage has chosen
Until = Callable[[ResolvedPlan, NextStep], str | None]


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
    """Whether to stop after a launch, and why; None: launch the next step.

    The decision is `LaunchOutcome.verdict`: a launch that exited 0 without progress fails (with what its
    log says: Megatron-LM's "Unable to load rng state", --exit-on-missing-checkpoint, a traceback), and
    so stops the loop and, recorded in the ledger, a Slurm chain (job_end); one that a signal stopped
    before its first save was interrupted (the next job resumes from the same save)."""
    verdict = outcome.verdict
    if verdict == "failed":
        if outcome.exit_code != 0:
            why = f"stage {outcome.stage} exited with {outcome.exit_code}"
            return "failed", why + (f"; {outcome.no_progress}" if outcome.no_progress else "")
        return "failed", outcome.no_progress or f"stage {outcome.stage} made no progress"
    if verdict == "interrupted":
        return "interrupted", (
            f"stage {outcome.stage} was asked to stop (a signal) at iteration {outcome.end_iteration} before "
            "its next save; the next launch resumes from the last save"
        )
    if not until_done:
        return "one-step", f"stage {outcome.stage}: one step launched"
    return None


def stopped_at(rp: ResolvedPlan, outcome: LaunchOutcome) -> str:
    """Where a launch that was asked to stop left its stage, for the message that says so."""
    target = rp.stage(outcome.stage).train_iters
    left = "done" if outcome.status == "done" else "not done; the next run resumes from its last save"
    return f"stage {outcome.stage} at iteration {outcome.end_iteration} of {target} ({left})"


def run_until_done(
    resolve: Resolve,
    launch: LaunchStep,
    *,
    until_done: bool = True,
    choose: ChooseStep | None = None,
    until: Until | None = None,
    next_of: Callable[[ResolvedPlan], NextStep] | None = None,
) -> UntilDone:
    """Launch the next step until the plan is done (or, without `until_done`, one step; or until `until`
    says so: stop `reached`). A sweep's choice is a step too: `choose` makes it (without one, the loop
    stops there, as after one step). `next_of(rp)` replaces `next_step` (one sweep branch's own steps).
    A stop signal this process received (`longctx.launch.stop`) ends the loop with `Interrupted`,
    before the next step and after every launch, whatever the launch's exit code."""
    outcomes: list[LaunchOutcome] = []
    while True:
        raise_if_requested()
        rp = resolve()
        step = next_of(rp) if next_of is not None else next_step(rp, plan_state(rp))
        reached = until(rp, step) if until is not None else None
        if reached is not None:
            return UntilDone("reached", reached, outcomes)
        if step.action == "all-done":
            return UntilDone("all-done", step.reason, outcomes)
        require_runnable(step)
        if step.action == "choose":
            if choose is None:
                return UntilDone("one-step", step.reason, outcomes)
            if not choose(rp, step):
                return UntilDone("dry-run", step.reason, outcomes)
            if not until_done:
                return UntilDone("one-step", f"stage {step.stage}: RoPE base chosen", outcomes)
            continue
        outcome = launch(rp, step)
        if outcome is None:
            return UntilDone("dry-run", step.reason, outcomes)
        outcomes.append(outcome)
        # asked to stop while it ran: its save is where the next run resumes, nothing goes on from it
        raise_if_requested(stopped_at(rp, outcome), where=str(rp.stage(outcome.stage).save_dir))
        stop = after_step(outcome, until_done=until_done)
        if stop is not None:
            return UntilDone(stop[0], stop[1], outcomes)


def preflight_launch(
    lp: LaunchPlan, facts: DeviceFacts, *, enabled: bool = True, environ: Mapping[str, str] | None = None
) -> PreflightReport | None:
    """Check a megatron-lm launch before it starts (None: nothing to check — disabled, or another backend).

    `facts` are the target's devices (the plan's cluster profile); the environment is the launch's own, the
    one the workers get (this process's, then the launch plan's env: CUDA_DEVICE_MAX_CONNECTIONS, PYTHONPATH).
    Raises PreflightError quoting Megatron-LM when it refuses the argv."""
    if not enabled or lp.backend != "megatron-lm":
        return None
    env = {**(os.environ if environ is None else environ), **lp.env}
    facts = dataclasses.replace(facts, env=env)
    # lp.argv = [python, pretrain_gpt.py, flags…]; what is started may be longer (the CPU runner adds its
    # flags after them): check the flags that Megatron-LM will actually parse
    words = list(getattr(lp, "command", lp.argv))
    script = lp.argv[1]
    flags = words[words.index(script) + 1 :] if script in words else list(lp.argv[2:])
    if getattr(lp, "cpu", False):
        # Megatron-LM on this machine's CPU: its runner reports an A100-class device, and there is no TE
        facts = DeviceFacts(
            "this machine: Megatron-LM on the CPU (the CPU runner's A100-class device)",
            gpu_arch=(8, 0),
            transformer_engine=None,
            env=env,
        )
    st = lp.stage
    job = StageJob(
        st.name,
        flags,
        st.world,
        st.gpus_per_node,
        rotary_base=float(st.rotary_base),
        seq_length=st.seq_length,
    )
    return require_passed(run_preflight(script, [job], facts), where=script)


def evaluates_after(rp: ResolvedPlan, outcome: LaunchOutcome, *, backend: Backend, enabled: bool) -> bool:
    """A finished stage is evaluated right away on the local backend (unless disabled by option or plan);
    on a cluster the chain job submits the eval job instead. The evaluation scores next-token
    predictions, so a diffusion objective's stages are not evaluated by it."""
    autoregressive = rp.objective.kind == "ar"
    branch = rp.stage(outcome.stage).branch_of is not None  # a sweep's choice evaluates its branches
    return (
        outcome.status == "done"
        and not branch
        and backend == "local"
        and enabled
        and rp.local.eval_after_stage
        and autoregressive
    )


def evaluate_finished(rp: ResolvedPlan, stage: str) -> str | None:
    """Evaluate a stage that just finished; a failed evaluation is a warning (returned), never a failed
    training step: the stage is done on disk, and `longctx eval run` can be repeated."""
    # the evaluator loads torch and megatron-core; `stage run --no-eval` and cluster steps do not need them
    from longctx.eval.runner import evaluate_finished_stage

    try:
        evaluate_finished_stage(rp, stage)
    except Interrupted:
        raise  # a stop signal, not a failed evaluation
    except Exception as err:
        return (
            f"warning: evaluation of stage {stage} failed: {err} — rerun it with "
            f"`longctx eval run <checkpoint> --plan PLAN --stage {stage}`"
        )
    return None
