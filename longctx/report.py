"""Findings of checks, and conversion of reports to JSON-ready data.

Every check (tokenizer, data, checkpoint, plan) returns a report holding `Finding`s; the CLI prints them
as a table or as JSON and exits non-zero when any finding is an error.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any, Literal

Level = Literal["error", "warning", "info"]


@dataclasses.dataclass
class Finding:
    """One observation of a check: an error stops the run, a warning is shown, info is context."""

    level: Level
    code: str
    message: str
    where: str | None = None
    fix: str | None = None
    expected: Any = None
    found: Any = None


class Findings(list[Finding]):
    """A list of findings with helpers to add and filter them."""

    def error(self, code: str, message: str, **kw: Any) -> Finding:
        return self._add("error", code, message, **kw)

    def warning(self, code: str, message: str, **kw: Any) -> Finding:
        return self._add("warning", code, message, **kw)

    def info(self, code: str, message: str, **kw: Any) -> Finding:
        return self._add("info", code, message, **kw)

    def _add(self, level: Level, code: str, message: str, **kw: Any) -> Finding:
        f = Finding(level=level, code=code, message=message, **kw)
        self.append(f)
        return f

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, level: Level | None = None) -> list[str]:
        return [f.code for f in self if level is None or f.level == level]

    def escalate_warnings(self, codes: Iterable[str] | None = None) -> None:
        """Turn warnings into errors (for --strict); only the given codes when codes is set."""
        wanted = None if codes is None else set(codes)
        for f in self:
            if f.level == "warning" and (wanted is None or f.code in wanted):
                f.level = "error"


def to_jsonable(obj: Any) -> Any:
    """Convert dataclasses, pydantic models, enums, paths and numpy scalars to JSON-ready values."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, PurePath):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump") and callable(obj.model_dump):
        return to_jsonable(obj.model_dump(mode="json"))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    # numpy scalars and arrays without importing numpy here
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return to_jsonable(obj.tolist())
    if hasattr(obj, "item") and callable(obj.item):
        return to_jsonable(obj.item())
    return str(obj)


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(obj), indent=indent, sort_keys=False)


__all__ = ["Finding", "Findings", "Level", "dumps", "to_jsonable"]
