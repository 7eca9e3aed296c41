"""A RoPE sweep, as a plan resolves it: the candidate bases, the branch each trains, and the choice on disk.

    [[stages]]
    name = "4k"
    rope = { sweep = ["men", "men-safe", 16_000_000, 64_000_000], tokens = 500_000 }

Each candidate (a method of `longctx.rope`, named or as `{ method, params }`, or an explicit base) gives
one base; candidates that give the same base share a branch. A branch is the stage itself, shortened to
`tokens` and saved under `<stage_dir>/sweep/rope-<base>/`: it loads what the stage would load (the
previous stage's final weights, or the base checkpoint) and trains at the stage's length with its
candidate base, its LR schedule fitted to the shorter run. `longctx.rope.sweep` evaluates the finished
branches at the stage's length and writes the choice to `<stage_dir>/sweep/choice.json`; from then on
the stage resolves with the chosen base. Until then it is *pending*: its rotary base is the smallest
candidate, and nothing launches it (`longctx.stage.state.next_step` runs the branches, then the choice).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from longctx.errors import LongctxError, PlanError, StageError
from longctx.plan.schema import RopeSpec, SweepMethod
from longctx.rope.base_bound import RotaryBase
from longctx.util import bounded_json
from longctx.util.confined_read import read_text

SWEEP_DIR = "sweep"
CHOICE_FILE = "choice.json"
# the one selection rule so far (longctx.rope.sweep states it in full)
RULE = "worst-depth"
_CHOICE_MAX_BYTES = 4 << 20
# the branches together may cost at most the stage they choose for: a sweep is short runs that pick a
# base, and beyond this it is a typo in `tokens` (or a grid search) that would multiply the stage's cost
MAX_SWEEP_SHARE = 1.0
_CHOICE_FIX = (
    "delete it (or move it away) and run `longctx rope sweep PLAN --stage {stage}` again: it evaluates the "
    "finished branches and writes the choice anew"
)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)


class BranchRecord(_Record):
    """One branch's evidence in `choice.json`, as `longctx.stage.sweep_choice.BranchEvidence.to_json` writes it:
    the fields `plan show` and `stage status` read are typed; the others are kept as written."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False, extra="allow")

    base: RotaryBase
    length: StrictInt = Field(gt=0)
    keys: StrictInt = Field(ge=0)
    greedy_hits: list[StrictInt]
    far_loss: float | None = None


class ChoiceRecord(_Record):
    """`choice.json`: the one definition of what the sweep's choice on disk holds."""

    base: RotaryBase
    rule: StrictStr
    reason: StrictStr
    candidates: list[RotaryBase] = Field(min_length=2)
    branch_tokens: StrictInt = Field(gt=0)
    evidence: list[BranchRecord]

    @model_validator(mode="after")
    def _chosen_among_candidates(self) -> ChoiceRecord:
        if self.base not in self.candidates:
            raise ValueError(f"the chosen base {self.base:,} is not one of its candidates")
        stray = sorted({e.base for e in self.evidence} - set(self.candidates))
        if stray:
            raise ValueError(f"evidence for base {stray[0]:,}, which is not one of its candidates")
        return self


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One branch of a sweep: a base, and which of the plan's candidates gave it."""

    base: int
    sources: tuple[str, ...]  # "men: …explanation…", "explicit base 16,000,000"

    @property
    def label(self) -> str:
        return f"rope-{self.base}"


@dataclasses.dataclass(frozen=True)
class SweepChoice:
    """What `choice.json` records: the chosen base, the rule, and each branch's evidence."""

    base: int
    rule: str
    reason: str
    candidates: tuple[int, ...]
    branch_tokens: int
    evidence: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "candidates": list(self.candidates),
            "evidence": list(self.evidence),
        }


