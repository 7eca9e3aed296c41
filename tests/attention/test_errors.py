"""Inputs the attention entry points refuse, each with a message naming the shapes."""

from __future__ import annotations

import pytest
import torch

from longctx.attention import allgather_attention, ring_attention
from longctx.errors import AttentionError

ENTRY_POINTS = [ring_attention, allgather_attention]


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_mismatched_head_dims(fn):
    q, k = torch.randn(1, 8, 4, 64), torch.randn(1, 8, 2, 32)
    with pytest.raises(AttentionError, match=r"head dims differ: q \[1, 8, 4, 64\], k \[1, 8, 2, 32\]"):
        fn(q, k, k, group=None)


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_kv_heads_not_dividing_query_heads(fn):
    q, k = torch.randn(1, 8, 6, 16), torch.randn(1, 8, 4, 16)
    with pytest.raises(AttentionError, match=r"KV heads \(4\) do not divide query heads \(6\)") as info:
        fn(q, k, k, group=None)
    assert "q [1, 8, 6, 16], k [1, 8, 4, 16]" in str(info.value)
    assert info.value.fix and "query groups" in info.value.fix


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_tensors_on_different_devices(fn):
    q = torch.randn(1, 8, 2, 16)
    k = torch.randn(1, 8, 2, 16, device="meta")
    with pytest.raises(AttentionError, match=r"different devices \(cpu, meta, cpu\)"):
        fn(q, k, q, group=None)


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_wrong_rank_and_mismatched_lengths(fn):
    with pytest.raises(AttentionError, match=r"must be 4-d .* got q \[8, 2, 16\]"):
        fn(torch.randn(8, 2, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16), group=None)
    q, k = torch.randn(1, 8, 2, 16), torch.randn(1, 6, 2, 16)
    with pytest.raises(
        AttentionError, match=r"sequence lengths differ: q \[1, 8, 2, 16\], k \[1, 6, 2, 16\]"
    ):
        fn(q, k, k, group=None)


def test_single_process_is_plain_attention_and_odd_lengths_are_fine():
    from tests.fixtures.attention import reference_attention

    q, k, v = (torch.randn(2, 9, 4, 16, dtype=torch.float64) for _ in range(3))
    for fn in ENTRY_POINTS:
        torch.testing.assert_close(fn(q, k, v, group=None), reference_attention(q, k, v, True))
