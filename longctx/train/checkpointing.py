"""Save and load checkpoints in Megatron-LM's torch_dist layout from the local backend.

Layout written (what Megatron-LM's `--load` and `longctx ckpt` read):
    SAVE/iter_NNNNNNN/{.metadata, __R_T.distcp, common.pt, metadata.json}
    SAVE/latest_checkpointed_iteration.txt   (written last, only after every rank finished)
The common state holds `args` (an argparse.Namespace with Megatron's field names), `checkpoint_version`
3.0, `iteration` and, with optimizer state, `opt_param_scheduler`, consumed samples and RNG state.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from longctx.util.fs import atomic_write_text

TRACKER = "latest_checkpointed_iteration.txt"
CHECKPOINT_VERSION = 3.0


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def use_fork_write_queue() -> None:
    """Give dist_checkpointing a write-results queue from a forked manager.

    By default its first save starts a *spawned* multiprocessing Manager
    (filesystem_async._get_write_results_queue), which re-imports the caller's __main__ (seconds with
    torch + megatron imported, and an EOFError when the entry point lacks a __main__ guard). A forked
    manager starts in milliseconds and needs neither.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", None) is None:
        filesystem_async._results_queue = mp.get_context("fork").Manager().Queue()


def save_checkpoint(
    save_dir: str | Path,
    iteration: int,
    *,
    model: Any,
    args: argparse.Namespace,
    sharded_extra: Mapping[str, Any] | None = None,
    common_extra: Mapping[str, Any] | None = None,
    write_tracker: bool = True,
) -> Path:
    """Save `model` (+ optional optimizer/RNG entries) as SAVE/iter_N; then update the tracker.

    `sharded_extra` may hold ShardedTensor/ShardedObject trees (optimizer, rng_state); `common_extra`
    plain picklable values (opt_param_scheduler, consumed samples). Every rank must call this.
    """
    from megatron.core import dist_checkpointing

    use_fork_write_queue()
    root = Path(save_dir)
    target = root / iter_dir_name(iteration)
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if target.exists():
            # a directory left by a save that died before metadata.json; the tracker never named it
            shutil.rmtree(target)
        target.mkdir()
    _barrier()

    state: dict[str, Any] = {
        "args": args,
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": iteration,
        "model": model.sharded_state_dict(),
    }
    state.update(common_extra or {})
    state.update(sharded_extra or {})
    dist_checkpointing.save(state, str(target))
    _barrier()
    if write_tracker and _rank() == 0:
        atomic_write_text(root / TRACKER, f"{iteration}\n")
    _barrier()
    return target


def load_model_weights(model: Any, checkpoint_dir: str | Path, *, strict: bool = True) -> None:
    """Load only the model weights of a torch_dist checkpoint directory (iter_N) into `model`."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    state = dist_checkpointing.load(
        {"model": model.sharded_state_dict()},
        str(checkpoint_dir),
        strict=StrictHandling.ASSUME_OK_UNEXPECTED,
    )
    model_sd = {k: v for k, v in state["model"].items() if not k.endswith("_extra_state")}
    missing, unexpected = model.load_state_dict(model_sd, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if strict and (missing or unexpected):
        raise RuntimeError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")


def tensor_count_bytes(model: Any) -> tuple[int, int]:
    n = sum(p.numel() for p in model.parameters())
    return n, sum(p.numel() * p.element_size() for p in model.parameters())


def cpu_state_copy(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
