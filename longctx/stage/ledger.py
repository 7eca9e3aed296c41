"""The ledger: an append-only, fsynced JSONL record of every launch of every stage in a run directory.

Each launch writes a `launch` record before the process starts and an `end` record after it exits.
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

from longctx.errors import StageError
from longctx.stage.run_files import LEDGER_BYTES, check_run_file, read_run_text
from longctx.util import bounded_json
from longctx.util.fs import append_line_durably

LEDGER_NAME = "ledger.jsonl"

# what a stage is bound to once it has launched
BINDING_FIELDS = (
    "tokenizer_md5", "data_digest", "base_identity", "rotary_base", "seq_length", "rope_scaling",
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

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "identity": CONTENT_IDENTITY}


def ledger_path(run_dir: Path) -> Path:
    return Path(run_dir) / LEDGER_NAME


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def append(run_dir: Path, record: dict[str, Any]) -> None:
    record = {"time": now(), "host": socket.gethostname(), "pid": os.getpid(),
              "job_id": os.environ.get("SLURM_JOB_ID"), **record}  # fmt: skip
    path = ledger_path(run_dir)
    check_run_file(path, Path(run_dir), "ledger")
    append_line_durably(path, json.dumps(record, sort_keys=True, default=str))


def read(run_dir: Path) -> list[dict[str, Any]]:
    """All records; a torn last line (a crash mid-write) is skipped, any other bad line is an error, as is
    a record whose known fields have the wrong type or an unbounded number."""
    path = ledger_path(run_dir)
    fix = "inspect the file; the ledger is append-only and must not be edited"
    text = read_run_text(path, Path(run_dir), "ledger", max_bytes=LEDGER_BYTES)
    if text is None:
        return []
    lines = text.splitlines()
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = bounded_json.loads(line)
        except bounded_json.BadJSON as err:
            if i == len(lines) - 1 and not text.endswith("\n"):
                continue
            raise StageError(f"ledger line {i + 1} is not JSON ({err})", where=str(path), fix=fix) from None
        if not isinstance(rec, dict):
            raise StageError(
                f"ledger line {i + 1} is a JSON {type(rec).__name__}, not a record (an object)",
                where=str(path),
                fix=fix,
            )
        bad = _mistyped(rec)
        if bad:
            raise StageError(f"ledger line {i + 1}: {bad}", where=str(path), fix=fix)
        out.append(rec)
    return out


# the type of each field longctx reads back from a record (absent or null is always allowed)
_INT_FIELDS = ("pid", "start_iteration", "end_iteration", "target_iterations", "exit_code", "progress",
               "position", "chain_length")  # fmt: skip
_STR_FIELDS = ("event", "stage", "action", "backend", "time", "host", "log", "status", "outcome", "kind",
               "reason", "chain_id", "script", "profile")  # fmt: skip
_ID_FIELDS = ("job_id", "slurm_job_id")  # a Slurm id: text or a number
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **{k: (int,) for k in _INT_FIELDS},
    **{k: (str,) for k in _STR_FIELDS},
    **{k: (str, int) for k in _ID_FIELDS},
    "seconds": (int, float),
    "binding": (dict,),
    "new_saves": (list,),
    "slurm_job_ids": (list,),
}


def _mistyped(rec: dict[str, Any]) -> str | None:
    """What is wrong with the record's known fields (None: nothing)."""
    for key, types in _FIELD_TYPES.items():
        v = rec.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, types):
            want = " or ".join(
                {int: "an integer", float: "a number", str: "text", dict: "an object", list: "a list"}[t]
                for t in types
            )
            return f"{key} is {json.dumps(v)[:60]}, not {want}"
    schedule = rec.get("binding", {}).get("schedule") if isinstance(rec.get("binding"), dict) else None
    if schedule is not None and not isinstance(schedule, dict):
        return "binding.schedule is not an object"
    for key in ("new_saves", "slurm_job_ids"):
        items = rec.get(key) or []
        if any(isinstance(x, bool) or not isinstance(x, int | str) for x in items):
            return f"{key} holds something other than iterations or job ids"
    return None


def launches(run_dir: Path, stage: str | None = None) -> Iterator[dict[str, Any]]:
    for rec in read(run_dir):
        if rec.get("event") == "launch" and (stage is None or rec.get("stage") == stage):
            yield rec


def recorded_binding(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """The binding of the stage's most recent launch (forced overrides become the new binding)."""
    last = None
    for rec in launches(run_dir, stage):
        last = rec.get("binding")
    return last


def binding_conflicts(recorded: dict[str, Any] | None, current: Binding) -> dict[str, tuple[Any, Any]]:
    if not recorded:
        return {}
    cur = current.as_dict()
    if recorded.get("identity") != CONTENT_IDENTITY:
        recorded, cur = _legacy_view(recorded, current)
    return {
        k: (recorded.get(k), cur[k]) for k in BINDING_FIELDS if k in recorded and recorded.get(k) != cur[k]
    }


def _legacy_view(recorded: dict[str, Any], current: Binding) -> tuple[dict[str, Any], dict[str, Any]]:
    """A record written before identity by content, and the current binding, made comparable: the base
    without its save directory (`<dir>@iter_…:<digest>` → `iter_…:<digest>`). Its data digest hashed
    paths and is not computed any more: check_binding refuses it rather than compare it."""
    rec = dict(recorded)
    base = rec.get("base_identity")
    if isinstance(base, str) and "@" in base:
        rec["base_identity"] = base.rsplit("@", 1)[1]
    return rec, current.as_dict()


def _old_data_digest(recorded: dict[str, Any] | None) -> bool:
    """The record binds the data by the digest written before identity by content."""
    return recorded is not None and recorded.get("identity") != CONTENT_IDENTITY and "data_digest" in recorded


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
        if rec.get("stage") != stage:
            continue
        if rec.get("event") == "launch":
            pending = (rec.get("binding") or {}).get("schedule")
            if current is None:
                current = pending
        elif rec.get("event") == "end" and pending is not None and _progressed(rec):
            current = pending
    return current


def _progressed(end: dict[str, Any]) -> bool:
    return int(end.get("end_iteration") or 0) > int(end.get("start_iteration") or 0) or bool(
        end.get("new_saves")
    )


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
