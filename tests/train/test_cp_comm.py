"""The plan's `[local] cp_comm` reaches the attention: with "allgather" every longctx attention layer
dispatches on the all-gather exchange, and the trained losses still equal the ring's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.helpers import run, spec


def _losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines())]


def test_allgather_exchange_is_used_and_trains_like_the_ring(fresh_run: Path, tmp_path: Path) -> None:
    kw = dict(
        seq_length=128,
        max_position_embeddings=128,
        train_iters=2,
        global_batch_size=2,
        save_interval=2,
        context_parallel=2,
    )
    ring, gather = tmp_path / "ring" / "ckpt", tmp_path / "allgather" / "ckpt"
    run(spec(fresh_run, ring, **kw), tmp_path / "ring.json", nproc=2)
    run(spec(fresh_run, gather, cp_comm="allgather", **kw), tmp_path / "allgather.json", nproc=2)
    ring_log = Path(str(tmp_path / "ring.json") + ".log").read_text()
    gather_log = Path(str(tmp_path / "allgather.json") + ".log").read_text()
    assert "CP 2 via p2p)" in ring_log
    assert "CP 2 via all_gather)" in gather_log
    assert "p2p" not in gather_log.split("CP 2 via", 1)[1].split(")", 1)[0]
    l_ring, l_gather = _losses(ring.parent / "metrics.jsonl"), _losses(gather.parent / "metrics.jsonl")
    assert len(l_ring) == len(l_gather) == 2
    assert l_gather == pytest.approx(l_ring, rel=1e-5, abs=1e-5)
