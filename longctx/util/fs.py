"""Atomic writes: files the pipeline produces appear whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from longctx.report import to_jsonable


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry so a rename inside it survives a crash."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (e.g. certain network mounts) refuse fsync on directories
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", *, encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on success fsync it and rename it over `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    binary = "b" in mode
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; files the pipeline writes are shared on clusters, so follow the umask
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb", encoding=None) as fh:
        fh.write(data)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def append_line_durably(path: str | os.PathLike[str], line: str) -> None:
    """Append one line (e.g. to a JSONL ledger) and fsync it before returning."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if "\n" in line:
        raise ValueError("a ledger line must not contain a newline")
    data = (line + "\n").encode("utf-8")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # a full disk may take part of the line before it refuses the rest
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            # a torn line (a full disk, a stop signal between two writes) would glue itself to the next
            # append: take it back, then report
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)
