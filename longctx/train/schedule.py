"""Learning-rate schedule with Megatron's formulas: linear warmup, then cosine / linear / WSD / constant.

Counted in iterations here; saved in Megatron's units (samples) so Megatron-LM can resume from it.
"""

from __future__ import annotations

import math
from typing import Any

from longctx.train.spec import LRSchedule


class LRScheduler:
    def __init__(self, cfg: LRSchedule) -> None:
        self.cfg = cfg
        self.num_steps = 0

    def lr_at(self, step: int) -> float:
        c = self.cfg
        if c.warmup_iters > 0 and step <= c.warmup_iters:
            return c.lr * step / c.warmup_iters
        if c.decay_style == "constant":
            return c.lr
        if step > c.decay_iters:
            return c.min_lr
        if c.decay_style == "WSD":
            wsd = c.wsd_decay_iters or 0
            anneal_start = c.decay_iters - wsd
            if step <= anneal_start:
                return c.lr
            r = (step - anneal_start) / max(1, wsd)
            if c.wsd_decay_style == "linear":
                coeff = 1.0 - r
            elif c.wsd_decay_style == "cosine":
                coeff = 0.5 * (math.cos(math.pi * r) + 1.0)
            elif c.wsd_decay_style == "exponential":
                coeff = 2.0 * (0.5**r) - 1.0
            else:  # minus_sqrt
                coeff = 1.0 - math.sqrt(r)
            return c.min_lr + coeff * (c.lr - c.min_lr)
        span = max(1, c.decay_iters - c.warmup_iters)
        r = (step - c.warmup_iters) / span
        coeff = 0.5 * (math.cos(math.pi * r) + 1.0) if c.decay_style == "cosine" else 1.0 - r
        return c.min_lr + coeff * (c.lr - c.min_lr)

    def step(self) -> float:
        self.num_steps += 1
        return self.lr_at(self.num_steps)

    @property
    def current_lr(self) -> float:
        return self.lr_at(self.num_steps)

    def megatron_state(self, global_batch_size: int) -> dict[str, Any]:
        """`opt_param_scheduler` as Megatron-LM saves it (steps in samples)."""
        c = self.cfg
        return {
            "max_lr": c.lr,
            "lr_warmup_steps": c.warmup_iters * global_batch_size,
            "num_steps": self.num_steps * global_batch_size,
            "lr_decay_style": c.decay_style,
            "lr_decay_steps": c.decay_iters * global_batch_size,
            "min_lr": c.min_lr,
            "start_wd": c.weight_decay,
            "end_wd": c.weight_decay,
            "wd_incr_style": "constant",
            "wd_incr_steps": c.decay_iters * global_batch_size,
        }

    def load_megatron_state(self, state: dict[str, Any], global_batch_size: int) -> None:
        self.num_steps = int(state["num_steps"]) // global_batch_size
