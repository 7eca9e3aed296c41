"""Resume exactness: N steps straight equal N/2-ish steps + a real SIGTERM + a relaunch, bitwise.

The SIGTERM lands at an arbitrary point of a step; the trainer finishes that step, saves (model,
AdamW moments, scheduler, RNG, consumed samples) and exits 0. On CPU every reduction is
deterministic (fixed world size and order), so the relaunch ends on identical parameters and losses.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import torch

from tests.train.helpers import launch, run, saved_tensors, spec

# a tiny step takes tens of milliseconds: the signal crosses the launcher, which passes it on, while the
# second half runs; with 8 steps a loaded machine finished all of them first
N = 24


def _losses(path: Path) -> dict[int, float]:
    return {r["iteration"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def test_sigterm_and_resume_is_bitwise_identical(fresh_run: Path, tmp_path: Path) -> None:
    straight = tmp_path / "straight" / "ckpt"
    run(spec(fresh_run, straight, train_iters=N, save_interval=N), tmp_path / "straight.json")

    stopped = tmp_path / "stopped" / "ckpt"
    s = spec(fresh_run, stopped, train_iters=N, save_interval=100)
    proc = launch(s, tmp_path / "stopped.json")
    metrics = Path(s.metrics_file)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= N // 2 - 1:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 0, "the signal path exits 0 after saving"
    tracker = int((stopped / "latest_checkpointed_iteration.txt").read_text())
    assert 1 <= tracker < N, f"stopped at {tracker}, expected a partial run"

    run(s, tmp_path / "stopped.json")  # relaunch: resumes from the tracker
    assert int((stopped / "latest_checkpointed_iteration.txt").read_text()) == N

    a = saved_tensors(straight / f"iter_{N:07d}")
    b = saved_tensors(stopped / f"iter_{N:07d}")
    assert a.keys() == b.keys() and any(k.startswith("optimizer.state.exp_avg") for k in a)
    diff = {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}
    assert diff == {}, diff
    la, lb = _losses(straight.parent / "metrics.jsonl"), _losses(stopped.parent / "metrics.jsonl")
    assert [la[i] for i in range(1, N + 1)] == [lb[i] for i in range(1, N + 1)]
