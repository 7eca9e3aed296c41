"""Scalings that change more than the base: YaRN, llama3 and linear position interpolation (PI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from longctx.rope import formulas

ScalingType = Literal["yarn", "llama3", "linear"]


@dataclass(frozen=True)
class RopeScaling:
    """One frequency scaling on top of a base.

    factor: s (YaRN, linear) or llama3's low-frequency divisor; original_length: the context the
    frequencies were trained for (YaRN's and llama3's `original_max_position_embeddings`).
    """

    type: ScalingType
    factor: float
    original_length: int
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None

    def inv_freq(self, base: float, rotary_dim: int) -> np.ndarray:
        """The frequencies the model actually uses (float64)."""
        if self.type == "yarn":
            return formulas.yarn_inv_freq(
                base,
                rotary_dim,
                self.factor,
                self.original_length,
                _or(self.beta_fast, 32.0),
                _or(self.beta_slow, 1.0),
            )
        if self.type == "llama3":
            return formulas.llama3_inv_freq(
                base,
                rotary_dim,
                self.factor,
                _or(self.low_freq_factor, 1.0),
                _or(self.high_freq_factor, 4.0),
                self.original_length,
            )
        return formulas.linear_inv_freq(base, rotary_dim, self.factor)

    def attention_factor(self) -> float:
        """YaRN's cos/sin multiplier mscale(s, m)/mscale(s, m_all) (1 for the other scalings)."""
        if self.type != "yarn":
            return 1.0
        return formulas.yarn_mscale(self.factor, _or(self.mscale, 1.0)) / formulas.yarn_mscale(
            self.factor, _or(self.mscale_all_dim, 0.0)
        )

    def hf_rope_scaling(self) -> dict[str, Any]:
        """The equivalent Hugging Face `rope_scaling` entry."""
        if self.type == "yarn":
            return {
                "rope_type": "yarn",
                "factor": self.factor,
                "original_max_position_embeddings": self.original_length,
                "beta_fast": self.beta_fast,
                "beta_slow": self.beta_slow,
            }
        if self.type == "llama3":
            return {
                "rope_type": "llama3",
                "factor": self.factor,
                "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_length,
            }
        return {"rope_type": "linear", "factor": self.factor}


def yarn_logit_scale(length: int, previous_length: int) -> float:
    """YaRN's attention factor as a multiplier of the logits: q and k each take mscale(s) = 0.1·ln s + 1,
    so q·k takes its square, for s = length / previous_length (1 where s ≤ 1: nothing to sharpen)."""
    s = length / previous_length
    return formulas.yarn_mscale(s, 1.0) ** 2 if s > 1 else 1.0


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
