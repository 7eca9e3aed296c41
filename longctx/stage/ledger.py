"""The ledger: an append-only, fsynced JSONL record of every launch of every stage in a run directory.

Each launch writes a `launch` record before the process starts and an `end` record after it exits
(each kind of record is a model of `longctx.stage.ledger_events`).
A launch records what the stage is bound to — tokenizer md5, data digests, base checkpoint identity,
RoPE base and scaling, sequence length. Relaunching a stage with anything different is refused unless
forced, and the override is recorded.

A launch also records the stage's LR schedule (`Binding.schedule`). Megatron-LM asserts on resume that
the scheduler's values equal the checkpoint's (OptimizerParamScheduler._check_and_set), so a started
stage whose plan now asks another schedule is refused (`check_schedule`) unless forced; a forced launch
adds `--override-opt_param-scheduler` and records the override (old → new).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from longctx import __version__
from longctx.errors import StageError
from longctx.stage.ledger_events import EVENTS, RECORD, End, Launch, LedgerEvent, RecordedBinding
from longctx.stage.run_files import LEDGER_BYTES, check_run_file, read_run_text
from longctx.util import bounded_json
from longctx.util.fs import append_line_durably

LEDGER_NAME = "ledger.jsonl"

# what a stage is bound to once it has launched
BINDING_FIELDS = (
    "tokenizer_md5", "data_digest", "base_identity", "rotary_base", "seq_length", "rope_scaling",
    "attention_scale",
)  # fmt: skip
# bindings recorded with this mark hash content and sizes only; older records hashed absolute paths into
# data_digest and prefixed base_identity with the save directory (compared the old way, see
# binding_conflicts)
CONTENT_IDENTITY = "content-1"

# what Megatron-LM's OptimizerParamScheduler checks against a resumed checkpoint, keyed as Megatron's args
# (global_batch_size: the scheduler counts warmup/decay/weight-decay steps in samples = iterations × it)
SCHEDULE_FIELDS: dict[str, str] = {
    "lr": "--lr",
    "min_lr": "--min-lr",
    "lr_warmup_iters": "--lr-warmup-iters",
    "lr_decay_iters": "--lr-decay-iters",
    "lr_decay_style": "--lr-decay-style",
    "weight_decay": "--weight-decay",
    "global_batch_size": "--global-batch-size",
}


@dataclasses.dataclass
class Binding:
    tokenizer_md5: str
    data_digest: str
    base_identity: str
    rotary_base: int
    seq_length: int
    schedule: dict[str, Any] | None = None  # SCHEDULE_FIELDS → value (checked by check_schedule)
    # the stage's RoPE scaling (YaRN) as the plan summarises it; None: the base alone (records written
    # before it was bound lack the key and are not compared on it)
    rope_scaling: dict[str, Any] | None = None
    # the logit scale folded into the weights at the stage's start (records before it lack the key)
    attention_scale: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "identity": CONTENT_IDENTITY}

    def record(self) -> RecordedBinding:
        """The binding as a launch record holds it."""
        return RecordedBinding.model_validate(self.to_json())


def ledger_path(run_dir: Path) -> Path:
    return Path(run_dir) / LEDGER_NAME


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def append(run_dir: Path, event: LedgerEvent) -> None:
    """Add `event` to the run's ledger, stamped with when, where and which process and Slurm job; the
    fields the writer set (null included) are written, and the line is one `read` accepts."""
    stamp = {
        "time": now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    record = {
        **stamp,
        **event.model_dump(mode="json", by_alias=True, exclude_unset=True),
        "event": event.event,
    }
    RECORD.validate_python(record)
    path = ledger_path(run_dir)
    check_run_file(path, Path(run_dir), "ledger")
    append_line_durably(path, json.dumps(record, sort_keys=True, default=str))


def read(run_dir: Path) -> list[LedgerEvent]:
    """All records; a torn last line (a crash mid-write) is skipped, any other bad line is an error, as is
    a record of no event longctx writes, or whose fields have the wrong type or an unbounded number."""
    path = ledger_path(run_dir)
    text = read_run_text(path, Path(run_dir), "ledger", max_bytes=LEDGER_BYTES)
    if text is None:
        return []
    lines = text.splitlines()
    out: list[LedgerEvent] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = bounded_json.loads(line)
        except bounded_json.BadJSON as err:
            if i == len(lines) - 1 and not text.endswith("\n"):
                continue
            raise _damaged(path, i, f"is not JSON ({err})") from None
        if not isinstance(rec, dict):
            raise _damaged(path, i, f"is a JSON {type(rec).__name__}, not a record (an object)")
        try:
            out.append(RECORD.validate_python(rec))
        except ValidationError as err:
            raise _damaged(path, i, _what_is_wrong(rec, err)) from None
    return out


def _damaged(path: Path, index: int, what: str) -> StageError:
    sep = "" if what.startswith("is ") else ":"
    fix = "inspect the file; the ledger is append-only and must not be edited"
    if "none longctx writes" in what:  # perhaps a newer longctx's event
        fix = f"run the longctx version that wrote this run directory (this is {__version__}), or {fix}"
    return StageError(f"ledger line {index + 1}{sep} {what}", where=str(path), fix=fix)


# what a field of the wrong type should have been, by pydantic's error type
_WANTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "text",
    "model_type": "an object",
    "dict_type": "an object",
    "list_type": "a list",
    "bool_type": "true or false",
}


def _what_is_wrong(rec: dict[str, Any], err: ValidationError) -> str:
    """The first wrong field of a record, as `end_iteration is "abc", not an integer`."""
    errors = err.errors()
    first = errors[0]
    if first["type"] == "union_tag_not_found":
        return f"the record names no event (one of {', '.join(EVENTS)})"
    if first["type"] == "union_tag_invalid":
        return f"event {json.dumps(rec.get('event'))[:60]} is none longctx writes ({', '.join(EVENTS)})"
    # a field that may be one of several types fails once per type, at the same input
    same = [e for e in errors if e["input"] is first["input"] and e["loc"][:2] == first["loc"][:2]]
    loc = _common_prefix([e["loc"][1:] for e in same])  # the first item is the event kind
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    want = " or ".join(dict.fromkeys(_WANTED.get(e["type"], e["msg"]) for e in same))
    return f"{key} is {json.dumps(first['input'], default=str)[:60]}, not {want}"


def _common_prefix(locs: list[tuple[int | str, ...]]) -> tuple[int | str, ...]:
    n = 0
    while all(len(loc) > n and loc[n] == locs[0][n] for loc in locs):
        n += 1
    return locs[0][:n]


def launches(run_dir: Path, stage: str | None = None) -> Iterator[Launch]:
    for rec in read(run_dir):
        if isinstance(rec, Launch) and (stage is None or rec.stage == stage):
            yield rec


def recorded_binding(run_dir: Path, stage: str) -> RecordedBinding | None:
    """The binding of the stage's most recent launch (forced overrides become the new binding)."""
    last = None
    for rec in launches(run_dir, stage):
        last = rec.binding
    return last


