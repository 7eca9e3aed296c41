"""Mean token loss by position: does the model use its context?

Token t + 1 of a held-out document is predicted from the t + 1 tokens before it; its loss goes to
the bucket holding position t + 1. A model that uses its context has loss falling with position up
to the length it was trained for, and rising (or flat) beyond it.

Packed windows (`packed_loss_by_position`): windows of the evaluated length stitched from several
held-out documents, each followed by EOD as in the training data, are scored twice: with attention
across documents (plain causal) and within documents (boundaries after each EOD). Both give a curve
by window position and the mean loss on the documents after the first of each window, the tokens
whose context the other documents can only disturb.

Buckets are log-spaced by default ([1, 16), [16, 32), [32, 64), … up to the length) so that short
and long contexts get equal room on a log axis; `fixed` gives equal-width buckets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
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
        length=length,
        docs=n,
        packed=packed,
        buckets=[tuple(b) for b in buckets],
        loss=loss,
        tokens=tokens,
        mean_loss=float(per_pos.mean()),
        long_loss=float(per_pos[half - 1 :].mean()),
    )


# -- packed windows --------------------------------------------------------------------------------


def packed_windows(
    documents: Iterable[np.ndarray], length: int, count: int, *, eod: int, seed: int
) -> list[np.ndarray]:
    """`count` windows of `length` tokens, each stitched from documents taken in order from `documents`.

    Each document is cut to a seeded random length in [length / 8, length / 2) (shorter ones stay
    whole) and followed by `eod`, so every window holds at least two documents and each starts at
    the beginning of one; the last is cut at the window's end (as a Megatron sample is)."""
    if length < 4:
        raise EvalError(f"length {length} is too short for packed windows")
    rng = np.random.default_rng([seed, length])
    lo = max(1, length // 8)
    hi = max(lo + 1, length // 2)
    source = iter(documents)
    windows: list[np.ndarray] = []
    for _ in range(count):
        parts: list[np.ndarray] = []
        have = 0
        while have < length:
            doc = next(source, None)
            if doc is None:
                raise EvalError("the held-out documents ran out while packing windows")
            body = doc[:-1] if len(doc) and doc[-1] == eod else doc
            body = body[body != eod][: int(rng.integers(lo, hi))]
            if not len(body):
                continue
            parts += [body, np.array([eod], dtype=np.int64)]
            have += len(body) + 1
        windows.append(np.concatenate(parts)[:length].astype(np.int64))
    return windows


def document_index(window: np.ndarray, eod: int) -> np.ndarray:
    """Per token, which document of the window it belongs to (0 = the first; an EOD closes its own)."""
    ends = (window == eod).astype(np.int64)
    return np.concatenate([[0], np.cumsum(ends)[:-1]])


class PackedLoss(BaseModel):
    """Loss by window position on packed windows, attention across documents (plain) vs within."""

    length: int
    windows: int
    documents: int  # documents in all the windows together
    buckets: list[tuple[int, int]]
    plain: list[float | None]  # mean loss per bucket, attention across documents
    within: list[float | None]  # mean loss per bucket, attention within documents
    tokens: list[int]
    plain_loss: float  # mean over every prediction of the windows
    within_loss: float
    later_tokens: int  # predictions of tokens of the 2nd, 3rd … document (each one's first token left out)
    plain_later_loss: float | None
    within_later_loss: float | None

    def centers(self) -> list[float]:
        return [float(np.sqrt(max(lo, 1) * hi)) for lo, hi in self.buckets]


def later_mask(window: np.ndarray, eod: int) -> np.ndarray:
    """Over the S − 1 predictions of `window`: True where the predicted token is in a document after
    the first and is not its first token (which no document's own context predicts)."""
    doc = document_index(window, eod)
    return (doc[1:] >= 1) & (doc[1:] == doc[:-1])


def packed_loss_by_position(
    plain: ScoreFn,
    within: ScoreFn,
    windows: Sequence[np.ndarray],
    *,
    eod: int,
    buckets: Sequence[tuple[int, int]] | None = None,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
) -> PackedLoss:
    """Score `windows` (of one length) with `plain` and with `within` (the same model attending within
    documents), per window position bucket and on the later documents."""
    if not windows:
        raise EvalError("no packed windows to measure loss by position on")
    length = len(windows[0])
    if any(len(w) != length for w in windows):
        raise EvalError("packed windows must share one length")
    buckets = list(buckets) if buckets is not None else position_buckets(length)
    losses: dict[str, list[np.ndarray]] = {"plain": [], "within": []}
    for k in range(0, len(windows), max(1, batch_size)):
        batch = torch.tensor(np.stack(windows[k : k + batch_size]), dtype=torch.long)
        for name, fn in (("plain", plain), ("within", within)):
            losses[name].append(-fn(batch).logprob)
            if advance is not None:
                advance(len(batch))
    per_tok = {name: np.concatenate(v) for name, v in losses.items()}  # [windows, S − 1]
    later = np.stack([later_mask(w, eod) for w in windows])
    n = len(windows)
    curves: dict[str, list[float | None]] = {}
    for name, tok in per_tok.items():
        per_pos = tok.mean(axis=0)
        curves[name] = [float(per_pos[lo - 1 : hi - 1].mean()) if hi > lo else None for lo, hi in buckets]
    n_later = int(later.sum())
    return PackedLoss(
        length=length,
        windows=n,
        documents=int(sum(document_index(w, eod)[-1] + 1 for w in windows)),
        buckets=[tuple(b) for b in buckets],
        plain=curves["plain"],
        within=curves["within"],
        tokens=[(hi - lo) * n for lo, hi in buckets],
        plain_loss=float(per_tok["plain"].mean()),
        within_loss=float(per_tok["within"].mean()),
        later_tokens=n_later,
        plain_later_loss=float(per_tok["plain"][later].mean()) if n_later else None,
        within_later_loss=float(per_tok["within"][later].mean()) if n_later else None,
    )
