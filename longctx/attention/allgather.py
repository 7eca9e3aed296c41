"""Context-parallel attention by all-gathering K/V: gather once, local queries against the prefix.

Simpler than the ring and often faster at small CP (one collective instead of CP−1 exchanges), at the
cost of holding the full-length K/V (kv heads only) for the duration of one layer's forward and
again in backward: the gathered K/V are not saved between the two, they are gathered afresh. dK/dV
are accumulated over the full sequence in float32 and reduce-scattered back to their owners.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.autograd import attention_function
from longctx.attention.blocks import Block, allgather_plan
from longctx.attention.checks import check_qkv
from longctx.attention.comm import all_gather_dim0, group_rank, group_size, reduce_scatter_dim0
from longctx.attention.documents import (
    CuSeqlens,
    Documents,
    Layout,
    cut_block,
    documents_and_split,
    rank_layouts,
)
from longctx.attention.kernels import BlockKernel, default_scale, lse_dtype, select_kernel
from longctx.attention.merge import merge_
from longctx.attention.zigzag import zigzag_all_gather, zigzag_split


def allgather_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: dist.ProcessGroup | None,
    causal: bool = True,
    softmax_scale: float | None = None,
    kernel: str | None = None,
    cu_seqlens: CuSeqlens | None = None,
    split: str = "zigzag",
) -> Tensor:
    """Same contract as `ring_attention` (`[batch, seq_local, heads, head_dim]` shards of `split`,
    `cu_seqlens` the document boundaries of the full sequence)."""
    cp = group_size(group)
    where = "allgather_attention"
    docs = documents_and_split(q, cu_seqlens, split, group, where=where)
    check_qkv(q, k, v, cp_size=cp, causal=(causal or docs is not None) and split == "zigzag", where=where)
    scale = default_scale(q.shape[-1], softmax_scale)
    blk = select_kernel(q.device, q.dtype, kernel)
    return _AllGatherAttention.apply(q, k, v, group, causal, scale, blk, docs, split)


def _gather_kv(k: Tensor, v: Tensor, group: dist.ProcessGroup, causal: bool) -> Tensor:
    """`[2, b, S, hkv, d]`: natural sequence order when causal; rank order otherwise.

    Without a mask the key order does not matter, so shards of any length are simply concatenated.
    """
    kv = torch.stack([k, v])
    if causal:
        return zigzag_all_gather(kv, group, seq_dim=2)
    gathered = all_gather_dim0(kv, group)  # [world, 2, b, s, hkv, d]
    world, _, b, s = gathered.shape[:4]
    return gathered.movedim(0, 2).reshape(2, b, world * s, *gathered.shape[4:])


def _scatter_dkv(dkv: Tensor, group: dist.ProcessGroup, causal: bool) -> Tensor:
    """Sum the full-sequence dK/dV over ranks and hand each rank its own chunks (inverse layout)."""
    world = group_size(group)
    if causal:
        per_rank = torch.stack([zigzag_split(dkv, r, world, seq_dim=2) for r in range(world)])
    else:
        two, b, total = dkv.shape[:3]
        per_rank = dkv.view(two, b, world, total // world, *dkv.shape[3:]).movedim(2, 0)
    return reduce_scatter_dim0(per_rank, group)


def _document_plan(
    rank: int, world: int, local_len: int, causal: bool, docs: Documents, split: str
) -> tuple[list[tuple[slice, Block]], list[tuple[slice, Tensor]]]:
    """(batch rows, block) of local queries against the gathered keys in sequence order, cut at
    documents; and per sample group the global position of each gathered row (rank order)."""
    layouts = rank_layouts(docs, world, local_len, split, causal)
    full = Layout.natural(local_len * world)
    block = Block(0, -1, 0, local_len, 0, local_len * world, causal)
    plan: list[tuple[slice, Block]] = []
    order: list[tuple[slice, Tensor]] = []
    for (rows, bounds), lay in zip(docs.rows(), layouts, strict=True):
        plan += [(rows, sub) for sub in cut_block(block, lay[rank], full, bounds, causal)]
        order.append((rows, torch.cat([lay[r].positions() for r in range(world)])))
    return plan, order


def _gather_documents(
    k: Tensor, v: Tensor, group: dist.ProcessGroup | None, order: list[tuple[slice, Tensor]]
) -> Tensor:
    """`[2, b, S, hkv, d]` in sequence order, whatever each sample group's layout."""
    kv = torch.stack([k, v])
    if group_size(group) > 1:
        gathered = all_gather_dim0(kv, group)  # type: ignore[arg-type]
        world, _, b, s = gathered.shape[:4]
        kv = gathered.movedim(0, 2).reshape(2, b, world * s, *gathered.shape[4:])
    natural = torch.empty_like(kv)
    for rows, where in order:
        natural[:, rows] = kv[:, rows].index_select(2, torch.argsort(where).to(kv.device))
    return natural


