"""Save and load checkpoints in Megatron-LM's torch_dist layout from the local backend.

Layout written (what Megatron-LM's `--load` and `longctx ckpt` read):
    SAVE/iter_NNNNNNN/{.metadata, __R_T.distcp, common.pt, metadata.json}
    SAVE/latest_checkpointed_iteration.txt   (written last, only after every rank finished)
The common state holds `args` (an argparse.Namespace with Megatron's field names), `checkpoint_version`
3.0, `iteration` and, with optimizer state, `opt_param_scheduler`, consumed samples and RNG state.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import shutil
import signal
from collections.abc import Mapping
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any

import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
from megatron.core.dist_checkpointing.validation import StrictHandling
from megatron.core.transformer.module import MegatronModule

from longctx.checkpoint.save_layout import TRACKER, iter_dir_name
from longctx.checkpoint.unpickle import safe_torch_load
from longctx.errors import CheckpointError
from longctx.util.fs import atomic_write_text

CHECKPOINT_VERSION = 3.0


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
    if getattr(filesystem_async, "_results_queue", None) is None:
        # the manager ignores SIGTERM: Slurm signals every process of a job step at its time limit, and
        # a manager that died with the workers would make the save they then start fail
        manager = SyncManager(ctx=mp.get_context("fork"))
        manager.start(signal.signal, (signal.SIGTERM, signal.SIG_IGN))
        filesystem_async._results_queue = manager.Queue()


def save_checkpoint(
    save_dir: str | Path,
    iteration: int,
    *,
    model: MegatronModule,
    args: argparse.Namespace,
    sharded_extra: Mapping[str, Any] | None = None,
    common_extra: Mapping[str, Any] | None = None,
    content_metadata: Mapping[str, Any] | None = None,
    write_tracker: bool = True,
    model_state: Mapping[str, Any] | None = None,
) -> Path:
    """Save `model` (+ optional optimizer/RNG entries) as SAVE/iter_N; then update the tracker.

    `sharded_extra` may hold ShardedTensor/ShardedObject trees (optimizer, rng_state); `common_extra`
    plain picklable values (opt_param_scheduler, consumed samples); `content_metadata` is what
    Megatron-LM's loader reads the optimizer layout from; `model_state` the model's sharded state
    dict when it is stored under other keys (see `longctx.mcore.stored_layout`). Every rank must call this.
    """
    require_psutil()
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
        "model": dict(model_state) if model_state is not None else model.sharded_state_dict(),
    }
    state.update(common_extra or {})
    state.update(sharded_extra or {})
    dist_checkpointing.save(
        state, str(target), content_metadata=dict(content_metadata) if content_metadata else None
    )
    _barrier()
    if write_tracker and _rank() == 0:
        atomic_write_text(root / TRACKER, f"{iteration}\n")
    _barrier()
    return target


def require_psutil() -> None:
    """megatron-core's writer processes call psutil before their error handling: without it each
    writer dies silently and the save waits for them forever. Refuse before the save starts."""
    if importlib.util.find_spec("psutil") is None:
        raise CheckpointError(
            "megatron-core's checkpoint writer needs psutil, which is not installed: a save would hang",
            where="the local trainer's save",
            fix="pip install psutil (a longctx dependency: rerun scripts/setup)",
        )


class _NoCommonPt(TorchCommonLoadStrategy):
    """An empty common state for saves that keep it inside the DCP shards (megatron-core ≥ 0.19, no
    common.pt): 0.16's loader reads common.pt first, and the weights need nothing from it."""

    def load_common(self, checkpoint_dir: Any) -> dict[str, Any]:
        return {}


class _SafeCommonPt(TorchCommonLoadStrategy):
    """common.pt through longctx's allow-list reader instead of torch's `weights_only` one: early 3.11
    releases (Debian 12's 3.11.2) pickle an enum member as `getattr(EnumClass, "NAME")` and
    `signal.SIGTERM` as a global, which `weights_only` refuses, so a save written there would not load."""

    def load_common(self, checkpoint_dir: Any) -> dict[str, Any]:
        path = Path(checkpoint_dir) / "common.pt"
        return safe_torch_load(path.read_bytes(), where=str(path), stub_megatron=False)


def common_strategy(checkpoint_dir: str | Path) -> TorchCommonLoadStrategy:
    """How megatron-core's loader reads a save's common state, whichever Python pickled it."""
    return _SafeCommonPt() if (Path(checkpoint_dir) / "common.pt").is_file() else _NoCommonPt()


def load_common_state(checkpoint_dir: str | Path) -> dict[str, Any]:
    """`dist_checkpointing.load_common_state_dict`, read by `common_strategy`."""
    return common_strategy(checkpoint_dir).load_common(checkpoint_dir)


def load_model_weights(
    model: MegatronModule,
    checkpoint_dir: str | Path,
    *,
    strict: bool = True,
    model_state: Mapping[str, Any] | None = None,
) -> None:
    """Load only the model weights of a torch_dist checkpoint directory (iter_N) into `model`
    (`model_state`: its sharded state dict under the checkpoint's keys, when they are not GPTModel's)."""
    directory = Path(checkpoint_dir)
    state = dist_checkpointing.load(
        {"model": dict(model_state) if model_state is not None else model.sharded_state_dict()},
        str(directory),
        strict=StrictHandling.ASSUME_OK_UNEXPECTED,
        common_strategy=common_strategy(directory),
    )
    model_sd = {k: v for k, v in state["model"].items() if not k.endswith("_extra_state")}
    missing, unexpected = model.load_state_dict(model_sd, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if strict and (missing or unexpected):
        raise RuntimeError(f"checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
