"""Packed-document cases the CP worker pool runs (`fn(rank, world, group, **kwargs)`), and the float64
reference: attention on the full sequence under a block-diagonal (causal or full) mask."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from longctx.attention import allgather_attention, ring_attention, zigzag_split
from longctx.attention.documents import balanced_split
from longctx.errors import AttentionError
from tests.attention import cases

VARIANTS = {"ring": ring_attention, "allgather": allgather_attention}


def per_sample_bounds(cu_seqlens: list[int], batch: int, seq: int) -> list[list[int]]:
    """Each sample's boundaries: the same for all (ends at S) or cut out of the batch's (ends at b·S)."""
    if cu_seqlens[-1] == seq:
        return [list(cu_seqlens)] * batch
    return [[x - i * seq for x in cu_seqlens if i * seq <= x <= (i + 1) * seq] for i in range(batch)]


def document_mask(bounds: list[int], seq: int, causal: bool) -> torch.Tensor:
    """`[seq, seq]` True where query i may attend key j: same document (and j ≤ i when causal)."""
    doc = torch.zeros(seq, dtype=torch.long)
    for n, (a, b) in enumerate(itertools.pairwise(bounds)):
        doc[a:b] = n
    allowed = doc[:, None] == doc[None, :]
    if causal:
        allowed &= torch.ones(seq, seq, dtype=torch.bool).tril()
    return allowed


def reference_documents(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, cu_seqlens: list[int]
) -> torch.Tensor:
    """Textbook float64 attention `[b, s, h, d]` with the block-diagonal mask of each sample."""
    q, k, v = q.double(), k.double(), v.double()
    b, s = q.shape[:2]
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    masks = torch.stack([document_mask(x, s, causal) for x in per_sample_bounds(cu_seqlens, b, s)])
    scores = scores.masked_fill(~masks[:, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)


def documents_case(
    rank: int,
    world: int,
    group: Any,
    *,
    variants: list[str],
    causal: bool,
    shape: tuple[int, int, int, int, int],
    cu_seqlens: list[int],
    dtype: str = "float32",
    piece: int | None = None,
    seed: int = 0,
    split: str = "zigzag",
) -> dict[str, dict[str, torch.Tensor]]:
    """Forward + backward of each variant with document boundaries on this rank's shard of `split`."""
    b, s, hq, hkv, d = shape
    full = cases.make_inputs(seed, b, s, hq, hkv, d)
    dt = cases.DTYPES[dtype]
    if split == "zigzag":
        local = {name: zigzag_split(t, rank, world, seq_dim=1).to(dt) for name, t in full.items()}
    else:
        local = {n: balanced_split(t, cu_seqlens, rank, world, causal=causal).to(dt) for n, t in full.items()}
    results: dict[str, dict[str, torch.Tensor]] = {}
    for variant in variants:
        q, k, v = (local[n].clone().requires_grad_() for n in ("q", "k", "v"))
        extra = {"piece": piece} if variant == "ring" else {}
        cu = torch.tensor(cu_seqlens, dtype=torch.int32)
        out = VARIANTS[variant](q, k, v, group=group, causal=causal, cu_seqlens=cu, split=split, **extra)
        out.backward(local["dout"])
        results[variant] = {
            "out": out.detach().double(),
            "dq": q.grad.double(),  # type: ignore[union-attr]
            "dk": k.grad.double(),  # type: ignore[union-attr]
            "dv": v.grad.double(),  # type: ignore[union-attr]
        }
    return results


def bad_documents_case(rank: int, world: int, group: Any, *, variant: str, per_rank: list[list[int]]) -> str:
    """The message this rank gets for boundaries `per_rank[rank]` (which may differ between ranks)."""
    q = torch.randn(1, 8, 2, 4)
    try:
        VARIANTS[variant](q, q, q, group=group, causal=True, cu_seqlens=per_rank[rank])
    except AttentionError as err:
        return str(err)
    return "no error"
