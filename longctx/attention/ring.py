"""Context-parallel ring attention over zigzag-sharded sequences, with K/V streamed in pieces.

Step t of CP−1 pairs every rank r with the rank t before it (src, whose K/V chunk r attends to) and
the rank t after it (dst, which attends to r's chunk). Nothing is forwarded around the ring: each
owner sends its own K/V rows straight to the rank that needs them, in pieces of at most `piece`
keys, one piece ahead of the compute (double buffering), and only the rows the zigzag block needs
(the first half of a chunk when the other half is masked). Every step is cut into the same number
of equal-work slots on every rank (see `blocks.ring_schedule`), so sender and receiver agree on
when each piece travels and the ranks advance in step.

Forward: the own-chunk block first (while the first piece is in flight), then each piece's block,
merged into float32 out/LSE accumulators through the LSE; pieces are `FORWARD_PIECES` times larger
here, since forward holds no gradients. Backward: the own-chunk block starts float32 dQ/dK/dV; each
slot's block runs in tiles of about `ring_query_tile` queries, each kernel call adding its dQ tile
here and its dK/dV to the slot's float32 sum, which is posted to the owner of those rows at the end
of the slot. It travels while the next slot's first call runs, and so do the sums arriving for this
rank's own rows; only then are they added and the next K/V piece posted. That slack absorbs the
jitter between ranks: waiting for each other at every slot's end cost up to 10 % at 8K on CPU.
Probabilities are recomputed from the saved final LSE.

Memory beyond a rank's own tensors (q, k, v, out, dout, dq, dk, dv) is a few pieces: in backward,
during a slot's first call, the K/V piece in use, the previous slot's sums (ours and the arriving
ones) and the call's dK/dV; during later calls, the piece in use and the next one in flight, the
slot's sum and one call's dK/dV — 8 pieces of K/V rows either way — and one query tile's dQ.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.autograd import attention_function
from longctx.attention.blocks import Block, Slot, query_tiles, ranged_ring_schedule, ring_schedule
from longctx.attention.checks import check_qkv
from longctx.attention.comm import PeerExchange, Pending, group_rank, group_size
from longctx.attention.documents import CuSeqlens, Documents, cut_block, documents_and_split, rank_layouts
from longctx.attention.kernels import BlockKernel, default_scale, lse_dtype, select_kernel
from longctx.attention.merge import merge_
from longctx.errors import AttentionError

PIECE_ENV = "LONGCTX_RING_PIECE"
_KV_TAG = 0
_DKV_TAG = 1
# the CPU flash kernel switches to 64-query blocks below 768 queries, which costs ~12 % in backward
_MIN_QUERY_TILE = 768
# forward pieces are this many backward pieces (see ring_forward)
FORWARD_PIECES = 4


def ring_piece(local_len: int, piece: int | None = None, *, device: torch.device | None = None) -> int:
    """Keys per K/V message of the ring's backward: `piece`, else $LONGCTX_RING_PIECE, else the rule.

    Rule: local_len / 16 rounded up to a multiple of 64, and at least 256 on CPU, 1024 on CUDA.
    Backward holds 8 pieces of K/V rows and one query tile (3 pieces of query rows; 4 at 8K, where
    3 would mean calls under 768 queries) beyond the 8 chunk-sized tensors a rank holds anyway (q, k,
    v, out, dout, dq, dk, dv): with L/16 that extra is ~9 % of them (less with GQA) whatever the CP
    size, and every step has the same 16 slots, so the number of messages is fixed and their cost
    relative to compute falls as L grows. The floor keeps kernel calls and messages large: every call
    allocates and fills its own outputs, which below 256 keys costs >10 % on CPU, and CUDA kernels need
    long blocks to fill the device.
    Forward uses pieces 4× larger.
    """
    where = "piece argument"
    if piece is None and os.environ.get(PIECE_ENV):
        where = f"${PIECE_ENV}"
        raw = os.environ[PIECE_ENV]
        try:
            piece = int(raw)
        except ValueError:
            raise AttentionError(
                f"ring piece size {raw!r} is not an integer",
                where=where,
                fix="set a number of keys, e.g. 512",
            ) from None
    if piece is not None:
        if isinstance(piece, bool) or not isinstance(piece, int) or piece < 1:
            raise AttentionError(
                f"ring piece size must be a positive number of keys, got {piece!r}",
                where=where,
                fix="pass e.g. piece=512, or leave it unset for the automatic rule",
            )
        return piece
    floor = 1024 if device is not None and device.type == "cuda" else 256
    return max(floor, 64 * math.ceil(local_len / (16 * 64)))


def ring_query_tile(piece: int) -> tuple[int, int]:
    """(queries per kernel call against one piece in backward, fewest queries per call): 3 pieces,
    and no call shorter than 768 queries unless the block is.

    Each call returns the dQ of its queries as a temporary, so the tile bounds that temporary.
    """
    return 3 * piece, _MIN_QUERY_TILE


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: dist.ProcessGroup | None,
    causal: bool = True,
    softmax_scale: float | None = None,
    kernel: str | None = None,
    piece: int | None = None,
    cu_seqlens: CuSeqlens | None = None,
    split: str = "zigzag",
) -> Tensor:
    """Attention of this rank's zigzag chunks against the whole sequence held by `group`.

    q `[batch, seq_local, heads, head_dim]`, k/v `[batch, seq_local, kv_heads, head_dim]` where
    seq_local = S / CP holds chunks r and 2·CP−1−r of the sequence (see `zigzag_split`); returns
    `[batch, seq_local, heads, head_dim]` in q's dtype. `group=None` (or a group of one) is plain
    attention. Non-causal attention uses the same ring without masks. `kernel` forces a block
    kernel (see `kernels.select_kernel`); `piece` sets the keys per K/V message (see `ring_piece`;
    every rank must use the same value).

    `cu_seqlens` (see `documents`): document boundaries of the full sequence, the same on every
    rank; each token then attends only within its document (causal or not), blocks no document
    spans are skipped, and only the key rows some query sees travel.

    `split`: how the shards were cut — "zigzag" (`zigzag_split`, the length a multiple of 2·CP), or
    "balanced", the document-aware split of `split.balanced_runs` (`split_shard`; needs `cu_seqlens`,
    the length a multiple of CP), which evens the work within documents over the ranks.
    """
    cp = group_size(group)
    docs = documents_and_split(q, cu_seqlens, split, group, where="ring_attention")
    check_qkv(
        q, k, v, cp_size=cp, causal=(causal or docs is not None) and split == "zigzag", where="ring_attention"
    )
    scale = default_scale(q.shape[-1], softmax_scale)
    blk = select_kernel(q.device, q.dtype, kernel)
    size = ring_piece(q.shape[1], piece, device=q.device)
    return _RingAttention.apply(q, k, v, group, causal, scale, blk, size, docs, split)


class _KVStream:
    """The K/V pieces of a ring schedule: posts each slot's messages, hands out the piece in hand.

    At most two pieces are alive: the one in use and the next one in flight.
    """

    def __init__(self, exchange: PeerExchange, k: Tensor, v: Tensor, slots: list[Slot]) -> None:
        self.exchange, self.k, self.v, self.slots = exchange, k, v, slots
        self._posted: dict[int, tuple[Pending, tuple[Tensor, Tensor] | None]] = {}
        self._piece: tuple[Tensor, Tensor] | None = None

    def post(self, s: int) -> None:
        """Start slot s's transfers: our rows that dst needs, and the next piece of src's chunk."""
        if s >= len(self.slots):
            return
        slot, k, v = self.slots[s], self.k, self.v
        sends: list[tuple[Tensor, int]] = []
        recvs: list[tuple[Tensor, int]] = []
        if slot.send_kv is not None:
            a, b = slot.send_kv
            # one message per batch element: rows of one sequence are contiguous, nothing is copied
            sends = [(x[i, a:b], slot.dst) for x in (k, v) for i in range(x.shape[0])]
        buf = None
        if slot.recv_kv is not None:
            n = slot.recv_kv[1] - slot.recv_kv[0]
            buf = (k.new_empty(k.shape[0], n, *k.shape[2:]), v.new_empty(v.shape[0], n, *v.shape[2:]))
            recvs = [(x[i], slot.src) for x in buf for i in range(x.shape[0])]
        self._posted[s] = (self.exchange.post(sends, recvs, tag=_KV_TAG), buf)

    def take(self, s: int) -> tuple[Tensor, Tensor] | None:
        """Wait for slot s's transfers; the K/V piece the slot's block uses (None if it has none)."""
        pending, buf = self._posted.pop(s)
        pending.wait()
        if buf is not None:
            self._piece = buf
        return self._piece

    def release(self) -> None:
        """The piece in hand is done with (its last slot was computed)."""
        self._piece = None


class _GradReturn:
    """dK/dV sums of one slot on their way back: ours to src, dst's for our rows into `bufs`."""

    def __init__(
        self,
        exchange: PeerExchange,
        slot: Slot,
        mine: tuple[Tensor, Tensor] | None,
        like: Tensor,
        expect: bool | None = None,
    ) -> None:
        """Post the transfers: send `mine` (float32 dK/dV of src's rows) to src, receive dst's sums
        for rows of this rank's chunk. `expect`: whether dst computed anything with our rows (default:
        its block has pairs). `like`: a tensor of the accumulators' dtype and trailing shape."""
        theirs = slot.dst_block
        self.rows = slice(theirs.k_start, theirs.k_stop)
        self.mine = mine  # alive until the send is done
        self.bufs: tuple[Tensor, Tensor] | None = None
        if theirs.pairs if expect is None else expect:
            n = theirs.k_stop - theirs.k_start
            self.bufs = (
                like.new_empty(like.shape[0], n, *like.shape[2:]),
                like.new_empty(like.shape[0], n, *like.shape[2:]),
            )
        sends = [(t, slot.src) for t in mine] if mine is not None else []
        recvs = [(t, slot.dst) for t in self.bufs] if self.bufs is not None else []
        self.pending = exchange.post(sends, recvs, tag=_DKV_TAG) if sends or recvs else Pending()

    def finish(self, dk: Tensor, dv: Tensor) -> None:
        """Wait for both transfers and add the arrived sums to `dk`/`dv`."""
        self.pending.wait()
        self.mine = None
        if self.bufs is not None:
            dk[:, self.rows] += self.bufs[0]
            dv[:, self.rows] += self.bufs[1]
            self.bufs = None


