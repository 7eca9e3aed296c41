"""Evaluation results (pydantic: the JSON written to disk is `model_dump`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, computed_field

from longctx.eval.accuracy import (
    EFFECTIVE_THRESHOLD,
    chance_greedy,
    chance_loglik,
    effective_length,
    hits_of,
    relative_effective_length,
    ruler_effective_length,
    spans,
    wilson_interval,
)
from longctx.eval.loss_position import PackedLoss, PositionLoss
from longctx.eval.score import ItemScore
from longctx.eval.settings import EvalSettings
from longctx.eval.short_context import ShortLoss
from longctx.eval.task_results import TaskResult
from longctx.plan.eval_tasks import parse_task


class PasskeyCell(BaseModel):
    depth: float
    needle_starts: list[int]
    keys: int
    greedy_accuracy: float
    loglik_accuracy: float | None
    loglik_margin: float | None  # mean over keys, nats
    token_margin: float
    digit_accuracy: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def greedy_hits(self) -> int:
        return hits_of(self.greedy_accuracy, self.keys) or 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def greedy_interval(self) -> tuple[float, float]:
        """Wilson 95 % interval of the greedy exact-match accuracy."""
        return wilson_interval(self.greedy_hits, self.keys)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def loglik_hits(self) -> int | None:
        return hits_of(self.loglik_accuracy, self.keys)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def loglik_interval(self) -> tuple[float, float] | None:
        return None if self.loglik_hits is None else wilson_interval(self.loglik_hits, self.keys)

    def headline(self) -> tuple[float, tuple[float, float]]:
        """The accuracy the table leads with (log-likelihood when scored, else greedy) and its interval."""
        if self.loglik_accuracy is not None and self.loglik_interval is not None:
            return self.loglik_accuracy, self.loglik_interval
        return self.greedy_accuracy, self.greedy_interval


class PasskeyResult(BaseModel):
    length: int
    distractors: int
    cells: list[PasskeyCell]
    items: list[ItemScore]
    greedy_accuracy: float
    loglik_accuracy: float | None
    loglik_margin: float | None
    token_margin: float
    natural: float  # share of items whose filler after the needle is whole sentences

    @property
    def accuracy(self) -> float:
        """The headline accuracy: log-likelihood when distractors were scored, else greedy."""
        return self.loglik_accuracy if self.loglik_accuracy is not None else self.greedy_accuracy

    @property
    def chance(self) -> float:
        """The headline accuracy of guessing: 1/(distractors + 1), or 10^-digits for the greedy key."""
        if self.loglik_accuracy is not None:
            return chance_loglik(self.distractors)
        digits = max((len(i.key) for i in self.items), default=1)
        return chance_greedy(digits)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def keys(self) -> int:
        return sum(c.keys for c in self.cells)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def greedy_hits(self) -> int:
        return sum(c.greedy_hits for c in self.cells)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def greedy_interval(self) -> tuple[float, float]:
        return wilson_interval(self.greedy_hits, self.keys)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def depths_at_chance(self) -> list[float]:
        """Depths whose headline interval reaches chance: their accuracy tells nothing apart from guessing."""
        return [c.depth for c in self.cells if spans(c.headline()[1], self.chance)]

    def greedy_depths_at_chance(self) -> list[float]:
        """Depths whose greedy interval reaches the greedy chance (10^-digits): no key retrieved."""
        digits = max((len(i.key) for i in self.items), default=1)
        return [c.depth for c in self.cells if spans(c.greedy_interval, chance_greedy(digits))]

    def loglik_depths_at_chance(self) -> list[float]:
        """Depths whose log-likelihood interval reaches 1/(distractors + 1)."""
        return [
            c.depth
            for c in self.cells
            if c.loglik_interval is not None and spans(c.loglik_interval, chance_loglik(self.distractors))
        ]

    @classmethod
    def from_items(
        cls, length: int, distractors: int, scores: Sequence[ItemScore], natural: float
    ) -> PasskeyResult:
        cells = []
        for depth in sorted({s.depth for s in scores}):
            group = [s for s in scores if s.depth == depth]
            cells.append(_cell(depth, group))
        return cls(
            length=length,
            distractors=distractors,
            cells=cells,
            items=list(scores),
            greedy_accuracy=_mean([float(s.greedy) for s in scores]),
            loglik_accuracy=_mean_opt([None if s.loglik is None else float(s.loglik) for s in scores]),
            loglik_margin=_mean_opt([s.loglik_margin for s in scores]),
            token_margin=_mean([s.token_margin for s in scores]),
            natural=natural,
        )


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else float("nan")


def _mean_opt(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(statistics.fmean(vals)) if vals else None


def _cell(depth: float, group: Sequence[ItemScore]) -> PasskeyCell:
    return PasskeyCell(
        depth=depth,
        needle_starts=[s.needle_start for s in group],
        keys=len(group),
        greedy_accuracy=_mean([float(s.greedy) for s in group]),
        loglik_accuracy=_mean_opt([None if s.loglik is None else float(s.loglik) for s in group]),
        loglik_margin=_mean_opt([s.loglik_margin for s in group]),
        token_margin=_mean([s.token_margin for s in group]),
        digit_accuracy=_mean([s.digit_accuracy for s in group]),
    )


class ContextElbo(BaseModel):
    """The bound of a target window (nats per token) by the clean context around it."""

    window: int
    contexts: list[int]  # clean tokens around the window (half on each side)
    t_levels: list[float]
    elbo: list[float]  # per context: mean over documents and levels
    elbo_by_t: list[list[float]]  # per context, per level: mean over documents
    per_doc: list[list[float]]  # per context, per document: mean over levels
    documents: int


class LengthResult(BaseModel):
    length: int
    extrapolated: bool  # longer than the checkpoint's trained window
    passkey: PasskeyResult
    position: PositionLoss | None  # autoregressive models: loss by position
    seconds: float
    packed: PackedLoss | None = None  # windows packed from several documents, across vs within
    context_elbo: ContextElbo | None = None  # diffusion models: a window's bound by its clean context
    objective: str = "ar"  # how the passkey was scored: "ar" (next token) or "mdm"/"udm" (infilling)
    tasks: list[TaskResult] = Field(default_factory=list)  # the needle tasks beyond single

    def task(self, name: str) -> TaskResult | None:
        return next((t for t in self.tasks if t.task == name), None)


class TaskLength(BaseModel):
    """One task's score at one length: hits / items, the accuracy and its Wilson 95 % interval; for the
    absent-name control, `present` = answers returning a present key (and no hits)."""

    length: int
    hits: int
    keys: int
    accuracy: float
    interval: tuple[float, float]
    present: int | None = None
    present_interval: tuple[float, float] | None = None
    extrapolated: bool = False


class TaskSummary(BaseModel):
    """One checkpoint's task across the lengths, with its effective lengths (None for the control)."""

    checkpoint: str
    task: str
    control: bool
    lengths: list[TaskLength]
    ruler_effective_length: int | None
    relative_effective_length: int | None


