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
from longctx.stage.run_files import LOCK_BYTES, check_run_file, read_run_text
from longctx.util import bounded_json
from longctx.util.printable import one_line

LOCK_NAME = "longctx.lock"
_MAX_PID = 2**31 - 1  # a pid beyond it is no process (os.kill would overflow)


@dataclasses.dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job_id: str | None
    since: str
    stage: str

    def describe(self) -> str:
        """One line for people; the fields come from a file, so their control characters are escaped."""
        job = f", Slurm job {one_line(self.job_id)}" if self.job_id else ""
        return (
            f"pid {self.pid} on {one_line(self.host)}{job}, since {one_line(self.since)}, "
            f"stage {one_line(self.stage)}"
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK_NAME


def _me(stage: str) -> Holder:
    since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return Holder(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID"), since, stage)


def read_holder(run_dir: Path) -> Holder | None:
    """The lock's holder; None when unlocked. StageError when the lock is not a regular file or not ours."""
    path = lock_path(run_dir)
    try:
        text = read_run_text(path, Path(run_dir), "run lock", max_bytes=LOCK_BYTES, appended=False)
    except StageError as err:
        if "UTF-8" not in err.what:
            raise
        text = ""
    if text is None:
        return None
    try:
        holder = _holder(bounded_json.loads(text))
    except bounded_json.BadJSON:
        holder = None
    if holder is None:
        raise StageError(
            "the run lock is not a holder record (host, pid, job id) written by longctx",
            where=str(path),
            fix=f"make sure no `longctx stage run` works on this run directory, then remove {path}",
        )
    return holder


def _holder(rec: object) -> Holder | None:
    """The holder of a lock record; None unless every field has the type and range longctx writes."""
    if not isinstance(rec, dict):
        return None
    host, pid, job, since, stage = (rec.get(k) for k in ("host", "pid", "job_id", "since", "stage"))
    if not all(isinstance(v, str) and v for v in (host, since, stage)):
        return None
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= _MAX_PID:
        return None
    if job is not None and (isinstance(job, bool) or not isinstance(job, str | int)):
        return None
    return Holder(host, pid, None if job is None else str(job), since, stage)  # type: ignore[arg-type]


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
        os.write(fd, json.dumps(me.to_json(), sort_keys=True).encode())
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
    check_run_file(path, Path(run_dir), "run lock", appended=False)
    if not _create(path, me):
        holder = read_holder(run_dir)
        reason = stale_reason(holder) if holder is not None else "it vanished"
        if holder is not None and reason is None:
            raise _held(path, holder)
        if holder is not None:
            replaced = {**holder.to_json(), "stale": reason}
            path.unlink(missing_ok=True)
        if not _create(path, me):  # another launcher replaced it first
            taken = read_holder(run_dir)
            if taken is not None:
                raise _held(path, taken)
            raise StageError(
                "another launcher took the run lock at the same moment",
                where=str(path),
                fix="run `longctx stage status` to see the holder, then try again",
            )
    try:
        yield replaced
    finally:
        with contextlib.suppress(OSError, StageError):
            if read_holder(run_dir) == me:
                path.unlink()
