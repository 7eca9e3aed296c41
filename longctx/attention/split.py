"""Document-aware context-parallel split: every rank the same tokens and the same attention work.

Zigzag balances *dense* causal work. Within documents a token's work is the keys it sees: t − d + 1
for the token at t of a document starting at d (causal), or the document's length (bidirectional).
Zigzag leaves that uneven whenever a document boundary falls off the chunk grid (at 128K with CP 8,
10 % of the tokens in short documents, the busiest rank did 22 × the idlest's work).

The split here assigns pieces of documents to ranks:
  * a document long enough to cut into pieces of at least `min_piece` tokens is cut into 2·CP equal
    pieces, rank r taking pieces r and 2·CP−1−r (causal: each rank then holds one early and one late
    piece, the same tokens and the same work), or into CP pieces, rank r taking piece r
    (bidirectional: every token does the same work, so equal pieces are equal work). Where the
    length does not divide, the extra tokens go to the ranks holding the fewest so far;
  * the shorter documents then fill the ranks' remaining room, largest work first, each to the rank
    with the least work that still has room for it whole; one that fits nowhere whole is cut to fill
    the rank with the most room, and the rest placed again.
A rank's pieces are held in sequence order, so its rows map to increasing global positions (see
`documents.Layout`), and two pieces are either the same rows or disjoint: every block of attention
between two ranks is a set of full rectangles and diagonals, never an offset-causal one.

The split is a pure function of the boundaries, so every rank computes the same one where the data is
sharded (`longctx.train.data`) and again in attention (`ring`, `allgather`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import Tensor

from longctx.errors import AttentionError

SPLITS = ("zigzag", "balanced")
# pieces shorter than this cost more in kernel-call overhead than they win in balance (CPU flash
# kernel: below ~64 queries its blocks shrink); small windows use shorter pieces
MIN_PIECE = 64

Runs = tuple[tuple[int, int], ...]  # increasing (global start, length) of one rank


def check_split(split: str, *, where: str) -> None:
    if split not in SPLITS:
        raise AttentionError(
            f"context-parallel split {split!r} is unknown", where=where, fix=f"use one of {', '.join(SPLITS)}"
        )


def token_work(length: int, causal: bool) -> int:
    """Query-key pairs of one whole document (what its attention FLOPs are proportional to)."""
    return length * (length + 1) // 2 if causal else length * length


def _piece_work(start: int, stop: int, doc_start: int, causal: bool, doc_len: int) -> int:
    n = stop - start
    if not causal:
        return n * doc_len
    return n * (start - doc_start) + n * (n + 1) // 2


def balanced_runs(
    bounds: Sequence[int], world: int, causal: bool, min_piece: int = MIN_PIECE
) -> tuple[Runs, ...]:
    """Per CP rank, the increasing runs of global positions it holds (see the module docstring).

    `bounds`: `[0, …, S]` of one sample; S must be a multiple of `world`."""
    return _balanced_runs(tuple(int(b) for b in bounds), world, causal, min_piece)


@lru_cache(maxsize=256)
def _balanced_runs(bounds: tuple[int, ...], world: int, causal: bool, min_piece: int) -> tuple[Runs, ...]:
    seq_len = bounds[-1]
    if world < 1 or seq_len % world:
        raise AttentionError(
            f"sequence length {seq_len} does not split into {world} equal shards",
            where="document-balanced split",
            fix=f"use a sequence length that is a multiple of CP = {world}",
        )
    if world == 1:
        return (((0, seq_len),),)
    local = seq_len // world
    parts = 2 * world if causal else world
    piece = max(1, min(min_piece, local // parts))
    pieces: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    tokens, work = [0] * world, [0] * world
    small: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(bounds):
        n = b - a
        if n == 0:
            continue
        if n < parts * piece:
            small.append((a, b))
            continue
        # pieces per rank: causal ranks take two (r, 2w−1−r), the n % parts extra tokens one each
        # to the ranks holding the fewest tokens so far
        base, extra = divmod(n, parts)
        lengths = [base] * parts
        order = sorted(range(world), key=lambda r: (tokens[r], r))
        for i in range(extra):
            r = order[i % world]
            lengths[r if i < world else parts - 1 - r] += 1
        start = a
        for i, length in enumerate(lengths):
            r = i if i < world else parts - 1 - i
            pieces[r].append((start, start + length))
            tokens[r] += length
            work[r] += _piece_work(start, start + length, a, causal, n)
            start += length
    room = [local - t for t in tokens]
    # (start, stop, document start): a document cut while filling comes back as its later part
    queue = sorted(((a, b, a) for a, b in small), key=lambda d: (-(d[1] - d[0]), d[0]))
    while queue:
        a, b, doc = queue.pop(0)
        n = b - a
        fits = [r for r in range(world) if room[r] >= n]
        if fits:
            r = min(fits, key=lambda r: (work[r], r))
            take = n
        else:  # cut: fill the rank with the most room, place the rest again
            r = max(range(world), key=lambda r: (room[r], -r))
            take = room[r]
        pieces[r].append((a, a + take))
        room[r] -= take
        work[r] += _piece_work(a, a + take, doc, causal, b - doc)
        if take < n:
            queue.insert(0, (a + take, b, doc))
    runs = tuple(_merge(sorted(p)) for p in pieces)
    assert all(sum(n for _, n in r) == local for r in runs), "balanced split lost tokens"
    return runs


def _merge(pieces: list[tuple[int, int]]) -> Runs:
    out: list[tuple[int, int]] = []
    for a, b in pieces:
        if b <= a:
            continue
        if out and out[-1][0] + out[-1][1] == a:
            out[-1] = (out[-1][0], out[-1][1] + b - a)
        else:
            out.append((a, b - a))
    return tuple(out)


def positions(runs: Runs, device: torch.device | str = "cpu") -> Tensor:
    """Global positions of a rank's rows (int64, increasing)."""
    if not runs:
        return torch.zeros(0, dtype=torch.long, device=device)
    return torch.cat([torch.arange(a, a + n, device=device) for a, n in runs])
