"""Which context-parallel split runs a packed sample faster: a model of what each kernel call costs.

FLOPs alone favour the document-balanced split wherever it evens out the ranks' work, but that split
cuts a rank's attention into more and smaller kernel calls, and a small call costs more per pair than
a large one: at 16K with CP 8 and 10 % of the tokens in short documents it balanced the FLOPs to 1.001
(zigzag 1.098) and still ran slower. The model here prices every call the ring makes on a rank, as
`ring.rank_work` lists them (forward: one call per sub-block of each forward piece; backward: one per
query tile of each backward piece):

    seconds = call + pair · pairs + q_row · queries + k_row · keys

with its own coefficients for forward and backward and for full and diagonal (causal) blocks. A rank's
time is the sum over its calls; the split's is its slowest rank's, which every ring step waits for.
`choose_split` takes the cheaper split, and zigzag unless the balanced one saves at least `MARGIN`
(the model's error on one rank's total is a few per cent).

The coefficients are per call at 8 heads × 64 (a width of 512): `CPU_FLASH_COST` was fitted to aten's
CPU flash kernel (fp32, one thread per rank), 42 shapes from 16 to 3,072 queries and 32 to 2,048 keys,
median error 11 % per call (`longctx bench kernel-cost` measures and fits them again). The
local trainer runs CP > 1 on CPU processes, so it is the model the trainer chooses with. The choice is
a pure function of the document boundaries, CP and causality, so the data loader (which cuts the
shards) and attention (which reads them) make it alike on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from longctx.attention.blocks import Block, query_tiles
from longctx.attention.documents import Documents, parse_documents
from longctx.attention.ring import FORWARD_PIECES, rank_work, ring_piece, ring_query_tile

# the balanced split must save this share of the modelled time to be chosen over zigzag
MARGIN = 0.03


@dataclass(frozen=True)
class CallCost:
    """Seconds of one kernel call, at the model's width (heads × head dim = 512)."""

    call_s: float
    """fixed cost of a call: dispatch, allocation of its outputs, the kernel's set-up"""
    full_pair_s: float
    """per query-key pair of a full (unmasked) block"""
    diagonal_pair_s: float
    """per visible pair of a diagonal (causal) block: the masked half still costs part of a tile"""
    query_row_s: float
    """per query row: loading it and writing its output (and, in backward, its dQ)"""
    key_row_s: float
    """per key row: loading K and V (and, in backward, writing dK and dV)"""

    def seconds(self, block: Block, queries: int | None = None) -> float:
        """One call on `block` (or on `queries` of its query rows: a backward tile)."""
        sq = block.q_stop - block.q_start if queries is None else queries
        sk = block.k_stop - block.k_start
        pairs = sq * (sq + 1) // 2 * self.diagonal_pair_s if block.causal else sq * sk * self.full_pair_s
        return self.call_s + pairs + sq * self.query_row_s + sk * self.key_row_s


@dataclass(frozen=True)
class KernelCost:
    """Forward and backward calls of one kernel on one kind of device."""

    name: str
    forward: CallCost
    backward: CallCost


# fitted on an Intel Xeon (x86_64, 2 KVM cores), torch 2.13 CPU build, fp32, one thread (module docstring)
CPU_FLASH_COST = KernelCost(
    name="cpu_flash (fp32, one thread, 8 × 64)",
    forward=CallCost(19.7e-6, 19.4e-9, 30.0e-9, 0.478e-6, 0.200e-6),
    backward=CallCost(25.4e-6, 43.6e-9, 70.0e-9, 0.361e-6, 0.685e-6),
)


def _calls_seconds(
    cost: CallCost,
    own: list[tuple[slice, Block]],
    remote: list[tuple[slice, Block]],
    tile: tuple[int, int] | None,
) -> float:
    """Seconds of one pass over a rank's blocks: one call per block, or (backward, `tile`) one per query
    tile of each remote block."""
    total = sum(cost.seconds(b) for _, b in own if b.pairs)
    for _, b in remote:
        if not b.pairs:
            continue
        if tile is None:
            total += cost.seconds(b)
        else:
            total += sum(cost.seconds(b, q1 - q0) for q0, q1 in query_tiles(b, *tile))
    return total


Work = tuple[list[tuple[slice, Block]], list[tuple[slice, Block]]]  # (own, remote) of `ring.rank_work`


def work_seconds(cost: KernelCost, forward: Work, backward: Work, piece: int) -> float:
    """Modelled seconds of a rank's forward work (its pieces `FORWARD_PIECES` × `piece`) and backward work
    (pieces of `piece`, remote blocks in query tiles)."""
    return _calls_seconds(cost.forward, *forward, None) + _calls_seconds(
        cost.backward, *backward, ring_query_tile(piece)
    )


def rank_seconds(
    rank: int, world: int, local_len: int, causal: bool, docs: Documents | None, split: str, cost: KernelCost
) -> float:
    """Modelled forward + backward seconds of ring attention on `rank` under `split` (`docs` None: dense)."""
    piece = ring_piece(local_len)
    forward = rank_work(rank, world, local_len, causal, piece * FORWARD_PIECES, docs, split)
    return work_seconds(cost, forward, rank_work(rank, world, local_len, causal, piece, docs, split), piece)


def split_seconds(docs: Documents, world: int, causal: bool, split: str, cost: KernelCost) -> float:
    """Modelled seconds of the slowest rank: what a step of ring attention under `split` waits for."""
    local = docs.seq_len // world
    return max(rank_seconds(r, world, local, causal, docs, split, cost) for r in range(world))


def choose_split(
    cu_seqlens: tuple[int, ...],
    *,
    batch: int,
    seq_len: int,
    world: int,
    causal: bool,
    cost: KernelCost = CPU_FLASH_COST,
) -> str:
    """ "balanced" where the model says the document-balanced split saves at least `MARGIN` of the
    slowest rank's time on this batch's documents, else "zigzag"."""
    return _choose(tuple(int(x) for x in cu_seqlens), batch, seq_len, world, causal, cost)


@lru_cache(maxsize=512)
def _choose(
    bounds: tuple[int, ...], batch: int, seq_len: int, world: int, causal: bool, cost: KernelCost
) -> str:
    if world < 2:
        return "zigzag"
    docs = parse_documents(list(bounds), batch=batch, seq_len=seq_len, where="choose_split")
    zigzag = split_seconds(docs, world, causal, "zigzag", cost)
    balanced = split_seconds(docs, world, causal, "balanced", cost)
    return "balanced" if balanced < zigzag * (1 - MARGIN) else "zigzag"
