"""Greedy generation rerunning only the answer positions against recorded keys and values: the same
answers, token for token, as rerunning whole sequences, from one full forward per batch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from longctx.attention.prefix_cache import PrefixCache
from longctx.eval.grid import PasskeyGrid
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.needles import TaskGrid
from longctx.eval.prefix_extend import prefix_extender
from longctx.eval.score import TokenScores, model_scorer
from longctx.eval.task_score import greedy_answers
from longctx.mcore.parallel import eval_parallel
from longctx.plan.eval_tasks import parse_task
from longctx.tokenizer import load_tokenizer
from tests.fixtures.eval import S2_LEN, EvalRun


def test_a_suffix_attends_as_it_does_in_the_whole_sequence() -> None:
    """Grouped queries (4 heads on 2 key/value heads), the suffix of 5 of 12 positions in 2 of 3 rows."""
    g = torch.Generator().manual_seed(0)
    s, b, heads, groups, d, start = 12, 3, 4, 2, 8, 7
    q = torch.randn(s, b, heads, d, generator=g)
    k, v = (torch.randn(s, b, groups, d, generator=g) for _ in range(2))
    full = F.scaled_dot_product_attention(
        q.permute(1, 2, 0, 3),
        k.permute(1, 2, 0, 3).repeat_interleave(2, dim=1),
        v.permute(1, 2, 0, 3).repeat_interleave(2, dim=1),
        is_causal=True,
    ).permute(2, 0, 1, 3)  # [s, b, heads, d]
    cache = PrefixCache()
    cache.record(1, k, v)
    cache.start, cache.rows = start, [2, 0]
    rows = torch.tensor([2, 0])
    got = cache.extend(1, q[start:, rows], k[start:, rows], v[start:, rows], 1 / math.sqrt(d))
    want = full[start:, rows].reshape(s - start, 2, heads * d)
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_answers_with_the_prefix_cache_are_those_without(eval_run: EvalRun, batch_size: int) -> None:
    """The stage checkpoint (3 iterations: a poor model) misses nearly everything, so its answers take
    several rounds; with the cache each batch costs one full forward."""
    tok = load_tokenizer(eval_run.tokenizer)
    tasks = TaskGrid(PasskeyGrid(tok, seed=5))
    items = [
        tasks.item(parse_task(name), S2_LEN, depth, index)
        for name in ("multikey-2", "multivalue-2", "absent-2")
        for depth in (0.0, 0.5, 1.0)
        for index in range(2)
    ]
    with eval_parallel(1) as par:
        loaded = load_model(checkpoint_info(eval_run.stage("s2")), par, max_length=S2_LEN)
        score = model_scorer(loaded)
        calls: list[int] = []

        def counted(tokens: torch.Tensor) -> TokenScores:
            calls.append(tokens.shape[0])
            return score(tokens)

        plain = greedy_answers(items, counted, batch_size=batch_size)
        full_forwards = len(calls)
        calls.clear()
        extend = prefix_extender(loaded)
        assert extend is not None
        cached = greedy_answers(items, counted, batch_size=batch_size, extend=extend)
    assert cached == plain
    chunks = math.ceil(len(items) / batch_size)
    assert len(calls) == chunks < full_forwards  # the later rounds ran on the suffixes alone
    assert sum(a != list(it.reference) for a, it in zip(plain, items, strict=True)) > len(items) // 2


def test_no_extender_where_suffixes_cannot_run_alone(eval_run: EvalRun) -> None:
    """A cache too small for one batch falls back to whole sequences, with the same answers."""
    tok = load_tokenizer(eval_run.tokenizer)
    items = [TaskGrid(PasskeyGrid(tok)).item(parse_task("multikey-2"), S2_LEN, 0.5, i) for i in range(2)]
    with eval_parallel(1) as par:
        loaded = load_model(checkpoint_info(eval_run.stage("s2")), par, max_length=S2_LEN)
        tiny = prefix_extender(loaded, max_bytes=1)
        assert tiny is not None and not tiny.fits(1, S2_LEN)
        score = model_scorer(loaded)
        assert greedy_answers(items, score, extend=tiny) == greedy_answers(items, score)
