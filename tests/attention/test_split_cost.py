"""The CP split cost model: it prices the calls the ring makes, and the trainer's split follows it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from longctx.attention.blocks import query_tiles, whole_pieces
from longctx.attention.documents import Documents, balanced_split, ring_document_pairs
from longctx.attention.ring import FORWARD_PIECES, rank_work, ring_piece, ring_query_tile
from longctx.attention.split_cost import (
    CPU_FLASH_COST,
    MARGIN,
    CallCost,
    KernelCost,
    choose_split,
    rank_seconds,
    split_seconds,
)
from longctx.attention.zigzag import zigzag_split
from longctx.bench.attention import document_lengths, long_tail_lengths
from longctx.train.data import micro_batch

CALLS_ONLY = KernelCost("calls", CallCost(1.0, 0.0, 0.0, 0.0, 0.0), CallCost(1.0, 0.0, 0.0, 0.0, 0.0))


def _bounds(lengths: list[int]) -> tuple[int, ...]:
    return (0, *itertools.accumulate(lengths))


def _docs(bounds: tuple[int, ...]) -> Documents:
    return Documents(bounds[-1], ((0, 1, bounds),))


def test_needed_rows_travel_in_whole_pieces() -> None:
    assert whole_pieces(10, 300, 128, 4) == [(10, 138), (138, 266), (266, 300), (300, 300)]
    assert whole_pieces(5, 5, 64, 2) == [(5, 5), (5, 5)]
    with pytest.raises(ValueError, match="do not fit"):
        whole_pieces(0, 300, 64, 4)


def test_the_model_prices_every_call_the_ring_makes() -> None:
    """With a cost of one second per call and nothing else, a rank's modelled time is its number of calls:
    one forward call per sub-block of the forward pieces, one backward call per query tile."""
    bounds = _bounds(document_lengths(16384, 0.10, 4096))
    docs, world = _docs(bounds), 8
    local = 16384 // world
    piece = ring_piece(local)
    for rank in range(world):
        own, remote = rank_work(rank, world, local, True, piece * FORWARD_PIECES, docs, "balanced")
        forward = sum(1 for _, b in own + remote if b.pairs)
        own, remote = rank_work(rank, world, local, True, piece, docs, "balanced")
        backward = sum(1 for _, b in own if b.pairs)
        backward += sum(len(query_tiles(b, *ring_query_tile(piece))) for _, b in remote if b.pairs)
        assert rank_seconds(rank, world, local, True, docs, "balanced", CALLS_ONLY) == forward + backward


def test_the_balanced_split_is_chosen_where_zigzag_leaves_ranks_uneven() -> None:
    """The long-tailed mix of the 64K stage's tiers: zigzag's busiest rank does 1.7× the mean work."""
    bounds = _bounds(long_tail_lengths(65536))
    docs = _docs(bounds)
    zigzag = split_seconds(docs, 8, True, "zigzag", CPU_FLASH_COST)
    balanced = split_seconds(docs, 8, True, "balanced", CPU_FLASH_COST)
    assert balanced < 0.7 * zigzag
    assert choose_split(bounds, batch=1, seq_len=65536, world=8, causal=True) == "balanced"


def test_calls_count_not_flops_alone() -> None:
    """At 16K with CP 8 and 10 % short documents the balanced split evens the FLOPs (1.001 vs zigzag's
    1.098) with more calls. Where calls cost more than that balance wins, the choice is zigzag."""
    bounds = _bounds(document_lengths(16384, 0.10, 4096))
    pairs = {
        split: max(ring_document_pairs(r, 8, 2048, True, bounds, split)[0] for r in range(8))
        for split in ("zigzag", "balanced")
    }
    assert pairs["balanced"] < 0.95 * pairs["zigzag"]  # FLOPs alone would take the balanced split
    costly_calls = replace(
        CPU_FLASH_COST,
        forward=replace(CPU_FLASH_COST.forward, call_s=0.01),
        backward=replace(CPU_FLASH_COST.backward, call_s=0.01),
    )
    assert choose_split(bounds, batch=1, seq_len=16384, world=8, causal=True, cost=costly_calls) == "zigzag"
    docs = _docs(bounds)
    z, b = (split_seconds(docs, 8, True, s, CPU_FLASH_COST) for s in ("zigzag", "balanced"))
    expected = "balanced" if b < z * (1 - MARGIN) else "zigzag"
    assert choose_split(bounds, batch=1, seq_len=16384, world=8, causal=True) == expected


def test_one_rank_or_one_document_keeps_zigzag() -> None:
    assert choose_split((0, 4096), batch=1, seq_len=4096, world=4, causal=True) == "zigzag"
    assert choose_split((0, 100, 4096), batch=1, seq_len=4096, world=1, causal=True) == "zigzag"


class _Windows(torch.utils.data.Dataset):
    """Two windows, each of documents of the given lengths (EOD = 0 closes each; the second rolled by 7)."""

    def __init__(self, lengths: list[int]) -> None:
        self.tokens = torch.cat(
            [torch.cat([torch.arange(1, n), torch.zeros(1, dtype=torch.long)]) for n in lengths]
        )

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        t = self.tokens.roll(i * 7)
        n = len(t)
        return {
            "tokens": t,
            "labels": t.roll(-1),
            "loss_mask": torch.ones(n),
            "position_ids": torch.arange(n),
        }


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [([64], "zigzag"), ([3072, 512, 256, 256], "balanced")],
)
def test_the_loader_cuts_the_shards_with_the_split_attention_reads(lengths: list[int], expected: str) -> None:
    """The data loader cuts each micro batch with the model's choice and records it for attention: a tiny
    window keeps zigzag (the balance would save less than the calls cost), a long document beside short
    ones takes the balanced split."""
    ds = _Windows(lengths)
    whole = micro_batch(ds, [0, 1], 0, 1, documents_eod=0)
    assert whole.cu_seqlens is not None
    seq = sum(lengths)
    assert (
        choose_split(tuple(whole.cu_seqlens.tolist()), batch=2, seq_len=seq, world=4, causal=True) == expected
    )
    for rank in range(4):
        mine = micro_batch(ds, [0, 1], rank, 4, documents_eod=0)
        assert mine.split == expected
        if expected == "balanced":
            want = balanced_split(whole.tokens, whole.cu_seqlens, rank, 4, causal=True)
        else:
            want = zigzag_split(whole.tokens, rank, 4, seq_dim=1)
        assert torch.equal(mine.tokens, want)
