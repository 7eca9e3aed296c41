"""Files the pipeline reads and appends to inside a run directory (the ledger, the lock, launch logs) must
be regular files there: a symlink could lead a ledger line into a file outside the run (or into
/dev/full, which takes bytes forever), a FIFO would block the reader forever. Checked with lstat before a
byte is read or written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from longctx.errors import StageError

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def check_run_file(path: Path, run_dir: Path, what: str) -> None:
    """StageError unless `path` is absent or a regular file whose directory lies inside `run_dir`."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise StageError(f"cannot inspect the {what}: {err.strerror}", where=str(path),
                         fix="check the run directory's permissions") from None  # fmt: skip
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        target = f" (to {os.readlink(path)})" if stat.S_ISLNK(st.st_mode) else ""
        raise StageError(
            f"the {what} is {kind}{target}, not a regular file; longctx reads and appends to it only as a "
            "regular file inside the run directory",
            where=str(path),
            fix=f"move it away and put the real {what} (a regular file) at {path}",
        )
    try:
        inside = path.parent.resolve().is_relative_to(Path(run_dir).resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        raise StageError(
            f"the {what} lies outside the run directory (its directory resolves to {path.parent.resolve()})",
            where=str(path),
            fix=f"replace the symbolic link on the way to {path} by a real directory inside {run_dir}",
        )
