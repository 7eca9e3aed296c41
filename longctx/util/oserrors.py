"""OS errors as domain errors: what the system refused, on which path, and what the user can do."""

from __future__ import annotations

import errno
import os

from longctx.errors import FileSystemError

_FIXES: dict[int, str] = {
    errno.EROFS: "the file system is mounted read-only: point the output (the plan's run_dir, --out, "
    "--run-dir) at a writable location, or remount it read-write",
    errno.ENOSPC: "the file system is full: free space on it (`df -h {dir}`) or move the output to a larger "
    "one, then run the command again (a stage continues from its last complete save)",
    errno.EDQUOT: "your disk quota is used up: free space in it or move the output to another file system, "
    "then run the command again",
    errno.EACCES: "this user may not access it: fix its permissions or choose a location you can write",
    errno.EPERM: "the operation is not permitted here: fix the permissions or choose another location",
    errno.ENOENT: "check the path: a directory on the way does not exist",
    errno.ENOTDIR: "a component of the path is a file where a directory is expected: remove or rename it",
    errno.EISDIR: "the path is a directory where a file is expected: give a file path",
    errno.ELOOP: "the path runs through a symlink loop: fix or remove the link",
    errno.ENAMETOOLONG: "the path is too long for the file system: choose a shorter one",
    errno.EMFILE: "too many open files: raise the limit (`ulimit -n`) and run the command again",
    errno.EIO: "the device reported an I/O error: check the file system (and the disk) before retrying",
}


def file_system_error(err: OSError, doing: str) -> FileSystemError:
    """The domain error of `err`, raised while `doing` (e.g. "stage run")."""
    where = os.fsdecode(err.filename) if err.filename is not None else None
    if err.filename2 is not None:
        where = f"{where} → {os.fsdecode(err.filename2)}"
    reason = err.strerror or type(err).__name__
    fix = _FIXES.get(err.errno or -1, "check the path and the file system, then run the command again")
    directory = os.path.dirname(os.fsdecode(err.filename)) if err.filename is not None else "."
    return FileSystemError(
        f"{doing}: the operating system refused: {reason}", where=where, fix=fix.format(dir=directory or ".")
    )
