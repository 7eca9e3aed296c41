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
from longctx.attention.layout import Layout, cut_block
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
