"""Greedy decoding of corrupted positions, most confident first (`longctx.eval.unmask`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch

from longctx.eval.unmask import fix_confident, infill_batched

VOCAB, MASK = 20, 20


@dataclasses.dataclass(frozen=True)
class _Item:
    tokens: list[int]
    where: list[int]

    @property
    def length(self) -> int:
        return len(self.tokens)


def _chain_oracle(items: Sequence[_Item], forwards: list[int]):
    """Knows a position's token once the position before it (in `where` order) is decoded, and the
    first one always: one forward cannot infill more than the first digit, decoding in turn can."""

    def infill(tokens: torch.Tensor, positions: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        forwards.append(len(positions))
        out = []
        for row, want in zip(tokens, positions, strict=True):
            it = next(it for it in items if it.where == want.tolist())
            lp = torch.full((len(want), VOCAB), 0.0)  # uniform: unsure
            for j, p in enumerate(it.where):
                if j == 0 or int(row[it.where[j - 1]]) != MASK:
                    lp[j] = -30.0
                    lp[j, it.tokens[p]] = 0.0
            out.append(lp.log_softmax(-1))
        return out

    return infill


def _items() -> list[_Item]:
    return [_Item(tokens=[(3 * i + k) % VOCAB for k in range(12)], where=[4, 5, 6, 7 + i]) for i in range(3)]


@pytest.mark.parametrize("threshold", [1.0, 0.9])
def test_decoding_in_turn_infills_what_one_forward_cannot(threshold: float) -> None:
    items, forwards = _items(), []
    done = infill_batched(
        items,
        _chain_oracle(items, forwards),
        positions=lambda it: it.where,
        noise_key=lambda it: str(it.tokens),
        tag="t",
        kind="mdm",
        mask_id=MASK,
        vocab_size=VOCAB,
        seed=0,
        threshold=threshold,
        batch_size=2,
    )
    for it, d in zip(items, done, strict=True):
        assert d.tokens == [it.tokens[p] for p in it.where]
        one_forward = d.logprobs.argmax(-1).tolist()
        assert one_forward[0] == it.tokens[it.where[0]] and one_forward[1:] != d.tokens[1:]
    # a chunk of 2 items, then 1: four rounds each (one sure digit a round), all rows of a chunk together
    assert forwards == [2] * 4 + [1] * 4


def test_a_round_fixes_every_sure_digit_and_the_surest_one_in_any_case() -> None:
    lp = torch.log(
        torch.tensor([[0.5, 0.5, 0.0], [0.95, 0.05, 0.0], [0.2, 0.1, 0.7], [0.0, 0.99, 0.01]]) + 1e-12
    )
    assert fix_confident(lp, [0, 1, 2, 3], 0.9) == [(1, 0), (3, 1)]
    assert fix_confident(lp, [0, 1, 2, 3], 1.0) == [(3, 1)]
    assert fix_confident(lp, [0, 2], 0.9) == [(2, 2)], "none sure: the surest alone"


def test_a_threshold_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        infill_batched(
            [],
            lambda t, p: [],
            positions=lambda it: [],
            noise_key=str,
            tag="t",
            kind="mdm",
            mask_id=MASK,
            vocab_size=VOCAB,
            seed=0,
            threshold=0.0,
        )


def test_uniform_noise_keeps_its_drawn_tokens_until_fixed() -> None:
    items, seen = _items()[:1], []

    def infill(tokens: torch.Tensor, positions: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        seen.append(tokens.clone())
        lp = torch.full((len(positions[0]), VOCAB), -30.0)
        lp[0, 7] = 0.0  # sure of the first digit only; unsure of the rest, which stay as drawn
        lp[1:] = 0.0
        return [lp.log_softmax(-1)]

    done = infill_batched(
        items,
        infill,
        positions=lambda it: it.where,
        noise_key=lambda it: "k",
        tag="t",
        kind="udm",
        mask_id=None,
        vocab_size=VOCAB,
        seed=3,
        threshold=0.9,
    )
    where = items[0].where
    drawn = [int(seen[0][0, p]) for p in where]
    assert [int(seen[1][0, p]) for p in where] == [7, *drawn[1:]]
    assert done[0].tokens[0] == 7 and len(seen) == len(where)
