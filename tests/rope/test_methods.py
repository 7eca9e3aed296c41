"""choose_base per method, the registry, and each bad input with its message."""

from __future__ import annotations

import pytest

from longctx.errors import RopeError
from longctx.report import to_jsonable
from longctx.rope import BASE_METHODS, METHODS, SCALING_METHODS, choose_base, validate_method

LLAMA = dict(rotary_dim=128, pretrain_base=10_000, pretrain_length=4_096)
BABY = dict(rotary_dim=128, pretrain_base=100_000, pretrain_length=4_096)


def test_method_names() -> None:
    assert BASE_METHODS == ("fixed", "abf", "men", "men-safe", "liu", "ntk")
    assert SCALING_METHODS == ("yarn", "llama3", "linear")
    assert set(METHODS) == set(BASE_METHODS) | set(SCALING_METHODS)


@pytest.mark.parametrize(
    ("target", "base"), [(16_384, 1_200_000), (65_536, 8_400_000), (131_072, 31_000_000)]
)
def test_men_safe_from_the_paper_table(target: int, base: int) -> None:
    choice = choose_base("men-safe", target_length=target, **BABY)
    assert choice.base == base
    assert "paper table" in choice.explanation and "two significant digits" in choice.explanation
    assert choice.diagnostics is not None and choice.diagnostics.passes_bound
    assert not choice.findings.warnings


def test_men_safe_falls_back_to_fit_then_exact() -> None:
    fit = choose_base("men-safe", target_length=100_000, **LLAMA)
    assert "paper fit" in fit.explanation
    other_dim = choose_base(
        "men-safe", target_length=16_384, rotary_dim=64, pretrain_base=10_000, pretrain_length=4096
    )
    assert "exact search" in other_dim.explanation
    exact = choose_base("men-safe", target_length=131_072, source="exact", **LLAMA)
    assert exact.base == 19_000_000  # 4 × 4,870,010 → two significant digits
    assert choose_base("men-safe", target_length=131_072, factor=2, **LLAMA).base == 16_000_000


def test_men_sources() -> None:
    exact = choose_base("men", target_length=16_384, **LLAMA)
    assert exact.base == 234_132 and exact.params == {"source": "exact"}
    assert "not monotone" in exact.explanation and "1.002^k" in exact.explanation
    assert "paper table 310,000" in exact.explanation
    assert choose_base("men", target_length=16_384, source="table", **LLAMA).base == 310_000
    assert choose_base("men", target_length=16_384, source="fit", **LLAMA).base == 307_923  # ceil(307,922.57)


def test_lower_bounds_keep_a_larger_pretraining_base() -> None:
    choice = choose_base(
        "men", target_length=16_384, rotary_dim=128, pretrain_base=1_000_000, pretrain_length=4096
    )
    assert choice.base == 1_000_000 and "already above it" in choice.explanation
    liu = choose_base("liu", target_length=4_096, **LLAMA)  # (T/2π)^(128/92) = 8,229.6 < 10,000
    assert liu.base == 10_000 and liu.exact == pytest.approx(8_229.6, abs=0.05)


@pytest.mark.parametrize(
    ("target", "liu", "ntk"),
    [(16_384, 56_628, 40_890), (65_536, 389_653, 167_199), (131_072, 1_022_122, 338_097)],
)
def test_liu_and_ntk_round_to_integers(target: int, liu: int, ntk: int) -> None:
    a = choose_base("liu", target_length=target, **LLAMA)
    b = choose_base("ntk", target_length=target, **LLAMA)
    assert (a.base, b.base) == (liu, ntk)
    assert "d_extra = 2⌈(d/2)·log_b(T/2π)⌉ = 92" in a.explanation
    # both sit below Men's bound from 16K up: a warning, not an error
    assert "below-men-bound" in a.findings.codes("warning")
    assert "below-men-bound" in b.findings.codes("warning")


def test_ntk_exact_value_and_scale_parameter() -> None:
    choice = choose_base("ntk", target_length=16_384, **LLAMA)
    assert choice.exact == pytest.approx(40_889.94, abs=0.005) and choice.base == 40_890
    assert choose_base("ntk", target_length=16_384, scale=8, **LLAMA).base == 82_685


def test_fixed_and_abf() -> None:
    assert choose_base("fixed", target_length=16_384, base=1_000_000, **LLAMA).base == 1_000_000
    assert choose_base("fixed", target_length=16_384, base="1e6", **LLAMA).base == 1_000_000
    abf = choose_base("abf", target_length=32_768, **LLAMA)
    assert abf.base == 500_000 and "Xiong" in abf.explanation


def test_base_below_pretraining_base_is_a_warning() -> None:
    choice = choose_base("fixed", target_length=16_384, base=50_000, **BABY)
    assert choice.base == 50_000
    [warning] = [f for f in choice.findings if f.code == "base-below-pretrain"]
    assert warning.level == "warning"
    assert "below the pretraining base 100,000" in warning.message
    choice.findings.escalate_warnings(["base-below-pretrain"])
    assert not choice.findings.ok


