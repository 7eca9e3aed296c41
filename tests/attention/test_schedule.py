"""The streamed ring's schedule (pieces, slots, messages) and the piece-size rule."""

from __future__ import annotations

import itertools

import pytest
import torch

from longctx.attention.blocks import (
    Block,
    plan_pairs,
    query_tiles,
    ring_plan,
    ring_schedule,
    ring_slot_count,
    split_range,
)
from longctx.attention.ring import PIECE_ENV, ring_piece, ring_query_tile
from longctx.errors import AttentionError

SHAPES = [
    (w, c, local, p)
    for w in (2, 3, 4)
    for c in (True, False)
    for local in (6, 14, 30)
    for p in (1, 2, 4, 5, 64)
]


def test_split_range_is_near_equal_and_covers():
    assert split_range(0, 10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert split_range(5, 7, 4) == [(5, 5), (5, 6), (6, 6), (6, 7)]
    for n, parts in ((17, 5), (3, 3), (0, 2)):
        ranges = split_range(0, n, parts)
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


@pytest.mark.parametrize(("world", "causal", "local", "piece"), SHAPES)
def test_schedule_covers_every_pair_once_and_both_sides_agree(world, causal, local, piece):
    seq = world * local
    total = seq * (seq + 1) // 2 if causal else seq * seq
    schedules = [ring_schedule(r, world, local, causal, piece) for r in range(world)]
    pairs = 0
    for rank, slots in enumerate(schedules):
        own = ring_plan(rank, world, local, causal)[0]
        pairs += own.pairs + plan_pairs([s.block for s in slots])
        # every rank walks the same number of slots: M per remote step
        assert len(slots) == (world - 1) * ring_slot_count(local, causal, piece)
        for i, slot in enumerate(slots):
            # the rank that computes with our rows sees the same slot from the other side
            other = schedules[slot.dst][i]
            assert other.src == rank and other.step == slot.step
            assert other.recv_kv == slot.send_kv
            assert other.block == slot.dst_block
            # a piece never exceeds the piece size, and the block's keys are exactly the piece
            if slot.recv_kv is not None:
                a, b = slot.recv_kv
                assert 0 < b - a <= piece and (slot.block.k_start, slot.block.k_stop) == (a, b)
    assert pairs == total


@pytest.mark.parametrize("world", [2, 3, 4])
def test_slots_carry_equal_work_on_every_rank(world):
    # when pieces divide the half chunk, slot s costs the same on every rank (ranks advance in step)
    local, piece = 48, 6
    for causal in (True, False):
        per_rank = [
            [s.block.pairs for s in ring_schedule(r, world, local, causal, piece)] for r in range(world)
        ]
        assert all(row == per_rank[0] for row in per_rank)


def test_a_piece_spans_its_slots_and_is_released_after_the_last():
    # rank 1 at CP 2 sees the first half of rank 0's chunk: each piece over two query halves
    slots = ring_schedule(1, 2, 12, True, 2)
    assert [s.recv_kv for s in slots] == [(0, 2), None, (2, 4), None, (4, 6), None]
    assert [s.piece_done for s in slots] == [False, True] * 3
    assert [(s.block.q_start, s.block.q_stop) for s in slots[:2]] == [(0, 6), (6, 12)]
    # rank 0 sees all of rank 1's chunk against its second half: one piece per slot
    slots = ring_schedule(0, 2, 12, True, 2)
    assert [s.recv_kv for s in slots] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    assert all(s.piece_done and (s.block.q_start, s.block.q_stop) == (6, 12) for s in slots)


def test_query_tiles():
    slot = ring_schedule(0, 2, 12, True, 2)[0]
    assert query_tiles(slot.block, 4) == [(6, 9), (9, 12)]
    assert query_tiles(slot.block, 100) == [(6, 12)]
    # causal 8K at CP 2: 2048 queries per slot, tiles of 3 pieces would be 683 < 768 → 2 calls
    block = Block(1, 0, 2048, 4096, 0, 256, False)
    assert query_tiles(block, *ring_query_tile(256)) == [(2048, 3072), (3072, 4096)]
    # 16K: 4096 queries, 3 calls of 3 pieces (1365 rows) hold less than 2 of 4 pieces
    wide = Block(1, 0, 4096, 8192, 0, 512, False)
    assert query_tiles(wide, *ring_query_tile(512)) == [(4096, 5461), (5461, 6826), (6826, 8192)]
    assert query_tiles(block, 4096) == [(2048, 4096)]
    assert query_tiles(Block(1, 0, 0, 500, 0, 2, False), 100, least=768) == [
        (0, 500)
    ]  # short block: one call
    assert query_tiles(Block(1, 0, 0, 5, 0, 2, False), 2) == [(0, 1), (1, 3), (3, 5)]
    assert query_tiles(Block(1, 0, 3, 3, 0, 2, False), 4) == []  # nothing to compute, no call


def test_piece_rule():
    # L/16 rounded up to 64, at least 256 on CPU and 1024 on CUDA
    assert ring_piece(4096) == 256  # S = 8K at CP 2
    assert ring_piece(8192) == 512  # S = 16K at CP 2
    assert ring_piece(100) == 256
    assert ring_piece(65536) == 4096
    assert ring_piece(5000) == 320
    assert ring_piece(4096, device=torch.device("cuda")) == 1024
    assert ring_piece(4096, 100) == 100
    assert ring_query_tile(256) == (768, 768)
    assert ring_query_tile(512) == (1536, 768)  # the CPU kernel's fast path needs ≥ 768 queries


def test_piece_from_environment(monkeypatch):
    monkeypatch.setenv(PIECE_ENV, "384")
    assert ring_piece(4096) == 384
    assert ring_piece(4096, 128) == 128  # the argument wins
    monkeypatch.setenv(PIECE_ENV, "lots")
    with pytest.raises(AttentionError, match="ring piece size 'lots' is not an integer") as info:
        ring_piece(4096)
    assert info.value.where == f"${PIECE_ENV}"
    monkeypatch.setenv(PIECE_ENV, "0")
    with pytest.raises(AttentionError, match="positive number of keys, got 0"):
        ring_piece(4096)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_piece_argument_is_refused(bad):
    from longctx.attention import ring_attention

    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(AttentionError, match=f"positive number of keys, got {bad!r}") as info:
        ring_attention(q, q, q, group=None, piece=bad)
    assert info.value.where == "piece argument"
