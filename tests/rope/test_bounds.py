"""RoPE parameters a typo gives, refused with the bound and what the parameter is (no 301-digit flag)."""

from __future__ import annotations

import pytest

from longctx.errors import RopeError
from longctx.rope import choose_base

YARN = dict(rotary_dim=64, head_dim=64, pretrain_base=1_000_000, pretrain_length=4096, with_diagnostics=False)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"factor": 1e300}, "factor must be at most 1024"),
        ({"factor": float("inf")}, "factor must be a finite number"),
        ({"factor": 10**400}, "factor must be a finite number"),  # past float's range: no OverflowError
        ({"factor": True}, "factor must be a finite number, got True"),
        ({"factor": "four"}, "factor must be a number, got 'four'"),
        ({"mscale": -1}, "mscale must be at least 0, got -1"),
        ({"beta_fast": 0}, "beta_fast must be greater than 0, got 0"),
        ({"mscale": 1e300}, "mscale must be at most 100"),
        ({"mscale_all_dim": 1e6}, "mscale_all_dim must be at most 100"),
        ({"beta_fast": 1e9}, "beta_fast must be at most 1024"),
        ({"beta_fast": 1.0, "beta_slow": 32.0}, "the ramp between the kept and the interpolated frequencies"),
        (
            {"original_length": 10**400},
            "original_length must be at most 6.71089e+07, got a 401-digit integer",
        ),
        ({"base": 10**300}, "base must be at most 1e+15"),
    ],
)
def test_yarn_parameters_out_of_range(params: dict, needle: str) -> None:
    with pytest.raises(RopeError, match=needle.replace("(", r"\(").replace("+", r"\+")):
        choose_base("yarn", target_length=16_384, **YARN, **params)


def test_yarn_cannot_shrink() -> None:
    with pytest.raises(RopeError, match=r"factor 0\.5 < 1\): YaRN stretches positions") as err:
        choose_base("yarn", target_length=16_384, original_length=32_768, **YARN)
    assert err.value.fix and "original_length" in err.value.fix
    ok = choose_base("yarn", target_length=16_384, **YARN)
    assert ok.scaling is not None and ok.scaling.factor == 4.0


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("fixed", {"base": 10**300}),
        ("ntk", {"scale": 1e300}),
        ("linear", {"factor": 1e300}),
        ("llama3", {"factor": 1e300}),
        ("men-safe", {"factor": 1e300}),
    ],
)
def test_other_methods_bounded(method: str, params: dict) -> None:
    with pytest.raises(RopeError, match="must be at most"):
        choose_base(method, target_length=16_384, **YARN, **params)


def test_plan_with_a_huge_explicit_base_is_a_plan_error() -> None:
    from pydantic import ValidationError

    from longctx.plan.schema import RopeSpec

    with pytest.raises(ValidationError, match=r"must be at most 10\^15"):
        RopeSpec(base=10**300)
    assert RopeSpec(base=500_000_000).base == 500_000_000
