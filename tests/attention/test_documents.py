"""Ring and all-gather attention within packed documents (`cu_seqlens`), CP 1–4 on gloo, against a
float64 reference with the block-diagonal mask; the boundaries they refuse; the work they skip."""

from __future__ import annotations

import itertools

import pytest
import torch

from longctx.attention import allgather_attention, ring_attention, zigzag_gather
from longctx.attention.blocks import plan_pairs, ring_plan
from longctx.attention.documents import balanced_gather, ring_document_pairs
from longctx.errors import AttentionError
from tests.attention import document_cases
from tests.attention.cases import make_inputs

F32_REL = 1e-5  # as the dense tests: max abs error relative to the reference's scale
NAMES = ("out", "dq", "dk", "dv")


def _reference(shape, causal, cu_seqlens):
    b, s, hq, hkv, d = shape
    full = make_inputs(0, b, s, hq, hkv, d)
    q, k, v = (full[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out = document_cases.reference_documents(q, k, v, causal, cu_seqlens)
    out.backward(full["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _rel_err(got, ref):
    return ((got - ref).abs().max() / ref.abs().max()).item()


# (world, causal, (batch, seq, q heads, kv heads, head dim), cu_seqlens, ring piece); chunks of
# c = S / (2·CP) tokens
CASES = [
    # odd lengths, documents shorter than a chunk (c = 5), one of a single token
    pytest.param(2, True, (2, 20, 4, 2, 16), [0, 3, 8, 9, 17, 20], None, id="cp2-causal-odd-short"),
    # bidirectional within documents, a boundary inside every chunk pair (c = 5)
    pytest.param(3, False, (1, 30, 4, 1, 16), [0, 7, 8, 19, 30], None, id="cp3-full-mqa"),
    # one document spanning every rank, short ones at both ends; streamed in 2-key pieces
    pytest.param(4, True, (1, 40, 4, 2, 16), [0, 2, 37, 40], 2, id="cp4-causal-spanning-p2"),
    # per-sample boundaries over the batch (sample 1: [0, 7, 24]), bidirectional
    pytest.param(4, False, (2, 24, 4, 2, 16), [0, 5, 24, 31, 48], None, id="cp4-full-per-sample"),
    # single-token documents everywhere but one
    pytest.param(
        3, True, (1, 18, 4, 4, 16), [0, 1, 2, 3, 4, 5, 6, 14, 15, 16, 17, 18], 1, id="cp3-causal-tokens"
    ),
    pytest.param(1, True, (2, 15, 4, 2, 16), [0, 4, 11, 15], None, id="cp1-causal-oddlen"),
]


@pytest.mark.parametrize("split", ["zigzag", "balanced"])
@pytest.mark.parametrize(("world", "causal", "shape", "cu", "piece"), CASES)
def test_documents_match_block_diagonal_reference(cp_pool, world, causal, shape, cu, piece, split):
    per_rank = cp_pool.run(
        document_cases.documents_case,
        world,
        variants=["ring", "allgather"],
        causal=causal,
        shape=shape,
        cu_seqlens=cu,
        piece=piece,
        split=split,
    )
    ref = _reference(shape, causal, cu)
    for variant in ("ring", "allgather"):
        if split == "zigzag":
            got = {n: zigzag_gather([r[variant][n] for r in per_rank], seq_dim=1) for n in NAMES}
        else:
            got = {n: balanced_gather([r[variant][n] for r in per_rank], cu, causal=causal) for n in NAMES}
        for name in NAMES:
            assert _rel_err(got[name], ref[name]) <= F32_REL, f"{variant} {name}"


def test_one_document_is_plain_attention():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 9, 4, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    for fn in (ring_attention, allgather_attention):
        for causal in (True, False):
            torch.testing.assert_close(
                fn(q, k, v, group=None, causal=causal, cu_seqlens=[0, 9]),
                fn(q, k, v, group=None, causal=causal),
            )


@pytest.mark.parametrize(
    ("cu", "message"),
    [
        ([0, 5, 3, 8], r"not increasing: entry 2 is 3 after 5"),
        ([0, 4, 7], r"ends at 7, not at the sequence length 8"),
        ([0, 4, 9], r"ends at 9, not at the sequence length 8"),
        ([2, 8], r"does not start at 0"),
        ([8], r"holds no document"),
        ([], r"holds no document"),
        (torch.tensor([0.0, 8.0]), r"1-d integer tensor"),
    ],
)
def test_bad_boundaries_are_refused(cu, message):
    q = torch.randn(1, 8, 2, 4)
    for fn in (ring_attention, allgather_attention):
        with pytest.raises(AttentionError, match=message):
            fn(q, q, q, group=None, cu_seqlens=cu)


def test_batch_boundaries_must_hold_every_sample_edge():
    q = torch.randn(2, 8, 2, 4)
    with pytest.raises(AttentionError, match=r"lacks the sample boundary 8"):
        ring_attention(q, q, q, group=None, cu_seqlens=[0, 5, 12, 16])


@pytest.mark.parametrize("variant", ["ring", "allgather"])
def test_boundaries_differing_between_ranks_are_refused_on_every_rank(cp_pool, variant):
    messages = cp_pool.run(
        document_cases.bad_documents_case, 2, variant=variant, per_rank=[[0, 4, 16], [0, 5, 16]]
    )
    for msg in messages:
        assert "document boundaries differ between CP ranks: rank 0 and rank(s) [1]" in msg
    # local boundaries (the shard's 8 tokens, not the full 16) are caught before any exchange
    messages = cp_pool.run(document_cases.bad_documents_case, 2, variant=variant, per_rank=[[0, 8]] * 2)
    assert all("ends at 8, not at the sequence length 16" in m for m in messages)


def _mask_pairs(bounds, causal):
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_computes_exactly_the_visible_pairs(world, causal):
    """The blocks executed cover each visible query-key pair once and nothing else: their pair
    count over the ranks equals the block-diagonal mask's."""
    s = 2 * world * 7
    for bounds in ([0, s], [0, 1, 9, 10, s - 3, s], list(range(0, s + 1, 3)) + ([s] if s % 3 else [])):
        got = sum(ring_document_pairs(r, world, s // world, causal, tuple(bounds))[0] for r in range(world))
        assert got == _mask_pairs(bounds, causal), bounds
    # one document: exactly the dense plan's work
    dense = sum(plan_pairs(ring_plan(r, world, s // world, causal)) for r in range(world))
    assert sum(ring_document_pairs(r, world, s // world, causal, (0, s))[0] for r in range(world)) == dense
