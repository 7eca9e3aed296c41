"""Base-selection methods: the registry plans validate against, and `choose_base`.

Every method returns an integer base (Megatron's `--rotary-base` is an int) with an explanation.
Base methods change only the base: `fixed`, `abf`, `men`, `men-safe`, `liu`, `ntk`. Scaling methods
keep a base and change the frequencies: `yarn`, `llama3`, `linear` (PI); whether a Megatron version
honours them is decided by `longctx.rope.megatron`. Each method is a function registered in `METHODS`
by the `@register(name, kind, summary, *params)` decorator above it.

A base below the pretraining base is a **warning** (finding `base-below-pretrain`), not an error:
Liu et al.'s small-base regime lowers the base on purpose, but in ABF-style extension a lower base
is almost always a typo. Plans that want it fatal escalate that code.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError

from longctx.errors import RopeError
from longctx.report import Findings
from longctx.rope import cossum, formulas
from longctx.rope.base_bound import MAX_BASE, check_base
from longctx.rope.diagnostics import RopeDiagnostics, _paper_applies, _partial, diagnose
from longctx.rope.scaling import RopeScaling

Kind = Literal["base", "scaling"]


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()


# Ceilings far above any model's and far below what a typo gives (1e300): a YaRN/PI factor (published
# models: 4 to 40), a context length, YaRN's betas and mscales, a rotary base (published: 1e4 to ~5e8)
# (MAX_BASE: longctx.rope.base_bound, the one bound of a base wherever one enters)
MAX_SCALE, MAX_LENGTH, MAX_BETA, MAX_MSCALE = 1024.0, 1 << 26, 1024.0, 100.0


@dataclass(frozen=True)
class Param:
    """One parameter of a method. default None means 'derived from the inputs' (see help)."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    above: float | None = None  # values must be > above
    at_least: float | None = None  # values must be ≥ at_least
    at_most: float | None = None  # values must be ≤ at_most (no real model goes near; typos do)

    def coerce(self, method: str, value: Any) -> Any:
        where = f"method {method!r}, parameter {self.name!r}"
        if self.type is int:
            number = _as_int(value, what=f"{self.name}", where=where, minimum_exclusive=self.above)
            self._not_above(number, where)
            return number
        if self.type is float:
            out = self._float(value, where)
            self._not_above(out, where)
            return out
        text = str(value)[:200]
        if self.choices and text not in self.choices:
            raise RopeError(
                f"{self.name} must be one of {', '.join(self.choices)}, got {text!r}", where=where
            )
        return text

    @functools.cached_property
    def _float_adapter(self) -> TypeAdapter[float]:
        return TypeAdapter(Annotated[float, Field(gt=self.above, ge=self.at_least, allow_inf_nan=False)])

    def _float(self, value: Any, where: str) -> float:
        """A finite float within the lower bound (the upper one: _not_above, which names digits)."""
        if isinstance(value, bool):  # a float to pydantic, a typo here
            raise RopeError(f"{self.name} must be a finite number, got {value!r}", where=where)
        try:
            return self._float_adapter.validate_python(value)
        except ValidationError as err:
            error = err.errors()[0]
        if error["type"] == "greater_than":
            message = f"must be greater than {self.above:g}, got {error['input']:g}"
        elif error["type"] == "greater_than_equal":
            message = f"must be at least {self.at_least:g}, got {error['input']:g}"
        elif error["type"] == "finite_number" or isinstance(value, int):  # an int past float's range
            message = f"must be a finite number, got {value!r:.60}"
        else:
            message = f"must be a number, got {value!r:.60}"
        raise RopeError(f"{self.name} {message}", where=where)

    def _not_above(self, number: float, where: str) -> None:
        if self.at_most is not None and number > self.at_most:
            shown = f"a {len(str(number))}-digit integer" if isinstance(number, int) else f"{number:.6g}"
            raise RopeError(
                f"{self.name} must be at most {self.at_most:g}, got {shown}",
                where=where,
                fix=f"check {self.name}: {self.help}",
            )


