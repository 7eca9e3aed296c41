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
import math
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


def key_space(digits: int, any_digit: bool) -> int:
    """How many different keys of `digits` digits the evaluation can draw: distinct digits while ten
    suffice (longctx.eval.passkey_text.random_key), any digits otherwise or with `any_digit`."""
    return 10**digits if any_digit or digits > 10 else math.perm(10, digits)


def key_space_problem(digits: int, any_digit: bool, distractors: int, tasks: Sequence[str]) -> str | None:
    """Why an item of these settings cannot draw the distinct keys it needs (the key and its distractors
    for `single`, one key per needle for the other tasks), or None. The evaluation draws keys at random
    until it has them: with fewer keys than it needs it can only give up, after loading the model."""
    space = key_space(digits, any_digit)
    needs = [(1 + distractors, f"the key and {distractors} distractors of the single task")]
    needs += [
        (t.count, f"the {t.count} needles of {t.name}") for t in map(parse_task, tasks) if t.kind != "single"
    ]
    need, what = max(needs)
    if need <= space:
        return None
    kind = "keys of any digits" if any_digit or digits > 10 else "keys of distinct digits"
    return (
        f"there are {space:,} {digits}-digit {kind}, fewer than the {need:,} distinct keys an item needs "
        f"({what}); raise key_digits, or lower distractors or the needles"
    )


def check_tasks(names: Sequence[str]) -> list[str]:
    """The tasks in their full names, `single` first (added when left out); ValueError on a bad name or
    a task given twice."""
    full = [parse_task(n).name for n in names]
    twice = sorted({n for n in full if full.count(n) > 1})
    if twice:
        raise ValueError(f"needle tasks repeat: {', '.join(twice)}")
    return ["single", *(n for n in full if n != "single")]
