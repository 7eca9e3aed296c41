"""The cos-sum engine: Men et al.'s test vectors, the block evaluator against the definition, the search."""

from __future__ import annotations

import numpy as np
import pytest

from longctx.errors import RopeError
from longctx.rope import cossum
from longctx.rope.cossum import (
    cos_sum_direct,
    cos_sum_scan,
    first_failing_position,
    grid_bases,
    grid_index,
    inv_freq,
    men_exact_bound,
)

# L_max(b) = first m with Σ_i cos(m·b^(−2i/d)) < 0, d = 128, cap 300 000 (float64, unrounded bases).
FIRST_FAILING = {
    10_000: 1_707,
    40_889.94: 4_067,
    56_627.8: 4_676,
    71_738.4: 7_231,
    82_684.62: 5_732,
    100_000: 7_757,
    167_198.74: 7_920,
    338_096.95: 10_629,
    389_653.3: 13_871,
    500_000: 18_438,
    514_640.3: 16_672,
    1_000_000: 27_115,
    1_022_121.9: 28_566,
    1_378_414.3: 31_991,
    1_500_000: 33_769,
    2_101_024: 77_060,
    4_871_608: 158_357,
    5_000_000: 82_999,
    7_800_000: 128_915,
    8_000_000: 61_936,
    10_000_000: 144_660,
}


@pytest.mark.parametrize(("base", "expected"), sorted(FIRST_FAILING.items()))
def test_first_failing_position_vectors(base: float, expected: int) -> None:
    assert first_failing_position(base, 128, 300_000) == expected


def test_first_failing_position_matches_definition_around_it() -> None:
    theta = inv_freq(1_000_000, 128)
    values = cos_sum_direct(theta, np.arange(27_115 + 1))
    assert (values[:-1] >= 0).all() and values[-1] < 0


def test_none_below_cap_and_cap_is_exclusive() -> None:
    assert first_failing_position(10_000, 128, 1_707) is None
    assert first_failing_position(10_000, 128, 1_708) == 1_707
    assert first_failing_position(1e9, 128, 50_000) is None


def test_min_cos_sum_vectors() -> None:
    scan = cos_sum_scan(234_151, 128, 16_384)
    assert scan.minimum == pytest.approx(0.3226, abs=5e-5)
    assert scan.argmin == 15_806 and scan.first_negative is None
    scan = cos_sum_scan(4_871_608, 128, 131_072)
    assert scan.minimum == pytest.approx(1.0731, abs=5e-5)
    assert scan.argmin == 124_869


def test_published_dips() -> None:
    # ProLong 8e6 at 64K dips to −0.03, Qwen 1e6 at 32K to −0.78, the paper's 7.8e6 at 128K to −1.02.
    assert cos_sum_scan(8_000_000, 128, 65_536).minimum == pytest.approx(-0.03, abs=0.005)
    assert cos_sum_scan(1_000_000, 128, 32_768).minimum == pytest.approx(-0.78, abs=0.005)
    assert cos_sum_scan(7_800_000, 128, 131_072).minimum == pytest.approx(-1.02, abs=0.005)


@pytest.mark.parametrize("base", [3_000.0, 123_456.0, 7.7e6])
@pytest.mark.parametrize("rotary_dim", [64, 128])
def test_block_evaluator_equals_definition(base: float, rotary_dim: int) -> None:
    length = 20_000
    fast = cossum.cos_sum_curve(base, rotary_dim, length)
    slow = cos_sum_direct(inv_freq(base, rotary_dim), np.arange(length))
    np.testing.assert_allclose(fast, slow, atol=1e-10, rtol=0)


def test_partial_rotary_adds_one_per_unrotated_pair() -> None:
    full = cossum.cos_sum(500_000, 96, np.arange(100))
    partial = cossum.cos_sum(500_000, 96, np.arange(100), head_dim=128)
    np.testing.assert_allclose(partial - full, 16.0)
    # Half rotary can never fail (Su): Σ_{i<d/4}(1 + cos) ≥ 0.
    assert men_exact_bound(131_072, 64, head_dim=128) == 2
    assert first_failing_position(10_000, 64, 100_000, head_dim=128) is None


