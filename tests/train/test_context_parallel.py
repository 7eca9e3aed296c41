"""CP = 2 (two processes, zigzag shards, ring attention) trains like CP = 1 on the full sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.helpers import run, saved_tensors, spec


def _losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines())]


def test_cp2_loss_curve_matches_cp1(fresh_run: Path, tmp_path: Path) -> None:
    kw = dict(
        seq_length=256,
        max_position_embeddings=256,
        rotary_base=50000,
        train_iters=4,
        global_batch_size=2,
        save_interval=4,
    )
    one = tmp_path / "cp1" / "ckpt"
    two = tmp_path / "cp2" / "ckpt"
    run(spec(fresh_run, one, **kw), tmp_path / "cp1.json")
    run(spec(fresh_run, two, context_parallel=2, **kw), tmp_path / "cp2.json", nproc=2)
    l1, l2 = _losses(one.parent / "metrics.jsonl"), _losses(two.parent / "metrics.jsonl")
    assert len(l1) == len(l2) == 4
    assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-5)
    assert l1[-1] < l1[0]
    a, b = saved_tensors(one / "iter_0000004"), saved_tensors(two / "iter_0000004")
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-4 * max(1.0, float(a[k].abs().max())), k
