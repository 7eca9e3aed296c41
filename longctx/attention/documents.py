"""Document boundaries inside packed sequences: attention stays within each document.

`cu_seqlens` holds the boundaries of the documents in the *full* sequence (before any CP split),
the same on every CP rank: `[0, e_1, …, S]`, or `[0, …, S, …, 2S, …, b·S]` for the samples of a
batch concatenated (each sample its own documents, every multiple of S a boundary). A repeated
boundary is an empty document and is dropped.

Which positions a rank holds. Each rank's rows are a `Layout`: increasing runs of global positions.
Under the zigzag split (`split="zigzag"`, dense-balanced) they are chunks r and 2·CP−1−r of 2·CP;
under the document-balanced split (`split="balanced"`, `split.balanced_runs`, per sample group) they
are the pieces of documents that split gives the rank — long documents cut into 2·CP pieces (rank r
taking pieces r and 2·CP−1−r) for causal attention or CP pieces bidirectionally, short ones whole —
held in sequence order. Either way the map from local rows to global positions is increasing, so
the local rows of one document are one contiguous range, on the query side and on the key side
alike.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.blocks import Block
from longctx.attention.comm import all_gather_dim0, group_rank, group_size
from longctx.attention.split import balanced_runs, check_split
from longctx.errors import AttentionError

CuSeqlens = Tensor | Sequence[int]


@dataclass(frozen=True)
class Documents:
    """Validated document boundaries: per sample group, the batch rows it covers and its bounds."""

    seq_len: int
    # (first batch row, stop batch row, strictly increasing bounds 0 … seq_len)
    groups: tuple[tuple[int, int, tuple[int, ...]], ...]

    def rows(self) -> Iterator[tuple[slice, tuple[int, ...]]]:
        for b0, b1, bounds in self.groups:
            yield slice(b0, b1), bounds

    def fingerprint(self) -> list[int]:
        """A few integers every rank must agree on (lengths, sums and a position-weighted sum)."""
        flat = [x for _, _, bounds in self.groups for x in bounds]
        rows = [b1 - b0 for b0, b1, _ in self.groups]
        weighted = sum((i + 1) * x for i, x in enumerate(flat)) % (1 << 61)
        return [self.seq_len, len(self.groups), sum(rows), len(flat), sum(flat), weighted]


def parse_documents(cu_seqlens: CuSeqlens, *, batch: int, seq_len: int, where: str) -> Documents:
    """Check `cu_seqlens` against a batch of `batch` sequences of `seq_len` tokens (full length)."""
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
            raise AttentionError(
                f"cu_seqlens must be a 1-d integer tensor, got {cu_seqlens.dtype} of shape "
                f"{list(cu_seqlens.shape)}",
                where=where,
                fix="pass the document boundaries as a 1-d int32/int64 tensor [0, …, S]",
            )
        values = [int(x) for x in cu_seqlens.tolist()]
    else:
        try:
            values = [int(x) for x in cu_seqlens]
        except (TypeError, ValueError):
            raise AttentionError(
                f"cu_seqlens must be a sequence of integers, got {cu_seqlens!r}", where=where
            ) from None
    shown = values if len(values) <= 12 else [*values[:6], "…", *values[-5:]]
    if len(values) < 2:
        raise AttentionError(
            f"cu_seqlens {shown} holds no document (it needs at least [0, S] with S = {seq_len})",
            where=where,
            fix=f"pass [0, {seq_len}] for one document per sample, or None for no boundaries",
        )
    if values[0] != 0:
        raise AttentionError(
            f"cu_seqlens {shown} does not start at 0", where=where, fix="document boundaries start at 0"
        )
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise AttentionError(
                f"cu_seqlens is not increasing: entry {i} is {values[i]} after {values[i - 1]} ({shown})",
                where=where,
                fix="pass cumulative document lengths (boundaries in sequence order)",
            )
    total = values[-1]
    if total == seq_len:
        return Documents(seq_len, ((0, batch, _dedupe(values)),))
    if batch > 1 and total == batch * seq_len:
        groups: list[tuple[int, int, tuple[int, ...]]] = []
        for i in range(batch):
            lo, hi = i * seq_len, (i + 1) * seq_len
            if lo not in values or hi not in values:
                missing = lo if lo not in values else hi
                raise AttentionError(
                    f"cu_seqlens over the batch ({batch} × {seq_len} tokens) lacks the sample boundary "
                    f"{missing} ({shown})",
                    where=where,
                    fix="a document cannot cross from one sample into the next: add every multiple of S",
                )
            a, z = bisect.bisect_left(values, lo), bisect.bisect_right(values, hi)
            bounds = _dedupe([v - lo for v in values[a:z]])
            if groups and groups[-1][2] == bounds:  # consecutive samples alike run in one call
                groups[-1] = (groups[-1][0], i + 1, bounds)
            else:
                groups.append((i, i + 1, bounds))
        return Documents(seq_len, tuple(groups))
    per_batch = f" or the batch's {batch} × {seq_len} = {batch * seq_len}" if batch > 1 else ""
    raise AttentionError(
        f"cu_seqlens ends at {total}, not at the sequence length {seq_len}{per_batch} ({shown})",
        where=where,
        fix="boundaries are of the full (unsharded) sequence: the last one is its length",
    )


def _dedupe(values: list[int]) -> tuple[int, ...]:
    out = [values[0]]
    out += [x for prev, x in itertools.pairwise(values) if x != prev]
    return tuple(out)


def check_documents_agree(docs: Documents, group: dist.ProcessGroup | None, device: torch.device) -> None:
    """Raise on every rank when the ranks of `group` were given different boundaries (one small
    all-gather): a rank attending with other documents than its peers would give a wrong answer."""
    if group_size(group) == 1:
        return
    mine = torch.tensor(docs.fingerprint(), dtype=torch.int64, device=device)
    every = all_gather_dim0(mine, group).cpu()  # type: ignore[arg-type]
    differ = [r for r in range(every.shape[0]) if not torch.equal(every[r], every[0])]
    if differ:
        raise AttentionError(
            f"document boundaries differ between CP ranks: rank 0 and rank(s) {differ} "
            f"(this is rank {group_rank(group)}; seq_len/groups/rows/count/sum per rank: "
            f"{every[:, :5].tolist()})",
            where="cu_seqlens of context-parallel attention",
            fix="pass the boundaries of the full sequence, identical on every rank (not of the local shard)",
        )


def documents_for(
    q: Tensor, cu_seqlens: CuSeqlens, group: dist.ProcessGroup | None, *, where: str
) -> Documents:
    """Parse `cu_seqlens` for this rank's q `[b, S/CP, h, d]` and check every rank got the same."""
    docs = parse_documents(cu_seqlens, batch=q.shape[0], seq_len=q.shape[1] * group_size(group), where=where)
    check_documents_agree(docs, group, q.device)
    return docs