@dataclasses.dataclass(frozen=True)
class ResolvedSweep:
    """A stage's sweep: its branches' bases, tokens per branch, where the choice lives, and the choice
    (None while pending)."""

    stage: str
    candidates: tuple[Candidate, ...]
    branch_tokens: int  # what each branch trains (planned; its iterations round up to whole batches)
    stage_tokens: int
    directory: Path  # <stage_dir>/sweep
    chosen: SweepChoice | None
    stale: str | None = (
        None  # why a choice on disk does not apply to these candidates (None: it does, or none)
    )

    @property
    def choice_path(self) -> Path:
        return self.directory / CHOICE_FILE

    @property
    def pending(self) -> bool:
        return self.chosen is None

    @property
    def bases(self) -> tuple[int, ...]:
        return tuple(c.base for c in self.candidates)

    def branch_name(self, candidate: Candidate) -> str:
        """The name a branch goes by in the ledger, the lock and `stage status`: `<stage>.rope-<base>`."""
        return f"{self.stage}.{candidate.label}"

    def branch_dir(self, candidate: Candidate) -> Path:
        return self.directory / candidate.label

    def summary(self) -> dict[str, Any]:
        return {
            "candidates": [{"base": c.base, "from": list(c.sources)} for c in self.candidates],
            "branch_tokens": self.branch_tokens,
            "total_tokens": self.branch_tokens * len(self.candidates),
            "share_of_stage": self.branch_tokens * len(self.candidates) / self.stage_tokens,
            "rule": RULE,
            "choice": self.chosen.to_json() if self.chosen else None,
            "stale": self.stale,
            "record": str(self.choice_path),
        }


def require_chosen(stage: str, sweep: ResolvedSweep | None) -> None:
    """A stage whose sweep has not chosen has no base to launch with (StageError naming the way on)."""
    if sweep is None or not sweep.pending:
        return
    raise StageError(
        f"stage {stage}'s RoPE base is not chosen yet: its sweep among "
        f"{', '.join(f'{b:,}' for b in sweep.bases)} is pending",
        where=str(sweep.choice_path),
        fix="run the sweep first: `longctx rope sweep PLAN --stage "
        + stage
        + "` (or `stage run --until-done`)",
    )


def describe(sweep: ResolvedSweep, branch_tokens_realized: int) -> list[str]:
    """Plain lines for `plan show` / `stage status`: the branches, their cost, and the evidence once chosen."""
    n = len(sweep.candidates)
    total = n * branch_tokens_realized
    lines = [
        f"sweep of {n} branches × {branch_tokens_realized:,} tokens = {total:,} tokens "
        f"({total / sweep.stage_tokens:.0%} of the stage's {sweep.stage_tokens:,}); rule {RULE}; {sweep.choice_path}"
    ]
    evidence = {int(e["base"]): e for e in sweep.chosen.evidence} if sweep.chosen else {}
    for c in sweep.candidates:
        e = evidence.get(c.base)
        shown = ""
        if e is not None:
            loss = e.get("far_loss")
            shown = (
                f": greedy {'/'.join(str(h) for h in e['greedy_hits'])} of {e['keys']} by depth at "
                f"{e['length']:,}" + (f", far-end loss {loss:.4f}" if isinstance(loss, float) else "")
            )
        mark = " ← chosen" if sweep.chosen and sweep.chosen.base == c.base else ""
        lines.append(f"  {c.base:>14,}  from {', '.join(c.sources)}{shown}{mark}")
    if sweep.stale:
        lines.append(f"  an earlier choice does not apply: {sweep.stale}")
    return lines


def merge_candidates(found: list[tuple[int, str]]) -> tuple[Candidate, ...]:
    """Candidates by base, ascending; the sources of equal bases merged in the plan's order."""
    by_base: dict[int, list[str]] = {}
    for base, source in found:
        by_base.setdefault(base, []).append(source)
    return tuple(Candidate(b, tuple(by_base[b])) for b in sorted(by_base))


def resolve_sweep(
    stage: str,
    rope: RopeSpec,
    *,
    stage_tokens: int,
    directory: Path,
    run_dir: Path,
    method_base: Callable[[str, dict[str, Any]], int],
    where: str,
) -> ResolvedSweep:
    """The sweep a stage's `rope` asks for; `method_base(method, params)` gives a method's base (for the
    stage's windows, as `rope.method` would)."""
    assert rope.sweep is not None and rope.tokens is not None
    found: list[tuple[int, str]] = []
    for cand in rope.sweep:
        if isinstance(cand, int):
            found.append((cand, f"explicit base {cand:,}"))
            continue
        method, params = (cand.method, cand.params) if isinstance(cand, SweepMethod) else (cand, {})
        try:
            base = method_base(method, params)
        except LongctxError as err:
            raise PlanError(f"sweep candidate {method!r}: {err.what}", where=where, fix=err.fix) from None
        found.append((base, method + (f" {params}" if params else "")))
    candidates = merge_candidates(found)
    if len(candidates) < 2:
        raise PlanError(
            f"the sweep's candidates all give base {candidates[0].base:,}: nothing to choose between",
            where=where,
            fix="add candidates that give other bases (explicit values, or other methods)",
        )
    _check_cost(len(candidates), rope.tokens, stage_tokens, where)
    bases = tuple(c.base for c in candidates)
    chosen, stale = read_choice(directory, run_dir, bases, rope.tokens, stage)
    return ResolvedSweep(stage, candidates, rope.tokens, stage_tokens, directory, chosen, stale)


