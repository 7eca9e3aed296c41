"""Closed forms: Liu, NTK, YaRN, llama3, Men's table and fit, rounding — against published vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from longctx.rope import formulas
from longctx.rope.cossum import inv_freq

D, T0, B0 = 128, 4_096, 10_000


def test_liu_critical_dimension() -> None:
    assert formulas.liu_d_extra(B0, T0, D) == 92
    assert formulas.liu_extrapolation_bound(B0, 92, D) == pytest.approx(4_711.7, abs=0.05)


def test_liu_ceiling_tolerates_rounding() -> None:
    # (d/2)·log_b(T/2π) exactly 46 up to float noise must stay 46, not become 47.
    b = (T0 / (2 * math.pi)) ** (64 / 46) * (1 - 1e-13)
    assert (D / 2) * math.log(T0 / (2 * math.pi)) / math.log(b) == pytest.approx(46, abs=1e-9)
    assert formulas.liu_d_extra(b, T0, D) == 92


@pytest.mark.parametrize(
    ("target", "liu", "beta0", "ntk"),
    [
        (16_384, 56_627.8, 71_738.4, 40_889.94),
        (32_768, 148_543.6, 192_144.5, 82_684.62),
        (65_536, 389_653.3, 514_640.3, 167_198.74),
        (131_072, 1_022_121.9, 1_378_414.3, 338_096.95),
    ],
)
def test_stage_vectors(target: int, liu: float, beta0: float, ntk: float) -> None:
    assert formulas.liu_base_for(target, 92, D) == pytest.approx(liu, abs=0.05)
    assert formulas.liu_critical_base(B0, T0, target) == pytest.approx(beta0, abs=0.05)
    assert formulas.ntk_base(B0, target / T0, D) == pytest.approx(ntk, abs=0.005)


def test_liu_chaining_keeps_d_extra() -> None:
    # Stage by stage from the rounded Liu base of the previous stage: d_extra stays 92.
    assert formulas.liu_d_extra(56_628, 16_384, D) == 92
    assert formulas.liu_base_for(65_536, formulas.liu_d_extra(56_628, 16_384, D), D) == pytest.approx(
        389_653.3, abs=0.05
    )


@pytest.mark.parametrize(
    ("base", "t_extra"),
    [(5e5, 78_400), (1e6, 129_027), (5e6, 410_265), (8e6, 575_143), (1e7, 675_196), (1.28e8, 4_219_267)],
)
def test_liu_extrapolation_bounds(base: float, t_extra: float) -> None:
    assert formulas.liu_extrapolation_bound(base, 92, D) == pytest.approx(t_extra, rel=2e-5)


def test_ntk_lowest_frequency_is_interpolated_by_exactly_s() -> None:
    b = formulas.ntk_base(B0, 4, D)
    assert inv_freq(b, D)[63] == pytest.approx(inv_freq(B0, D)[63] / 4, rel=1e-12)
    assert inv_freq(b, D)[63] == pytest.approx(2.886955e-05, rel=1e-6)
    # two stages ×2 give the same base as one ×4
    assert formulas.ntk_base(formulas.ntk_base(B0, 2, D), 2, D) == pytest.approx(b, rel=1e-12)


INV_FREQ_AT = [0, 1, 10, 20, 23, 33, 40, 46, 63]


@pytest.mark.parametrize(
    ("freqs", "expected"),
    [
        (
            lambda: inv_freq(1e4, D),
            [
                1,
                8.659644e-01,
                2.371374e-01,
                5.623413e-02,
                3.651741e-02,
                8.659643e-03,
                3.162278e-03,
                1.333521e-03,
                1.154782e-04,
            ],
        ),
        (
            lambda: inv_freq(1e6, D),
            [
                1,
                8.058422e-01,
                1.154782e-01,
                1.333521e-02,
                6.978306e-03,
                8.058422e-04,
                1.778279e-04,
                4.869675e-05,
                1.240938e-06,
            ],
        ),
        (
            lambda: inv_freq(40_889.94, D),
            [
                1,
                8.471172e-01,
                1.902983e-01,
                3.621344e-02,
                2.201407e-02,
                4.189240e-03,
                1.311414e-03,
                4.846193e-04,
                2.886955e-05,
            ],
        ),
        (
            lambda: formulas.yarn_inv_freq(1e4, D, 4, 4096),
            [
                1,
                8.659644e-01,
                2.371374e-01,
                5.623413e-02,
                3.335725e-02,
                5.412277e-03,
                1.337887e-03,
                3.333804e-04,
                2.886955e-05,
            ],
        ),
        (
            lambda: formulas.yarn_inv_freq(1e6, D, 4, 32_768),
            [
                1,
                8.058422e-01,
                1.154782e-01,
                1.333521e-02,
                6.978306e-03,
                4.503236e-04,
                4.445699e-05,
                1.217419e-05,
                3.102344e-07,
            ],
        ),
        (
            lambda: formulas.llama3_inv_freq(5e5, D, 8, 1, 4, 8192),
            [
                1,
                8.146172e-01,
                1.286874e-01,
                1.656044e-02,
                8.952259e-03,
                3.126936e-04,
                3.428102e-05,
                1.001787e-05,
                3.068926e-07,
            ],
        ),
    ],
)
def test_inv_freq_vectors(freqs, expected: list[float]) -> None:
    np.testing.assert_allclose(freqs()[INV_FREQ_AT], expected, rtol=2e-6)


@pytest.mark.parametrize(
    ("d", "base", "original", "low_high"),
    [
        (128, 1e4, 4_096, (20, 46)),
        (128, 1e6, 32_768, (23, 40)),
        (128, 1e6, 4_096, (13, 31)),
        (128, 5e5, 8_192, (18, 35)),
        (64, 1e4, 4_096, (10, 23)),
    ],
)
def test_yarn_correction_range(d: int, base: float, original: int, low_high: tuple[int, int]) -> None:
    assert formulas.yarn_correction_range(d, base, original) == low_high


def test_yarn_correction_dims_and_mscale() -> None:
    assert formulas.yarn_correction_dim(32, 128, 1e4, 4096) == pytest.approx(20.9445, abs=1e-4)
    assert formulas.yarn_correction_dim(1, 128, 1e4, 4096) == pytest.approx(45.0269, abs=1e-4)
    assert formulas.yarn_correction_dim(32, 128, 1e6, 32_768) == pytest.approx(23.5959, abs=1e-4)
    got = [formulas.yarn_mscale(s) for s in (4, 8, 16, 32, 40)]
    np.testing.assert_allclose(got, [1.138629, 1.207944, 1.277259, 1.346574, 1.368888], atol=1e-6)
    assert formulas.yarn_mscale(1) == 1.0


def test_llama3_split() -> None:
    assert formulas.llama3_split(5e5, 128) == (29, 6, 29)


def test_men_table_and_fit() -> None:
    assert [formulas.men_paper(n) for n in (16_384, 65_536, 131_072)] == [310_000, 2_100_000, 7_800_000]
    assert formulas.men_paper(100_000) is None
    fits = [round(formulas.men_fit(n)) for n in (4_096, 16_384, 32_768, 65_536, 131_072)]
    assert fits == [32_232, 307_923, 951_740, 2_941_678, 9_092_264]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.24e6, 1_200_000),
        (8.4e6, 8_400_000),
        (3.12e7, 31_000_000),
        (1.25e6, 1_300_000),
        (936_604, 940_000),
        (99_500, 100_000),
        (7, 7),
    ],
)
def test_round_sig(value: float, expected: int) -> None:
    assert formulas.round_sig(value, 2) == expected