@dataclass(frozen=True)
class RopeInputs:
    """What every method starts from. rotary_dim = kv_channels × rotary_percent; head_dim = kv_channels
    (only matters for partial rotary)."""

    rotary_dim: int
    pretrain_base: float
    pretrain_length: int
    target_length: int
    head_dim: int | None = None

    @property
    def scale(self) -> float:
        """s = target / pretraining length."""
        return self.target_length / self.pretrain_length


@dataclass(frozen=True)
class Outcome:
    """What a method computes before diagnostics: the unrounded value, the integer base, why."""

    exact: float
    base: int
    explanation: str
    scaling: RopeScaling | None = None


#: A method's computation: validated parameters (defaults filled in) → Outcome.
Compute = Callable[[RopeInputs, dict[str, Any]], Outcome]


@dataclass(frozen=True)
class Method:
    name: str
    kind: Kind
    summary: str
    params: tuple[Param, ...]
    compute: Compute = field(repr=False)

    def resolve(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Validated parameters with defaults filled in; unknown or missing ones raise RopeError."""
        given = dict(params or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            allowed = ", ".join(known) or "none"
            raise RopeError(
                f"method {self.name!r} has no parameter {', '.join(map(repr, unknown))}",
                fix=f"parameters of {self.name!r}: {allowed}",
            )
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name in given and given[p.name] is not None:
                out[p.name] = p.coerce(self.name, given[p.name])
            elif p.default is REQUIRED:
                raise RopeError(
                    f"method {self.name!r} needs parameter {p.name!r}",
                    fix=f"{p.name}: {p.help}",
                )
            else:
                out[p.name] = p.default
        return out


@dataclass
class BaseChoice:
    """A method's answer: the integer base, why, its parameters and what it means at the target length.

    exact is the value before rounding (NTK 40 889.94 → base 40 890). findings holds warnings such
    as `base-below-pretrain` and `below-men-bound`, and info such as `cos-sum-dip`.
    """

    method: str
    base: int
    explanation: str
    params: dict[str, Any]
    inputs: RopeInputs
    exact: float
    scaling: RopeScaling | None = None
    diagnostics: RopeDiagnostics | None = None
    findings: Findings = field(default_factory=Findings)

    @property
    def kind(self) -> Kind:
        return METHODS[self.method].kind

    @property
    def warnings(self) -> list[str]:
        return [f.message for f in self.findings.warnings]


# --- helpers ---------------------------------------------------------------------------------------


def _as_int(
    value: Any, *, what: str, where: str | None = None, minimum_exclusive: float | None = None
) -> int:
    """An integer from an int or an integral float/str ('1e6' → 1000000); Megatron wants integers."""
    if isinstance(value, bool):
        raise RopeError(f"{what} must be an integer, got {value!r}", where=where)
    try:
        number = float(value) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        raise RopeError(f"{what} must be an integer, got {value!r}", where=where) from None
    if isinstance(number, float):
        if not math.isfinite(number) or number != int(number):
            raise RopeError(
                f"{what} must be an integer, got {value!r}",
                where=where,
                fix="Megatron's --rotary-base is an int; round it (e.g. 40890, not 40889.94)",
            )
        number = int(number)
    if minimum_exclusive is not None and not number > minimum_exclusive:
        raise RopeError(f"{what} must be greater than {minimum_exclusive:g}, got {number}", where=where)
    return number


def to_int(value: float) -> int:
    """Nearest integer, halves up (the integer Megatron gets)."""
    return math.floor(value + 0.5)


def _fmt(value: float) -> str:
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}"


def _keep_floor(inp: RopeInputs, value: int, text: str) -> tuple[int, str]:
    """A lower bound below the pretraining base means the base already satisfies it: keep it."""
    if value >= inp.pretrain_base:
        return value, text
    kept = to_int(inp.pretrain_base)
    return kept, f"{text} The pretraining base {_fmt(inp.pretrain_base)} is already above it, so it is kept."


def _men_value(inp: RopeInputs, source: str) -> tuple[float, str]:
    return men_bound_value(inp.target_length, inp.rotary_dim, head_dim=inp.head_dim, source=source)


def men_bound_value(
    length: int, rotary_dim: int, *, head_dim: int | None = None, source: str = "exact"
) -> tuple[float, str]:
    """Men's bound for a length from one source (exact, table, fit, or paper = table, else fit, for
    d = 128, else exact), and a label saying which source gave it."""
    d = rotary_dim
    paper_ok = _paper_applies(d, head_dim)
    if source in ("table", "fit") and not paper_ok:
        raise RopeError(
            f"Men et al.'s {source} is for full rotary with rotary dim 128, not rotary dim {d}"
            + ("" if _partial(head_dim, d) is None else f" of head dim {head_dim}"),
            fix="use source 'exact', which searches for the model's own dimensions",
        )
    if source == "paper":
        if paper_ok and formulas.men_paper(length) is not None:
            source = "table"
        elif paper_ok:
            source = "fit"
        else:
            source = "exact"
    if source == "table":
        value = formulas.men_paper(length)
        if value is None:
            lengths = ", ".join(f"{n:,}" for n in formulas.MEN_PAPER_TABLE)
            raise RopeError(
                f"Men et al.'s table has no entry for length {length:,}",
                fix=f"tabulated lengths: {lengths}; or use source 'fit' or 'exact'",
            )
        return float(value), f"paper table {_fmt(value)}"
    if source == "fit":
        value = formulas.men_fit(length)
        return value, f"paper fit 0.0424·L^1.628 = {_fmt(value)}"
    partial = _partial(head_dim, d)
    value = cossum.men_exact_bound(length, d, head_dim=partial)
    if partial is not None and partial - d >= d:  # unrotated pairs ≥ rotated pairs: Σ ≥ 0 always
        return float(value), "exact search: no bound, the unrotated pairs alone keep the sum ≥ 0"
    return float(value), f"exact search {_fmt(value)}"


def men_safe_base(
    length: int, rotary_dim: int, *, head_dim: int | None = None, factor: float = 4.0, source: str = "paper"
) -> int:
    """factor × Men's bound, rounded to two significant digits (no floor at a pretraining base)."""
    value, _ = men_bound_value(length, rotary_dim, head_dim=head_dim, source=source)
    return formulas.round_sig(factor * value, 2)


