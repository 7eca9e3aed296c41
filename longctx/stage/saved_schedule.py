"""The LR schedule a stage's latest save carries — what Megatron-LM's scheduler compares the argv with
on resume (`opt_param_scheduler` in common.pt, counted in samples), in ledger.SCHEDULE_FIELDS terms.

The save is the ground truth: a run directory whose ledger is missing or stale (a save copied from the
cluster, a stage continued on the other backend) is checked against it all the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longctx.checkpoint.layout import read_tracker
from longctx.checkpoint.unpickle import safe_torch_load
from longctx.errors import LongctxError


def checkpoint_schedule(save_dir: Path) -> dict[str, Any] | None:
    """SCHEDULE_FIELDS → value of the save the tracker in `save_dir` names; None when it has none to read."""
    tracker = read_tracker(save_dir) if save_dir.is_dir() else None
    common_pt = save_dir / tracker.dir_name / "common.pt" if tracker is not None else None
    if common_pt is None or not common_pt.is_file():
        return None
    try:
        with common_pt.open("rb") as fh:
            common = safe_torch_load(fh, where=str(common_pt))
    except (LongctxError, OSError):
        return None  # `ckpt verify` reports an unreadable save; the ledger's record stands in
    sched = common.get("opt_param_scheduler") if isinstance(common, dict) else None
    args = common.get("args") if isinstance(common, dict) else None
    gbs = getattr(args, "global_batch_size", None)
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
