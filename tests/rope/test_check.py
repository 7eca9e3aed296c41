"""`longctx.rope.check`: the verdict of `rope check` (and the option precedence it starts from),
called directly."""

from __future__ import annotations

import pytest

from longctx.errors import RopeError
from longctx.rope import RopeModelArgs
from longctx.rope.check import check_base, resolve_inputs


def test_below_the_bound_is_an_error() -> None:
    result = check_base(1_000_000, 128, 65_536)
    assert not result.passes and not result.ok and result.verdict == "below the bound"
    below = [f for f in result.findings if f.code == "below-men-bound"]
    assert [f.level for f in below] == ["error"]
    assert "below Men's bound 2,091,624 for 65,536 tokens" in below[0].message
    data = result.to_json()
    assert data["ok"] is False and data["first_failing_position"] == 27_115 and data["margin"] < 1


def test_a_dip_above_the_bound_passes() -> None:
    result = check_base(1_000_000, 128, 32_768)
    assert result.passes and result.ok and result.verdict == "passes"
    assert [f.code for f in result.findings] == ["cos-sum-dip", "below-men-safe"]
    assert result.to_json()["men_bound"] == 630_740


def test_below_the_pretraining_base_is_a_warning() -> None:
    result = check_base(50_000, 128, 4096, pretrain_base=100_000, pretrain_length=4096)
    warning = next(f for f in result.findings if f.code == "base-below-pretrain")
    assert warning.level == "warning" and result.ok
    assert result.diagnostics.liu_d_extra == 74


@pytest.mark.parametrize(
    ("base", "length", "message"),
    [(None, 4096, "no base to check"), (10_000, None, "no length to check the base for")],
)
def test_missing_inputs(base: int | None, length: int | None, message: str) -> None:
    with pytest.raises(RopeError, match=message):
        check_base(base, 128, length)


def test_explicit_inputs_beat_the_checkpoint() -> None:
    ck = RopeModelArgs(rotary_dim=16, head_dim=32, base=10_000, length=64, position_embedding_type="rope")
    kw = dict(base_option="--base", length_option="--from-length", need_pretrain=True)
    facts = resolve_inputs(ck, rotary_dim=None, head_dim=None, base=None, length=None, **kw)
    assert (facts.rotary_dim, facts.head_dim, facts.pretrain_base, facts.pretrain_length) == (
        16,
        32,
        10_000,
        64,
    )
    facts = resolve_inputs(ck, rotary_dim=8, head_dim=None, base=500, length=128, **kw)
    # an explicit rotary dim drops the checkpoint's head dim (it described the checkpoint's rotary part)
    assert (facts.rotary_dim, facts.head_dim, facts.pretrain_base, facts.pretrain_length) == (
        8,
        None,
        500,
        128,
    )


def test_inputs_that_are_not_known() -> None:
    kw = dict(base_option="--base", length_option="--from-length")
    with pytest.raises(RopeError, match="the rotary dim is not known"):
        resolve_inputs(None, rotary_dim=None, head_dim=None, base=1, length=1, need_pretrain=False, **kw)
    with pytest.raises(RopeError, match="--base and --from-length not given"):
        resolve_inputs(None, rotary_dim=128, head_dim=None, base=None, length=None, need_pretrain=True, **kw)
    facts = resolve_inputs(
        None, rotary_dim=128, head_dim=None, base=None, length=None, need_pretrain=False, **kw
    )
    assert facts.pretrain_base is None and facts.pretrain_length is None
