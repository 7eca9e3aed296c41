"""Graceful exits: SIGTERM / SIGUSR1 / SIGINT ask for a save; the time limit and exit interval do too.

The handler only sets a flag. The loop checks it after every step, agrees across ranks (MAX
all-reduce, so one signalled rank stops them all at the same iteration), saves and exits 0. A signal
that comes twice (Slurm signals every process of a step, and the step's launcher passes it on too) is
still one request: ending the worker before its save is its launcher's decision (`longctx.launch.stop`).
A worker whose launcher died without passing anything on (a SIGKILL) saves and exits as if signalled.
"""

from __future__ import annotations

import os
import signal
import time
from types import FrameType

import torch
import torch.distributed as dist

from longctx.mcore.parallel import collective_device
from longctx.util.orphan import parent_gone

_START = time.monotonic()
_received: list[int] = []


def install() -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        _received.append(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, handler)


def received() -> int | None:
    if not _received and parent_gone():
        _received.append(signal.SIGTERM)
    return _received[0] if _received else None


def output_gone() -> None:
    """The pipe to the launcher (stdout and stderr) is closed: the launcher died. Send what this worker
    still prints to /dev/null, so that a print cannot kill it before it has saved."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def elapsed_minutes() -> float:
    return (time.monotonic() - _START) / 60.0


def agree(flag: bool) -> bool:
    """True on every rank when any rank says True."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