def test_dip_above_the_bound_is_info() -> None:
    # Qwen: 1e6 at 32K is above the bound but dips to −0.78
    choice = choose_base("fixed", target_length=32_768, base=1_000_000, **LLAMA)
    assert choice.findings.codes() == ["cos-sum-dip"] and choice.findings.ok


def test_scaling_methods() -> None:
    yarn = choose_base(
        "yarn", rotary_dim=128, pretrain_base=1_000_000, pretrain_length=32_768, target_length=131_072
    )
    assert yarn.base == 1_000_000 and yarn.scaling is not None
    assert (yarn.scaling.type, yarn.scaling.factor, yarn.scaling.original_length) == ("yarn", 4.0, 32_768)
    assert yarn.scaling.attention_factor() == pytest.approx(1.138629, abs=1e-6)
    assert "below index 23" in yarn.explanation and "above 40" in yarn.explanation
    assert yarn.scaling.hf_rope_scaling()["original_max_position_embeddings"] == 32_768
    llama3 = choose_base(
        "llama3", rotary_dim=128, pretrain_base=500_000, pretrain_length=8_192, target_length=131_072
    )
    assert "(29 frequencies)" in llama3.explanation and "6 blended" in llama3.explanation
    linear = choose_base("linear", target_length=16_384, **LLAMA)
    assert linear.scaling is not None and linear.scaling.factor == 4.0
    d = linear.diagnostics
    assert d is not None and d.scaling == "linear"
    # PI squeezes 16K positions into 4K: the first failing position moves from 1,707 to about 4 × that
    assert d.first_failing_position is not None and 4 * 1_700 < d.first_failing_position < 4 * 1_710


def test_diagnostics_fields_and_json() -> None:
    choice = choose_base("men-safe", target_length=131_072, **BABY)
    d = choice.diagnostics
    assert d is not None
    assert d.men_bound == 4_870_010 and d.men_paper == 7_800_000 and round(d.men_fit) == 9_092_264
    assert d.first_failing_position is None or d.first_failing_position >= 131_072
    assert d.liu_d_extra == 74 and d.cos_sum_at_zero == 64
    data = to_jsonable(choice)
    assert (
        data["base"] == 31_000_000
        and data["diagnostics"]["first_failing_position"] == d.first_failing_position
    )


def test_partial_rotary_uses_the_exact_search() -> None:
    choice = choose_base(
        "men", target_length=131_072, rotary_dim=64, head_dim=128, pretrain_base=10_000, pretrain_length=4_096
    )
    assert choice.base == 10_000  # half rotary never fails: the pretraining base is kept
    with pytest.raises(RopeError, match="for full rotary with rotary dim 128"):
        choose_base(
            "men",
            target_length=16_384,
            rotary_dim=128,
            head_dim=160,
            source="table",
            pretrain_base=1e4,
            pretrain_length=4096,
        )


def test_validate_method_fills_defaults() -> None:
    assert validate_method("men-safe") == {"factor": 4.0, "source": "paper"}
    assert validate_method("abf", {"base": "1e6"}) == {"base": 1_000_000}
    assert validate_method("yarn", {"factor": 4})["beta_fast"] == 32.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(pretrain_base=0), "pretraining base must be a number greater than 1, got 0"),
        (dict(pretrain_base=-10_000), "pretraining base must be a number greater than 1"),
        (dict(pretrain_length=0), "pretraining length must be a positive integer, got 0"),
        (dict(target_length=-1), "target length must be a positive integer, got -1"),
        (dict(target_length=2_048), "target length 2,048 is shorter than the pretraining length 4,096"),
        (dict(rotary_dim=127), r"rotary dim must be even \(RoPE turns pairs of dimensions\), got 127"),
        (dict(rotary_dim=2), "rotary dim must be an even integer of at least 4"),
        (dict(method="rope-magic"), "unknown RoPE method 'rope-magic'"),
        (dict(method="fixed"), "method 'fixed' needs parameter 'base'"),
        (dict(method="fixed", base=0), "base must be greater than 1, got 0"),
        (dict(method="fixed", base=40_889.94), "base must be an integer"),
        (dict(method="men", source="guess"), "source must be one of exact, table, fit, got 'guess'"),
        (dict(method="men", source="table", target_length=100_000), "table has no entry for length 100,000"),
        (dict(method="men-safe", factor=0.5), "factor must be at least 1, got 0.5"),
        (dict(method="ntk", sclae=4), "method 'ntk' has no parameter 'sclae'"),
        (dict(method="liu", pretrain_length=6, target_length=16), "too short for Liu's formula"),
    ],
)
def test_bad_inputs(kwargs: dict, message: str) -> None:
    args = dict(method="men-safe", target_length=16_384, **LLAMA)
    args.update(kwargs)
    with pytest.raises(RopeError, match=message):
        choose_base(args.pop("method"), **args)
