"""JSON from a file, with the numbers and the nesting a reader can take: integers within 64 bits, finite
floats, no NaN/Infinity, at most `MAX_DEPTH` levels. Python's own parser accepts 1e400 (as inf), a
4301-digit integer (then raises ValueError, not a decode error) and nesting up to the recursion limit;
here each of these is a `BadJSON` naming what was refused."""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32
INT_LIMIT = 1 << 63


class BadJSON(ValueError):
    """Text that is not JSON, or JSON with a number or a nesting outside the bounds."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise BadJSON(f"the integer {text[:24]}… ({len(text)} characters) is beyond 64 bits")
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise BadJSON(f"the integer {text} is beyond 64 bits")
    return value


def _float(text: str) -> float:
    if len(text) > 64:
        raise BadJSON(f"the number {text[:24]}… ({len(text)} characters) is too long")
    value = float(text)
    if not math.isfinite(value):
        raise BadJSON(f"the number {text} is beyond a 64-bit float")
    return value


def _constant(name: str) -> float:
    raise BadJSON(f"{name} is not a number JSON allows")


def _depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > MAX_DEPTH:
                return False
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return True


def loads(text: str | bytes) -> Any:
    """The JSON value of `text`; BadJSON when it is not JSON or a number or the nesting is out of bounds."""
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except BadJSON:
        raise
    except RecursionError:
        raise BadJSON(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError) as err:  # JSONDecodeError, bytes that are not UTF-8
        raise BadJSON(str(err).splitlines()[0] if str(err) else "not JSON") from None
    if not _depth_ok(value):
        raise BadJSON(f"nested deeper than {MAX_DEPTH} levels")
    return value
