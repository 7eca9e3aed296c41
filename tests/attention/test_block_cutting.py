"""The block cutting within documents, as a property: for random document layouts, CP 1–4, both
splits, causal and bidirectional, the sub-blocks every rank executes — in the ring (its own chunk and
every slot of the remote steps) and in the all-gather plan — score each query against exactly the
keys of its document it may see (key position ≤ query position when causal), each pair once over all
ranks, and nothing else. Diagonal sub-blocks hold the same global positions on both sides (causal in
local order is causal in sequence order); a rank expects sums back for a slot exactly when the rank it
sends to computes something with its rows there.

Plans only, no kernels and no processes: a few hundred layouts run in seconds."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longctx.attention.allgather import _document_plan
from longctx.attention.blocks import Block
from longctx.attention.documents import Documents, rank_layouts
from longctx.attention.ring import _plan


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, tuple[int, ...], str, bool, int]:
    world = draw(st.integers(1, 4))
    seq = 2 * world * draw(st.integers(1, 6))  # a multiple of 2·CP: zigzag's chunks, and CP's
    inner = draw(st.sets(st.integers(1, seq - 1), max_size=seq - 1)) if seq > 1 else set()
    bounds = (0, *sorted(inner), seq)
    split = draw(st.sampled_from(["zigzag", "balanced"]))
    causal = draw(st.booleans())
    piece = draw(st.integers(1, seq // world))  # keys per K/V message: one slot or many
    return world, seq, bounds, split, causal, piece


def _visible(bounds: tuple[int, ...], causal: bool) -> np.ndarray:
    seq = bounds[-1]
    doc = np.searchsorted(np.asarray(bounds), np.arange(seq), side="right")
    mask = doc[:, None] == doc[None, :]
    return mask & np.tri(seq, dtype=bool) if causal else mask


def _score(counts: np.ndarray, sub: Block, qpos: np.ndarray, kpos: np.ndarray, where: str) -> None:
    """Add the pairs `sub` scores to `counts` [query position, key position]."""
    assert 0 <= sub.q_start < sub.q_stop <= len(qpos) and 0 <= sub.k_start < sub.k_stop <= len(kpos), where
    q, k = qpos[sub.q], kpos[sub.k]
    if sub.causal:  # a diagonal: query i sees keys 0..i of the block, in local order
        assert np.array_equal(q, k), f"{where}: diagonal over different positions {q} / {k}"
        rows, cols = np.tril_indices(len(q))
        np.add.at(counts, (q[rows], k[cols]), 1)
    else:
        np.add.at(counts, (np.repeat(q, len(k)), np.tile(k, len(q))), 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_every_query_scores_exactly_the_keys_it_sees(case: tuple[int, int, tuple[int, ...], str, bool, int]):
    world, seq, bounds, split, causal, piece = case
    local = seq // world
    docs = Documents(seq, ((0, 1, bounds),))
    pos = [lay.positions().numpy() for lay in rank_layouts(docs, world, local, split, causal)[0]]
    want = _visible(bounds, causal).astype(np.int64)
    # every position on exactly one rank
    assert sorted(np.concatenate(pos).tolist()) == list(range(seq))

    ring = np.zeros((seq, seq), dtype=np.int64)
    plans = [_plan(r, world, local, causal, piece, docs, split) for r in range(world)]
    for r, plan in enumerate(plans):
        for _, sub in plan.own:
            _score(ring, sub, pos[r], pos[r], f"rank {r} own")
        for s, (slot, cuts) in enumerate(zip(plan.slots, plan.cuts, strict=True)):
            for _, sub in cuts:
                # keys of the piece at hand
                assert slot.block.k_start <= sub.k_start and sub.k_stop <= slot.block.k_stop
                _score(ring, sub, pos[r], pos[slot.src], f"rank {r} slot {s} from {slot.src}")
            # sums come back for slot s exactly when dst computes with this rank's rows in its slot s
            dst = plans[slot.dst]
            assert dst.slots[s].src == r
            assert plan.expect[s] == bool(dst.cuts[s]), (r, s)
    np.testing.assert_array_equal(ring, want, err_msg=f"ring {case}")

    gathered = np.zeros((seq, seq), dtype=np.int64)
    natural = np.arange(seq)
    for r in range(world):
        blocks, _ = _document_plan(r, world, local, causal, docs, split)
        for _, sub in blocks:
            _score(gathered, sub, pos[r], natural, f"all-gather rank {r}")
    np.testing.assert_array_equal(gathered, want, err_msg=f"all-gather {case}")
