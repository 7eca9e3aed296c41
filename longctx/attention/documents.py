"""Document boundaries inside packed sequences: attention stays within each document.

`cu_seqlens` holds the boundaries of the documents in the *full* sequence (before zigzag sharding),
the same on every CP rank: `[0, e_1, …, S]`, or `[0, …, S, …, 2S, …, b·S]` for the samples of a
batch concatenated (each sample its own documents, every multiple of S a boundary). A repeated
boundary is an empty document and is dropped.

How blocks are cut. A rank's shard is chunks r and 2·CP−1−r, concatenated in sequence order, so the
map from local rows to global positions is increasing: the local rows of one document are one
contiguous range, on the query side and on the key side alike. Every block of the ring and the
all-gather plans is either diagonal (the same global positions for queries and keys, causal in local
order) or fully visible (every key before every query, or no causal mask). Restricted to one
document it stays what it was — a diagonal block over the document's rows, or a full rectangle — so
each block becomes one kernel call per document it touches, and a block no document spans on both
sides is skipped. No kernel needs a mask of its own.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.blocks import Block, ring_plan
from longctx.attention.comm import all_gather_dim0, group_rank, group_size
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


def document_blocks(block: Block, q_layout: Layout, k_layout: Layout, bounds: tuple[int, ...]) -> list[Block]:
    """`block` cut at document boundaries: one sub-block per document with both queries and keys in
    the block, diagonal if `block` is, else full (see the module docstring)."""
    q_docs = [_doc_range(bounds, a, b) for a, b in q_layout.spans(block.q_start, block.q_stop)]
    k_docs = [_doc_range(bounds, a, b) for a, b in k_layout.spans(block.k_start, block.k_stop)]
    ranges = sorted(
        (max(a0, b0), min(a1, b1)) for a0, a1 in q_docs for b0, b1 in k_docs if max(a0, b0) < min(a1, b1)
    )
    out: list[Block] = []
    seen = -1
    for i0, i1 in ranges:
        for i in range(max(i0, seen + 1), i1):
            seen = i
            d0, d1 = bounds[i], bounds[i + 1]
            q0 = max(block.q_start, q_layout.rows_before(d0))
            q1 = min(block.q_stop, q_layout.rows_before(d1))
            k0 = max(block.k_start, k_layout.rows_before(d0))
            k1 = min(block.k_stop, k_layout.rows_before(d1))
            if q0 >= q1 or k0 >= k1:
                continue
            if block.causal and q1 - q0 != k1 - k0:
                raise AssertionError(f"diagonal block {block} cut unevenly at document [{d0}, {d1})")
            out.append(Block(block.step, block.src, q0, q1, k0, k1, block.causal))
    return out


def ring_document_pairs(
    rank: int, world: int, local_len: int, causal: bool, bounds: tuple[int, ...]
) -> tuple[int, int]:
    """(query-key pairs, kernel calls) the ring computes on `rank` for one sample with `bounds`."""
    mine = Layout.zigzag(rank, world, local_len)
    pairs = calls = 0
    for block in ring_plan(rank, world, local_len, causal):
        subs = document_blocks(block, mine, Layout.zigzag(block.src, world, local_len), bounds)
        pairs += sum(b.pairs for b in subs)
        calls += len(subs)
    return pairs, calls