def load_choice(path: Path, run_dir: Path, stage: str) -> SweepChoice | None:
    """The choice at `path` (None when there is none), read through `ChoiceRecord`: PlanError naming the
    file, what is wrong and the way out for anything damaged (not JSON, wrong types, missing keys, a base
    out of bounds or not among its candidates) — never a value silently truncated."""
    text = read_text(path, run_dir, "RoPE sweep choice", error=PlanError, max_bytes=_CHOICE_MAX_BYTES)
    if text is None:
        return None
    fix = _CHOICE_FIX.format(stage=stage)
    try:
        record = ChoiceRecord.model_validate(bounded_json.loads(text))
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(x) for x in first["loc"] if not str(x).startswith("function-")) or "the record"
        msg = first["msg"].removeprefix("Value error, ")
        raise PlanError(
            f"the RoPE sweep choice is damaged: {field}: {msg}", where=str(path), fix=fix
        ) from None
    except (ValueError, RecursionError) as err:  # not JSON (bounded_json.BadJSON is a ValueError too)
        what = f"the RoPE sweep choice is damaged: not JSON ({str(err)[:200]})"
        raise PlanError(what, where=str(path), fix=fix) from None
    evidence = tuple(e.model_dump() for e in record.evidence)
    return SweepChoice(
        base=record.base,
        rule=record.rule,
        reason=record.reason,
        candidates=tuple(record.candidates),
        branch_tokens=record.branch_tokens,
        evidence=evidence,
    )


def _check_cost(branches: int, branch_tokens: int, stage_tokens: int, where: str) -> None:
    """PlanError when the branches together cost more than MAX_SWEEP_SHARE of the stage."""
    total = branches * branch_tokens
    if total <= MAX_SWEEP_SHARE * stage_tokens:
        return
    most = int(MAX_SWEEP_SHARE * stage_tokens) // branches
    raise PlanError(
        f"the sweep's {branches} branches × {branch_tokens:,} tokens = {total:,} tokens cost "
        f"{total / stage_tokens:.0%} of the stage's {stage_tokens:,}, more than the {MAX_SWEEP_SHARE:.0%} "
        "a sweep may spend choosing its base",
        where=where,
        fix=f"give each branch at most {most:,} tokens (rope.tokens), or sweep fewer candidates",
    )


def read_choice(
    directory: Path, run_dir: Path, bases: tuple[int, ...], branch_tokens: int, stage: str = "STAGE"
) -> tuple[SweepChoice | None, str | None]:
    """The choice on disk, if it was made for these candidate bases and branch tokens; else (None, why)
    — why is None when there is no choice yet."""
    path = directory / CHOICE_FILE
    choice = load_choice(path, run_dir, stage)
    if choice is None:
        return None, None
    if tuple(sorted(choice.candidates)) != bases or choice.branch_tokens != branch_tokens:
        return None, (
            f"{path} was chosen among {', '.join(f'{b:,}' for b in choice.candidates)} with "
            f"{choice.branch_tokens:,} tokens per branch; the plan now asks for "
            f"{', '.join(f'{b:,}' for b in bases)} with {branch_tokens:,}"
        )
    return choice, None


__all__ = [
    "CHOICE_FILE",
    "MAX_SWEEP_SHARE",
    "RULE",
    "SWEEP_DIR",
    "BranchRecord",
    "Candidate",
    "ChoiceRecord",
    "ResolvedSweep",
    "SweepChoice",
    "describe",
    "load_choice",
    "merge_candidates",
    "read_choice",
    "require_chosen",
    "resolve_sweep",
]