def documents_and_split(
    q: Tensor, cu_seqlens: CuSeqlens | None, split: str, group: dist.ProcessGroup | None, *, where: str
) -> Documents | None:
    """`documents_for`, and a check that `split` is known and has the boundaries it is cut by."""
    check_split(split, where=where)
    if cu_seqlens is None:
        if split != "zigzag":
            raise AttentionError(
                f"split {split!r} cuts shards at documents but no cu_seqlens were given",
                where=where,
                fix="pass the document boundaries of the full sequence, or split='zigzag' for dense attention",
            )
        return None
    return documents_for(q, cu_seqlens, group, where=where)


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


def document_blocks(block: Block, q_layout: Layout, k_layout: Layout, bounds: tuple[int, ...]) -> list[Block]:
    """`block` of a zigzag plan (diagonal, or every key before every query, or unmasked) cut at
    document boundaries."""
    return cut_block(block, q_layout, k_layout, bounds, block.causal or _before(block, q_layout, k_layout))


def _before(block: Block, q_layout: Layout, k_layout: Layout) -> bool:
    """Whether every key of `block` precedes every query (a causal plan's full block)."""
    q = q_layout.spans(block.q_start, block.q_stop)
    k = k_layout.spans(block.k_start, block.k_stop)
    return bool(q and k) and max(b for _, b in k) <= min(a for a, _ in q)


