"""What a rotary base (or a scaled set of frequencies) means for a context length.

Two views side by side, because they disagree by an order of magnitude and both are cited:
Men et al.'s cos-sum criterion (the base must keep Σ cos(m·θ_i) ≥ 0 for every m below the length)
and Liu et al.'s extrapolation bound (the period of the critical dimension must reach the length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from longctx.errors import RopeError
from longctx.rope import cossum, formulas

if TYPE_CHECKING:
    from longctx.rope.scaling import RopeScaling

#: Default search cap for the first failing position, as a multiple of the length.
SEARCH_CAP_FACTOR = 4


@dataclass(frozen=True)
class RopeDiagnostics:
    """Diagnostics of one base at one length.

    first_failing_position: first m < search_cap with B(m) < 0 (Men's L_max), None when none.
    min_cos_sum / min_cos_sum_position: min of B(m) over m < length, and where (B(0) = head_dim / 2).
    men_bound: Men's lower bound for this length by exact search (first passing base on the 0.2 %
        grid); passes_bound is base ≥ men_bound. With a scaling (yarn, llama3, linear) no single base
        compares, so passes_bound is then the cos-sum condition on the scaled frequencies.
    liu_*: Liu et al.'s critical dimension d_extra from the pretraining base and length, the critical
        base β0 for tuning at this length, the extrapolation bound T_extra = 2π·base^(d_extra/d), and
        the limit after tuning at this length (T_extra when base > β0, else the length itself); None
        when the pretraining base or length is not known. Liu's view bounds extrapolation *beyond* the
        tuned length; it never fails a base at the length it is trained at.
    """

    base: float
    rotary_dim: int
    head_dim: int
    length: int
    scaling: str | None
    search_cap: int
    first_failing_position: int | None
    min_cos_sum: float
    min_cos_sum_position: int
    cos_sum_at_zero: float
    cos_sum_nonnegative: bool
    men_bound: int
    men_paper: int | None
    men_fit: float | None
    passes_bound: bool
    liu_d_extra: int | None
    liu_critical_base: float | None
    liu_extrapolation_bound: float | None
    liu_limit_after_tuning: float | None

    @property
    def margin(self) -> float:
        """base / men_bound: how far above (> 1) or below (< 1) the bound the base sits."""
        return self.base / self.men_bound


def diagnose(
    base: float,
    rotary_dim: int,
    length: int,
    *,
    head_dim: int | None = None,
    pretrain_base: float | None = None,
    pretrain_length: int | None = None,
    scaling: RopeScaling | None = None,
    search_cap: int | None = None,
) -> RopeDiagnostics:
    """Diagnostics of `base` at `length` for a rotary dim (and head dim, for partial rotary).

    The first failing position is searched up to `search_cap` (default 4 × length) so that a passing
    base also shows its margin. Liu's numbers need both `pretrain_base` and `pretrain_length`.
    """
    offset = cossum.check_dims(rotary_dim, head_dim)
    cossum.check_base(base)
    cossum.check_length(length)
    cap = SEARCH_CAP_FACTOR * length if search_cap is None else int(search_cap)
    if cap < length:
        raise RopeError(
            f"search cap {cap} is below the length {length}", fix="use a cap of at least the length"
        )
    theta = cossum.inv_freq(base, rotary_dim) if scaling is None else scaling.inv_freq(base, rotary_dim)
    scan = cossum.scan_frequencies(theta, length, offset=offset)
    first = scan.first_negative
    if first is None:
        first = cossum.first_negative(theta, cap, offset=offset, start=length)  # the margin beyond it
    men_bound = cossum.men_exact_bound(int(length), int(rotary_dim), head_dim=_partial(head_dim, rotary_dim))
    paper = formulas.men_paper(length) if _paper_applies(rotary_dim, head_dim) else None
    fit = formulas.men_fit(length) if _paper_applies(rotary_dim, head_dim) else None
    nonneg = scan.minimum >= 0
    passes = nonneg if scaling is not None else base >= men_bound

    d_extra = beta0 = t_extra = limit = None
    if pretrain_base is not None and pretrain_length is not None and scaling is None:
        d_extra = formulas.liu_d_extra(pretrain_base, pretrain_length, rotary_dim)
        beta0 = formulas.liu_critical_base(pretrain_base, pretrain_length, max(length, pretrain_length))
        t_extra = formulas.liu_extrapolation_bound(base, d_extra, rotary_dim)
        limit = t_extra if base > beta0 else float(length)
    return RopeDiagnostics(
        base=base,
        rotary_dim=rotary_dim,
        head_dim=rotary_dim if head_dim is None else head_dim,
        length=length,
        scaling=None if scaling is None else scaling.type,
        search_cap=cap,
        first_failing_position=first,
        min_cos_sum=scan.minimum,
        min_cos_sum_position=scan.argmin,
        cos_sum_at_zero=float(np.float64(rotary_dim / 2 + offset)),
        cos_sum_nonnegative=nonneg,
        men_bound=men_bound,
        men_paper=paper,
        men_fit=fit,
        passes_bound=bool(passes),
        liu_d_extra=d_extra,
        liu_critical_base=beta0,
        liu_extrapolation_bound=t_extra,
        liu_limit_after_tuning=limit,
    )


def _partial(head_dim: int | None, rotary_dim: int) -> int | None:
    """head_dim only when it changes the sum (keeps the search cache keyed on what matters)."""
    return None if head_dim is None or head_dim == rotary_dim else int(head_dim)


def _paper_applies(rotary_dim: int, head_dim: int | None) -> bool:
    """The paper's table and fit are for full rotary with d = 128."""
    return rotary_dim == formulas.MEN_PAPER_DIM and _partial(head_dim, rotary_dim) is None
