"""One launch of the local trainer that the demo builds on (its base, each phase of `--train-base`).

The trainer saves and exits 0 when asked to stop (a signal, a time limit), so an exit code says nothing
about how far it got: what counts is the iteration of its last save against the target, read after
every launch. A launch this process was asked to stop ends the command (`Interrupted`); one that ended
short of its target for any other reason is an error; neither is reported as done nor trained on.
"""

from __future__ import annotations

import sys
from pathlib import Path

from longctx.checkpoint.save_layout import read_tracker
from longctx.errors import StageError
from longctx.launch.local import LocalLauncher
from longctx.launch.stop import raise_if_requested


def reached(save_dir: Path) -> int:
    """The iteration of the last save in `save_dir` (0 before the first)."""
    t = read_tracker(save_dir) if save_dir.exists() else None
    return 0 if t is None else t.iteration


def train_to_target(
    spec_path: Path, *, nproc: int, env: dict[str, str], log: Path, save_dir: Path, target: int, what: str
) -> int:
    """Run the trainer on `spec_path` (`nproc` workers) and return the iteration it saved, which is
    `target`: raises Interrupted when this process was asked to stop, StageError when the launch failed
    or stopped short. `what` names the training in messages ("base pretraining", "phase copy")."""
    code = LocalLauncher(echo=True).run(
        [sys.executable, "-m", "longctx.train", "--spec", str(spec_path)], nproc=nproc, env=env, log=log
    )
    got = reached(save_dir)
    raise_if_requested(f"{what} at iteration {got} of {target}", where=str(save_dir))
    if code != 0:
        raise StageError(
            f"{what} failed (exit {code})",
            where=str(log),
            fix="read the log; rerunning resumes from the last save",
        )
    if got < target:
        raise StageError(
            f"{what} stopped at iteration {got} of {target}",
            where=str(save_dir),
            fix="rerun the same command: it resumes from that save",
        )
    return got
