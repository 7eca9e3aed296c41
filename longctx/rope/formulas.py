"""Closed-form RoPE formulas: Men et al.'s published bound, Liu et al.'s critical dimension, NTK-aware
scaling, and the per-frequency rules of YaRN, llama3 and linear interpolation (PI).

Notation: d = rotary dim, θ_i = b^(−2i/d), λ_i = 2π/θ_i (wavelength), T_train / L0 = pretraining length,
T / L = target length, s = L / L0. All functions are pure and take plain numbers.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

from longctx.errors import RopeError
from longctx.rope.cossum import inv_freq

TWO_PI = 2.0 * math.pi

# Ceilings of quantities that are integers up to rounding (46.0000000001 must stay 46).
_CEIL_TOL = 1e-9

# --- Men et al. 2024 (arXiv 2405.14591): lower bound of the base, rotary dim 128 ---------------------

#: The paper's table of b*(L) for d = 128 (lengths as powers of two).
MEN_PAPER_TABLE: dict[int, int] = {
    1024: 4_300,
    2048: 16_000,
    4096: 27_000,
    8192: 84_000,
    16384: 310_000,
    32768: 640_000,
    65536: 2_100_000,
    131072: 7_800_000,
    262144: 36_000_000,
    524288: 64_000_000,
    1048576: 510_000_000,
}
MEN_PAPER_DIM = 128
MEN_FIT_COEF, MEN_FIT_EXP = 0.0424, 1.628


def men_paper(length: int) -> int | None:
    """The paper's tabulated bound for exactly this length (d = 128), or None when not tabulated."""
    return MEN_PAPER_TABLE.get(int(length))


def men_fit(length: float) -> float:
    """The paper's fit b ≈ 0.0424·L^1.628 (d = 128)."""
    return MEN_FIT_COEF * float(length) ** MEN_FIT_EXP


def round_sig(value: float, digits: int = 2) -> int:
    """Round to `digits` significant digits, halves up (3.12e7 → 31 000 000, 1.25e6 → 1 300 000)."""
    if not value > 0:
        raise RopeError(f"cannot round {value!r} to significant digits", fix="pass a positive number")
    exponent = math.floor(math.log10(value)) - digits + 1
    quantum = Decimal(1).scaleb(exponent)
    return int(Decimal(repr(float(value))).quantize(quantum, rounding=ROUND_HALF_UP))


# --- Liu et al. 2023 (arXiv 2310.05209): critical dimension ------------------------------------------


def liu_d_extra(pretrain_base: float, pretrain_length: float, rotary_dim: int) -> int:
    """Critical dimension d_extra = 2·⌈(d/2)·log_b(T_train/2π)⌉: dims whose period fits T_train.

    Clamped to [2, d]: a base below T_train/2π sees every period during pretraining.
    """
    ratio = pretrain_length / TWO_PI
    if ratio <= 1.0:
        raise RopeError(
            f"pretraining length {pretrain_length} is too short for Liu's formula (needs more than 2π)",
            fix="pass the pretraining context length in tokens, e.g. 4096",
        )
    half = (rotary_dim / 2) * math.log(ratio) / math.log(pretrain_base)
    d_extra = 2 * math.ceil(half - _CEIL_TOL)
    return max(2, min(rotary_dim, d_extra))


def liu_base_for(length: float, d_extra: int, rotary_dim: int) -> float:
    """Smallest base whose extrapolation limit reaches `length`: β(T) = (T/2π)^(d/d_extra)."""
    return (length / TWO_PI) ** (rotary_dim / d_extra)


def liu_critical_base(pretrain_base: float, pretrain_length: float, tune_length: float) -> float:
    """β0 = b_pre^(log_{T_train/2π}(T_tune/2π)): above it the limit is T_extra, below it T_tune."""
    exponent = math.log(tune_length / TWO_PI) / math.log(pretrain_length / TWO_PI)
    return pretrain_base**exponent


