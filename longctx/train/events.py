"""The local trainer's training record in Megatron-LM's TensorBoard (and W&B) vocabulary.

Megatron-LM (`megatron/training/training.py`, `training_log`) writes each scalar twice: against the
iteration under its own tag, and against consumed samples under `<tag> vs samples`. The local trainer
writes the same tags into the stage's `tensorboard/` directory (the one `--tensorboard-dir` names for
the cluster backend), one event file per launch, so one viewer shows both backends side by side.

Megatron-LM's `throughput` is model TFLOP/s per GPU, computed from its own FLOP formula and written
only with `--log-timers-to-tensorboard`; the local trainer does not model FLOPs, so it writes
Megatron-LM's `iteration-time` (seconds per iteration, the same meaning) and its own
`tokens-per-second` rather than a `throughput` that would mean something else.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from longctx.train.event_tags import (
    BATCH_SIZE,
    GRAD_NORM,
    ITERATION_TIME,
    LEARNING_RATE,
    LOSS,
    TOKENS_PER_SECOND,
    VS_SAMPLES,
)
from longctx.util.wandb_settings import WandbSettings


def _wandb() -> ModuleType | None:
    """The `wandb` module when it is installed: an optional extra, imported only when a plan asks for
    W&B (it is heavy and most runs never use it)."""
    try:
        return importlib.import_module("wandb")
    except ImportError:
        return None


class TrainingEvents:
    """The scalars of one launch: TensorBoard events in `log_dir`, and W&B when `wandb` is set and installed."""

    def __init__(
        self, log_dir: str | Path, wandb: WandbSettings | None = None, config: dict[str, Any] | None = None
    ):
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        # flush often: the curves are read while a stage runs, and a SIGKILL loses only the queue
        self.writer = SummaryWriter(log_dir=str(log_dir), max_queue=20, flush_secs=10)
        self.wandb_run: Any = None
        self.wandb_note = ""
        if wandb is not None:
            module = _wandb()
            if module is None:
                self.wandb_note = "W&B asked for but `wandb` is not installed: logging to TensorBoard only"
            else:
                Path(wandb.save_dir).mkdir(parents=True, exist_ok=True)
                self.wandb_run = module.init(
                    project=wandb.project, name=wandb.exp_name, dir=wandb.save_dir, config=config or {}
                )

    def iteration(
        self,
        iteration: int,
        consumed_samples: int,
        *,
        loss: float,
        lr: float,
        grad_norm: float,
        batch_size: int,
        seconds: float,
        tokens_per_second: float,
    ) -> None:
        """One training iteration's scalars, against the iteration and against consumed samples."""
        values = {LOSS: loss, LEARNING_RATE: lr, GRAD_NORM: grad_norm, BATCH_SIZE: float(batch_size)}
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, iteration)
            self.writer.add_scalar(tag + VS_SAMPLES, value, consumed_samples)
        self.writer.add_scalar(ITERATION_TIME, seconds, iteration)
        self.writer.add_scalar(TOKENS_PER_SECOND, tokens_per_second, iteration)
        if self.wandb_run is not None:
            logged = {**values, ITERATION_TIME: seconds, TOKENS_PER_SECOND: tokens_per_second}
            self.wandb_run.log({**logged, "samples vs steps": consumed_samples}, step=iteration)

    def close(self) -> None:
        self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
