"""Context-parallel ring attention over zigzag-sharded sequences.

Forward: K and V (kv heads only, stacked into one buffer) travel once around the CP ring; the next
chunk's transfer is started before the current block is computed. Partial outputs merge through the
LSE in float32. Backward: K/V travel around again, together with float32 dK/dV accumulators that
follow their chunk and arrive back at its owner after the last step; each block recomputes its
probabilities from the saved final LSE (no S×S tensor is kept).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.blocks import ring_plan
from longctx.attention.checks import check_qkv
from longctx.attention.comm import RingComm, group_rank, group_size
from longctx.attention.kernels import BlockKernel, default_scale, lse_dtype, select_kernel
from longctx.attention.merge import merge_

_KV_TAG = 0
_DKV_TAG = 1


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: dist.ProcessGroup | None,
    causal: bool = True,
    softmax_scale: float | None = None,
    kernel: str | None = None,
) -> Tensor:
    """Attention of this rank's zigzag chunks against the whole sequence held by `group`.

    q `[batch, seq_local, heads, head_dim]`, k/v `[batch, seq_local, kv_heads, head_dim]` where
    seq_local = S / CP holds chunks r and 2·CP−1−r of the sequence (see `zigzag_split`); returns
    `[batch, seq_local, heads, head_dim]` in q's dtype. `group=None` (or a group of one) is plain
    attention. Non-causal attention uses the same ring without masks. `kernel` forces a block
    kernel (see `kernels.select_kernel`).
    """
    cp = group_size(group)
    check_qkv(q, k, v, cp_size=cp, causal=causal, where="ring_attention")
    scale = default_scale(q.shape[-1], softmax_scale)
    blk = select_kernel(q.device, q.dtype, kernel)
    return _RingAttention.apply(q, k, v, group, causal, scale, blk)


def ring_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    scale: float,
    blk: BlockKernel,
) -> tuple[Tensor, Tensor]:
    """(out in q's dtype, lse float32 `[b, h, s]`) of ring attention; no autograd."""
    world, rank = group_size(group), group_rank(group)
    if world == 1:
        out, lse = blk.forward(q, k, v, causal, scale)
        return out, lse.to(lse_dtype(q.dtype))
    acc = lse_dtype(q.dtype)
    plan = ring_plan(rank, world, q.shape[1], causal)
    bufs = [torch.stack([k, v]), None]
    bufs[1] = torch.empty_like(bufs[0])
    comm = RingComm(group, tag=_KV_TAG)  # type: ignore[arg-type]
    out_acc: Tensor | None = None
    lse_acc: Tensor | None = None
    for block in plan:
        kv = bufs[block.step % 2]
        last = block.step == world - 1
        if not last:
            comm.start(kv, bufs[(block.step + 1) % 2])
        b_out, b_lse = blk.forward(q[:, block.q], kv[0][:, block.k], kv[1][:, block.k], block.causal, scale)
        if out_acc is None or lse_acc is None:  # step 0 always covers every local query
            out_acc = b_out.to(acc).contiguous()
            lse_acc = b_lse.to(acc).contiguous()
        else:
            merge_(out_acc[:, block.q], lse_acc[:, :, block.q], b_out, b_lse)
        if not last:
            comm.wait()
    assert out_acc is not None and lse_acc is not None
    return out_acc.to(q.dtype), lse_acc


def ring_backward(
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
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) for this rank's chunks, given the saved final out and lse."""
    world, rank = group_size(group), group_rank(group)
    if world == 1:
        return blk.backward(dout, q, k, v, out, lse, causal, scale)
    acc = lse_dtype(q.dtype)
    plan = ring_plan(rank, world, q.shape[1], causal)
    kv_bufs = [torch.stack([k, v]), None]
    kv_bufs[1] = torch.empty_like(kv_bufs[0])
    shape = (2, *k.shape)
    dkv_bufs = [
        torch.zeros(shape, dtype=acc, device=k.device),
        torch.empty(shape, dtype=acc, device=k.device),
    ]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv_comm = RingComm(group, tag=_KV_TAG)  # type: ignore[arg-type]
    dkv_comm = RingComm(group, tag=_DKV_TAG)  # type: ignore[arg-type]
    for block in plan:
        step = block.step
        kv = kv_bufs[step % 2]
        last = step == world - 1
        if not last:
            kv_comm.start(kv, kv_bufs[(step + 1) % 2])
        qs, ks = block.q, block.k
        b_dq, b_dk, b_dv = blk.backward(
            dout[:, qs], q[:, qs], kv[0][:, ks], kv[1][:, ks], out[:, qs], lse[:, :, qs], block.causal, scale
        )
        if step > 0:
            dkv_comm.wait()  # the accumulator of this K/V chunk, from the previous rank
        dkv = dkv_bufs[step % 2]
        dq[:, qs] += b_dq
        dkv[0][:, ks] += b_dk
        dkv[1][:, ks] += b_dv
        # pass it on; after the last step it lands at the chunk's owner
        dkv_comm.start(dkv, dkv_bufs[(step + 1) % 2])
        if not last:
            kv_comm.wait()
    dkv_comm.wait()
    home = dkv_bufs[world % 2]
    return dq.to(q.dtype), home[0].to(k.dtype), home[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        group: dist.ProcessGroup | None,
        causal: bool,
        scale: float,
        blk: BlockKernel,
    ) -> Tensor:
        out, lse = ring_forward(q, k, v, group, causal, scale, blk)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.scale, ctx.blk = group, causal, scale, blk  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, dout: Tensor):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        group, causal, scale, blk = ctx.group, ctx.causal, ctx.scale, ctx.blk  # type: ignore[attr-defined]
        dq, dk, dv = ring_backward(dout, q, k, v, out, lse, group, causal, scale, blk)
        return dq, dk, dv, None, None, None, None
