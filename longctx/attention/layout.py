"""Which global positions a CP rank's rows hold (`Layout`), and attention blocks cut at documents.

How blocks are cut (`cut_block`). The ring and all-gather plans are blocks of local query rows
against key rows of some rank's layout (or of the gathered sequence in order). Within one document
a block's visible pairs — same document and, causally, key position ≤ query position — are a few
diagonal sub-blocks (the same positions on both sides, causal in local order) and full rectangles
(every key before every query, or no causal mask): keys are grouped by the first query that sees
them, which for increasing layouts is one contiguous range of rows. So each block becomes kernel
calls on plain diagonal or unmasked blocks, one or a few per document it touches; a block no
document spans on both sides is skipped. No kernel needs a mask of its own, whichever split cut the
shards.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from longctx.attention.blocks import Block


@dataclass(frozen=True)
class Layout:
    """Which global positions a tensor's rows hold: increasing runs `(global_start, rows)`."""

    runs: tuple[tuple[int, int], ...]

    @classmethod
    def zigzag(cls, rank: int, world: int, local_len: int) -> Layout:
        if world == 1:
            return cls(((0, local_len),))
        c = local_len // 2
        return cls(((rank * c, c), ((2 * world - 1 - rank) * c, c)))

    @classmethod
    def natural(cls, length: int) -> Layout:
        return cls(((0, length),))

    def positions(self) -> Tensor:
        """Global position of each local row (int64)."""
        return (
            torch.cat([torch.arange(a, a + n) for a, n in self.runs])
            if self.runs
            else torch.zeros(0, dtype=torch.long)
        )

    def rows_before(self, g: int) -> int:
        """Local rows holding global positions < g (the layout is increasing)."""
        return sum(min(max(g - start, 0), n) for start, n in self.runs)

    def spans(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Global ranges of local rows [lo, hi)."""
        out: list[tuple[int, int]] = []
        row = 0
        for start, n in self.runs:
            a, b = max(lo, row), min(hi, row + n)
            if a < b:
                out.append((start + a - row, start + b - row))
            row += n
        return out


def _doc_range(bounds: tuple[int, ...], g0: int, g1: int) -> tuple[int, int]:
    """Indices [i0, i1) of the documents overlapping global positions [g0, g1) (g0 < g1)."""
    return bisect.bisect_right(bounds, g0) - 1, bisect.bisect_left(bounds, g1)


def _docs_of(spans: list[tuple[int, int]], bounds: tuple[int, ...]) -> set[int]:
    out: set[int] = set()
    for a, b in spans:
        i0, i1 = _doc_range(bounds, a, b)
        out.update(range(i0, i1))
    return out


def cut_block(
    block: Block, q_layout: Layout, k_layout: Layout, bounds: tuple[int, ...], causal: bool
) -> list[Block]:
    """The visible pairs of `block` (local query rows × local key rows) as diagonal and full
    sub-blocks: same document, and with `causal` key position ≤ query position.

    Both layouts are increasing, so within one document the queries that see a key at position g
    are one contiguous range of local rows (those at positions ≥ g, > g where g is not a query's);
    keys are grouped by that range, and a run of positions held on both sides (same rows in the same
    order) is one diagonal. `q_layout is k_layout` with equal row ranges (a rank's own chunk) is one
    diagonal per document: local order is global order there.
    """
    q_spans = q_layout.spans(block.q_start, block.q_stop)
    k_spans = k_layout.spans(block.k_start, block.k_stop)
    shared = _docs_of(q_spans, bounds) & _docs_of(k_spans, bounds)
    same = q_layout is k_layout and (block.q_start, block.q_stop) == (block.k_start, block.k_stop)
    out: list[Block] = []

    def add(q0: int, q1: int, k0: int, k1: int, diagonal: bool) -> None:
        if q0 >= q1 or k0 >= k1:
            return
        last = out[-1] if out else None
        if (
            not diagonal
            and last is not None
            and not last.causal
            and (last.q_start, last.q_stop, last.k_stop) == (q0, q1, k0)
        ):
            out[-1] = Block(block.step, block.src, q0, q1, last.k_start, k1, False)
            return
        out.append(Block(block.step, block.src, q0, q1, k0, k1, diagonal))

    for i in sorted(shared):
        d0, d1 = bounds[i], bounds[i + 1]
        q0 = max(block.q_start, q_layout.rows_before(d0))
        q1 = min(block.q_stop, q_layout.rows_before(d1))
        k0 = max(block.k_start, k_layout.rows_before(d0))
        k1 = min(block.k_stop, k_layout.rows_before(d1))
        if q0 >= q1 or k0 >= k1:
            continue
        if not causal:
            add(q0, q1, k0, k1, False)
            continue
        if same:
            add(q0, q1, k0, k1, True)
            continue
        held = q_layout.spans(q0, q1)  # positions of this document's queries
        edges = sorted({x for a, b in held for x in (a, b)})
        for a, b in k_layout.spans(k0, k1):
            cuts = [a, *(x for x in edges if a < x < b), b]
            for p0, p1 in itertools.pairwise(cuts):
                r0 = k_layout.rows_before(p0)
                r1 = r0 + (p1 - p0)
                common = any(x <= p0 and p1 <= y for x, y in held)
                first = q_layout.rows_before(p1)  # queries at positions ≥ p1
                if common:
                    d = q_layout.rows_before(p0)
                    add(d, d + (p1 - p0), r0, r1, True)
                add(max(first, q0), q1, r0, r1, False)
    return out
