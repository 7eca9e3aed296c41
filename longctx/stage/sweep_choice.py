"""A RoPE sweep's evidence and choice: evaluate each finished branch at its stage's length, choose by the
stated rule, record the candidates, the evidence and the choice (`choice.json` and the ledger).

    evidence = branch_evidence(rp, st)          # one BranchEvidence per candidate base
    base, reason = choose(evidence)
    choice = record_choice(rp, st)              # both, then written; the stage now resolves with it
    cost = sweep_cost(rp, st)                   # what the branches cost, before anything runs

The rule (`worst-depth`): a stage extended to L is worth its worst depth at L — the effective length
asks every depth to hold — so the branch with the most greedy exact matches at its worst depth wins;
ties go to the most matches over all depths, then to the lower held-out loss at the window's far end
(autoregressive: the mean loss at positions ≥ L/2; diffusion: the ELBO of a window with the widest
clean context), then to the smaller base (the least change from what the model knows).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from longctx.errors import StageError
from longctx.eval.accuracy import wilson_interval
from longctx.eval.data import heldout_for_stage
from longctx.eval.engine import CheckpointRef, evaluate_checkpoints
from longctx.eval.results import CheckpointEval
from longctx.eval.runner import plan_settings
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.rope_sweep import RULE, SweepChoice
from longctx.plan.stage_data import plan_tokenizer
from longctx.stage import ledger
from longctx.stage.ledger_events import RopeSweep
from longctx.stage.lock import run_lock
from longctx.stage.pace import stage_pace
from longctx.stage.state import plan_state, stage_state
from longctx.util.fs import atomic_write_json


@dataclasses.dataclass(frozen=True)
class BranchEvidence:
    """What one branch measured at its stage's length."""

    branch: str
    base: int
    sources: tuple[str, ...]
    tokens: int
    length: int
    depths: tuple[float, ...]
    hits: tuple[int, ...]  # greedy exact matches per depth
    keys: int  # per depth
    far_loss: float | None  # AR: mean loss at positions ≥ L/2; diffusion: widest-context ELBO (nats/token)

    @property
    def worst(self) -> int:
        return min(self.hits)

    @property
    def total(self) -> int:
        return sum(self.hits)

    @property
    def finite_far_loss(self) -> float | None:
        """The far-end loss, None when unmeasured or not finite (a diverged branch: JSON has no NaN)."""
        return self.far_loss if self.far_loss is not None and math.isfinite(self.far_loss) else None

    def rank_key(self) -> tuple[float, ...]:
        loss = self.finite_far_loss
        return (-self.worst, -self.total, math.inf if loss is None else loss, self.base)

    def to_json(self) -> dict[str, Any]:
        lo, hi = wilson_interval(self.worst, self.keys)
        n = self.keys * len(self.hits)
        return {
            "branch": self.branch,
            "base": self.base,
            "from": list(self.sources),
            "tokens": self.tokens,
            "length": self.length,
            "depths": list(self.depths),
            "greedy_hits": list(self.hits),
            "keys": self.keys,
            "worst_depth": self.worst / self.keys if self.keys else 0.0,
            "worst_interval": [lo, hi],
            "greedy": self.total / n if n else 0.0,
            "far_loss": self.finite_far_loss,
        }


def _far_loss(ev: CheckpointEval, length: int) -> float | None:
    res = ev.at(length)
    if res is None:
        return None
    if res.position is not None:
        return res.position.long_loss
    if res.context_elbo is not None and res.context_elbo.elbo:
        return res.context_elbo.elbo[-1]
    return None


def _unfinished(st: ResolvedStage) -> list[str]:
    return [b.name for b in st.branches if stage_state(b).status != "done"]


def branch_evidence(rp: ResolvedPlan, st: ResolvedStage, *, log: Any = None) -> list[BranchEvidence]:
    """Evaluate every branch of `st`'s sweep at the stage's length (StageError while one is unfinished).
    Results are cached with the plan's other evaluations, so a second choice re-uses them."""
    if st.sweep is None:
        raise StageError(
            f"stage {st.name} has no RoPE sweep",
            where=rp.where,
            fix="give the stage rope = { sweep = [...], tokens = N }",
        )
    left = _unfinished(st)
    if left:
        raise StageError(
            f"sweep branches not finished: {', '.join(left)}",
            where=str(st.sweep.directory),
            fix="run them first: `longctx stage run PLAN --until-done` (or `longctx rope sweep`)",
        )
    refs = [CheckpointRef(b.name, b.save_dir, expected_rotary_base=b.rotary_base) for b in st.branches]
    # what the rule reads, no more: the single-needle grid's greedy matches and the far-end loss (no
    # distractor scoring, other needle tasks, short-context or packed-window losses), so the choice costs
    # a fraction of a full evaluation
    settings = plan_settings(rp).model_copy(
        update={"distractors": 0, "short_docs": 0, "packed_windows": 0, "tasks": ["single"]}
    )
    report = evaluate_checkpoints(
        refs,
        lengths=[st.seq_length],
        tokenizer=plan_tokenizer(rp),
        heldout=heldout_for_stage(rp, st),
        settings=settings,
        short_length=int(rp.base.seq_length),
        cache_dir=Path(rp.run_dir) / "eval" / "cache",
        plan=rp.name,
        stage=st.name,
        log=log,
    )
    out = []
    for b, ev in zip(st.branches, report.checkpoints, strict=True):
        res = ev.at(st.seq_length)
        if res is None:
            raise StageError(f"branch {b.name} was not evaluated at {st.seq_length}", where=str(b.save_dir))
        cells = sorted(res.passkey.cells, key=lambda c: c.depth)
        out.append(
            BranchEvidence(
                b.name,
                b.rotary_base,
                next(c.sources for c in st.sweep.candidates if c.base == b.rotary_base),
                b.tokens_realized,
                st.seq_length,
                tuple(c.depth for c in cells),
                tuple(c.greedy_hits for c in cells),
                min(c.keys for c in cells),
                _far_loss(ev, st.seq_length),
            )
        )
    return out