# --- Men's bound by search -------------------------------------------------------------------------

# First passing bases published for d = 128 (a grid of 0.2 % steps with another anchor).
REFERENCE_FIRST_PASS = {4_096: 26_962, 16_384: 234_151, 65_536: 2_101_024, 131_072: 4_871_608}


@pytest.mark.parametrize(("length", "reference"), sorted(REFERENCE_FIRST_PASS.items()))
def test_men_exact_bound_is_first_pass_on_the_grid(length: int, reference: int) -> None:
    bound = men_exact_bound(length, 128)
    assert cos_sum_scan(bound, 128, length).minimum >= 0
    # the grid point below fails
    k = round(np.log(bound) / np.log(cossum.GRID_RATIO))
    assert grid_bases(k, 1)[0] == bound
    below = grid_bases(k - 1, 1)[0]
    assert below < bound and cos_sum_scan(below, 128, length).first_negative is not None
    # The reference grid passes narrow islands ours steps over (at 4K 26,962 lies in one ~0.07 % wide);
    # elsewhere the two grids agree to within about one step.
    assert cos_sum_scan(reference, 128, length).minimum >= 0
    tolerance = 0.07 if length == 4_096 else 0.005
    assert abs(bound / reference - 1) < tolerance


def test_men_exact_bound_values_are_stable() -> None:
    # Pinned so that a change of grid or search shows up here first.
    assert [men_exact_bound(n, 128) for n in (4_096, 16_384, 32_768, 65_536, 131_072)] == [
        28_674,
        234_132,
        630_740,
        2_091_624,
        4_870_010,
    ]


@pytest.mark.parametrize("rotary_dim", [16, 64, 128, 256])
@pytest.mark.parametrize("length", [64, 1_024, 4_096])
def test_walking_from_base_two_finds_the_same_bound(rotary_dim: int, length: int) -> None:
    k = grid_index(2)
    while True:
        bases = grid_bases(k, 256)
        first = cossum._first_passing(bases, rotary_dim, length, 0.0)
        if first is not None:
            break
        k += 256
    assert int(bases[first]) == men_exact_bound(length, rotary_dim)


def test_grid_is_anchored_at_one() -> None:
    bases = grid_bases(grid_index(1e6), 3)
    np.testing.assert_array_equal(bases, np.rint(1.002 ** np.arange(grid_index(1e6), grid_index(1e6) + 3)))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: first_failing_position(10_000, 127, 1000), "rotary dim must be even"),
        (lambda: first_failing_position(10_000, 0, 1000), "rotary dim must be an even integer of at least 4"),
        (lambda: first_failing_position(0, 128, 1000), "rotary base must be a number greater than 1"),
        (lambda: first_failing_position(-5, 128, 1000), "rotary base must be a number greater than 1"),
        (lambda: first_failing_position(10_000, 128, 0), "search cap must be a positive integer"),
        (lambda: men_exact_bound(0, 128), "length must be a positive integer"),
        (
            lambda: men_exact_bound(4096, 128, head_dim=96),
            "head dim must be even and at least the rotary dim",
        ),
    ],
)
def test_bad_inputs(call, message: str) -> None:
    with pytest.raises(RopeError, match=message):
        call()


def test_block_evaluator_far_out() -> None:
    theta = inv_freq(1e6, 128)
    starts = (1_000_000 // 128 + np.arange(16)) * 128.0
    fast = cossum._Blocks(theta, 0.0).values(starts[None, :])[0].ravel()
    direct = cos_sum_direct(theta, (starts[:, None] + np.arange(128)).ravel())
    assert np.abs(fast - direct).max() < cossum._REFINE_TOL / 50
