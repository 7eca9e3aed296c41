"""More ranks on a node than GPUs: every rank refuses before any process group exists, so none waits
for a peer that is gone. The device count is made visible to the check through LONGCTX_DEVICE_COUNT,
so a CPU machine takes the decision a one-GPU machine takes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from longctx.arch import ModelArch
from longctx.errors import ParallelError
from longctx.launch.local import LocalLauncher
from longctx.mcore.parallel import (
    DEVICE_COUNT_ENV,
    check_ranks_fit,
    init_training_parallel,
    visible_device_count,
)
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec
from tests.fixtures.run import ARCH


def _spec(tmp: Path, cp: int) -> TrainSpec:
    # nothing here is read: the trainer refuses before it touches the tokenizer or the data
    return TrainSpec(
        stage="t",
        arch=ModelArch(**ARCH),
        seq_length=128,
        max_position_embeddings=128,
        rotary_base=10000,
        padded_vocab_size=512,
        tokenizer=TokenizerInfo(path=str(tmp / "tok"), md5="0" * 32, vocab_size=500, eod_id=0, pad_id=None),
        data=[(None, str(tmp / "data"))],
        split="98,2,0",
        data_cache_path=str(tmp / "cache"),
        global_batch_size=2,
        micro_batch_size=1,
        train_iters=2,
        context_parallel=cp,
        lr=LRSchedule(lr=1e-3, min_lr=1e-4, warmup_iters=1, decay_iters=2),
        save=str(tmp / "ckpt"),
        save_interval=100,
        threads_per_process=1,
    )


def test_a_cp2_launch_on_a_one_gpu_node_is_refused_by_every_rank_at_once(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.json"
    _spec(tmp_path, cp=2).dump(spec_path)
    log = tmp_path / "train.log"
    t0 = time.monotonic()
    rc = LocalLauncher(echo=False, grace_s=5).run(
        [sys.executable, "-m", "longctx.train", "--spec", str(spec_path)],
        nproc=2,
        env={DEVICE_COUNT_ENV: "1", "OMP_NUM_THREADS": "1"},
        log=log,
    )
    text = log.read_text()
    assert rc == 2, text
    for rank in (0, 1):
        assert (
            f"[{rank}] [longctx] error: this launch starts 2 process(es) on this node, which shows 1 GPU(s)"
            in text
        )
    assert "Traceback" not in text
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "ckpt").exists()


def test_the_check_refuses_before_the_process_group_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv(DEVICE_COUNT_ENV, "1")
    assert not dist.is_initialized()
    with pytest.raises(ParallelError, match="CUDA_VISIBLE_DEVICES=''"):
        init_training_parallel(1, 2, seed=0)
    assert not dist.is_initialized()


def test_ranks_that_fit_and_cpu_ranks_pass() -> None:
    check_ranks_fit({"LOCAL_WORLD_SIZE": "2"}, 2)
    check_ranks_fit({"LOCAL_WORLD_SIZE": "8"}, None)  # CPU ranks: no limit
    with pytest.raises(ParallelError):
        check_ranks_fit({"WORLD_SIZE": "2"}, 1)
    assert visible_device_count({DEVICE_COUNT_ENV: "3"}) == 3
    # the demo's CPU ranks on a one-GPU machine: hidden GPUs lift the limit
    assert visible_device_count({DEVICE_COUNT_ENV: "1", "CUDA_VISIBLE_DEVICES": ""}) is None
    with pytest.raises(ParallelError, match="not an integer"):
        visible_device_count({DEVICE_COUNT_ENV: "one"})
