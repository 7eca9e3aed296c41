"""Which attention blocks each CP rank computes, for the ring and the all-gather variants.

The attention code executes exactly these plans (the ring cuts each remote step into the slots of
`ring_schedule`, which cover the same pairs), and the benchmark counts FLOPs from what is executed,
so the balance it reports is the balance of the work actually done.

Zigzag ring, rank r holding chunks (r, 2n−1−r) and receiving at step t the K/V of rank
j = (r − t) mod n, with h = half the local length:
  * j == r: both local chunks against both local chunks, causal on the diagonal;
  * j <  r: chunk j precedes both local chunks and chunk 2n−1−j follows both → all queries against
            the first half of the received K/V, no mask;
  * j >  r: chunk r precedes both received chunks (sees nothing), chunk 2n−1−r follows both →
            the second half of the queries against all received K/V, no mask.
Without causality every step is all queries against all keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """Local queries [q_start, q_stop) against keys [k_start, k_stop) of the K/V at hand."""

    step: int
    src: int  # CP rank whose K/V chunk this is (ring), or -1 for the gathered full sequence
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool

    @property
    def q(self) -> slice:
        return slice(self.q_start, self.q_stop)

    @property
    def k(self) -> slice:
        return slice(self.k_start, self.k_stop)

    @property
    def pairs(self) -> int:
        """Query-key pairs scored (what attention FLOPs are proportional to)."""
        sq, sk = self.q_stop - self.q_start, self.k_stop - self.k_start
        if self.causal:  # diagonal block: query i sees keys 0..i
            return sq * (sq + 1) // 2
        return sq * sk


def ring_plan(rank: int, world: int, local_len: int, causal: bool) -> list[Block]:
    """Blocks of the zigzag ring on `rank`, in step order (K/V local length = `local_len`)."""
    blocks: list[Block] = []
    half = local_len // 2
    for step in range(world):
        src = (rank - step) % world
        if not causal:
            blocks.append(Block(step, src, 0, local_len, 0, local_len, False))
        elif src == rank:
            blocks.append(Block(step, src, 0, local_len, 0, local_len, True))
        elif src < rank:
            blocks.append(Block(step, src, 0, local_len, 0, half, False))
        else:
            blocks.append(Block(step, src, half, local_len, 0, local_len, False))
    return blocks


def contiguous_ring_plan(rank: int, world: int, local_len: int, causal: bool) -> list[Block]:
    """Blocks a ring would compute with a plain contiguous split (rank r holds chunk r of n).

    Only used to report the imbalance zigzag removes: rank r sees r full blocks and one diagonal.
    """
    blocks: list[Block] = []
    for step in range(world):
        src = (rank - step) % world
        if not causal or src < rank:
            blocks.append(Block(step, src, 0, local_len, 0, local_len, False))
        elif src == rank:
            blocks.append(Block(step, src, 0, local_len, 0, local_len, True))
    return blocks


def allgather_plan(rank: int, world: int, local_len: int, causal: bool) -> list[Block]:
    """Blocks of the all-gather variant: local queries against the gathered full sequence.

    Causal: each local chunk a runs a diagonal block on its own keys and a full block on the prefix
    [0, a·c) — two plain kernels instead of one offset-causal one, merged through the LSE.
    """
    if not causal:
        return [Block(0, -1, 0, local_len, 0, local_len * world, False)]
    c = local_len // 2
    blocks: list[Block] = []
    for h, chunk in enumerate((rank, 2 * world - 1 - rank)):
        q0 = h * c
        blocks.append(Block(0, -1, q0, q0 + c, chunk * c, (chunk + 1) * c, True))
        if chunk > 0:
            blocks.append(Block(0, -1, q0, q0 + c, 0, chunk * c, False))
    return blocks


def plan_pairs(blocks: list[Block]) -> int:
    return sum(b.pairs for b in blocks)


# ------------------------------------------------------------------------------ streamed ring schedule


def split_range(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) cut into `parts` contiguous ranges whose lengths differ by at most one.

    Ranges are empty when there are more parts than rows; nothing has to divide evenly.
    """
    n = stop - start
    return [(start + i * n // parts, start + (i + 1) * n // parts) for i in range(parts)]


def whole_pieces(start: int, stop: int, piece: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) as `parts` ranges of `piece` rows in order, the last non-empty one shorter and any
    after it empty; `stop - start` must fit in `parts` pieces."""
    if stop - start > piece * parts:
        raise ValueError(f"{stop - start} rows do not fit in {parts} pieces of {piece}")
    return [(min(start + i * piece, stop), min(start + (i + 1) * piece, stop)) for i in range(parts)]


def ring_slot_count(local_len: int, causal: bool, piece: int) -> int:
    """Slots per remote ring step: how many units of equal work every rank cuts each step into.

    Causal zigzag blocks are either all local queries against the first half of the remote keys or
    the second half of the queries against all of them (L·h pairs either way, h = L/2); the slot count
    is even so that the first kind can split its keys in half as many pieces and its queries in two.
    """
    if piece < 1:
        raise ValueError(f"piece must be ≥ 1, got {piece}")
    if causal:
        return 2 * -(-(local_len // 2) // piece)
    return -(-local_len // piece)


@dataclass(frozen=True)
class Slot:
    """One unit of a remote ring step on one rank, and the K/V messages that go with it.

    `block` is what this rank computes in the slot: local queries against the piece of `src`'s chunk
    in hand (its keys are exactly that piece's rows; it may be empty). `dst_block` is what `dst`
    computes with this rank's rows in the same slot, so each side knows what the other sends back.
    Row ranges are chunk rows: `recv_kv` of `src`'s chunk arrives for this slot (a new piece),
    `send_kv` of this rank's chunk goes to `dst`; `piece_done` marks the last slot of the piece.
    """

    step: int
    src: int
    dst: int
    block: Block
    dst_block: Block
    recv_kv: tuple[int, int] | None
    send_kv: tuple[int, int] | None
    piece_done: bool


@dataclass(frozen=True)
class _Unit:
    block: Block
    first: bool  # the piece arrives for this unit
    last: bool  # the piece is not needed after this unit


def _step_units(rank: int, world: int, local_len: int, causal: bool, slots: int) -> list[list[_Unit]]:
    units: list[list[_Unit]] = []
    for block in ring_plan(rank, world, local_len, causal)[1:]:
        if block.k_stop - block.k_start == local_len:  # all keys: one piece per slot
            k_parts, q_parts = slots, 1
        else:  # half the keys, all queries: half as many pieces, each over two query halves
            k_parts, q_parts = slots // 2, 2
        step: list[_Unit] = []
        for k0, k1 in split_range(block.k_start, block.k_stop, k_parts):
            for j, (q0, q1) in enumerate(split_range(block.q_start, block.q_stop, q_parts)):
                # an empty piece (more slots than rows) still takes its slot, so slots stay aligned
                sub = Block(block.step, block.src, q0, q1 if k0 < k1 else q0, k0, k1, False)
                step.append(_Unit(sub, first=j == 0, last=j == q_parts - 1))
        units.append(step)
    return units


def ring_schedule(rank: int, world: int, local_len: int, causal: bool, piece: int) -> list[Slot]:
    """Slots of the remote steps (1 … world−1) on `rank`, in the order every rank walks them.

    Every rank has the same number of slots per step and, with zigzag, the same work in each slot,
    so a message posted in slot s is consumed in slot s on the other side: the sender and the
    receiver of each piece agree on when it travels, and ranks advance in step.
    """
    if world < 2:
        return []
    slots = ring_slot_count(local_len, causal, piece)
    mine = _step_units(rank, world, local_len, causal, slots)
    schedule: list[Slot] = []
    for t, units in enumerate(mine, start=1):
        src, dst = (rank - t) % world, (rank + t) % world
        theirs = _step_units(dst, world, local_len, causal, slots)[t - 1]
        for u, d in zip(units, theirs, strict=True):
            b, db = u.block, d.block
            schedule.append(
                Slot(
                    step=t,
                    src=src,
                    dst=dst,
                    block=b,
                    dst_block=db,
                    recv_kv=(b.k_start, b.k_stop) if u.first and b.k_start < b.k_stop else None,
                    send_kv=(db.k_start, db.k_stop) if d.first and db.k_start < db.k_stop else None,
                    piece_done=u.last,
                )
            )
    return schedule


def query_tiles(block: Block, tile: int, least: int = 1) -> list[tuple[int, int]]:
    """The block's queries cut into ceil(rows / tile) near-equal tiles, but fewer where tiles would
    be shorter than `least` rows (one tile if the block has fewer); none if the block is empty.

    One kernel call per tile.
    """
    if block.pairs == 0:
        return []
    rows = block.q_stop - block.q_start
    calls = max(1, min(-(-rows // tile), rows // least))
    return split_range(block.q_start, block.q_stop, calls)


def ranged_ring_schedule(
    rank: int, world: int, local_len: int, piece: int, need: Callable[[int, int], tuple[int, int]]
) -> list[Slot]:
    """Slots of the remote steps when `need(dst, src)` says which rows [k0, k1) of src's chunk dst
    attends to (any layout, e.g. within documents): every step is cut into ceil(local_len / piece)
    slots on every rank, slot i carrying piece i of the needed rows (possibly empty), so a message
    posted in slot i is consumed in slot i on the other side. Each slot's block is all local queries
    against its piece; which of its pairs are visible is the caller's to cut.

    The needed rows go out in whole pieces, the last one shorter and the slots after it empty: cut
    evenly over every slot they made narrow blocks of odd widths (141 keys at 16K, CP 8), each a
    kernel call that scores its pairs up to 1.4× slower on CPU than a piece-wide one.
    """
    if world < 2:
        return []
    slots = -(-local_len // piece)
    schedule: list[Slot] = []
    for t in range(1, world):
        src, dst = (rank - t) % world, (rank + t) % world
        mine = whole_pieces(*need(rank, src), piece, slots)
        theirs = whole_pieces(*need(dst, rank), piece, slots)
        for (k0, k1), (d0, d1) in zip(mine, theirs, strict=True):
            schedule.append(
                Slot(
                    step=t,
                    src=src,
                    dst=dst,
                    block=Block(t, src, 0, local_len if k0 < k1 else 0, k0, k1, False),
                    dst_block=Block(t, rank, 0, local_len if d0 < d1 else 0, d0, d1, False),
                    recv_kv=(k0, k1) if k0 < k1 else None,
                    send_kv=(d0, d1) if d0 < d1 else None,
                    piece_done=True,
                )
            )
    return schedule
