"""Progress you can act on, per stage: tokens/s over its last launch, the time to finish the stage and
the plan at that pace, and resumes whose loss comes back far above where it stopped.

The pace is the median tokens/s the trainer logged during the stage's last launch (its events, metrics
or logs, as `stage curves` reads them), else that launch's wall time from the ledger (start-up
included). A stage not launched yet is estimated at the most recent measured pace. A resume that loads
the right save continues the loss where it stopped; one that loads the wrong save (an older stage's, a
base checkpoint) starts far above it, which is what `resume_jumps` flags.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field

from longctx.errors import StageError
from longctx.plan.derive import ResolvedPlan
from longctx.stage import ledger
from longctx.stage.curves import PlanCurves, StageCurve, read_plan_curves
from longctx.stage.ledger_events import End, LedgerEvent
from longctx.stage.state import StageState

JUMP_WINDOW = 3  # iterations compared on each side of a resume
JUMP_MIN_NATS = 0.3  # a jump smaller than this is noise at any loss level
# an ETA beyond this is no estimate (a rate of 5e-324 tokens/s logged by a broken trainer): shown as unknown
MAX_ETA_SECONDS = 100 * 365 * 24 * 3600.0


@dataclass
class ResumeJump:
    iteration: int  # where the resume started
    before: float  # mean loss of the last iterations before it
    after: float  # loss of the first iteration after it

    def describe(self) -> str:
        return f"loss {self.before:.2f} → {self.after:.2f} after the resume at {self.iteration} (wrong save?)"


@dataclass
class StagePace:
    stage: str
    tokens_per_s: float | None  # over the last launch (or the estimate for a stage not launched)
    measured: bool  # False: estimated from another stage's pace
    stage_eta_seconds: float | None  # until this stage is done
    plan_eta_seconds: float | None  # until this stage is done, counting the stages before it
    resume_jumps: list[ResumeJump] = field(default_factory=list)

    def flag(self) -> str:
        return "; ".join(j.describe() for j in self.resume_jumps)


def _last_launch_rate(curve: StageCurve, curves: PlanCurves, records: list[LedgerEvent]) -> float | None:
    mine = [m for m in curves.launches if m.stage == curve.stage]
    if not mine:
        return None
    last = mine[-1]
    end = last.end_iteration if last.end_iteration is not None else curve.target_iterations
    logged = [p[2] for p in curve.tokens_per_s if last.start_iteration < p[0] <= end and p[2] > 0]
    if logged:
        rate = statistics.median(logged)
        return rate if math.isfinite(rate) and rate > 0 else None
    ends = [r for r in records if isinstance(r, End) and r.stage == curve.stage]
    seconds = (ends[-1].seconds or 0.0) if ends else 0.0
    if seconds > 0:
        gained = ends[-1].gained
        rate = gained * curve.tokens_per_iteration / seconds if gained > 0 else None
        return rate if rate is not None and math.isfinite(rate) else None
    return None


def resume_jumps(curve: StageCurve, curves: PlanCurves) -> list[ResumeJump]:
    """Resumes of `curve`'s stage after which the loss is far above its value before."""
    out = []
    for m in curves.launches:
        if m.stage != curve.stage or m.action != "resume":
            continue
        before = [p[2] for p in curve.loss if p[0] <= m.start_iteration][-JUMP_WINDOW:]
        after = [p[2] for p in curve.loss if p[0] > m.start_iteration][:1]
        if not before or not after:
            continue
        # the loss moves by about one step's change per iteration; a jump of many steps' worth is no noise
        steps = [abs(y - x) for x, y in itertools.pairwise(before)]
        b, a = statistics.fmean(before), after[0]
        if a - b > max(JUMP_MIN_NATS, 4 * statistics.fmean(steps) if steps else 0.0):
            out.append(ResumeJump(m.start_iteration, b, a))
    return out


def plan_pace(
    rp: ResolvedPlan, states: list[StageState], curves: PlanCurves, records: list[LedgerEvent]
) -> list[StagePace]:
    out: list[StagePace] = []
    plan_eta: float | None = 0.0
    latest: float | None = None
    for st, s, c in zip(rp.stages, states, curves.stages, strict=True):
        rate = _last_launch_rate(c, curves, records)
        measured = rate is not None
        latest = rate if measured else latest
        rate = rate if measured else latest
        remaining = 0 if s.status == "done" else max(0, st.train_iters - s.iteration) * c.tokens_per_iteration
        stage_eta = 0.0 if remaining == 0 else _eta(remaining, rate)
        plan_eta = None if plan_eta is None or stage_eta is None else plan_eta + stage_eta
        plan_eta = plan_eta if plan_eta is None or plan_eta <= MAX_ETA_SECONDS else None
        out.append(StagePace(st.name, rate, measured, stage_eta, plan_eta, resume_jumps(c, curves)))
    return out


def _eta(tokens: int, rate: float | None) -> float | None:
    """Seconds for `tokens` at `rate` tokens/s; None when unknown or beyond any useful horizon."""
    if rate is None or not math.isfinite(rate) or rate <= 0:
        return None
    eta = tokens / rate
    return eta if math.isfinite(eta) and eta <= MAX_ETA_SECONDS else None


def stage_pace(rp: ResolvedPlan, states: list[StageState]) -> list[StagePace]:
    """`plan_pace` from what is on disk (the curves `stage curves` draws and the ledger)."""
    try:
        records = ledger.read(rp.run_dir)
    except StageError:  # `stage curves` names the unreadable ledger; the pace then comes from the logs
        records = []
    return plan_pace(rp, states, read_plan_curves(rp), records)
