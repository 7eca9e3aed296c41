"""suggest: every method per length, the recommendation rule."""

from __future__ import annotations

import pytest

from longctx.errors import RopeError
from longctx.rope import BASE_METHODS, SCALING_METHODS, suggest


def test_baby_9b_dense_stages() -> None:
    # base 100,000 at 4K, rotary dim 128, the 16K/64K/128K stages
    result = suggest(
        rotary_dim=128, pretrain_base=100_000, pretrain_length=4_096, lengths=[131_072, 16_384, 65_536]
    )
    assert [s.length for s in result.lengths] == [16_384, 65_536, 131_072]
    assert result.recommended == {16_384: 1_200_000, 65_536: 8_400_000, 131_072: 31_000_000}
    for row in result.lengths:
        assert [c.method for c in row.choices] == list(BASE_METHODS)
        assert row.recommended_by == "men-safe"
        assert row.choice("fixed").base == 100_000
        assert row.choice("abf").base == 500_000
        for c in row.choices:
            assert c.diagnostics is not None and c.diagnostics.men_bound == row.men_bound
    last = result.lengths[-1]
    assert (last.men_bound, last.men_paper, round(last.men_fit or 0)) == (4_870_010, 7_800_000, 9_092_264)
    # the OpenEuroLLM schedule's 5e6 at 128K is barely above the exact bound, 1e6 at 32K-64K below it
    assert last.choice("men").base == 4_870_010


def test_recommendation_never_goes_down() -> None:
    # a pretraining base above men-safe at the first length is kept
    result = suggest(rotary_dim=128, pretrain_base=2_000_000, pretrain_length=4_096, lengths=[16_384, 65_536])
    assert result.recommended == {16_384: 2_000_000, 65_536: 8_400_000}
    assert [s.recommended_by for s in result.lengths] == ["pretraining base", "men-safe"]


def test_other_rotary_dims_use_the_exact_search() -> None:
    result = suggest(rotary_dim=64, pretrain_base=10_000, pretrain_length=4_096, lengths=[16_384])
    row = result.lengths[0]
    assert row.men_paper is None and row.men_fit is None
    assert row.men_bound == 1_528_450
    assert row.recommended == 6_100_000  # 4 × 1,528,450 → two significant digits


def test_scaling_methods_can_be_listed() -> None:
    result = suggest(
        rotary_dim=128,
        pretrain_base=10_000,
        pretrain_length=4_096,
        lengths=[16_384],
        methods=BASE_METHODS + SCALING_METHODS,
    )
    assert [c.method for c in result.lengths[0].choices][-3:] == ["yarn", "llama3", "linear"]
    assert result.recommended == {16_384: 1_200_000}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(lengths=[]), "no target lengths given"),
        (dict(lengths=[2_048]), "target length 2,048 is shorter than the pretraining length 4,096"),
        (dict(methods=["men", "magic"]), "unknown RoPE method 'magic'"),
        (dict(rotary_dim=100 + 1), "rotary dim must be even"),
    ],
)
def test_bad_inputs(kwargs: dict, message: str) -> None:
    args = dict(rotary_dim=128, pretrain_base=10_000, pretrain_length=4_096, lengths=[16_384])
    args.update(kwargs)
    with pytest.raises(RopeError, match=message):
        suggest(**args)
