"""The ledger: an append-only, fsynced JSONL record of every launch of every stage in a run directory.

Each launch writes a `launch` record before the process starts and an `end` record after it exits.
A launch records what the stage is bound to — tokenizer md5, data digests, base checkpoint identity,
RoPE base, sequence length. Relaunching a stage with anything different is refused unless forced, and
the override is recorded.
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
from longctx.util.fs import append_line_durably

LEDGER_NAME = "ledger.jsonl"

# what a stage is bound to once it has launched
BINDING_FIELDS = ("tokenizer_md5", "data_digest", "base_identity", "rotary_base", "seq_length")


@dataclasses.dataclass
class Binding:
    tokenizer_md5: str
    data_digest: str
    base_identity: str
    rotary_base: int
    seq_length: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def ledger_path(run_dir: Path) -> Path:
    return Path(run_dir) / LEDGER_NAME


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def append(run_dir: Path, record: dict[str, Any]) -> None:
    record = {"time": now(), "host": socket.gethostname(), "pid": os.getpid(),
              "job_id": os.environ.get("SLURM_JOB_ID"), **record}  # fmt: skip
    append_line_durably(ledger_path(run_dir), json.dumps(record, sort_keys=True, default=str))


def read(run_dir: Path) -> list[dict[str, Any]]:
    """All records; a torn last line (a crash mid-write) is skipped, any other bad line is an error."""
    path = ledger_path(run_dir)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            raise StageError(
                f"ledger line {i + 1} is not JSON",
                where=str(path),
                fix="inspect the file; the ledger is append-only and must not be edited",
            ) from None
    return out


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
    return {
        k: (recorded.get(k), cur[k]) for k in BINDING_FIELDS if k in recorded and recorded.get(k) != cur[k]
    }


def check_binding(run_dir: Path, stage: str, current: Binding, *, force: bool) -> dict[str, tuple[Any, Any]]:
    """Raise StageError when the stage was launched with other inputs (unless force); return conflicts."""
    conflicts = binding_conflicts(recorded_binding(run_dir, stage), current)
    if conflicts and not force:
        detail = "; ".join(f"{k}: ledger {a!r}, now {b!r}" for k, (a, b) in conflicts.items())
        raise StageError(
            f"stage {stage!r} was launched with different inputs than now ({detail})",
            where=str(ledger_path(run_dir)),
            fix="restore the original tokenizer/data/base/RoPE, or pass --force to override (recorded in the ledger)",
        )
    return conflicts