def liu_extrapolation_bound(base: float, d_extra: int, rotary_dim: int) -> float:
    """T_extra = 2π·β^(d_extra/d): the longest context a base extrapolates to after tuning."""
    return TWO_PI * base ** (d_extra / rotary_dim)


# --- NTK-aware (bloc97; YaRN paper Def. 1) -------------------------------------------------------------


def ntk_base(base: float, scale: float, rotary_dim: int) -> float:
    """b′ = b·s^(d/(d−2)): the lowest frequency is interpolated by exactly s."""
    return base * scale ** (rotary_dim / (rotary_dim - 2))


# --- YaRN (Peng et al. 2023, arXiv 2309.00071; same numbers in HF and Megatron) -------------------------


def yarn_correction_dim(n_rotations: float, rotary_dim: int, base: float, original_length: float) -> float:
    """Dimension index whose wavelength fits `n_rotations` times into the original length."""
    return rotary_dim * math.log(original_length / (n_rotations * TWO_PI)) / (2 * math.log(base))


def yarn_correction_range(
    rotary_dim: int, base: float, original_length: float, beta_fast: float = 32, beta_slow: float = 1
) -> tuple[int, int]:
    """(low, high) = (⌊dim(β_fast)⌋, ⌈dim(β_slow)⌉), clamped to [0, d − 1]."""
    low = math.floor(yarn_correction_dim(beta_fast, rotary_dim, base, original_length))
    high = math.ceil(yarn_correction_dim(beta_slow, rotary_dim, base, original_length))
    return max(low, 0), min(high, rotary_dim - 1)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """0.1·m·ln s + 1 (1 for s ≤ 1): YaRN's attention temperature factor."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(
    base: float,
    rotary_dim: int,
    scale: float,
    original_length: float,
    beta_fast: float = 32,
    beta_slow: float = 1,
) -> np.ndarray:
    """NTK-by-parts frequencies: high frequencies kept, low ones divided by s, a linear ramp between."""
    extrap = inv_freq(base, rotary_dim)
    interp = extrap / scale
    low, high = yarn_correction_range(rotary_dim, base, original_length, beta_fast, beta_slow)
    hi = high + 0.001 if low == high else high  # avoid a zero-width ramp
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (hi - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1 → extrapolate (keep θ), 0 → interpolate (θ/s)
    return interp * (1.0 - keep) + extrap * keep


# --- llama3 (Llama 3.1) -----------------------------------------------------------------------------


def llama3_inv_freq(
    base: float,
    rotary_dim: int,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_length: float = 8192,
) -> np.ndarray:
    """Wavelengths below L0/high kept, above L0/low divided by `factor`, smoothly blended between."""
    freqs = inv_freq(base, rotary_dim)
    wavelen = TWO_PI / freqs
    low_wavelen = original_length / low_freq_factor
    high_wavelen = original_length / high_freq_factor
    smooth = (original_length / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    return np.where(wavelen < high_wavelen, freqs, np.where(wavelen > low_wavelen, freqs / factor, blended))


def llama3_split(
    base: float,
    rotary_dim: int,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_length: float = 8192,
) -> tuple[int, int, int]:
    """How many frequencies llama3 keeps, blends and divides (5e5, d 128, 1/4/8192 → 29, 6, 29)."""
    wavelen = TWO_PI / inv_freq(base, rotary_dim)
    kept = int((wavelen < original_length / high_freq_factor).sum())
    divided = int((wavelen > original_length / low_freq_factor).sum())
    return kept, len(wavelen) - kept - divided, divided


# --- linear position interpolation (PI, Chen et al. 2023) -------------------------------------------------


def linear_inv_freq(base: float, rotary_dim: int, scale: float) -> np.ndarray:
    """Positions divided by s, i.e. every frequency divided by s."""
    return inv_freq(base, rotary_dim) / scale