def _after_first_call(kv: _KVStream, s: int, returning: _GradReturn | None, dk: Tensor, dv: Tensor) -> None:
    """Slot s's first kernel call is done: the next piece may start travelling and the previous
    slot's sums must have arrived. Not earlier: during that call the previous slot's sums (ours
    being sent, dst's arriving) take the place the next piece and this slot's sum hold later."""
    kv.post(s + 1)
    _finish(returning, dk, dv)


def _finish(returning: _GradReturn | None, dk: Tensor, dv: Tensor) -> None:
    """Wait for the sums of `returning` (if any) and add those that arrived to `dk`/`dv`."""
    if returning is not None:
        returning.finish(dk, dv)


@dataclass(frozen=True)
class _Plan:
    """What one rank computes and exchanges in one direction of the ring.

    `own`: (batch rows, sub-block) of its own chunk; `slots`: the remote steps' slots; `cuts[s]`: the
    (batch rows, sub-block) slot s computes, key rows being rows of src's chunk (all full blocks);
    `expect[s]`: whether dst computes anything with this rank's rows in slot s (so sums come back).
    Dense attention keeps the zigzag schedule and whole blocks; within documents the blocks are cut
    at the documents of each sample group and only the key rows some query sees travel.
    """

    own: list[tuple[slice, Block]]
    slots: list[Slot]
    cuts: list[list[tuple[slice, Block]]]
    expect: list[bool]


