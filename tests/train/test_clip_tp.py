"""Gradient clipping under TP 2: the norm is the whole model's (shards summed over the TP group, copies
counted once), so both ranks clip by the same factor and the clipped model equals TP 1's."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longctx.train.precision import MainParams
from longctx.util.net import free_port

MAX_NORM = 1.0


def _full() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 4, generator=g), torch.randn(4, generator=g)  # a split weight's grad, a norm's


def _params(split: torch.Tensor, copy: torch.Tensor) -> list[torch.nn.Parameter]:
    w, n = torch.nn.Parameter(torch.zeros_like(split)), torch.nn.Parameter(torch.zeros_like(copy))
    w.tensor_model_parallel = True  # what megatron-core's ColumnParallelLinear marks its weight with
    w.grad, n.grad = split.clone(), copy.clone()
    return [w, n]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    split, copy = _full()
    main = MainParams(_params(split.chunk(2)[rank], copy))
    norm = main.clip_grad_norm(MAX_NORM, dist.group.WORLD)
    torch.save({"norm": norm, "grads": [p.grad for p in main.masters]}, f"{out}/{rank}.pt")
    dist.destroy_process_group()


def test_tp2_clips_both_shards_by_the_global_norm(tmp_path: Path) -> None:
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    split, copy = _full()
    whole = MainParams(_params(split, copy))
    norm = whole.clip_grad_norm(MAX_NORM, None)
    expected = float(torch.cat([split.flatten(), copy]).norm())
    assert abs(norm - expected) < 1e-5 and norm > MAX_NORM
    ranks = [torch.load(tmp_path / f"{r}.pt") for r in (0, 1)]
    for r in ranks:
        assert abs(r["norm"] - norm) < 1e-5, (r["norm"], norm)
    clipped_split = torch.cat([ranks[0]["grads"][0], ranks[1]["grads"][0]])
    torch.testing.assert_close(clipped_split, whole.masters[0].grad)
    for r in ranks:
        torch.testing.assert_close(r["grads"][1], whole.masters[1].grad)


def test_no_clipping_below_the_limit_or_at_zero() -> None:
    split, copy = _full()
    main = MainParams(_params(split, copy))
    assert main.clip_grad_norm(0.0, None) > 1.0
    torch.testing.assert_close(main.masters[0].grad, split)
    small = MainParams(_params(split * 1e-3, copy * 1e-3))
    small.clip_grad_norm(MAX_NORM, None)
    torch.testing.assert_close(small.masters[0].grad, split * 1e-3)
