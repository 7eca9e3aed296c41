"""Reading a file longctx did not write in this process (a run's ledger, lock, logs, metrics and event
files; a shipped card) as data: confined, typed and bounded.

A file is read only when it is a regular file (not a symbolic link, FIFO, device, socket or directory),
its directory lies inside the given root, it is no larger than the caller's bound and, where longctx also
writes to it, it has one name only (through a second hard link a write would change a file outside the
root). The checks are made on the open descriptor: the file is opened with O_NOFOLLOW | O_NONBLOCK, so a
FIFO or a device is never waited on, and fstat must describe the file lstat described. Every refusal is
the caller's domain error carrying what, where and fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from longctx.errors import LongctxError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _not_regular(
    path: Path, st: os.stat_result, what: str, error: type[LongctxError], place: str
) -> LongctxError:
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
    target = ""
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            target = f" (to {os.readlink(path)})"
    return error(
        f"the {what} is {kind}{target}, not a regular file; longctx reads and writes it only as a "
        f"regular file inside {place}",
        where=str(path),
        fix=f"move it away and put the real {what} (a regular file) at {path}",
    )


def check_file(
    path: Path,
    root: Path,
    what: str,
    *,
    error: type[LongctxError],
    max_bytes: int | None = None,
    single_link: bool = False,
    place: str = "the run directory",
) -> os.stat_result | None:
    """The lstat of `path` once it passes every check (None: it does not exist); `error` otherwise. For a
    file handed on by name (to TensorBoard's reader) or appended to; `open_file` checks the descriptor."""
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise error(
            f"cannot inspect the {what}: {err.strerror}",
            where=str(path),
            fix="check the directory's permissions",
        ) from None
    if st is not None:
        _check_stat(path, st, what, error, max_bytes, single_link, place)
    _check_inside(path, root, what, error, place)
    return st


def _check_stat(
    path: Path,
    st: os.stat_result,
    what: str,
    error: type[LongctxError],
    max_bytes: int | None,
    single_link: bool,
    place: str,
) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st, what, error, place)
    if single_link and st.st_nlink > 1:
        raise error(
            f"the {what} has {st.st_nlink} names (hard links): longctx writes to it, and a write through "
            "this name would change the file behind the others too, which may lie outside the run",
            where=str(path),
            fix=f"give it a copy of its own: cp -p {path} {path}.own && mv {path}.own {path}",
        )
    if max_bytes is not None and st.st_size > max_bytes:
        raise error(
            f"the {what} is {_size(st.st_size)}, more than the {_size(max_bytes)} longctx reads from a {what}; "
            "it is not one longctx wrote",
            where=str(path),
            fix=f"move it away (a real {what} is far smaller) and run the command again",
        )


def _check_inside(path: Path, root: Path, what: str, error: type[LongctxError], place: str) -> None:
    try:
        parent = path.parent.resolve()
        inside = parent.is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):
        parent, inside = path.parent, False
    if not inside:
        raise error(
            f"the {what} lies outside {place} (its directory resolves to {parent})",
            where=str(path),
            fix=f"replace the symbolic link on the way to {path} by a real directory inside {root}",
        )


@contextlib.contextmanager
def open_file(
    path: Path,
    root: Path,
    what: str,
    *,
    error: type[LongctxError],
    max_bytes: int,
    single_link: bool = False,
    place: str = "the run directory",
) -> Iterator[IO[bytes] | None]:
    """The checked file, open for reading in binary (None when it does not exist)."""
    path = Path(path)
    before = check_file(
        path, root, what, error=error, max_bytes=max_bytes, single_link=single_link, place=place
    )
    if before is None:
        yield None
        return
    flags = (
        os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        yield None
        return
    except OSError as err:
        raise error(
            f"cannot read the {what}: {err.strerror}", where=str(path), fix="check the file's permissions"
        ) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise error(
                f"the {what} was replaced while it was being opened",
                where=str(path),
                fix="make sure nothing else writes the run directory, then run the command again",
            )
        _check_stat(path, st, what, error, max_bytes, single_link, place)
        yield fh


def read_bytes(
    path: Path,
    root: Path,
    what: str,
    *,
    error: type[LongctxError],
    max_bytes: int,
    single_link: bool = False,
    place: str = "the run directory",
) -> bytes | None:
    """The whole checked file (None when it does not exist); at most `max_bytes` are ever read."""
    with open_file(
        path, root, what, error=error, max_bytes=max_bytes, single_link=single_link, place=place
    ) as fh:
        if fh is None:
            return None
        try:
            data = fh.read(max_bytes + 1)
        except OSError as err:
            raise error(
                f"cannot read the {what}: {err.strerror}",
                where=str(path),
                fix="check the file system, then run the command again",
            ) from None
    if len(data) > max_bytes:  # it grew after the check
        raise error(
            f"the {what} grew past {_size(max_bytes)} while it was read",
            where=str(path),
            fix="make sure nothing else writes it, then run the command again",
        )
    return data


def read_text(
    path: Path,
    root: Path,
    what: str,
    *,
    error: type[LongctxError],
    max_bytes: int,
    single_link: bool = False,
    place: str = "the run directory",
) -> str | None:
    """`read_bytes` as UTF-8 text; bytes that are not UTF-8 are the caller's error, naming the offset."""
    data = read_bytes(
        path, root, what, error=error, max_bytes=max_bytes, single_link=single_link, place=place
    )
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(
            f"the {what} is not UTF-8 text (byte {err.start})",
            where=str(path),
            fix=f"restore the {what}, or move it away",
        ) from None


def iter_lines(
    path: Path,
    root: Path,
    what: str,
    *,
    error: type[LongctxError],
    max_bytes: int,
    max_line: int,
    place: str = "the run directory",
) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each line of the checked file, streamed; a line longer than `max_line`
    bytes gives None (its bytes are skipped, not held). Nothing when the file does not exist."""
    with open_file(path, root, what, error=error, max_bytes=max_bytes, place=place) as fh:
        if fh is None:
            return
        n, left = 0, max_bytes
        while left > 0:
            chunk = fh.readline(min(max_line + 1, left))
            if not chunk:
                return
            left -= len(chunk)
            n += 1
            if len(chunk) > max_line and not chunk.endswith(b"\n"):
                while left > 0 and chunk and not chunk.endswith(b"\n"):  # skip the rest of the long line
                    chunk = fh.readline(min(MiB, left))
                    left -= len(chunk)
                yield n, None
                continue
            yield n, chunk.decode("utf-8", errors="replace").rstrip("\r\n")