def binding_conflicts(recorded: RecordedBinding | None, current: Binding) -> dict[str, tuple[Any, Any]]:
    """The bound fields whose recorded value differs from the current one (a field the record does not
    hold is not compared: it was bound after the record was written)."""
    if recorded is None:
        return {}
    cur = current.to_json()
    if recorded.identity != CONTENT_IDENTITY:
        recorded, cur = _legacy_view(recorded, current)
    old = {k: getattr(recorded, k) for k in BINDING_FIELDS if k in recorded.model_fields_set}
    return {k: (v, cur[k]) for k, v in old.items() if v != cur[k]}


def _legacy_view(recorded: RecordedBinding, current: Binding) -> tuple[RecordedBinding, dict[str, Any]]:
    """A record written before identity by content, and the current binding, made comparable: the base
    without its save directory (`<dir>@iter_…:<digest>` → `iter_…:<digest>`). Its data digest hashed
    paths and is not computed any more: check_binding refuses it rather than compare it."""
    base = recorded.base_identity
    if base is not None and "@" in base:
        recorded = recorded.model_copy(update={"base_identity": base.rsplit("@", 1)[1]})
    return recorded, current.to_json()


def _old_data_digest(recorded: RecordedBinding | None) -> bool:
    """The record binds the data by the digest written before identity by content."""
    return (
        recorded is not None
        and recorded.identity != CONTENT_IDENTITY
        and "data_digest" in recorded.model_fields_set
    )


