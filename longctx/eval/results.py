"""Evaluation results (pydantic: the JSON written to disk is `model_dump`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from longctx.eval.loss_position import PackedLoss, PositionLoss
from longctx.eval.score import ItemScore
from longctx.eval.settings import EvalSettings
from longctx.eval.short_context import ShortLoss


class PasskeyCell(BaseModel):
    depth: float
    needle_starts: list[int]
    keys: int
    greedy_accuracy: float
    loglik_accuracy: float | None
    loglik_margin: float | None  # mean over keys, nats
    token_margin: float
    digit_accuracy: float


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

    @classmethod
    def from_items(
        cls, length: int, distractors: int, scores: Sequence[ItemScore], natural: float
    ) -> PasskeyResult:
        cells = []
        for depth in sorted({s.depth for s in scores}):
            group = [s for s in scores if s.depth == depth]
            cells.append(_cell(depth, group))
        return cls(
            length=length, distractors=distractors, cells=cells, items=list(scores),
            greedy_accuracy=_mean([float(s.greedy) for s in scores]),
            loglik_accuracy=_mean_opt([None if s.loglik is None else float(s.loglik) for s in scores]),
            loglik_margin=_mean_opt([s.loglik_margin for s in scores]),
            token_margin=_mean([s.token_margin for s in scores]), natural=natural,
        )  # fmt: skip


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else float("nan")


def _mean_opt(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(statistics.fmean(vals)) if vals else None


def _cell(depth: float, group: Sequence[ItemScore]) -> PasskeyCell:
    return PasskeyCell(
        depth=depth, needle_starts=[s.needle_start for s in group], keys=len(group),
        greedy_accuracy=_mean([float(s.greedy) for s in group]),
        loglik_accuracy=_mean_opt([None if s.loglik is None else float(s.loglik) for s in group]),
        loglik_margin=_mean_opt([s.loglik_margin for s in group]),
        token_margin=_mean([s.token_margin for s in group]),
        digit_accuracy=_mean([s.digit_accuracy for s in group]),
    )  # fmt: skip


class LengthResult(BaseModel):
    length: int
    extrapolated: bool  # longer than the checkpoint's trained window
    passkey: PasskeyResult
    position: PositionLoss
    seconds: float
    packed: PackedLoss | None = None  # windows packed from several documents, across vs within


class CheckpointEval(BaseModel):
    label: str
    checkpoint: dict[str, Any]  # CheckpointInfo.to_json()
    trained_length: int | None
    rotary_base: int
    results: list[LengthResult] = Field(default_factory=list)
    short: ShortLoss | None = None
    short_delta_vs_base: float | None = None  # short loss − the base model's on the same documents
    seconds: float = 0.0
    cached: list[str] = Field(default_factory=list)  # which parts came from the result cache

    def at(self, length: int) -> LengthResult | None:
        return next((r for r in self.results if r.length == length), None)

    def packed_result(self) -> PackedLoss | None:
        """The packed-window measurement at the longest length that has one."""
        return next((r.packed for r in sorted(self.results, key=lambda r: -r.length) if r.packed), None)


class EvalReport(BaseModel):
    plan: str | None
    stage: str | None
    settings: EvalSettings
    method: str
    lengths: list[int]
    checkpoints: list[CheckpointEval]
    heldout: dict[str, Any]
    out_dir: str | None = None
    plots: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    seconds: float = 0.0

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
                row[str(n)] = None if r is None else {
                    "passkey": r.passkey.accuracy, "greedy": r.passkey.greedy_accuracy,
                    "margin": r.passkey.loglik_margin if r.passkey.loglik_margin is not None else r.passkey.token_margin,
                    "long_loss": r.position.long_loss, "extrapolated": r.extrapolated,
                }  # fmt: skip
            row["short_loss"] = ce.short.loss if ce.short else None
            row["short_delta_vs_base"] = ce.short_delta_vs_base
            pk = ce.packed_result()
            row["packed"] = None if pk is None else {
                "length": pk.length, "plain_loss": pk.plain_loss, "within_loss": pk.within_loss,
                "plain_later_loss": pk.plain_later_loss, "within_later_loss": pk.within_later_loss,
            }  # fmt: skip
            rows.append(row)
        return rows


METHOD_TEXT = (
    "passkey: greedy = the greedy continuation is exactly the key (from one teacher-forced forward); "
    "loglik = the key's log-prob beats each of {n} distractor keys; margin = log p(key) − max log p(distractor) "
    "in nats (without distractors: mean answer-token margin over the best other token)"
)
