"""Positions on every CP rank under the document-balanced split, as Megatron-LM's own packed-THD test
checks them (documents [0, 4, 8] at CP 2: rank 0 holds positions 0, 3, 4, 7), with reset_position_ids
on and off; and RoPE taken from those positions."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

from longctx.mcore.cpu import apply_cpu_compat
from longctx.mcore.positions import rotary_angles
from longctx.train.data import micro_batch

EOD = 9


def _sample(tokens: list[int]) -> dict[str, torch.Tensor]:
    t = torch.tensor(tokens)
    return {
        "tokens": t,
        "labels": t.roll(-1),
        "loss_mask": torch.ones(len(t)),
        "position_ids": torch.arange(len(t)),
    }


# two documents of 4 tokens, [0, 4, 8]: each cut into 2·CP = 4 pieces, rank r taking pieces r and 3 − r
DATA = [_sample([1, 2, 3, EOD, 5, 6, 7, EOD])]
WANT = {
    (0, False): [0, 3, 4, 7],
    (1, False): [1, 2, 5, 6],
    (0, True): [0, 3, 0, 3],
    (1, True): [1, 2, 1, 2],
}


@pytest.mark.parametrize("reset", [False, True])
@pytest.mark.parametrize("rank", [0, 1])
def test_positions_of_each_rank(rank: int, reset: bool) -> None:
    b = micro_batch(DATA, [0], rank, 2, documents_eod=EOD, reset_position_ids=reset, split="balanced")
    assert b.position_ids.tolist() == [WANT[rank, reset]]
    # the tokens, labels and loss mask are cut the same way: token at global position g is g + 1
    global_pos = WANT[rank, False]
    assert b.tokens.tolist() == [[DATA[0]["tokens"][g].item() for g in global_pos]]
    assert b.labels.tolist() == [[DATA[0]["labels"][g].item() for g in global_pos]]
    assert b.cu_seqlens.tolist() == [0, 4, 8]  # the full sample's boundaries on every rank


def test_bidirectional_split_is_contiguous_pieces() -> None:
    """Bidirectional work is the same for every token of a document: CP equal pieces, no zigzag."""
    got = [
        micro_batch(DATA, [0], r, 2, documents_eod=EOD, causal=False, split="balanced").position_ids.tolist()
        for r in (0, 1)
    ]
    assert got == [[[0, 1, 4, 5]], [[2, 3, 6, 7]]]


def test_dense_batches_keep_zigzag() -> None:
    b = micro_batch(DATA, [0], 0, 2)
    assert b.position_ids.tolist() == [[0, 1, 6, 7]] and b.cu_seqlens is None


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_from_positions_matches_megatrons_table(interleaved: bool) -> None:
    """The angles built from position ids are megatron-core's table rows at those positions, per sample."""
    apply_cpu_compat()  # megatron-core places the table on the current CUDA device
    rope = RotaryEmbedding(
        kv_channels=16, rotary_percent=1.0, rotary_interleaved=interleaved, rotary_base=10000
    )
    table = rope.get_emb(16)  # [16, 1, 1, 16]
    positions = torch.tensor([[0, 3, 4, 7], [0, 3, 0, 3]])
    angles = rotary_angles(rope, positions)
    assert angles.shape == (4, 2, 1, 16)
    for i in range(2):
        assert torch.equal(angles[:, i, 0], table[positions[i], 0, 0])