def _plan(
    rank: int, world: int, local_len: int, causal: bool, piece: int, docs: Documents | None, split: str
) -> _Plan:
    every = slice(None)
    if docs is None:
        slots = ring_schedule(rank, world, local_len, causal, piece)
        return _Plan(
            [(every, Block(0, rank, 0, local_len, 0, local_len, causal))],
            slots,
            [[(every, s.block)] if s.block.pairs else [] for s in slots],
            [bool(s.dst_block.pairs) for s in slots],
        )
    layouts = rank_layouts(docs, world, local_len, split, causal)
    groups = [(rows, bounds, lay) for (rows, bounds), lay in zip(docs.rows(), layouts, strict=True)]

    def cut(block: Block, q_rank: int, k_rank: int) -> list[tuple[slice, Block]]:
        return [
            (rows, sub)
            for rows, bounds, lay in groups
            for sub in cut_block(block, lay[q_rank], lay[k_rank], bounds, causal)
        ]

    def need(dst: int, src: int) -> tuple[int, int]:
        subs = [b for _, b in cut(Block(0, src, 0, local_len, 0, local_len, False), dst, src)]
        if not subs:
            return 0, 0
        return min(b.k_start for b in subs), max(b.k_stop for b in subs)

    slots = ranged_ring_schedule(rank, world, local_len, piece, need)
    return _Plan(
        cut(Block(0, rank, 0, local_len, 0, local_len, causal), rank, rank),
        slots,
        [cut(s.block, rank, s.src) if s.recv_kv else [] for s in slots],
        [bool(s.send_kv) and bool(cut(s.dst_block, s.dst, rank)) for s in slots],
    )


