"""What every process-based benchmark shares: fresh spawned ranks over gloo, and their peak memory.

Each measurement runs in freshly spawned processes so that its peak memory can be read from the
kernel's own accounting of the process. The peak resident set (VmHWM) is reset through
/proc/self/clear_refs after a warm-up, and the figure is the peak minus the resident set at a chosen
point before the measured allocations; glibc's mmap threshold is pinned at 64 KiB so that freed
tensors leave the resident set and iterations do not ratchet it. That covers everything torch
allocated, which Python-level tracers miss. Where the peak cannot be reset, the increase of
`getrusage` `ru_maxrss` is used and the report says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from longctx.errors import LongctxError

MEMORY_METHODS = {
    "hwm": "peak RSS (VmHWM, reset after warm-up) minus RSS before the inputs, fresh process per run",
    "maxrss": "increase of getrusage ru_maxrss over the measured run, fresh process per run",
}


def _maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024  # Linux reports KiB


def status_bytes(key: str) -> int | None:
    """A byte figure of /proc/self/status (VmRSS, VmHWM), or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


def fixed_mmap_threshold() -> None:
    # glibc raises its mmap threshold after large frees and then serves tensors from a heap that only
    # grows; a fixed 64 KiB threshold keeps every tensor-sized block mmap'd, so RSS follows live
    # memory and repeated iterations do not ratchet the peak through heap fragmentation.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD


def trim_heap() -> None:
    # hand freed heap pages back to the OS so a warm-up's leftovers are not reused unseen
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak resident memory of this process above a base (see the module docstring).

    `start()` resets the peak and takes the current RSS as the base; `reset_peak()` resets the peak
    only, so the base can be taken before allocations the peak is then measured after."""

    method = "maxrss"
    base = 0

    def start(self) -> None:
        self.reset_peak()
        self.base = (status_bytes("VmRSS") or 0) if self.method == "hwm" else _maxrss_bytes()

    def reset_peak(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux ≥ 4.0)
            self.method = "hwm" if status_bytes("VmHWM") is not None else "maxrss"
        except OSError:
            self.method = "maxrss"

    def current_increase(self) -> int:
        now = status_bytes("VmRSS") if self.method == "hwm" else None
        return max(0, now - self.base) if now is not None else 0

    def peak_increase(self) -> int:
        peak = status_bytes("VmHWM") if self.method == "hwm" else _maxrss_bytes()
        return max(0, (peak or 0) - self.base)


Worker = Callable[..., None]


def guarded(rank: int, out: Any, body: Callable[[], Any]) -> None:
    """Run a worker's body, putting ("ok", rank, result) or ("error", rank, traceback) on `out`."""
    try:
        out.put(("ok", rank, body()))
    except LongctxError as err:  # says what, where and how to fix: no traceback needed
        out.put(("error", rank, f"{type(err).__name__}: {err}"))
    except BaseException as err:  # reported to the parent, which raises
        out.put(("error", rank, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def run_ranks(
    target: Worker,
    args: tuple[Any, ...],
    world: int,
    *,
    timeout_s: float,
    error: Callable[[str], LongctxError],
) -> list[Any]:
    """Spawn `world` processes `target(rank, world, init_file, *args, out)` and collect one result each.

    `init_file` is a fresh file:// rendezvous for torch.distributed; each worker puts one
    ("ok" | "error", rank, value) on `out` (see `guarded`). Raises `error(message)` when a worker
    fails (at the first failure; the rest are stopped), dies or sends nothing within `timeout_s`.
    """
    import torch.multiprocessing as mp  # torch loads in the workers and here only when measuring

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="longctx-bench-") as tmp:
        init_file = os.path.join(tmp, "init")
        procs = [
            ctx.Process(target=target, args=(r, world, init_file, *args, results), daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
        got: dict[int, Any] = {}
        errors: list[str] = []
        deadline = time.monotonic() + timeout_s
        try:
            while len(got) + len(errors) < world:
                try:
                    status, rank, value = results.get(timeout=5.0)
                except queue.Empty:
                    dead = [p.exitcode for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                    if dead:
                        errors.append(f"worker(s) died: {', '.join(_death(c) for c in dead)}")
                    elif time.monotonic() > deadline:
                        errors.append(f"no result after {timeout_s:.0f} s")
                    else:
                        continue
                    break
                if status == "ok":
                    got[rank] = value
                else:
                    # the others may be waiting for this one (a collective, a turn): stop here
                    errors.append(f"rank {rank}: {value}")
                    break
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        if errors:
            raise error("; ".join(errors))
    return [got[r] for r in range(world)]


def _death(exitcode: int) -> str:
    """How a worker ended: a signal by name (SIGKILL is what the kernel's OOM killer sends)."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
    return f"{name} (out of memory?)" if name == "SIGKILL" else name
