"""Mean token loss by position: does the model use its context?

Token t + 1 of a held-out document is predicted from the t + 1 tokens before it; its loss goes to
the bucket holding position t + 1. A model that uses its context has loss falling with position up
to the length it was trained for, and rising (or flat) beyond it.

Buckets are log-spaced by default ([1, 16), [16, 32), [32, 64), … up to the length) so that short
and long contexts get equal room on a log axis; `fixed` gives equal-width buckets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel

from longctx.errors import EvalError
from longctx.eval.score import ScoreFn


def position_buckets(
    length: int, *, kind: Literal["log", "fixed"] = "log", first: int = 16, count: int = 16
) -> list[tuple[int, int]]:
    """Half-open [lo, hi) ranges over predicted positions 1 … length − 1."""
    if length < 2:
        raise EvalError(f"length {length} has no next-token predictions")
    if kind == "fixed":
        edges = sorted({1, *(round(1 + k * (length - 1) / count) for k in range(1, count)), length})
    elif kind == "log":
        edges = [1]
        edge = max(2, first)
        while edge < length:
            edges.append(edge)
            edge *= 2
        edges.append(length)
    else:
        raise EvalError(f"unknown bucket kind {kind!r}", fix="use log or fixed")
    return [(lo, hi) for lo, hi in itertools.pairwise(edges) if hi > lo]


class PositionLoss(BaseModel):
    length: int
    docs: int
    packed: bool  # sequences are held-out documents packed back to back, not single documents
    buckets: list[tuple[int, int]]
    loss: list[float | None]  # mean loss per bucket (nats/token)
    tokens: list[int]
    mean_loss: float
    long_loss: float  # mean loss at positions ≥ length / 2

    def centers(self) -> list[float]:
        return [float(np.sqrt(max(lo, 1) * hi)) for lo, hi in self.buckets]


def loss_by_position(
    score: ScoreFn,
    docs: Sequence[np.ndarray],
    *,
    buckets: Sequence[tuple[int, int]] | None = None,
    packed: bool = False,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
) -> PositionLoss:
    """Mean loss per position bucket over `docs` (all of the same length)."""
    if not docs:
        raise EvalError("no held-out documents to measure loss by position on")
    length = len(docs[0])
    if any(len(d) != length for d in docs):
        raise EvalError("documents for loss by position must share one length")
    buckets = list(buckets) if buckets is not None else position_buckets(length)
    total = np.zeros(length - 1)
    for k in range(0, len(docs), max(1, batch_size)):
        batch = torch.tensor(np.stack(docs[k : k + batch_size]), dtype=torch.long)
        out = score(batch)
        total += -out.logprob.sum(axis=0)
        if advance is not None:
            advance(len(batch))
    n = len(docs)
    per_pos = total / n  # index t: loss of predicting position t + 1
    loss: list[float | None] = []
    tokens: list[int] = []
    for lo, hi in buckets:
        seg = per_pos[lo - 1 : hi - 1]
        loss.append(float(seg.mean()) if len(seg) else None)
        tokens.append(len(seg) * n)
    half = max(1, length // 2)
    return PositionLoss(
        length=length, docs=n, packed=packed, buckets=[tuple(b) for b in buckets], loss=loss, tokens=tokens,
        mean_loss=float(per_pos.mean()), long_loss=float(per_pos[half - 1 :].mean()),
    )  # fmt: skip
