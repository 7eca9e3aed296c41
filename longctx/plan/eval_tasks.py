"""The needle tasks an evaluation can run (RULER's needle-in-a-haystack variants), by name.

A plan's `[eval].tasks` lists them (`["single", "multikey-2", "multivalue", "multiquery", "absent"]`):

* `single` — one needle, its name asked (the passkey grid every report has);
* `multikey-K` — K needles under K distinct names, the question names one of them;
* `multivalue-V` — V needles stating V distinct keys for one name; every key must be returned;
* `multiquery-Q` — Q needles under Q distinct names, all asked at once; every key must be returned;
* `absent-K` — a control: K needles, the question names someone absent; never a hit.

A name without its count takes RULER's 4 (`multikey` = `multikey-4`); names are stored in that full
form, `single` first (it is always measured).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Literal

TaskKind = Literal["single", "multikey", "multivalue", "multiquery", "absent"]
KINDS: tuple[TaskKind, ...] = ("single", "multikey", "multivalue", "multiquery", "absent")
DEFAULT_COUNT = 4  # RULER's needles per haystack (keys, values, queries)
MAX_COUNT = 16
# the fewest needles each kind means something with
_LEAST = {"multikey": 2, "multivalue": 2, "multiquery": 2, "absent": 1}
_NAME = re.compile(r"^(?P<kind>[a-z]+)(?:-(?P<count>\d{1,3}))?$")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    kind: TaskKind
    count: int  # needles (multikey, absent), values (multivalue) or names asked (multiquery); 1 for single

    @property
    def name(self) -> str:
        return "single" if self.kind == "single" else f"{self.kind}-{self.count}"

    @property
    def control(self) -> bool:
        """The absent-name control: reported, never scored as a hit."""
        return self.kind == "absent"


def parse_task(text: str) -> TaskSpec:
    """`multikey-2` → TaskSpec("multikey", 2); ValueError naming the accepted forms otherwise."""
    m = _NAME.match(text.strip())
    kind = m.group("kind") if m else None
    if m is None or kind not in KINDS:
        raise ValueError(
            f"unknown needle task {text!r}; use single, multikey-K, multivalue-V, multiquery-Q or absent-K"
        )
    count = m.group("count")
    if kind == "single":
        if count is not None:
            raise ValueError(f"the single task has one needle; write 'single', not {text!r}")
        return TaskSpec("single", 1)
    n = DEFAULT_COUNT if count is None else int(count)
    if not _LEAST[kind] <= n <= MAX_COUNT:
        raise ValueError(f"{kind} takes {_LEAST[kind]}–{MAX_COUNT} needles, got {n} in {text!r}")
    return TaskSpec(kind, n)  # type: ignore[arg-type]


def check_tasks(names: Sequence[str]) -> list[str]:
    """The tasks in their full names, `single` first (added when left out); ValueError on a bad name or
    a task given twice."""
    full = [parse_task(n).name for n in names]
    twice = sorted({n for n in full if full.count(n) > 1})
    if twice:
        raise ValueError(f"needle tasks repeat: {', '.join(twice)}")
    return ["single", *(n for n in full if n != "single")]
