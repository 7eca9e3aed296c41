"""The files of a run directory that longctx reads and appends to (the ledger, the lock, launch logs,
metrics.jsonl, TensorBoard event files), read through one reader: `longctx.util.confined_read`, with
StageError and the bounds below. A symlink could lead a ledger line into a file outside the run (or into
/dev/full, which takes bytes forever), a FIFO would block the reader forever, a hard link would carry an
append to a file outside the run, and a file of many GiB would end in MemoryError; each is refused,
naming the file, before a byte is read or written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from longctx.errors import StageError
from longctx.util import confined_read
from longctx.util.confined_read import GiB, KiB, MiB

# what longctx reads from each file of a run, at most (each far above what a real run writes)
LEDGER_BYTES = 256 * MiB  # ~1 KiB per record, two records per launch
LOCK_BYTES = 64 * KiB  # a holder record is ~200 bytes
METRICS_BYTES = 4 * GiB  # one ~200-byte line per logged iteration
LOG_BYTES = 8 * GiB  # streamed; Megatron-LM's logs repeat warnings per rank
EVENTS_BYTES = 4 * GiB  # streamed by TensorBoard's reader
LINE_BYTES = 1 * MiB  # one line of metrics.jsonl or of a log


def check_run_file(path: Path, run_dir: Path, what: str, *, appended: bool = True) -> None:
    """StageError unless `path` is absent or a regular file whose directory lies inside `run_dir` and,
    when longctx appends to it (`appended`), has no second name (hard link)."""
    confined_read.check_file(Path(path), Path(run_dir), what, error=StageError, single_link=appended)


def check_run_input(path: Path, run_dir: Path, what: str, *, max_bytes: int) -> bool:
    """For a file handed by name to another reader (TensorBoard's): StageError unless it is a regular file
    inside the run of at most `max_bytes`; False when it does not exist."""
    st = confined_read.check_file(Path(path), Path(run_dir), what, error=StageError, max_bytes=max_bytes)
    return st is not None


def read_run_text(
    path: Path, run_dir: Path, what: str, *, max_bytes: int, appended: bool = True
) -> str | None:
    """The whole file as UTF-8 text (None when absent), through the checks of `check_run_file` and the
    size bound."""
    return confined_read.read_text(
        Path(path), Path(run_dir), what, error=StageError, max_bytes=max_bytes, single_link=appended
    )


def run_file_lines(
    path: Path, run_dir: Path, what: str, *, max_bytes: int
) -> Iterator[tuple[int, str | None]]:
    """(line number, text or None for an over-long line) of a run file read as a stream."""
    return confined_read.iter_lines(
        Path(path), Path(run_dir), what, error=StageError, max_bytes=max_bytes, max_line=LINE_BYTES
    )