def check_binding(run_dir: Path, stage: str, current: Binding, *, force: bool) -> dict[str, tuple[Any, Any]]:
    """Raise StageError when the stage was launched with other inputs (unless force); return conflicts."""
    recorded = recorded_binding(run_dir, stage)
    conflicts = binding_conflicts(recorded, current)
    if _old_data_digest(recorded) and not force:
        raise StageError(
            f"stage {stage!r} was launched by an earlier longctx that recorded its data by a digest of paths, "
            "which is no longer computed: the data cannot be checked against that launch",
            where=str(ledger_path(run_dir)),
            fix="if the stage's data (blend, .bin/.idx files) is unchanged, pass --force once: the launch "
            "records today's binding in the ledger and later launches are checked against it",
        )
    if conflicts and not force:
        detail = "; ".join(f"{k}: ledger {a!r}, now {b!r}" for k, (a, b) in conflicts.items())
        raise StageError(
            f"stage {stage!r} was launched with different inputs than now ({detail})",
            where=str(ledger_path(run_dir)),
            fix="restore the original tokenizer/data/base/RoPE, or pass --force to override (recorded in the ledger)",
        )
    return conflicts


# -- the LR schedule a started stage's checkpoints carry ------------------------------------------


def recorded_schedule(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """The schedule the stage's saves were written with: its first launch's, replaced by a later launch's
    (a forced override) only once that launch made progress (its `end` record is past its start) — a
    launch that saved nothing left the checkpoint's scheduler as it was. None: nothing recorded."""
    current: dict[str, Any] | None = None
    pending: dict[str, Any] | None = None
    for rec in read(run_dir):
        if isinstance(rec, Launch) and rec.stage == stage:
            pending = rec.binding.schedule if rec.binding is not None else None
            if current is None:
                current = pending
        elif isinstance(rec, End) and rec.stage == stage and pending is not None and rec.progressed:
            current = pending
    return current


def schedule_conflicts(
    recorded: dict[str, Any] | None, current: dict[str, Any] | None
) -> dict[str, tuple[Any, Any]]:
    if not recorded or not current:
        return {}
    return {
        k: (recorded[k], current.get(k))
        for k in SCHEDULE_FIELDS
        if k in recorded and k in current and recorded[k] != current[k]
    }


def check_schedule(
    run_dir: Path,
    stage: str,
    current: dict[str, Any] | None,
    *,
    force: bool,
    saved: dict[str, Any] | None = None,
) -> dict[str, tuple[Any, Any]]:
    """For a started stage (a tracker in its save dir): raise StageError when the plan's schedule differs
    from the one its checkpoints carry — `saved`, read from the latest save, or else the one this ledger
    recorded — unless force; return the differences (old, new)."""
    recorded = saved if saved is not None else recorded_schedule(run_dir, stage)
    conflicts = schedule_conflicts(recorded, current)
    if conflicts and not force:
        detail = "; ".join(f"{k} ({SCHEDULE_FIELDS[k]}): {a!r} → {b!r}" for k, (a, b) in conflicts.items())
        revert = ", ".join(f"{k} = {a!r}" for k, (a, _) in conflicts.items())
        raise StageError(
            f"stage {stage!r} has started and its checkpoint's LR schedule differs from the plan's now "
            f"(saved → now: {detail}); Megatron-LM would stop on resume "
            "(OptimizerParamScheduler asserts these equal the checkpoint's)",
            where=str(ledger_path(run_dir)),
            fix=f"revert the plan's schedule ({revert}), or pass --force to resume with the new schedule "
            "(adds --override-opt_param-scheduler; the override is recorded in the ledger)",
        )
    return conflicts
