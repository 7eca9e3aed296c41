"""A failed worker stops the others: SIGTERM, then SIGKILL after the grace period. The trainer's own
SIGTERM handler only asks for a save, which a rank blocked on its dead peer never reaches."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from longctx.launch.local import LocalLauncher

# rank 1 fails at once; rank 0 takes SIGTERM as the trainer does (a flag) and stays blocked for 20 s
WORKER = """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *_: print("asked to save", flush=True))
print("waiting", flush=True)
time.sleep(20)
"""


def test_a_worker_that_swallows_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    log = tmp_path / "launch.log"
    t0 = time.monotonic()
    rc = LocalLauncher(echo=False, grace_s=1.0).run([sys.executable, "-c", WORKER], nproc=2, env={}, log=log)
    elapsed = time.monotonic() - t0
    assert elapsed < 10, f"the launcher waited {elapsed:.0f}s for a worker that ignores SIGTERM"
    assert rc == 3, "the first failure, not the kill of the worker stopped after it, is the launch's code"
    text = log.read_text()
    assert "waiting" in text and "asked to save" in text, text


def test_workers_that_end_on_sigterm_are_not_killed(tmp_path: Path) -> None:
    worker = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(5)\ntime.sleep(20)\n"
    t0 = time.monotonic()
    rc = LocalLauncher(echo=False, grace_s=60.0).run(
        [sys.executable, "-c", worker], nproc=2, env={}, log=tmp_path / "l.log"
    )
    assert rc == 5 and time.monotonic() - t0 < 10
