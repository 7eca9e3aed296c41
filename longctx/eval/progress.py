"""Progress of an evaluation on stderr: one line per measured cell (a checkpoint's passkey grid, needle
task, loss by position, packed windows or short-context loss at one length) with done/total and an
estimate of the time left.

The bar `longctx.util.progress.progress_bar` draws counts forwards but is only drawn on a terminal; these
lines also reach logs and pipes, where an evaluation of long lengths otherwise says nothing for hours.
They go where the bar goes (stderr, so `--json` keeps stdout one document) and are silenced by the same
switch (LONGCTX_NO_PROGRESS=1).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from longctx.eval.settings import EvalSettings
from longctx.util.progress import progress_disabled, stderr_console
from longctx.util.units import human_length

PREFIX = "[longctx eval]"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One unit of the progress count; `weight` (tokens through the model, roughly) spreads the time
    measured so far over what is left, so a 4K cell counts 16 times a 256 one of as many sequences."""

    checkpoint: str
    length: int
    what: str
    weight: float


def length_cells(label: str, n: int, s: EvalSettings, *, causal: bool, packed: bool) -> list[Cell]:
    """The cells of one checkpoint at length `n`, in the order the engine measures them."""
    items = s.keys_per_cell * len(s.depths)
    tasks = [t for t in s.tasks if t != "single"]
    if causal:
        cells = [Cell(label, n, "passkey", items * (1 + s.distractors) * n)]
        cells.append(Cell(label, n, "loss by position", s.loss_docs * n))
        if packed:
            cells.append(Cell(label, n, "packed windows", 2 * s.packed_windows * n))
        return cells + [Cell(label, n, t, items * n) for t in tasks]
    # a diffusion model decodes a key one digit a round, and its ELBO takes a pass per context and level
    cells = [Cell(label, n, "passkey", items * s.key_digits * n)]
    cells.append(Cell(label, n, "elbo by context", s.loss_docs * len(s.elbo_levels) * n))
    return cells + [Cell(label, n, t, items * s.key_digits * n) for t in tasks]


def short_cell(label: str, s: EvalSettings, short_length: int) -> Cell:
    return Cell(label, short_length, "short-context loss", s.short_docs * short_length)


def _clock(seconds: float) -> str:
    """`under 1 s`, `42 s`, `3 min 05 s`, `2 h 07 min`."""
    s = round(seconds)
    if s < 1:
        return "under 1 s"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class EvalProgress:
    """Counts the cells of one evaluation and prints a line as each is measured."""

    def __init__(
        self,
        cells: Sequence[Cell],
        *,
        cached: int = 0,
        enabled: bool = True,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.total = len(cells)
        self._weights = {(c.checkpoint, c.length, c.what): c.weight for c in cells}
        self.left = sum(c.weight for c in cells)
        self.done = 0
        self.measured = 0.0
        self.enabled = enabled and not progress_disabled()
        self._write = write or _stderr
        self._clock = clock
        self._start = clock()
        if self.enabled and (self.total or cached):
            what = f"{self.total} cells to measure" if self.total else "nothing to measure"
            self._write(f"{PREFIX} {what}" + (f", {cached} from the cache" if cached else ""))

    def finished(self, checkpoint: str, length: int, what: str) -> None:
        """A cell was measured: print `3/24 s1 @ 1K multikey-2: 41 s elapsed, about 2 min 10 s left`."""
        weight = self._weights.pop((checkpoint, length, what), 0.0)
        self.done += 1
        self.measured += weight
        self.left = max(0.0, self.left - weight)
        if not self.enabled:
            return
        elapsed = self._clock() - self._start
        if self.done >= self.total:
            rest = "done"
        elif self.measured > 0:  # the time so far per unit of weight, over the weight still to measure
            rest = f"about {_clock(elapsed / self.measured * self.left)} left"
        else:
            rest = "time left unknown"
        self._write(
            f"{PREFIX} {self.done}/{self.total} {checkpoint} @ {human_length(length)} "
            f"{what}: {_clock(elapsed)} elapsed, {rest}"
        )


def _stderr(line: str) -> None:
    # the bar's console: on a terminal the line is printed above a bar that is being drawn
    stderr_console.print(line, markup=False, highlight=False, soft_wrap=True)


def silent() -> EvalProgress:
    """A progress that counts nothing and prints nothing (ranks other than the first, library callers)."""
    return EvalProgress([], enabled=False)