def _men_context(inp: RopeInputs) -> str:
    """The paper's numbers for comparison (d = 128 only)."""
    if not _paper_applies(inp.rotary_dim, inp.head_dim):
        return ""
    paper = formulas.men_paper(inp.target_length)
    fit = formulas.men_fit(inp.target_length)
    table = f"paper table {_fmt(paper)}, " if paper is not None else ""
    return f" For comparison: {table}paper fit {_fmt(round(fit))}."


_EXACT_NOTE = (
    "The exact search walks the geometric grid round(1.002^k) upwards from the length and takes the "
    "first base whose cos-sum Σ_i cos(m·b^(−2i/d)) is ≥ 0 for every m < L. The sum is not monotone in "
    "the base: many larger bases fail again through small dips near m ≈ L, and a finer grid can find a "
    "passing island just below, so read the result as a floor to about 0.2 %."
)

# --- the methods -----------------------------------------------------------------------------------

#: Every method by name, in the order they are registered below (the order help and errors list them).
METHODS: dict[str, Method] = {}


def register(name: str, kind: Kind, summary: str, *params: Param) -> Callable[[Compute], Compute]:
    """Decorator: register the function as method `name` of this kind, with these parameters, in METHODS."""

    def add(compute: Compute) -> Compute:
        if name in METHODS:
            raise ValueError(f"RoPE method {name!r} is registered twice")
        METHODS[name] = Method(name, kind, summary, params, compute)
        return compute

    return add


