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
from longctx.attention.documents import CuSeqlens, Documents, Layout, document_blocks, documents_for
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
) -> Tensor:
    """Same contract as `ring_attention` (zigzag-sharded `[batch, seq_local, heads, head_dim]`,
    `cu_seqlens` the document boundaries of the full sequence)."""
    cp = group_size(group)
    docs = None
    if cu_seqlens is not None:
        docs = documents_for(q, cu_seqlens, group, where="allgather_attention")
    check_qkv(q, k, v, cp_size=cp, causal=causal or docs is not None, where="allgather_attention")
    scale = default_scale(q.shape[-1], softmax_scale)
    blk = select_kernel(q.device, q.dtype, kernel)
    return _AllGatherAttention.apply(q, k, v, group, causal, scale, blk, docs)


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
    rank: int, world: int, local_len: int, causal: bool, docs: Documents
) -> list[tuple[slice, Block]]:
    """(batch rows, block) of the all-gather plan cut at documents; keys in sequence order."""
    if world == 1:
        plan = [Block(0, 0, 0, local_len, 0, local_len, causal)]
    else:
        plan = allgather_plan(rank, world, local_len, causal)
    mine, full = Layout.zigzag(rank, world, local_len), Layout.natural(local_len * world)
    return [
        (rows, sub)
        for block in plan
        for rows, bounds in docs.rows()
        for sub in document_blocks(block, mine, full, bounds)
    ]


def allgather_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    scale: float,
    blk: BlockKernel,
    docs: Documents | None = None,
) -> tuple[Tensor, Tensor]:
    world, rank = group_size(group), group_rank(group)
    if world == 1 and docs is None:
        out, lse = blk.forward(q, k, v, causal, scale)
        return out, lse.to(lse_dtype(q.dtype))
    acc = lse_dtype(q.dtype)
    # with documents the keys are always gathered in sequence order (the boundaries refer to it)
    kv = torch.stack([k, v]) if world == 1 else _gather_kv(k, v, group, causal or docs is not None)  # type: ignore[arg-type]
    b, s, h, d = q.shape
    out_acc = torch.zeros(b, s, h, d, dtype=acc, device=q.device)
    lse_acc = torch.full((b, h, s), float("-inf"), dtype=acc, device=q.device)
    if docs is None:
        plan = [(slice(None), block) for block in allgather_plan(rank, world, s, causal)]
    else:
        plan = _document_plan(rank, world, s, causal, docs)
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
) -> tuple[Tensor, Tensor, Tensor]:
    world, rank = group_size(group), group_rank(group)
    if world == 1 and docs is None:
        return blk.backward(dout, q, k, v, out, lse, causal, scale)
    acc = lse_dtype(q.dtype)
    ordered = causal or docs is not None
    kv = torch.stack([k, v]) if world == 1 else _gather_kv(k, v, group, ordered)  # type: ignore[arg-type]
    dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    if docs is None:
        plan = [(slice(None), block) for block in allgather_plan(rank, world, q.shape[1], causal)]
    else:
        plan = _document_plan(rank, world, q.shape[1], causal, docs)
    for rows, block in plan:
        qs, ks = block.q, block.k
        b_dq, b_dk, b_dv = blk.backward(
            dout[rows, qs], q[rows, qs], kv[0][rows, ks], kv[1][rows, ks], out[rows, qs], lse[rows, :, qs],
            block.causal, scale,
        )  # fmt: skip
        dq[rows, qs] += b_dq
        dkv[0][rows, ks] += b_dk
        dkv[1][rows, ks] += b_dv
    if world == 1:
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)
    mine = _scatter_dkv(dkv, group, ordered)  # type: ignore[arg-type]
    return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype)


_AllGatherAttention = attention_function("_AllGatherAttention", allgather_forward, allgather_backward)
