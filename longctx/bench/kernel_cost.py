"""`longctx bench kernel-cost`: the split cost model's coefficients fitted to this machine's kernel.

The CP split the trainer takes for a packed sample is chosen by `longctx.attention.split_cost`, which
prices each kernel call as call + pair · pairs + q_row · queries + k_row · keys. This bench times the
block kernel's forward and backward on diagonal and full blocks of the shapes the ring makes (16 to
3,072 queries, 32 to 2,048 keys), fits the coefficients by least squares on the relative error, and
prints them next to the ones the model ships, with each fit's error per call.

    cal = calibrate(threads=1)
    cal.fitted.forward.call_s, cal.median_error["forward"]
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from longctx.attention.blocks import Block
from longctx.attention.kernels import select_kernel
from longctx.attention.split_cost import CPU_FLASH_COST, CallCost, KernelCost
from longctx.bench.memory_check import machine

# what the ring calls: causal diagonals of the own chunk, and remote pieces against up to a few
# thousand queries (backward tiles of 768 and more, forward blocks of a whole chunk)
DIAGONALS = (16, 64, 128, 256, 512, 1024, 2048)
QUERIES = (32, 128, 512, 768, 1024, 2048, 3072)
KEYS = (32, 64, 141, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class CallTiming:
    """One block shape's median forward and backward seconds."""

    queries: int
    keys: int
    causal: bool
    forward_s: float
    backward_s: float

    @property
    def block(self) -> Block:
        return Block(0, 0, 0, self.queries, 0, self.keys, self.causal)


@dataclass
class Calibration:
    """The coefficients fitted here, the shipped ones, and how well each predicts the timings."""

    fitted: KernelCost
    shipped: KernelCost
    timings: list[CallTiming]
    median_error: dict[str, float] = field(default_factory=dict)
    max_error: dict[str, float] = field(default_factory=dict)
    shipped_median_error: dict[str, float] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "fitted": asdict(self.fitted),
            "shipped": asdict(self.shipped),
            "median_error": self.median_error,
            "max_error": self.max_error,
            "shipped_median_error": self.shipped_median_error,
            "timings": [asdict(t) for t in self.timings],
            "machine": self.machine,
        }


def shapes() -> list[tuple[int, int, bool]]:
    """(queries, keys, causal) of every timed block."""
    return [(n, n, True) for n in DIAGONALS] + [(q, k, False) for q, k in itertools.product(QUERIES, KEYS)]


def time_call(
    queries: int, keys: int, causal: bool, *, heads: int, head_dim: int, repeats: int
) -> CallTiming:
    """Median forward and backward seconds of one block kernel call (one warm-up call first)."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, queries, heads, head_dim, generator=gen)
    k, v = (torch.randn(1, keys, heads, head_dim, generator=gen) for _ in range(2))
    blk = select_kernel(q.device, q.dtype, None)
    scale = head_dim**-0.5
    fwd, bwd = [], []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out, lse = blk.forward(q, k, v, causal, scale)
        t1 = time.perf_counter()
        blk.backward(out, q, k, v, out, lse, causal, scale)
        if i:
            fwd.append(t1 - t0)
            bwd.append(time.perf_counter() - t1)
    return CallTiming(queries, keys, causal, statistics.median(fwd), statistics.median(bwd))


def _features(t: CallTiming) -> list[float]:
    pairs = t.queries * (t.queries + 1) // 2 if t.causal else t.queries * t.keys
    return [1.0, 0.0 if t.causal else pairs, pairs if t.causal else 0.0, t.queries, t.keys]


def fit(timings: list[CallTiming], backward: bool) -> CallCost:
    """Least squares on the relative error (every shape weighs alike, small calls as much as large)."""
    y = torch.tensor([t.backward_s if backward else t.forward_s for t in timings], dtype=torch.float64)
    x = torch.tensor([_features(t) for t in timings], dtype=torch.float64)
    w = 1.0 / y
    coef = torch.linalg.lstsq(x * w[:, None], (y * w)[:, None]).solution[:, 0]
    return CallCost(*(float(c) for c in coef))


def errors(cost: CallCost, timings: list[CallTiming], backward: bool) -> list[float]:
    """|model / measured − 1| per shape."""
    return [abs(cost.seconds(t.block) / (t.backward_s if backward else t.forward_s) - 1) for t in timings]


def calibrate(*, threads: int = 1, heads: int = 8, head_dim: int = 64, repeats: int = 3) -> Calibration:
    """Time every shape, fit forward and backward, compare with the shipped coefficients."""
    torch.set_num_threads(threads)
    timings = [time_call(q, k, c, heads=heads, head_dim=head_dim, repeats=repeats) for q, k, c in shapes()]
    fitted = KernelCost(
        name=f"cpu_flash fitted here ({threads} thread(s), {heads} × {head_dim})",
        forward=fit(timings, backward=False),
        backward=fit(timings, backward=True),
    )
    cal = Calibration(fitted=fitted, shipped=CPU_FLASH_COST, timings=timings, machine=machine())
    for name, backward in (("forward", False), ("backward", True)):
        mine = errors(getattr(fitted, name), timings, backward)
        cal.median_error[name] = statistics.median(mine)
        cal.max_error[name] = max(mine)
        cal.shipped_median_error[name] = statistics.median(
            errors(getattr(CPU_FLASH_COST, name), timings, backward)
        )
    return cal