def _scatter_documents(
    dkv: Tensor, group: dist.ProcessGroup | None, order: list[tuple[slice, Tensor]]
) -> Tensor:
    """Inverse of `_gather_documents` for the gradients: each rank's rows summed over the ranks."""
    ranked = torch.empty_like(dkv)
    for rows, where in order:
        ranked[:, rows] = dkv[:, rows].index_select(2, where.to(dkv.device))
    world = group_size(group)
    if world == 1:
        return ranked
    two, b, total = ranked.shape[:3]
    per_rank = ranked.view(two, b, world, total // world, *ranked.shape[3:]).movedim(2, 0)
    return reduce_scatter_dim0(per_rank.contiguous(), group)  # type: ignore[arg-type]


def allgather_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    scale: float,
    blk: BlockKernel,
    docs: Documents | None = None,
    split: str = "zigzag",
) -> tuple[Tensor, Tensor]:
    world, rank = group_size(group), group_rank(group)
    if world == 1 and docs is None:
        out, lse = blk.forward(q, k, v, causal, scale)
        return out, lse.to(lse_dtype(q.dtype))
    acc = lse_dtype(q.dtype)
    b, s, h, d = q.shape
    if docs is None:
        kv = _gather_kv(k, v, group, causal)  # type: ignore[arg-type]
        plan = [(slice(None), block) for block in allgather_plan(rank, world, s, causal)]
    else:  # keys in sequence order: the boundaries refer to it
        plan, order = _document_plan(rank, world, s, causal, docs, split)
        kv = _gather_documents(k, v, group, order)
    out_acc = torch.zeros(b, s, h, d, dtype=acc, device=q.device)
    lse_acc = torch.full((b, h, s), float("-inf"), dtype=acc, device=q.device)
    for rows, block in plan:
        b_out, b_lse = blk.forward(
            q[rows, block.q], kv[0][rows, block.k], kv[1][rows, block.k], block.causal, scale
        )
        merge_(out_acc[rows, block.q], lse_acc[rows, :, block.q], b_out, b_lse)
    return out_acc.to(q.dtype), lse_acc


def allgather_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    scale: float,
    blk: BlockKernel,
    docs: Documents | None = None,
    split: str = "zigzag",
) -> tuple[Tensor, Tensor, Tensor]:
    world, rank = group_size(group), group_rank(group)
    if world == 1 and docs is None:
        return blk.backward(dout, q, k, v, out, lse, causal, scale)
    acc = lse_dtype(q.dtype)
    if docs is None:
        kv = _gather_kv(k, v, group, causal)  # type: ignore[arg-type]
        plan = [(slice(None), block) for block in allgather_plan(rank, world, q.shape[1], causal)]
    else:
        plan, order = _document_plan(rank, world, q.shape[1], causal, docs, split)
        kv = _gather_documents(k, v, group, order)
    dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    for rows, block in plan:
        qs, ks = block.q, block.k
        b_dq, b_dk, b_dv = blk.backward(
            dout[rows, qs],
            q[rows, qs],
            kv[0][rows, ks],
            kv[1][rows, ks],
            out[rows, qs],
            lse[rows, :, qs],
            block.causal,
            scale,
        )
        dq[rows, qs] += b_dq
        dkv[0][rows, ks] += b_dk
        dkv[1][rows, ks] += b_dv
    mine = (
        _scatter_dkv(dkv, group, causal)  # type: ignore[arg-type]
        if docs is None
        else _scatter_documents(dkv, group, order)
    )
    return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype)


_AllGatherAttention = attention_function("_AllGatherAttention", allgather_forward, allgather_backward)
