"""Which attention blocks each CP rank computes, for the ring and the all-gather variants.

The attention code executes exactly these plans, and the benchmark counts FLOPs from them, so the
balance it reports is the balance of the work actually done.

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
