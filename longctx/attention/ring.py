"""Context-parallel ring attention over zigzag-sharded sequences.

Forward: K and V (kv heads only) travel once around the CP ring; the next
chunk's transfer is started before the current block is computed. Partial outputs merge through the
LSE in float32. Backward: K/V travel around again, together with float32 dK/dV accumulators that
follow their chunk and arrive back at its owner after the last step; each block recomputes its
probabilities from the saved final LSE (no S×S tensor is kept).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.autograd import attention_function
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
    comm = RingComm(group, tag=_KV_TAG)  # type: ignore[arg-type]
    cur_k, cur_v = k.contiguous(), v.contiguous()
    out_acc: Tensor | None = None
    lse_acc: Tensor | None = None
    for block in ring_plan(rank, world, q.shape[1], causal):
        last = block.step == world - 1
        if not last:  # next chunk in flight while this one is computed
            nxt_k, nxt_v = torch.empty_like(cur_k), torch.empty_like(cur_v)
            comm.start([cur_k, cur_v], [nxt_k, nxt_v])
        b_out, b_lse = blk.forward(q[:, block.q], cur_k[:, block.k], cur_v[:, block.k], block.causal, scale)
        if out_acc is None or lse_acc is None:  # step 0 always covers every local query
            out_acc = b_out.to(acc).contiguous()
            lse_acc = b_lse.to(acc).contiguous()
        else:
            merge_(out_acc[:, block.q], lse_acc[:, :, block.q], b_out, b_lse)
        del b_out, b_lse
        if not last:
            comm.wait()
            cur_k, cur_v = nxt_k, nxt_v
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
    """(dq, dk, dv) for this rank's chunks, given the saved final out and lse.

    Buffers are kept to what the overlap needs: the K/V chunk in use and the next one in flight, the
    dK/dV accumulator being sent and the one being received (float32), plus one block's gradients.
    """
    world, rank = group_size(group), group_rank(group)
    if world == 1:
        return blk.backward(dout, q, k, v, out, lse, causal, scale)
    acc = lse_dtype(q.dtype)
    kv_comm = RingComm(group, tag=_KV_TAG)  # type: ignore[arg-type]
    dkv_comm = RingComm(group, tag=_DKV_TAG)  # type: ignore[arg-type]
    cur_k, cur_v = k.contiguous(), v.contiguous()
    dq: Tensor | None = None
    recv_dk = recv_dv = None
    for block in ring_plan(rank, world, q.shape[1], causal):
        step, qs, ks = block.step, block.q, block.k
        last = step == world - 1
        if not last:
            nxt_k, nxt_v = torch.empty_like(cur_k), torch.empty_like(cur_v)
            kv_comm.start([cur_k, cur_v], [nxt_k, nxt_v])
        b_dq, b_dk, b_dv = blk.backward(
            dout[:, qs], q[:, qs], cur_k[:, ks], cur_v[:, ks], out[:, qs], lse[:, :, qs], block.causal, scale
        )
        if dq is None:  # step 0 covers every local query and key: its gradients start the sums
            dq = b_dq.to(acc).contiguous()
            send_dk, send_dv = b_dk.to(acc).contiguous(), b_dv.to(acc).contiguous()
        else:
            dq[:, qs] += b_dq
            dkv_comm.wait()  # this chunk's accumulator, from the previous rank; our last send is done
            assert recv_dk is not None and recv_dv is not None
            recv_dk[:, ks] += b_dk
            recv_dv[:, ks] += b_dv
            send_dk, send_dv = recv_dk, recv_dv
        del b_dq, b_dk, b_dv
        # pass the accumulator on; after the last step it lands at the chunk's owner
        recv_dk, recv_dv = torch.empty_like(send_dk), torch.empty_like(send_dv)
        dkv_comm.start([send_dk, send_dv], [recv_dk, recv_dv])
        if not last:
            kv_comm.wait()
            cur_k, cur_v = nxt_k, nxt_v
    dkv_comm.wait()
    assert dq is not None and recv_dk is not None and recv_dv is not None
    return dq.to(q.dtype), recv_dk.to(k.dtype), recv_dv.to(v.dtype)


_RingAttention = attention_function("_RingAttention", ring_forward, ring_backward)
