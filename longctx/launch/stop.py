"""One signal discipline for every long command and every launch of this process.

    with stop_on_signals(raise_when_idle=True):   # the CLI wraps every command in it
        proc = spawn(argv, env=env)                # each child in a session of its own
        code = wait(proc)
        raise_if_requested("stage s1 at iteration 4 of 6")   # never build on a stopped launch

* The first SIGTERM, SIGINT or SIGUSR1 is recorded and passed on once to every running child (a
  trainer saves and exits, a `stage run` passes it on to its own workers; a SIGINT goes on as SIGTERM,
  which every trainer takes as "save and exit"). With no child running, a command scope
  (`raise_when_idle`) stops at once with `Interrupted`; otherwise the command goes on only until its
  children have ended, and every loop that launches calls `raise_if_requested` after a launch, so a
  stopped launch is neither reported as done nor built upon.
* A second signal kills every process below this one (the children, what they started, their
  process groups: SIGKILL), so nothing outlives a command asked twice.
* Children live in sessions of their own: a Ctrl-C or a `timeout` that signals this process group
  reaches this process alone, which passes it on exactly once (a launcher that also saw its parent's
  copy would take it for the second signal). A child whose parent died without passing anything on
  (a SIGKILL) stops as if signalled (`longctx.util.orphan`).
* A child started with `forward=False` (srun: Slurm signals every process of its job step itself, and
  turns a repeated signal into SIGKILL) stays in this process group and is neither signalled nor
  killed from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

import psutil

from longctx.errors import Interrupted
from longctx.util.orphan import PARENT_ENV, parent_gone

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
POLL_S = 0.2


@dataclasses.dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    forward: bool


@dataclasses.dataclass
class _State:
    """What this process was asked and what it started, for its outermost `stop_on_signals` scope."""

    received: list[int] = dataclasses.field(default_factory=list)  # every one, for the process's life
    since: int = 0  # how many of them came before the outermost scope began
    children: list[_Child] = dataclasses.field(default_factory=list)
    depth: int = 0
    raise_when_idle: bool = False
    starting: int = 0  # a spawn in progress: its child is not registered yet, a signal waits for it
    escalated: bool = False


_state = _State()


def signals_received() -> tuple[int, ...]:
    """Every stop signal this process received under a scope, in order (compare counts before and after
    a launch to tell whether it was asked to stop)."""
    return tuple(_state.received)


def requested() -> int | None:
    """The first stop signal the running command received (SIGTERM for a parent that is gone); None:
    not asked to stop, or no command running (outside every scope the discipline does not apply)."""
    if _state.depth == 0:
        return None
    _notice_orphaned()
    mine = _mine()
    return mine[0] if mine else None


def raise_if_requested(what: str = "", *, where: str | None = None) -> None:
    """Raise `Interrupted` (saying `what` was reached) when this process was asked to stop."""
    signum = requested()
    if signum is not None:
        raise Interrupted(signum, what, where=where)


@contextlib.contextmanager
def stop_on_signals(*, raise_when_idle: bool = False) -> Iterator[None]:
    """Handle the stop signals while the block runs (nested scopes share the outermost one's handler).

    `raise_when_idle`: a signal that finds no child running raises `Interrupted` in the block at once
    (a command); without it, the signal is only recorded (a launcher inside a process that decides
    itself what a signal means). Outside the main thread nothing is installed: Python delivers signals
    to the main thread only, whose scope then handles them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _state.depth == 0
    previous: dict[int, Any] = {}
    if outer:
        _state.since = len(_state.received)
        _state.escalated = False
        _state.raise_when_idle = raise_when_idle
        previous = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if outer:
            for s, h in previous.items():
                signal.signal(s, h)
            _state.raise_when_idle = False
            _state.children = [c for c in _state.children if c.proc.poll() is None]


def spawn(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, forward: bool = True, **popen: Any
) -> subprocess.Popen[bytes]:
    """Start a child under this discipline (see the module docstring); `popen` goes to `subprocess.Popen`.
    A child started after a stop was asked gets the signal at once; after a second one, it is killed."""
    child_env = dict(os.environ if env is None else env)
    # only a child this process starts itself may judge it by its parent: srun's tasks are started by
    # slurmstepd, and would take the difference for this process's death
    child_env.pop(PARENT_ENV, None)
    if forward:
        child_env[PARENT_ENV] = str(os.getpid())
    _state.starting += 1
    try:
        proc = subprocess.Popen(list(argv), env=child_env, start_new_session=forward, **popen)
        _state.children.append(_Child(proc, forward))
    finally:
        _state.starting -= 1
    if forward and _state.escalated:
        kill_tree([proc])
    elif forward and _mine():
        _send(proc, _passed_on(_mine()[0]))
    return proc


def wait(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a child of `spawn`; a parent gone meanwhile counts as a stop signal (passed on)."""
    while (rc := proc.poll()) is None:
        _notice_orphaned()
        time.sleep(POLL_S)
    forget(proc)
    return rc


def forget(proc: subprocess.Popen[bytes]) -> None:
    """`proc` has ended: it is no longer a child that signals reach."""
    _state.children = [c for c in _state.children if c.proc is not proc]


def kill_tree(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGKILL `procs`, everything they started and their process groups (never this process's own)."""
    victims: list[psutil.Process] = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(p.pid)
            victims += [top, *top.children(recursive=True)]  # read before any dies and is re-parented
    groups = set()
    for v in victims:
        with contextlib.suppress(psutil.Error, OSError):
            groups.add(os.getpgid(v.pid))
        with contextlib.suppress(psutil.Error):
            v.kill()
    for g in groups - {os.getpgrp()}:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)


def _mine() -> list[int]:
    """The stop signals of the running command (its outermost scope)."""
    return _state.received[_state.since :]


def _live() -> list[_Child]:
    return [c for c in _state.children if c.proc.poll() is None]


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(OSError):
        proc.send_signal(signum)


def _passed_on(signum: int) -> int:
    """What a child gets for `signum`: SIGTERM for a Ctrl-C, the signal every trainer (longctx's,
    Megatron-LM's exit-signal-handler) takes as "save and exit"; other signals as they came."""
    return signal.SIGTERM if signum == signal.SIGINT else signum


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _state.received.append(signum)
    running = _live()
    forwarded = [c.proc for c in running if c.forward]
    if len(_mine()) > 1:
        _state.escalated = True  # asked again: nothing below this process may outlive it
        kill_tree(forwarded)
    else:
        for p in forwarded:
            _send(p, _passed_on(signum))
    # children running (or one starting): the code waiting for them goes on, sees them end and stops at
    # its next check, after recording how the launch ended; nothing running: stop here
    if not running and not _state.starting and _state.raise_when_idle:
        raise Interrupted(signum)


def _notice_orphaned() -> None:
    """The longctx process that started this one is gone: behave as on its SIGTERM, once."""
    if parent_gone() and not _mine():
        _on_signal(signal.SIGTERM, None)
