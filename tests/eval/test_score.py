"""Scoring logic against oracles whose answers are known.

The oracles are ScoreFns written in numpy, not neural networks: an in-context copier predicts the
token that followed the most recent earlier occurrence of the last `N` tokens, optionally only when
that occurrence lies within `window` tokens. A copier retrieves any pass key; a windowed one
retrieves exactly the keys whose needle is within its window of the question. That proves the grid,
label alignment and both scoring methods measure retrieval at the right depth; what a megatron
model scores through the same code is tested in test_model.py.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from longctx.eval.grid import PasskeyGrid
from longctx.eval.loss_position import loss_by_position, position_buckets
from longctx.eval.score import TokenScores, score_passkey, scores_from_logits
from longctx.eval.short_context import short_context_loss

VOCAB = 512
HIT = math.log(0.9)
MISS = math.log(0.1 / (VOCAB - 1))
UNIFORM = -math.log(VOCAB)


def copy_oracle(context: int = 6, window: int | None = None):
    """ScoreFn: after tokens x[t-N+1..t], predict what followed their last earlier occurrence."""

    def score(tokens: torch.Tensor) -> TokenScores:
        b, s = tokens.shape
        lp = np.zeros((b, s - 1))
        am = np.zeros((b, s - 1), dtype=np.int64)
        mg = np.zeros((b, s - 1))
        for row in range(b):
            x = tokens[row].tolist()
            last: dict[tuple[int, ...], int] = {}
            for t in range(s - 1):
                ctx = tuple(x[max(0, t - context + 1) : t + 1])
                prev = last.get(ctx)
                if prev is not None and (window is None or t - prev <= window):
                    guess = x[prev + 1]
                    am[row, t] = guess
                    hit = guess == x[t + 1]
                    lp[row, t] = HIT if hit else MISS
                    mg[row, t] = HIT - MISS if hit else MISS - HIT
                else:  # no usable occurrence: uniform (ties everywhere)
                    am[row, t] = 0
                    lp[row, t] = UNIFORM
                    mg[row, t] = 0.0
                if len(ctx) == context:
                    last[ctx] = t
        return TokenScores(logprob=lp, argmax=am, margin=mg)

    return score


def test_scores_from_logits() -> None:
    logits = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 5.0]]])
    labels = torch.tensor([[0, 2, 1]])
    lp, am, mg = scores_from_logits(logits, labels)
    ref = logits.log_softmax(-1)
    assert torch.allclose(lp, ref.gather(-1, labels.unsqueeze(-1)).squeeze(-1))
    assert am.tolist() == [[0, 1, 2]]
    # right answer: margin over the runner-up (> 0); wrong: the gap to the argmax (< 0)
    assert mg[0, 0] == pytest.approx(ref[0, 0, 0] - ref[0, 0, 1])
    assert mg[0, 1] == pytest.approx(ref[0, 1, 2] - ref[0, 1, 1])
    assert mg[0, 2] == pytest.approx(ref[0, 2, 1] - ref[0, 2, 2])


def test_copier_retrieves_every_key_at_every_depth(demo_tokenizer: Any) -> None:
    items = PasskeyGrid(demo_tokenizer, distractors=3).grid([300, 1200], [0.0, 0.3, 0.7, 1.0], keys=2)
    scores = score_passkey(items, copy_oracle())
    assert all(s.greedy for s in scores)
    assert all(s.loglik for s in scores)
    assert all(s.digit_accuracy == 1.0 for s in scores)
    assert all(s.token_margin == pytest.approx(HIT - MISS) for s in scores)
    # key log-prob = answer tokens × log 0.9; a distractor misses at least one token
    for it, s in zip(items, scores, strict=True):
        assert s.logprob == pytest.approx(len(it.answer) * HIT)
        assert s.loglik_margin is not None and s.loglik_margin >= HIT - MISS - 1e-9
        assert demo_tokenizer.decode(s.greedy_tokens).strip() == it.key


def test_windowed_copier_fails_exactly_beyond_its_window(demo_tokenizer: Any) -> None:
    window = 400
    items = PasskeyGrid(demo_tokenizer, distractors=2).grid([1024], [0.0, 0.25, 0.5, 0.75, 1.0], keys=2)
    scores = score_passkey(items, copy_oracle(window=window), batch_size=3)
    distances = [it.question_start - it.needle_start for it in items]
    assert min(distances) <= window < max(distances)  # the grid straddles the window
    for it, s, d in zip(items, scores, distances, strict=True):
        within = d <= window
        assert s.greedy is within, (it.depth, d)
        assert s.loglik is within  # beyond the window every candidate ties: a tie is not a win
        assert (s.loglik_margin > 0) is within  # type: ignore[operator]
        assert s.needle_start == it.needle_start


def test_batching_does_not_change_scores(demo_tokenizer: Any) -> None:
    items = PasskeyGrid(demo_tokenizer, distractors=3).grid([256], [0.2, 0.8], keys=2)
    a = score_passkey(items, copy_oracle(window=120), batch_size=1)
    b = score_passkey(items, copy_oracle(window=120), batch_size=5)
    assert [x.model_dump() for x in a] == [x.model_dump() for x in b]


def test_no_distractors_gives_greedy_only(demo_tokenizer: Any) -> None:
    items = PasskeyGrid(demo_tokenizer, distractors=0).grid([256], [0.5], keys=2)
    for s in score_passkey(items, copy_oracle()):
        assert s.greedy and s.loglik is None and s.loglik_margin is None


def position_oracle(length: int):
    """ScoreFn whose loss at predicted position p is 1 / p (the model 'uses its context')."""

    def score(tokens: torch.Tensor) -> TokenScores:
        b, s = tokens.shape
        p = np.arange(1, s, dtype=np.float64)
        lp = np.tile(-1.0 / p, (b, 1))
        return TokenScores(
            logprob=lp, argmax=np.zeros((b, s - 1), dtype=np.int64), margin=np.zeros((b, s - 1))
        )

    return score


def test_loss_by_position_buckets_and_means() -> None:
    length = 1024
    docs = [np.arange(length) % 50 for _ in range(3)]
    buckets = position_buckets(length, first=16)
    assert buckets[0] == (1, 16) and buckets[-1][1] == length
    assert all(a[1] == b[0] for a, b in itertools.pairwise(buckets))  # contiguous
    res = loss_by_position(position_oracle(length), docs, buckets=buckets, batch_size=2)
    for (lo, hi), loss, n in zip(res.buckets, res.loss, res.tokens, strict=True):
        assert loss == pytest.approx(np.mean(1.0 / np.arange(lo, hi)))
        assert n == 3 * (hi - lo)
    assert res.loss == sorted(res.loss, reverse=True)  # falls with position
    assert res.long_loss == pytest.approx(np.mean(1.0 / np.arange(length // 2, length)))
    fixed = position_buckets(length, kind="fixed", count=8)
    assert len(fixed) == 8 and fixed[0][0] == 1 and fixed[-1][1] == length


def test_short_context_loss_is_token_weighted() -> None:
    docs = [np.arange(n) for n in (40, 40, 64)]
    res = short_context_loss(position_oracle(64), docs, length=64, batch_size=2)
    expected = (2 * np.sum(1.0 / np.arange(1, 40)) + np.sum(1.0 / np.arange(1, 64))) / (2 * 39 + 63)
    assert res.loss == pytest.approx(expected)
    assert res.tokens == 2 * 39 + 63 and res.docs == 3
    # under CP = 2 documents are cut to multiples of 4 tokens
    assert short_context_loss(position_oracle(64), [np.arange(42)], length=64, cp=2).tokens == 39