@register(
    "fixed",
    "base",
    "a given base",
    Param("base", int, REQUIRED, "the rotary base, an integer > 1", above=1, at_most=MAX_BASE),
)
def _fixed(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    base = p["base"]
    return Outcome(float(base), base, f"fixed: the given base {_fmt(base)}.")


@register(
    "abf",
    "base",
    "one fixed large base (Xiong et al. 2023), default 500 000",
    Param("base", int, 500_000, "the rotary base (default 500000)", above=1, at_most=MAX_BASE),
)
def _abf(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    base = p["base"]
    text = (
        f"abf (adjusted base frequency, Xiong et al. 2023): one larger base, RoPE unchanged, continued "
        f"pretraining at the target length; base {_fmt(base)}. Llama 2 Long moved 10,000 → 500,000 for "
        f"16K–32K and Llama 3 kept 500,000 up to 32,768; the value carries no length dependence, so "
        f"check it against Men's bound at {inp.target_length:,}."
    )
    return Outcome(float(base), base, text)


@register(
    "men",
    "base",
    "Men et al.'s lower bound: exact search, or the paper's table or fit",
    Param(
        "source",
        str,
        "exact",
        "exact (search for the model's rotary dim), table or fit (paper, d = 128)",
        choices=("exact", "table", "fit"),
    ),
)
def _men(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    value, label = _men_value(inp, p["source"])
    base = math.ceil(value - 1e-9)
    text = (
        f"men (Men et al. 2024, base of RoPE bounds context length): the lower bound of the base for "
        f"{inp.target_length:,} tokens at rotary dim {inp.rotary_dim}, {label} → {_fmt(base)}."
    )
    if label.startswith("exact search "):
        text += " " + _EXACT_NOTE + _men_context(inp)
    base, text = _keep_floor(inp, base, text)
    return Outcome(value, base, text)


@register(
    "men-safe",
    "base",
    "Men et al.'s bound × factor (default 4), two significant digits",
    Param("factor", float, 4.0, "multiplier of the bound (default 4)", at_least=1.0, at_most=MAX_SCALE),
    Param(
        "source",
        str,
        "paper",
        "paper (table, else fit, for d = 128; else exact), exact, table or fit",
        choices=("paper", "exact", "table", "fit"),
    ),
)
def _men_safe(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    value, label = _men_value(inp, p["source"])
    factor = p["factor"]
    raw = factor * value
    base = formulas.round_sig(raw, 2)
    text = (
        f"men-safe: {factor:g} × Men et al.'s bound ({label}) = {_fmt(raw)}, rounded to two significant "
        f"digits → {_fmt(base)}. Recipes that train at the target length sit at or above Men's bound "
        f"(Code Llama 1,000,000 at 16K, ProLong 8,000,000 at 64K), and a base sweep at 128K on the "
        f"baby_9b_dense family reached full needle retrieval only at 3.2e7, about 4× the paper's 7.8e6."
    )
    if label.startswith("exact search "):
        text += " " + _EXACT_NOTE
    base, text = _keep_floor(inp, base, text)
    return Outcome(raw, base, text)


@register("liu", "base", "Liu et al.'s critical-dimension base (T/2π)^(d/d_extra)")
def _liu(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    d = inp.rotary_dim
    d_extra = formulas.liu_d_extra(inp.pretrain_base, inp.pretrain_length, d)
    value = formulas.liu_base_for(inp.target_length, d_extra, d)
    beta0 = formulas.liu_critical_base(inp.pretrain_base, inp.pretrain_length, inp.target_length)
    base = to_int(value)
    text = (
        f"liu (Liu et al. 2023, scaling laws of RoPE extrapolation): critical dimension d_extra = "
        f"2⌈(d/2)·log_b(T/2π)⌉ = {d_extra} from base {_fmt(inp.pretrain_base)} at {inp.pretrain_length:,}; "
        f"the base whose extrapolation limit 2π·b^(d_extra/d) reaches {inp.target_length:,} is "
        f"(T/2π)^(d/d_extra) = {_fmt(value)} → {_fmt(base)} (critical base β0 for tuning at this "
        f"length: {_fmt(beta0)})."
    )
    base, text = _keep_floor(inp, base, text)
    return Outcome(value, base, text)


@register(
    "ntk",
    "base",
    "NTK-aware base b·s^(d/(d−2))",
    Param("scale", float, None, "s (default target / pretraining length)", at_least=1.0, at_most=MAX_SCALE),
)
def _ntk(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    d = inp.rotary_dim
    scale = inp.scale if p["scale"] is None else p["scale"]
    value = formulas.ntk_base(inp.pretrain_base, scale, d)
    base = to_int(value)
    text = (
        f"ntk (NTK-aware, bloc97): b·s^(d/(d−2)) = {_fmt(inp.pretrain_base)} × {scale:g}^({d}/{d - 2}) = "
        f"{_fmt(value)} → {_fmt(base)}; the lowest frequency is interpolated by exactly s = {scale:g}. "
        f"Made for inference without training; fine-tuned it trails PI unless s is set above the "
        f"expected scale (YaRN paper)."
    )
    return Outcome(value, base, text)


#: the scaling methods' `base`: they keep a base and change the frequencies
_BASE_PARAM = Param(
    "base", int, None, "rotary base to keep (default: the pretraining base)", above=1, at_most=MAX_BASE
)


def _scaling_base(inp: RopeInputs, p: dict[str, Any]) -> int:
    return to_int(inp.pretrain_base) if p["base"] is None else p["base"]


@register(
    "yarn",
    "scaling",
    "YaRN NTK-by-parts interpolation with attention temperature",
    _BASE_PARAM,
    Param(
        "factor",
        float,
        None,
        "s (default target / original length; published models use 4 to 40)",
        at_least=1.0,
        at_most=MAX_SCALE,
    ),
    Param(
        "original_length",
        int,
        None,
        "original context (default the pretraining length)",
        above=0,
        at_most=MAX_LENGTH,
    ),
    Param("beta_fast", float, 32.0, "β_fast (default 32), above β_slow", above=0, at_most=MAX_BETA),
    Param("beta_slow", float, 1.0, "β_slow (default 1), below β_fast", above=0, at_most=MAX_BETA),
    Param("mscale", float, 1.0, "mscale (default 1.0)", at_least=0, at_most=MAX_MSCALE),
    Param("mscale_all_dim", float, 0.0, "mscale_all_dim (default 0.0)", at_least=0, at_most=MAX_MSCALE),
)
def _yarn(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    base = _scaling_base(inp, p)
    original = inp.pretrain_length if p["original_length"] is None else p["original_length"]
    factor = inp.target_length / original if p["factor"] is None else p["factor"]
    if factor < 1:
        raise RopeError(
            f"yarn: the target length {inp.target_length:,} is shorter than the original length {original:,} "
            f"(factor {factor:.4g} < 1): YaRN stretches positions, it cannot shrink them",
            fix="give original_length the context the model was trained for, or use a base method",
        )
    if factor > MAX_SCALE:
        raise RopeError(f"yarn: factor {factor:.6g} is above {MAX_SCALE:g}", fix="check original_length")
    if not p["beta_fast"] > p["beta_slow"]:
        raise RopeError(
            f"yarn: beta_fast {p['beta_fast']:g} must be above beta_slow {p['beta_slow']:g} (the ramp between "
            "the kept and the interpolated frequencies would be inverted)",
            fix="YaRN's defaults are beta_fast = 32, beta_slow = 1",
        )
    scaling = RopeScaling(
        "yarn", factor, original, p["beta_fast"], p["beta_slow"], p["mscale"], p["mscale_all_dim"]
    )
    low, high = formulas.yarn_correction_range(inp.rotary_dim, base, original, p["beta_fast"], p["beta_slow"])
    text = (
        f"yarn (Peng et al. 2023): base {_fmt(base)} kept; NTK-by-parts over the {inp.rotary_dim // 2} "
        f"frequencies: those below index {low} keep θ, those above {high} are divided by s = {factor:g}, "
        f"a linear ramp between (original length {original:,}, β {p['beta_fast']:g}/{p['beta_slow']:g}); "
        f"cos/sin scaled by {scaling.attention_factor():.6f} (0.1·ln s + 1). Qwen2.5/Qwen3: train 32K at "
        f"1,000,000, serve 128K with factor 4."
    )
    return Outcome(float(base), base, text, scaling)


@register(
    "llama3",
    "scaling",
    "Llama 3.1 frequency-band scaling",
    _BASE_PARAM,
    Param(
        "factor",
        float,
        8.0,
        "divisor of the low frequencies (default 8, Llama 3.1)",
        at_least=1.0,
        at_most=MAX_SCALE,
    ),
    Param("low_freq_factor", float, 1.0, "default 1", above=0),
    Param("high_freq_factor", float, 4.0, "default 4", above=0),
    Param("original_length", int, None, "original context (default the pretraining length)", above=0),
)
def _llama3(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    base = _scaling_base(inp, p)
    original = inp.pretrain_length if p["original_length"] is None else p["original_length"]
    scaling = RopeScaling(
        "llama3",
        p["factor"],
        original,
        low_freq_factor=p["low_freq_factor"],
        high_freq_factor=p["high_freq_factor"],
    )
    kept, blended, divided = formulas.llama3_split(
        base, inp.rotary_dim, p["low_freq_factor"], p["high_freq_factor"], original
    )
    text = (
        f"llama3 (Llama 3.1): base {_fmt(base)} kept; wavelengths below {original:,}/"
        f"{p['high_freq_factor']:g} kept ({kept} frequencies), above {original:,}/{p['low_freq_factor']:g} "
        f"divided by {p['factor']:g} ({divided}), {blended} blended. Llama 3.1 used base 500,000 with "
        f"factor 8, 1/4, original 8,192 for 8K → 128K."
    )
    return Outcome(float(base), base, text, scaling)


@register(
    "linear",
    "scaling",
    "linear position interpolation (PI)",
    _BASE_PARAM,
    Param("factor", float, None, "s (default target / pretraining length)", at_least=1.0, at_most=MAX_SCALE),
)
def _linear(inp: RopeInputs, p: dict[str, Any]) -> Outcome:
    base = _scaling_base(inp, p)
    factor = inp.scale if p["factor"] is None else p["factor"]
    scaling = RopeScaling("linear", factor, inp.pretrain_length)
    text = (
        f"linear (position interpolation, Chen et al. 2023): base {_fmt(base)} kept, positions divided by "
        f"s = {factor:g} (every frequency / s), so {inp.target_length:,} positions span the pretrained "
        f"{inp.target_length / factor:,.0f}."
    )
    return Outcome(float(base), base, text, scaling)


BASE_METHODS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.kind == "base")
SCALING_METHODS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.kind == "scaling")


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise RopeError(f"unknown RoPE method {name!r}", fix=f"choose one of: {', '.join(METHODS)}") from None


def validate_method(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check a method name and its parameters (for plans); returns the parameters with defaults."""
    return get_method(name).resolve(params)


def validate_inputs(
    *,
    rotary_dim: int,
    pretrain_base: float,
    pretrain_length: int,
    target_length: int,
    head_dim: int | None = None,
) -> RopeInputs:
    """RopeInputs, or RopeError naming the bad input."""
    cossum.check_dims(rotary_dim, head_dim)
    if (
        isinstance(pretrain_base, bool)
        or not isinstance(pretrain_base, numbers.Real)
        or not pretrain_base > 1
    ):
        raise RopeError(
            f"pretraining base must be a number greater than 1, got {pretrain_base!r}",
            fix="the checkpoint's --rotary-base, e.g. 10000",
        )
    if not math.isfinite(pretrain_base):
        raise RopeError(f"pretraining base must be finite, got {pretrain_base!r}")
    for name, value in (("pretraining length", pretrain_length), ("target length", target_length)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise RopeError(f"{name} must be a positive integer, got {value!r}", fix="e.g. 4096 or 16384")
    if target_length < pretrain_length:
        raise RopeError(
            f"target length {target_length:,} is shorter than the pretraining length {pretrain_length:,}",
            fix="context extension goes up: use a target length of at least the pretraining length",
        )
    base = int(pretrain_base) if float(pretrain_base).is_integer() else float(pretrain_base)
    return RopeInputs(
        int(rotary_dim), base, int(pretrain_length), int(target_length), _partial(head_dim, rotary_dim)
    )


def choose_base(
    method: str,
    *,
    rotary_dim: int,
    pretrain_base: float,
    pretrain_length: int,
    target_length: int,
    head_dim: int | None = None,
    with_diagnostics: bool = True,
    **params: Any,
) -> BaseChoice:
    """The base `method` gives for extending a model from pretrain_length to target_length.

    rotary_dim = kv_channels × rotary_percent; head_dim = kv_channels when only part of each head is
    rotated (the unrotated pairs add to the cos-sum). Parameters per method: `METHODS[name].params`.

    Raises RopeError for bad inputs (non-positive base or length, odd rotary dim, target shorter than
    the pretraining length, unknown method or parameter). A resulting base below the pretraining base
    is a warning finding `base-below-pretrain`, not an error (see the module docstring).
    """
    spec = get_method(method)
    inp = validate_inputs(
        rotary_dim=rotary_dim,
        pretrain_base=pretrain_base,
        pretrain_length=pretrain_length,
        target_length=target_length,
        head_dim=head_dim,
    )
    resolved = spec.resolve(params)
    out = spec.compute(inp, resolved)
    check_base(out.base, what=f"the base {method} gives ({_fmt(out.exact)})")
    choice = BaseChoice(
        method=method,
        base=out.base,
        explanation=out.explanation,
        params=resolved,
        inputs=inp,
        exact=out.exact,
        scaling=out.scaling,
    )
    if out.base < inp.pretrain_base:
        choice.findings.warning(
            "base-below-pretrain",
            f"{method}: base {out.base:,} is below the pretraining base {_fmt(inp.pretrain_base)}; a lower "
            f"base shortens every wavelength (only Liu et al.'s small-base regime does this on purpose)",
            expected=f">= {_fmt(inp.pretrain_base)}",
            found=out.base,
            fix="raise the base or keep the pretraining base",
        )
    if with_diagnostics:
        choice.diagnostics = diagnose(
            out.base,
            inp.rotary_dim,
            inp.target_length,
            head_dim=inp.head_dim,
            pretrain_base=inp.pretrain_base,
            pretrain_length=inp.pretrain_length,
            scaling=out.scaling,
        )
        add_diagnostic_findings(choice.findings, choice.diagnostics, label=method)
    return choice


def add_diagnostic_findings(
    findings: Findings, diag: RopeDiagnostics, *, label: str = "", safe_factor: float | None = None
) -> None:
    """Warnings and info that a diagnosis implies (shared by choose_base and `rope check`); with
    safe_factor, a base above the bound but below men-safe gets an info finding too."""
    prefix = f"{label}: " if label else ""
    first = diag.first_failing_position
    if diag.scaling is None and not diag.passes_bound:
        findings.warning(
            "below-men-bound",
            f"{prefix}base {_fmt(diag.base)} is below Men's bound {diag.men_bound:,} for {diag.length:,} "
            f"tokens (cos-sum first negative at m = {first:,}); by Men et al. the model gets only "
            f"superficial long-context ability (low perplexity, failed retrieval)",
            expected=f">= {diag.men_bound:,}",
            found=diag.base,
            fix=f"use a base of at least {diag.men_bound:,} (men-safe gives a margin)",
        )
    elif diag.scaling is not None and not diag.cos_sum_nonnegative:
        findings.warning(
            "cos-sum-negative",
            f"{prefix}the {diag.scaling} frequencies give a negative cos-sum at m = {first:,} < {diag.length:,} "
            f"(min {diag.min_cos_sum:.3f} at m = {diag.min_cos_sum_position:,})",
        )
    elif not diag.cos_sum_nonnegative:
        _dip(findings, diag, prefix)
    if safe_factor is not None and diag.scaling is None and diag.passes_bound:
        safe = men_safe_base(
            diag.length,
            diag.rotary_dim,
            head_dim=_partial(diag.head_dim, diag.rotary_dim),
            factor=safe_factor,
        )
        if diag.base < safe:
            findings.info(
                "below-men-safe",
                f"{prefix}base {_fmt(diag.base)} is above Men's bound but below men-safe ({safe_factor:g} × the "
                f"bound = {safe:,}); a base sweep at 128K on the baby_9b_dense family needed about 4× the "
                f"paper's bound for full needle retrieval",
                expected=f">= {safe:,}",
                found=diag.base,
            )


def _dip(findings: Findings, diag: RopeDiagnostics, prefix: str) -> None:
    findings.info(
        "cos-sum-dip",
        f"{prefix}above the bound, but the cos-sum dips to {diag.min_cos_sum:.3f} (of "
        f"{diag.cos_sum_at_zero:g}) at m = {diag.min_cos_sum_position:,}; such small dips are common "
        f"above the bound (Qwen's 1,000,000 at 32K: −0.78) and published models train fine there",
    )
