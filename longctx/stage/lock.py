"""One launcher at a time per run directory.

Whatever launches or trains a stage holds `<run_dir>/longctx.lock` for the launch: a JSON record of the
holder (host, pid, Slurm job id, since, stage). It is created with O_EXCL, which shared cluster file
systems honour where advisory locks (flock) are not always honoured. A second launcher finds it and is
refused (StageError, exit 2) before it writes anything. A lock whose holder is gone is stale: a pid of
this host that no longer runs, or the Slurm job this process runs in (a requeued job that was killed).
A stale lock is named and replaced. A holder on another host cannot be checked from here: it is named,
with how to remove the lock once that job is known to be gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longctx.errors import StageError
from longctx.stage.run_files import check_run_file

LOCK_NAME = "longctx.lock"
_MAX_LOCK_BYTES = 64 * 1024  # a holder record is ~200 bytes; anything larger is not ours


@dataclasses.dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job_id: str | None
    since: str
    stage: str

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return f"pid {self.pid} on {self.host}{job}, since {self.since}, stage {self.stage}"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK_NAME


def _me(stage: str) -> Holder:
    since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return Holder(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID"), since, stage)


def read_holder(run_dir: Path) -> Holder | None:
    """The lock's holder; None when unlocked. StageError when the lock is not a regular file or not ours."""
    path = lock_path(run_dir)
    check_run_file(path, Path(run_dir), "run lock")
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_LOCK_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StageError(f"cannot read the run lock: {err.strerror}", where=str(path),
                         fix="check the run directory's permissions") from None  # fmt: skip
    try:
        rec = json.loads(raw.decode("utf-8")) if len(raw) <= _MAX_LOCK_BYTES else None
        return Holder(str(rec["host"]), int(rec["pid"]), rec.get("job_id") and str(rec["job_id"]),
                      str(rec["since"]), str(rec["stage"]))  # fmt: skip
    except (ValueError, TypeError, KeyError, RecursionError):
        raise StageError(
            "the run lock is not a holder record (host, pid, job id) written by longctx",
            where=str(path),
            fix=f"make sure no `longctx stage run` works on this run directory, then remove {path}",
        ) from None


def stale_reason(h: Holder) -> str | None:
    """Why the holder is certainly gone (None: alive, or on another host where it cannot be checked)."""
    here = os.environ.get("SLURM_JOB_ID")
    if h.job_id and here == h.job_id and not (h.host == socket.gethostname() and h.pid == os.getpid()):
        return f"Slurm job {h.job_id} is this job, restarted: its earlier process is gone"
    if h.host != socket.gethostname():
        return None
    try:
        os.kill(h.pid, 0)
    except ProcessLookupError:
        return f"no process {h.pid} runs on {h.host}"
    except PermissionError:
        return None  # it runs, as another user
    return None


def _held(path: Path, h: Holder) -> StageError:
    remote = h.host != socket.gethostname()
    check = f"check that job ({'squeue -j ' + h.job_id if h.job_id else 'ssh ' + h.host}); " if remote else ""
    return StageError(
        f"the run directory is locked by another launch: {h.describe()}",
        where=str(path),
        fix=f"wait for that launch to end (`longctx stage status` shows the holder); {check}"
        f"if it is gone, remove {path}",
    )


def _create(path: Path, me: Holder) -> bool:
    """Write the holder record into a new lock file; False when one exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(me.as_dict(), sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def run_lock(run_dir: Path, stage: str) -> Iterator[dict[str, Any] | None]:
    """Hold the run directory's lock for a launch of `stage`; yields the stale holder it replaced (a record
    for the ledger) or None. StageError, with nothing written, when a live launch holds it."""
    path = lock_path(run_dir)
    me = _me(stage)
    replaced: dict[str, Any] | None = None
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    check_run_file(path, Path(run_dir), "run lock")
    if not _create(path, me):
        holder = read_holder(run_dir)
        reason = stale_reason(holder) if holder is not None else "it vanished"
        if holder is not None and reason is None:
            raise _held(path, holder)
        if holder is not None:
            replaced = {**holder.as_dict(), "stale": reason}
            path.unlink(missing_ok=True)
        if not _create(path, me):  # another launcher replaced it first
            taken = read_holder(run_dir)
            if taken is not None:
                raise _held(path, taken)
            raise StageError("another launcher took the run lock at the same moment", where=str(path),
                             fix="run `longctx stage status` to see the holder, then try again")  # fmt: skip
    try:
        yield replaced
    finally:
        with contextlib.suppress(OSError, StageError):
            if read_holder(run_dir) == me:
                path.unlink()
