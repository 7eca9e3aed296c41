"""Zigzag sharding: Megatron's layout exactly, inverse gather, positions, block plans' balance."""

from __future__ import annotations

import pytest
import torch

from longctx.attention import zigzag_gather, zigzag_positions, zigzag_split
from longctx.attention.blocks import allgather_plan, contiguous_ring_plan, plan_pairs, ring_plan
from longctx.errors import AttentionError
from tests.attention import cases


def _literal(x: torch.Tensor, rank: int, cp: int, dim: int) -> torch.Tensor:
    # the layout restated: 2·cp equal chunks, rank r keeps chunk r then chunk 2·cp−1−r
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=dim)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
@pytest.mark.parametrize("seq_dim", [0, 1, 2, -2])
def test_split_is_the_literal_layout_and_gather_inverts_it(cp, seq_dim):
    shape = [3, 4, 5, 6]
    shape[seq_dim] = 2 * cp * 3
    x = torch.randn(*shape)
    shards = [zigzag_split(x, r, cp, seq_dim) for r in range(cp)]
    for r, shard in enumerate(shards):
        assert torch.equal(shard, _literal(x, r, cp, seq_dim) if cp > 1 else x)
    assert torch.equal(zigzag_gather(shards, seq_dim), x)


def test_positions_are_global():
    assert zigzag_positions(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert zigzag_positions(12, 0, 3).tolist() == [0, 1, 10, 11]
    assert zigzag_positions(7, 0, 1).tolist() == list(range(7))


def test_length_not_divisible_by_two_cp_names_the_numbers():
    with pytest.raises(AttentionError, match=r"sequence length 10 is not divisible by 2·CP = 4 \(CP = 2\)"):
        zigzag_split(torch.zeros(1, 10), 0, 2)
    with pytest.raises(AttentionError, match=r"CP rank 2 is outside 0\.\.1"):
        zigzag_split(torch.zeros(1, 8), 2, 2)
    with pytest.raises(AttentionError, match="shards differ in shape"):
        zigzag_gather([torch.zeros(1, 4), torch.zeros(1, 6)])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_split_equals_megatron_get_batch_on_this_cp_rank(cp_pool, world):
    assert all(cp_pool.run(cases.megatron_batch_case, world, seq=2 * world * 5))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_plans_cover_every_visible_pair_once(world, causal):
    seq = 2 * world * 6
    local = seq // world
    total = seq * (seq + 1) // 2 if causal else seq * seq
    ring = [plan_pairs(ring_plan(r, world, local, causal)) for r in range(world)]
    gathered = [plan_pairs(allgather_plan(r, world, local, causal)) for r in range(world)]
    assert sum(ring) == total
    assert sum(gathered) == total
    # zigzag gives every rank exactly the same work
    assert len(set(ring)) == 1
    assert len(set(gathered)) == 1


def test_contiguous_split_is_unbalanced():
    world, local = 4, 64
    pairs = [plan_pairs(contiguous_ring_plan(r, world, local, True)) for r in range(world)]
    assert sum(pairs) == (world * local) * (world * local + 1) // 2
    assert max(pairs) / min(pairs) > 6