def rank_layouts(docs: Documents, world: int, local_len: int, split: str, causal: bool) -> list[list[Layout]]:
    """Per sample group of `docs`, the layout of every CP rank under `split`."""
    if split == "zigzag":
        zig = [Layout.zigzag(r, world, local_len) for r in range(world)]
        return [zig for _ in docs.groups]
    return [[Layout(runs) for runs in balanced_runs(bounds, world, causal)] for _, _, bounds in docs.groups]


def ring_document_pairs(
    rank: int, world: int, local_len: int, causal: bool, bounds: tuple[int, ...], split: str = "zigzag"
) -> tuple[int, int]:
    """(query-key pairs, kernel calls) the ring computes on `rank` for one sample with `bounds`."""
    docs = Documents(local_len * world, ((0, 1, tuple(bounds)),))
    layouts = rank_layouts(docs, world, local_len, split, causal)[0]
    mine = layouts[rank]
    pairs = calls = 0
    for step in range(world):
        src = (rank - step) % world
        block = Block(step, src, 0, local_len, 0, local_len, causal and src == rank)
        subs = cut_block(block, mine, mine if src == rank else layouts[src], tuple(bounds), causal)
        pairs += sum(b.pairs for b in subs)
        calls += len(subs)
    return pairs, calls


def balanced_index(
    cu_seqlens: CuSeqlens, batch: int, seq_len: int, rank: int, world: int, causal: bool
) -> Tensor:
    """`[batch, seq_len / world]` global positions of `rank`'s rows under the balanced split of each
    sample's documents (`split.balanced_runs`)."""
    docs = parse_documents(cu_seqlens, batch=batch, seq_len=seq_len, where="balanced split")
    index = torch.empty(batch, seq_len // world, dtype=torch.long)
    for rows, bounds in docs.rows():
        index[rows] = Layout(balanced_runs(bounds, world, causal)[rank]).positions()
    return index


def balanced_split(
    x: Tensor, cu_seqlens: CuSeqlens, rank: int, world: int, *, causal: bool, seq_dim: int = 1
) -> Tensor:
    """This rank's shard of `x` (`[batch, S, …]` along `seq_dim` = 1, or `[S, …]` with seq_dim 0 for
    one sample) under the balanced split: what `ring_attention(…, split="balanced")` expects. Tokens,
    labels, loss masks and position ids must all be cut with it."""
    seq_dim = seq_dim % x.dim()
    if seq_dim == 0:
        return balanced_split(x.unsqueeze(0), cu_seqlens, rank, world, causal=causal)[0]
    if seq_dim != 1:
        raise AttentionError(f"balanced_split cuts dim 0 or 1, not {seq_dim}", where="balanced split")
    b, s = x.shape[:2]
    if s % world:
        raise AttentionError(
            f"sequence length {s} does not split into {world} equal shards",
            where="balanced split",
            fix=f"use a sequence length that is a multiple of CP = {world}",
        )
    index = balanced_index(cu_seqlens, b, s, rank, world, causal).to(x.device)
    return x.gather(1, index.view(b, -1, *([1] * (x.dim() - 2))).expand(b, -1, *x.shape[2:]))


def balanced_gather(shards: Sequence[Tensor], cu_seqlens: CuSeqlens, *, causal: bool) -> Tensor:
    """Inverse of `balanced_split` (seq dim 1): the full `[batch, S, …]` from every rank's shard."""
    world = len(shards)
    b, local = shards[0].shape[:2]
    out = shards[0].new_empty(b, local * world, *shards[0].shape[2:])
    for rank, shard in enumerate(shards):
        index = balanced_index(cu_seqlens, b, local * world, rank, world, causal).to(shard.device)
        out.scatter_(1, index.view(b, -1, *([1] * (shard.dim() - 2))).expand_as(shard), shard)
    return out