def rank_work(
    rank: int,
    world: int,
    local_len: int,
    causal: bool,
    piece: int,
    docs: Documents | None,
    split: str = "zigzag",
) -> tuple[list[tuple[slice, Block]], list[tuple[slice, Block]]]:
    """(own-chunk sub-blocks, remote sub-blocks) `rank` computes in backward: what the benchmark
    counts and times rank by rank (remote key rows relative to each slot's piece)."""
    plan = _plan(rank, world, local_len, causal, piece, docs, split)
    remote = [
        (
            rows,
            Block(
                sub.step,
                sub.src,
                sub.q_start,
                sub.q_stop,
                sub.k_start - slot.block.k_start,
                sub.k_stop - slot.block.k_start,
                False,
            ),
        )
        for slot, cuts in zip(plan.slots, plan.cuts, strict=True)
        for rows, sub in cuts
    ]
    return plan.own, remote


def _whole(rows: slice, sub: Block, q: Tensor, k: Tensor) -> bool:
    """Whether (rows, sub) is every batch row, query and key of the tensors at hand."""
    return (
        rows == slice(None)
        and (sub.q_start, sub.q_stop) == (0, q.shape[1])
        and (sub.k_start, sub.k_stop) == (0, k.shape[1])
    )


def ring_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: dist.ProcessGroup | None,
    causal: bool,
    scale: float,
    blk: BlockKernel,
    piece: int,
    docs: Documents | None = None,
    split: str = "zigzag",
) -> tuple[Tensor, Tensor]:
    """(out in q's dtype, lse float32 `[b, h, s]`) of ring attention; no autograd."""
    world, rank = group_size(group), group_rank(group)
    if world == 1 and docs is None:
        out, lse = blk.forward(q, k, v, causal, scale)
        return out, lse.to(lse_dtype(q.dtype))
    acc = lse_dtype(q.dtype)
    # forward holds no gradients, so its peak is far below backward's: larger pieces, fewer merges
    plan = _plan(rank, world, q.shape[1], causal, FORWARD_PIECES * piece, docs, split)
    kv = None
    if plan.slots:
        kv = _KVStream(PeerExchange(group), k.contiguous(), v.contiguous(), plan.slots)  # type: ignore[arg-type]
        kv.post(0)  # the first piece travels while the own chunk is computed
    if len(plan.own) == 1 and _whole(*plan.own[0], q, k):
        out, lse = blk.forward(q, k, v, plan.own[0][1].causal, scale)
        out_acc, lse_acc = out.to(acc).contiguous(), lse.to(acc).contiguous()
        del out, lse
    else:  # every query sees at least itself, so each row gets a finite LSE from its own chunk
        b, s, h, d = q.shape
        out_acc = torch.zeros(b, s, h, d, dtype=acc, device=q.device)
        lse_acc = torch.full((b, h, s), float("-inf"), dtype=acc, device=q.device)
        for rows, sub in plan.own:
            b_out, b_lse = blk.forward(q[rows, sub.q], k[rows, sub.k], v[rows, sub.k], sub.causal, scale)
            merge_(out_acc[rows, sub.q], lse_acc[rows, :, sub.q], b_out, b_lse)
    for s, slot in enumerate(plan.slots):
        assert kv is not None
        kv.post(s + 1)
        held = kv.take(s)
        for rows, sub in plan.cuts[s]:
            assert held is not None and not sub.causal
            ks = slice(sub.k_start - slot.block.k_start, sub.k_stop - slot.block.k_start)
            b_out, b_lse = blk.forward(q[rows, sub.q], held[0][rows, ks], held[1][rows, ks], False, scale)
            merge_(out_acc[rows, sub.q], lse_acc[rows, :, sub.q], b_out, b_lse)
            del b_out, b_lse
        if slot.piece_done:
            kv.release()
        del held
    return out_acc.to(q.dtype), lse_acc


