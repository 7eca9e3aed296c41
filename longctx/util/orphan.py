"""Whether the longctx process that started this one is gone.

A launcher (`longctx.launch.stop.spawn`) starts its children in sessions of their own, so that only
it decides which signals reach them; a SIGKILL it cannot pass on (`timeout -k`, the OOM killer) would
then leave them running. It names itself in `PARENT_ENV`; a child that finds another parent (it was
re-parented to init or a subreaper) stops as if asked to: the trainer saves and exits, a launcher stops
its own workers. The variable is read once and removed from this process's environment, so that what
this process starts by other means (a preflight, a shell) never inherits a parent it did not have.
"""

from __future__ import annotations

import os

PARENT_ENV = "LONGCTX_PARENT_PID"


def _expected_parent() -> int | None:
    raw = os.environ.pop(PARENT_ENV, "")
    return int(raw) if raw.isdigit() else None


_PARENT = _expected_parent()


def parent_gone() -> bool:
    """True when a longctx launcher started this process and is no longer its parent."""
    return _PARENT is not None and os.getppid() != _PARENT