def choose(evidence: list[BranchEvidence]) -> tuple[int, str]:
    """The chosen base by the `worst-depth` rule, and the reason in one line."""
    ranked = sorted(evidence, key=BranchEvidence.rank_key)
    best = ranked[0]
    why = (
        f"{best.worst}/{best.keys} at its worst depth and {best.total}/{best.keys * len(best.hits)} overall "
        f"at {best.length:,}"
    )
    if len(ranked) > 1:
        second = ranked[1]
        if (best.worst, best.total) == (second.worst, second.total):
            a, b = best.finite_far_loss, second.finite_far_loss
            if a is not None and b is not None and a != b:
                why += f", tied with {second.base:,} on retrieval: lower far-end loss ({_apart(a, b)})"
            else:
                why += f", tied with {second.base:,}: the smaller base"
        else:
            why += f" (next: {second.base:,} with {second.worst}/{second.keys}, {second.total})"
    return best.base, f"base {best.base:,}: {why}"


def _apart(a: float, b: float) -> str:
    """`a vs b` with the fewest decimals (4 at least) that tell them apart."""
    for places in range(4, 17):
        shown = f"{a:.{places}f}", f"{b:.{places}f}"
        if shown[0] != shown[1]:
            break
    return " vs ".join(shown)


def record_choice(rp: ResolvedPlan, st: ResolvedStage, *, log: Any = None) -> SweepChoice:
    """Evaluate the branches, choose, and write the choice and a ledger record, holding the run's lock."""
    evidence = branch_evidence(rp, st, log=log)  # StageError without a sweep, or with a branch unfinished
    assert st.sweep is not None
    base, reason = choose(evidence)
    choice = SweepChoice(
        base=base,
        rule=RULE,
        reason=reason,
        candidates=st.sweep.bases,
        branch_tokens=st.sweep.branch_tokens,
        evidence=tuple(e.to_json() for e in evidence),
    )
    with run_lock(rp.run_dir, st.name):
        atomic_write_json(st.sweep.choice_path, choice.to_json())
        ledger.append(rp.run_dir, RopeSweep.model_validate({"stage": st.name, **choice.to_json()}))
    return choice


@dataclasses.dataclass(frozen=True)
class SweepCost:
    """What a sweep costs before it runs: tokens, their share of the stage's, and time at the known pace."""

    stage: str
    branches: int
    branch_tokens: int
    total_tokens: int
    stage_tokens: int
    seconds: float | None  # the branches at the stage's (estimated) pace; None when no pace is known
    stage_seconds: float | None

    @property
    def share(self) -> float:
        return self.total_tokens / self.stage_tokens

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"share": self.share}


def sweep_cost(rp: ResolvedPlan, st: ResolvedStage) -> SweepCost:
    """The branches' tokens (whole batches) against the stage's, and their time at the pace `stage status`
    estimates for the stage (None before any launch of the plan has measured one)."""
    assert st.sweep is not None
    total = sum(b.tokens_realized for b in st.branches)
    rate = next((p.tokens_per_s for p in stage_pace(rp, plan_state(rp)) if p.stage == st.name), None)
    secs = total / rate if rate else None
    stage_secs = st.tokens_realized / rate if rate else None
    return SweepCost(
        st.name, len(st.branches), st.branches[0].tokens_realized, total, st.tokens_realized, secs, stage_secs
    )


def sweep_status(st: ResolvedStage) -> dict[str, Any]:
    """A stage's sweep for `stage status`: the summary (candidates, cost, choice) and each branch's progress."""
    assert st.sweep is not None
    branches = []
    for b in st.branches:
        s = stage_state(b)
        branches.append(
            {
                "branch": b.name,
                "base": b.rotary_base,
                "status": s.status,
                "iteration": s.iteration,
                "target": s.target_iterations,
                "save_dir": str(b.save_dir),
            }
        )
    return {**st.sweep.summary(), "branches": branches}


def sweep_stage(rp: ResolvedPlan, name: str | None) -> ResolvedStage:
    """The stage `rope sweep` works on: the one named, else the first whose sweep is pending, else the first
    with a sweep (StageError when none has one)."""
    if name is not None:
        st = rp.stage(name)
        if st.sweep is None:
            raise StageError(
                f"stage {name} has no RoPE sweep",
                where=rp.where,
                fix="give it rope = { sweep = [...], tokens = N }, or name a stage that has one",
            )
        return st
    swept = [st for st in rp.stages if st.sweep is not None]
    if not swept:
        raise StageError(
            "no stage of this plan has a RoPE sweep",
            where=rp.where,
            fix="give a stage rope = { sweep = [candidates], tokens = N } (docs/stages.md)",
        )
    return next((st for st in swept if st.sweep is not None and st.sweep.pending), swept[0])


__all__ = [
    "BranchEvidence",
    "SweepCost",
    "branch_evidence",
    "choose",
    "record_choice",
    "sweep_cost",
    "sweep_stage",
]
