"""The LR schedule a stage's latest save carries — what Megatron-LM's scheduler compares the argv with
on resume (`opt_param_scheduler` in the common state, counted in samples), in ledger.SCHEDULE_FIELDS terms.

The save is the ground truth: a run directory whose ledger is missing or stale (a save copied from the
cluster, a stage continued on the other backend) is checked against it all the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longctx.checkpoint.metadata import args_dict, read_common_state
from longctx.checkpoint.save_layout import read_tracker
from longctx.checkpoint.tree import DirTree
from longctx.errors import LongctxError


def checkpoint_schedule(save_dir: Path) -> dict[str, Any] | None:
    """SCHEDULE_FIELDS → value of the save the tracker in `save_dir` names; None when it has none to read."""
    tracker = read_tracker(save_dir) if save_dir.is_dir() else None
    if tracker is None or not (save_dir / tracker.dir_name).is_dir():
        return None
    try:
        common = read_common_state(DirTree(save_dir), tracker.dir_name, None).state or {}
    except (LongctxError, OSError):
        return None  # `ckpt check` reports an unreadable save; the ledger's record stands in
    sched = common.get("opt_param_scheduler")
    gbs = args_dict(common).get("global_batch_size")
    if not isinstance(sched, dict) or not isinstance(gbs, int) or gbs <= 0:
        return None
    try:
        return {
            "lr": float(sched["max_lr"]),
            "min_lr": float(sched["min_lr"]),
            "lr_warmup_iters": int(sched["lr_warmup_steps"]) // gbs,
            "lr_decay_iters": int(sched["lr_decay_steps"]) // gbs,
            "lr_decay_style": str(sched["lr_decay_style"]),
            "weight_decay": float(sched["start_wd"]),
            "global_batch_size": gbs,
        }
    except (KeyError, TypeError, ValueError):
        return None
