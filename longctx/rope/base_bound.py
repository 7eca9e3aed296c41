"""What a RoPE base must be wherever one enters longctx (a plan's base or sweep candidate, a method's
result, the sweep's choice on disk, an option): an integer, as Megatron's `--rotary-base` is, above 1
(a base of 1 gives every pair the same frequency) and at most MAX_BASE — far above any model's
(published: 1e4 to ~5e8) and far below what a typo gives (2**63 − 1, 1e300). One definition, so the
same value is never refused in one place and let through (or truncated) in another."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from longctx.errors import RopeError

MAX_BASE = 10**15
BASE_FIX = "give the rotary base as an integer, e.g. 1000000 (not 1e6 or 1000000.5), at most 10^15"


def base_problem(value: object) -> str | None:
    """Why `value` is not a RoPE base longctx accepts, or None when it is one."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer (Megatron's --rotary-base is an int), got {_shown(value)}"
    if value <= 1:
        return f"must be greater than 1, got {value}"
    if value > MAX_BASE:
        return f"must be at most 10^15 (published models use 1e4 to ~5e8), got {_shown(value)}"
    return None


def check_base(value: object, *, what: str = "the rotary base", where: str | None = None) -> int:
    """`value` as a base, or RopeError naming `what` and what is wrong with it."""
    problem = base_problem(value)
    if problem is not None:
        raise RopeError(f"{what} {problem}", where=where, fix=BASE_FIX)
    assert isinstance(value, int)
    return value


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and len(str(value)) > 18:
        return f"a {len(str(value))}-digit integer"
    return repr(value)[:60]


def _validated(value: Any) -> int:
    problem = base_problem(value)
    if problem is not None:
        raise ValueError(f"rotary base {problem}")
    return int(value)


# a pydantic field holding a base (plan schema, the sweep's choice record): the same rule, as a type
RotaryBase = Annotated[int, BeforeValidator(_validated)]

__all__ = ["BASE_FIX", "MAX_BASE", "RotaryBase", "base_problem", "check_base"]
