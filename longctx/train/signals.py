"""Graceful exits: SIGTERM / SIGUSR1 ask for a save; the time limit and exit interval do too.

The handler only sets a flag. The loop checks it after every step, agrees across ranks (MAX
all-reduce, so one signalled rank stops them all at the same iteration), saves and exits 0.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

import torch
import torch.distributed as dist

from longctx.mcore.parallel import collective_device

_START = time.monotonic()
_received: list[int] = []


def install() -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        _received.append(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, handler)


def received() -> int | None:
    return _received[0] if _received else None


def elapsed_minutes() -> float:
    return (time.monotonic() - _START) / 60.0


def agree(flag: bool) -> bool:
    """True on every rank when any rank says True."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