def task_length(r: LengthResult, task: str) -> TaskLength | None:
    """The score of `task` in one LengthResult (single: the passkey grid's greedy exact match)."""
    if task == "single":
        p = r.passkey
        return TaskLength(
            length=r.length,
            hits=p.greedy_hits,
            keys=p.keys,
            accuracy=p.greedy_accuracy,
            interval=p.greedy_interval,
            extrapolated=r.extrapolated,
        )
    t = r.task(task)
    if t is None:
        return None
    return TaskLength(
        length=r.length,
        hits=t.hits,
        keys=t.keys,
        accuracy=t.accuracy,
        interval=t.interval,
        present=t.present if t.control else None,
        present_interval=t.present_interval if t.control else None,
        extrapolated=r.extrapolated,
    )


def task_summary(ce: CheckpointEval, task: str, settings: EvalSettings) -> TaskSummary:
    rows = [x for r in sorted(ce.results, key=lambda r: r.length) if (x := task_length(r, task)) is not None]
    control = parse_task(task).control
    scores = {x.length: x.accuracy for x in rows}
    return TaskSummary(
        checkpoint=ce.label,
        task=task,
        control=control,
        lengths=rows,
        ruler_effective_length=None if control else ruler_effective_length(scores, settings.ruler_threshold),
        relative_effective_length=None
        if control
        else relative_effective_length(scores, settings.relative_threshold),
    )


