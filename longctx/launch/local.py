"""Start the processes of one launch and forward signals to them.

`LocalLauncher` runs W workers on this host itself (RANK/WORLD_SIZE/MASTER_* set per worker) instead
of torchrun, so SIGTERM/SIGUSR1/SIGINT reach every worker at once (`longctx.launch.stop`: passed on
once, a second signal kills them) and nothing kills them after a grace period while they save. Only
when a worker fails are the others stopped: SIGTERM first, then, after `grace_s`, SIGKILL, since the
trainer's SIGTERM handler merely asks for a save that a rank waiting in a collective for its dead peer
never reaches. Other launchers (srun + torchrun on a cluster) provide the same `run`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Protocol

from longctx.launch.stop import POLL_S, forget, kill_tree, requested, spawn, stop_on_signals
from longctx.util.net import free_port


class Launcher(Protocol):
    def run(self, argv: Sequence[str], *, nproc: int, env: dict[str, str], log: Path) -> int: ...


def pump_lines(
    src: IO[bytes], sinks: list[IO[bytes]], prefix: bytes = b"", failed: list[OSError] | None = None
) -> None:
    """Copy `src` line by line to every sink, each line flushed at once (logs stay live). A sink that
    refuses a write (a full or read-only disk under the log) is dropped and its error kept in `failed`:
    the workers must not block on a pipe nobody reads."""
    live = list(sinks)
    for line in iter(src.readline, b""):
        for s in list(live):
            try:
                s.write(prefix + line)
                s.flush()
            except OSError as err:
                live.remove(s)
                if failed is not None:
                    failed.append(err)


@contextlib.contextmanager
def launch_log(log: Path) -> Iterator[tuple[IO[bytes], list[OSError]]]:
    """The launch log opened for appending, and the list `pump_lines` puts its write errors in. Errors
    after the open are reported, not raised: a disk that fills up under the log must not kill a launch
    whose workers may still save elsewhere, nor stop its end from being recorded."""
    failed: list[OSError] = []
    logf = open(log, "ab")  # noqa: SIM115 (closed below, where a failing close is reported, not raised)
    try:
        yield logf, failed
    finally:
        try:
            logf.close()
        except OSError as err:
            failed.append(err)
        if failed:
            print(f"warning: the launch log {log} is incomplete: {failed[0].strerror}", file=sys.stderr)


class LocalLauncher:
    """W worker processes of `argv` on this host (a python command line); returns the worst exit code."""

    def __init__(self, echo: bool = True, grace_s: float = 30.0) -> None:
        self.echo = echo
        self.grace_s = grace_s

    def run(self, argv: Sequence[str], *, nproc: int, env: dict[str, str], log: Path) -> int:
        log.parent.mkdir(parents=True, exist_ok=True)
        port = free_port()
        procs: list[subprocess.Popen[bytes]] = []
        threads: list[threading.Thread] = []
        # the workers start under this process's signal discipline (`longctx.launch.stop`): a signal is
        # passed on to each once, a second one kills them, a launcher that dies stops them
        with stop_on_signals(), launch_log(log) as (logf, log_errors):
            try:
                for rank in range(nproc):
                    wenv = dict(
                        os.environ,
                        **env,
                        RANK=str(rank),
                        LOCAL_RANK=str(rank),
                        WORLD_SIZE=str(nproc),
                        LOCAL_WORLD_SIZE=str(nproc),
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port),
                        PYTHONUNBUFFERED="1",
                    )
                    p = spawn(argv, env=wenv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    procs.append(p)
                    sinks: list[IO[bytes]] = [logf]
                    if self.echo and rank == 0:
                        sinks.append(sys.stdout.buffer)
                    t = threading.Thread(
                        target=pump_lines,
                        args=(p.stdout, sinks, f"[{rank}] ".encode() if nproc > 1 else b"", log_errors),
                        daemon=True,
                    )
                    t.start()
                    threads.append(t)
                codes = _wait_all(procs, self.grace_s)
            except BaseException:
                kill_tree(procs)  # a rank that failed to start: the others would wait for it forever
                raise
            finally:
                for p in procs:
                    forget(p)
                for t in threads:
                    t.join(timeout=5)
        return codes[0] if codes else 0


def _wait_all(procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> list[int]:
    """Wait for every worker; when one fails, stop the others (they would hang in a collective):
    SIGTERM, then SIGKILL (with what they started) to those still running `grace_s` later. The exit codes
    come in the order the workers ended: the first failure (the cause, not the signals of the workers
    stopped after it) first."""
    codes: dict[int, int] = {}
    terminated_at: float | None = None
    while len(codes) < len(procs):
        requested()  # a launcher whose own parent is gone stops its workers as on a SIGTERM
        for i, p in enumerate(procs):
            if i in codes:
                continue
            rc = p.poll()
            if rc is not None:
                codes[i] = rc
                if rc != 0 and terminated_at is None:
                    terminated_at = time.monotonic()
                    for q in procs:
                        if q.poll() is None:
                            q.terminate()
        if terminated_at is not None and time.monotonic() - terminated_at > grace_s:
            kill_tree([q for q in procs if q.poll() is None])
        time.sleep(POLL_S)
    return sorted(codes.values(), key=lambda rc: rc == 0)
