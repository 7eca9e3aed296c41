"""Why a file system cannot take a write, asked of the file system itself.

Writers that hide the OS error (torch's zip writer reports a full disk as "unexpected pos …", a
distributed save as a CheckpointException) still leave a file system that says what is wrong."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Below this much free space a checkpoint save cannot succeed (one shard of the smallest model is more)
MIN_FREE_BYTES = 64 << 20


def existing_ancestor(path: str | os.PathLike[str]) -> Path:
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def storage_problem(path: str | os.PathLike[str], *, min_free: int = MIN_FREE_BYTES) -> OSError | None:
    """An OSError for what keeps `path`'s file system from taking a write (read-only, full), or None."""
    where = existing_ancestor(path)
    try:
        st = os.statvfs(where)
    except OSError as err:
        return err
    if st.f_flag & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))
    free = st.f_bavail * st.f_frsize
    if free < min_free:
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({free / 2**20:.1f} MiB free)", str(where))
    return None


def os_error_in(err: BaseException) -> OSError | None:
    """The first OSError in an exception's chain (cause and context), or None."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None