class CheckpointEval(BaseModel):
    label: str
    checkpoint: dict[str, Any]  # CheckpointInfo.to_json()
    trained_length: int | None
    rotary_base: int
    results: list[LengthResult] = Field(default_factory=list)
    short: ShortLoss | None = None
    short_delta_vs_base: float | None = None  # short loss − the base model's on the same documents
    short_delta_interval: tuple[float, float] | None = (
        None  # its 95 % interval over the documents (bootstrap)
    )
    seconds: float = 0.0
    cached: list[str] = Field(default_factory=list)  # which parts came from the result cache

    def at(self, length: int) -> LengthResult | None:
        return next((r for r in self.results if r.length == length), None)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def every_depth_effective_length(self) -> int | None:
        """The single needle's every-depth effective length: the longest evaluated length up to which
        greedy exact match stays ≥ EFFECTIVE_THRESHOLD at every depth (longctx.eval.accuracy). Stricter than
        the per-task lengths of `task_summary` (RULER's and the relative rule, over all depths at once),
        so it has its own name wherever it is shown."""
        return effective_length(
            {r.length: [c.greedy_accuracy for c in r.passkey.cells] for r in self.results}
        )

    def packed_result(self) -> PackedLoss | None:
        """The packed-window measurement at the longest length that has one."""
        return next((r.packed for r in sorted(self.results, key=lambda r: -r.length) if r.packed), None)


class EvalReport(BaseModel):
    plan: str | None
    stage: str | None
    settings: EvalSettings
    # where the settings come from: the plan's [eval], and the fields options overrode
    settings_origin: str | None = None
    method: str
    lengths: list[int]
    checkpoints: list[CheckpointEval]
    heldout: dict[str, Any]
    out_dir: str | None = None
    plots: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    # greedy accuracy every depth keeps up to the every-depth effective length
    every_depth_threshold: float = EFFECTIVE_THRESHOLD

    @computed_field  # type: ignore[prop-decorator]
    @property
    def task_summary(self) -> list[TaskSummary]:
        """Per task (settings order), per checkpoint with results: the score at each length and the
        effective lengths by RULER's and NoLiMa's rules (longctx.eval.accuracy)."""
        return [
            task_summary(ce, t, self.settings)
            for t in self.settings.tasks
            for ce in self.checkpoints
            if ce.results
        ]

    def identity(self) -> str:
        """What makes two reports comparable: the measured settings, the lengths and the held-out data
        (not the checkpoints: a later summary of the same plan replaces an earlier one)."""
        return self.settings.fingerprint(
            self.lengths, self.heldout.get("prefixes"), self.heldout.get("split")
        )

    def table(self) -> list[dict[str, Any]]:
        """One row per checkpoint: per length the headline passkey accuracy, greedy accuracy, mean
        margin and the long-position loss; then the short-context loss and its change vs the base, and
        the packed-window losses (across vs within documents) at the longest length measured."""
        rows = []
        for ce in self.checkpoints:
            row: dict[str, Any] = {
                "checkpoint": ce.label,
                "trained_length": ce.trained_length,
                "rotary_base": ce.rotary_base,
            }
            for n in self.lengths:
                r = ce.at(n)
                row[str(n)] = (
                    None
                    if r is None
                    else {
                        "passkey": r.passkey.accuracy,
                        "greedy": r.passkey.greedy_accuracy,
                        "greedy_hits": r.passkey.greedy_hits,
                        "keys": r.passkey.keys,
                        "greedy_interval": r.passkey.greedy_interval,
                        "depths_at_chance": r.passkey.depths_at_chance,
                        "margin": r.passkey.loglik_margin
                        if r.passkey.loglik_margin is not None
                        else r.passkey.token_margin,
                        "long_loss": r.position.long_loss if r.position is not None else None,
                        "extrapolated": r.extrapolated,
                        "elbo_widest_context": r.context_elbo.elbo[-1]
                        if r.context_elbo is not None
                        else None,
                    }
                )
            row["every_depth_effective_length"] = ce.every_depth_effective_length
            row["short_loss"] = ce.short.loss if ce.short else None
            row["short_delta_vs_base"] = ce.short_delta_vs_base
            row["short_delta_interval"] = ce.short_delta_interval
            pk = ce.packed_result()
            row["packed"] = (
                None
                if pk is None
                else {
                    "length": pk.length,
                    "plain_loss": pk.plain_loss,
                    "within_loss": pk.within_loss,
                    "plain_later_loss": pk.plain_later_loss,
                    "within_later_loss": pk.within_later_loss,
                }
            )
            rows.append(row)
        return rows


METHOD_TEXT = (
    "passkey: greedy = the greedy continuation is exactly the key (from one teacher-forced forward); "
    "loglik = the key's log-prob beats each of {n} distractor keys; margin = log p(key) − max log p(distractor) "
    "in nats (without distractors: mean answer-token margin over the best other token)"
)
