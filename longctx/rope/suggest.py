"""Every base method at every target length, side by side, with a recommended base per length."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from longctx.errors import RopeError
from longctx.rope import cossum, formulas
from longctx.rope.diagnostics import _paper_applies
from longctx.rope.methods import BASE_METHODS, BaseChoice, choose_base, get_method, to_int

RECOMMENDATION_RULE = (
    "men-safe (4 × Men et al.'s bound, two significant digits), never below the pretraining base, the "
    "previous stage's base or the exact bound. Published recipes that train at the target length sit at "
    "or above Men's bound (Liu and NTK bases from a 10,000 base fall below it from 16K up), and a 128K sweep on the "
    "baby_9b_dense family needed about 4× the paper's bound (3.2e7) for full needle retrieval."
)


@dataclass
class LengthSuggestion:
    """All methods at one target length and the base recommended for it."""

    length: int
    men_bound: int
    men_paper: int | None
    men_fit: float | None
    recommended: int
    recommended_by: str
    choices: list[BaseChoice] = field(default_factory=list)

    def choice(self, method: str) -> BaseChoice:
        for c in self.choices:
            if c.method == method:
                return c
        raise KeyError(method)


@dataclass
class Suggestion:
    rotary_dim: int
    head_dim: int | None
    pretrain_base: float
    pretrain_length: int
    rule: str
    lengths: list[LengthSuggestion] = field(default_factory=list)

    @property
    def recommended(self) -> dict[int, int]:
        """{target length: recommended base}."""
        return {s.length: s.recommended for s in self.lengths}


def suggest(
    *,
    rotary_dim: int,
    pretrain_base: float,
    pretrain_length: int,
    lengths: Sequence[int],
    head_dim: int | None = None,
    methods: Sequence[str] = BASE_METHODS,
    safe_factor: float = 4.0,
    abf_base: int = 500_000,
) -> Suggestion:
    """Run `methods` for each target length (ascending) and recommend one base per length.

    `fixed` keeps the pretraining base; `abf` uses `abf_base`; the others use their defaults
    (men: exact search; men-safe: ×`safe_factor` of the paper's value, or of the exact search for
    rotary dims other than 128). Scaling methods may be listed too; they keep the base.
    """
    if not lengths:
        raise RopeError("no target lengths given", fix="e.g. --lengths 16384,65536,131072")
    too_long = [n for n in lengths if n > cossum.MAX_LENGTH]
    if too_long:
        raise RopeError(
            f"target length {max(too_long):,} is beyond what longctx plans for ({cossum.MAX_LENGTH:,} tokens; "
            "the diagnostics scan every offset up to the target)",
            where="--lengths",
            fix=f"give target lengths up to {cossum.MAX_LENGTH:,} (16M) tokens",
        )
    for name in methods:
        get_method(name)
    out = Suggestion(rotary_dim, head_dim, pretrain_base, pretrain_length, RECOMMENDATION_RULE)
    previous = to_int(pretrain_base)
    common = dict(
        rotary_dim=rotary_dim, pretrain_base=pretrain_base, pretrain_length=pretrain_length, head_dim=head_dim
    )
    for length in sorted(set(lengths)):
        row_choices: list[BaseChoice] = []
        for name in methods:
            params: dict[str, object] = {}
            if name == "fixed":
                params["base"] = to_int(pretrain_base)
            elif name == "abf":
                params["base"] = abf_base
            elif name == "men-safe":
                params["factor"] = safe_factor
            row_choices.append(choose_base(name, target_length=length, **common, **params))  # type: ignore[arg-type]
        safe = next((c for c in row_choices if c.method == "men-safe"), None)
        if safe is None:
            safe = choose_base("men-safe", target_length=length, factor=safe_factor, **common)  # type: ignore[arg-type]
        diag = safe.diagnostics
        assert diag is not None
        candidates = [
            (formulas.round_sig(safe.exact, 2), "men-safe"),  # before men-safe's own floor
            (previous, "previous stage" if out.lengths else "pretraining base"),
            (diag.men_bound, "men"),
        ]
        recommended = max(value for value, _ in candidates)
        by = next(label for value, label in candidates if value == recommended)
        paper_ok = _paper_applies(rotary_dim, head_dim)
        out.lengths.append(
            LengthSuggestion(
                length=length,
                men_bound=diag.men_bound,
                men_paper=formulas.men_paper(length) if paper_ok else None,
                men_fit=formulas.men_fit(length) if paper_ok else None,
                recommended=recommended,
                recommended_by=by,
                choices=row_choices,
            )
        )
        previous = recommended
    return out