def _own_backward(
    plan: _Plan,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    blk: BlockKernel,
    scale: float,
    acc: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """The own chunk's gradients, in the accumulation dtype: they start the sums (and are the whole of
    them for its local pairs)."""
    if len(plan.own) == 1 and _whole(*plan.own[0], q, k):
        b_dq, b_dk, b_dv = blk.backward(dout, q, k, v, out, lse, plan.own[0][1].causal, scale)
        return tuple(g.to(acc).contiguous() for g in (b_dq, b_dk, b_dv))  # type: ignore[return-value]
    dq, dk, dv = (torch.zeros(t.shape, dtype=acc, device=t.device) for t in (q, k, v))
    for rows, sub in plan.own:
        qs, ks = sub.q, sub.k
        b_dq, b_dk, b_dv = blk.backward(
            dout[rows, qs],
            q[rows, qs],
            k[rows, ks],
            v[rows, ks],
            out[rows, qs],
            lse[rows, :, qs],
            sub.causal,
            scale,
        )
        dq[rows, qs] += b_dq
        dk[rows, ks] += b_dk
        dv[rows, ks] += b_dv
    return dq, dk, dv


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
    piece: int,
    docs: Documents | None = None,
    split: str = "zigzag",
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) for this rank's chunks, given the saved final out and lse."""
    world, rank = group_size(group), group_rank(group)
    if world == 1 and docs is None:
        return blk.backward(dout, q, k, v, out, lse, causal, scale)
    acc = lse_dtype(q.dtype)
    plan = _plan(rank, world, q.shape[1], causal, piece, docs, split)
    exchange = kv = None
    if plan.slots:
        exchange = PeerExchange(group)  # type: ignore[arg-type]
        kv = _KVStream(exchange, k.contiguous(), v.contiguous(), plan.slots)
        kv.post(0)
    dq, dk, dv = _own_backward(plan, dout, q, k, v, out, lse, blk, scale, acc)
    tile = ring_query_tile(piece)
    returning: _GradReturn | None = None  # the previous slot's sums, still travelling
    for s, slot in enumerate(plan.slots):
        assert kv is not None and exchange is not None
        held = kv.take(s)
        summed: tuple[Tensor, Tensor] | None = None  # this slot's dK/dV of src's rows, float32
        first = True
        for rows, sub in plan.cuts[s]:
            assert held is not None
            ks = slice(sub.k_start - slot.block.k_start, sub.k_stop - slot.block.k_start)
            whole = rows == slice(None) and (ks.start, ks.stop) == (0, held[0].shape[1])
            for q0, q1 in query_tiles(sub, *tile):
                qs = slice(q0, q1)
                t_dq, t_dk, t_dv = blk.backward(
                    dout[rows, qs],
                    q[rows, qs],
                    held[0][rows, ks],
                    held[1][rows, ks],
                    out[rows, qs],
                    lse[rows, :, qs],
                    False,
                    scale,
                )
                dq[rows, qs] += t_dq
                del t_dq
                if summed is None and whole:
                    summed = (t_dk.to(acc).contiguous(), t_dv.to(acc).contiguous())
                else:
                    if summed is None:
                        summed = (
                            held[0].new_zeros(held[0].shape, dtype=acc),
                            held[1].new_zeros(held[1].shape, dtype=acc),
                        )
                    summed[0][rows, ks] += t_dk
                    summed[1][rows, ks] += t_dv
                del t_dk, t_dv
                if first:
                    _after_first_call(kv, s, returning, dk, dv)
                    returning, first = None, False
        if first:
            _after_first_call(kv, s, returning, dk, dv)
            returning = None
        if slot.piece_done:
            kv.release()
        del held
        returning = _GradReturn(exchange, slot, summed, dk, plan.expect[s])
        del summed
    _finish(returning, dk, dv)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


_RingAttention = attention_function("_RingAttention", ring_forward, ring_backward)
