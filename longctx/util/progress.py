"""Progress bars on stderr for long operations (hashing, scans, tokenization, training)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

stderr_console = Console(stderr=True)


def progress_disabled() -> bool:
    """LONGCTX_NO_PROGRESS=1 silences bars (e.g. in logs of batch jobs)."""
    return os.environ.get("LONGCTX_NO_PROGRESS", "") not in ("", "0")


@contextlib.contextmanager
def progress_bar(
    description: str, total: float | None, *, unit: str = "items"
) -> Iterator[Callable[..., None]]:
    """Yield `advance(n)`; shows a bar on stderr (bytes get transfer-speed columns)."""
    if progress_disabled():
        yield lambda n=1: None
        return
    if unit == "bytes":
        columns = [
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        ]
    else:
        columns = [
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ]
    with Progress(*columns, console=stderr_console, transient=not sys.stderr.isatty()) as prog:
        task = prog.add_task(description, total=total)

        def advance(n: float = 1) -> None:
            prog.update(task, advance=n)

        yield advance
