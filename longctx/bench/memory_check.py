"""The memory model (`longctx.plan.memory`) against the peaks the local backend measures.

Each configuration of a grid runs a few training steps of the local trainer in fresh processes
(`longctx.bench.steps`) and its steady peak per process is set beside the model's estimate for the
same model, length, TP, CP, micro batch, recompute and precision, with the device description of
the machine it runs on (`CPU_LOCAL_FP32` / `CPU_LOCAL_BF16` on the CPU, `GPU_LOCAL_BF16` on a GPU).
The ratio measured / predicted says per configuration whether a scaling term (length, layers,
hidden, GQA, TP, CP, recompute, micro batch) holds; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from longctx.bench.steps import StepCase, StepMeasure, measure_steps
from longctx.plan.memory import (
    CPU_LOCAL_BF16,
    CPU_LOCAL_FP32,
    GPU_LOCAL_BF16,
    DeviceModel,
    MemoryEstimate,
    MemoryInputs,
    estimate,
)
from longctx.util.machine import cpu_model

TOLERANCE = 0.15  # the target: every configuration within ±15 % on the CPU
# base: 4 layers, hidden 256, 8 heads (MHA), SwiGLU 768, vocab 512; each case varies one thing
GRID: tuple[StepCase, ...] = (
    StepCase("seq 1K", 1024),
    StepCase("seq 2K", 2048),
    StepCase("seq 4K", 4096),
    StepCase("seq 8K", 8192),
    StepCase("8 layers, 2K", 2048, layers=8),
    StepCase("hidden 512, 2K", 2048, hidden=512),
    StepCase("GQA 8/2, 2K", 2048, groups=2),
    StepCase("micro batch 2, 2K", 2048, micro_batch=2),
    StepCase("TP 2, 2K", 2048, tp=2),
    StepCase("TP 2, 4K", 4096, tp=2),
    StepCase("CP 2, 4K", 4096, cp=2),
    StepCase("CP 2, 8K", 8192, cp=2),
    StepCase("full recompute, 4K", 4096, recompute="full"),
    StepCase("selective recompute, 4K", 4096, recompute="selective"),
    StepCase("bf16, 2K", 2048, bf16=True),
    StepCase("bf16 GQA 8/2, CP 2, 4K", 4096, groups=2, cp=2, bf16=True),
)
QUICK: tuple[StepCase, ...] = (
    StepCase("seq 1K", 1024),
    StepCase("CP 2, 2K", 2048, cp=2),
)

# one GPU: bf16 CP 1 only, what the GPU memory model describes (a CP 2 case needs a second GPU)
GPU_CP1: tuple[StepCase, ...] = (
    StepCase("bf16, 2K", 2048, bf16=True),
    StepCase("bf16, 8K", 8192, bf16=True),
    StepCase("bf16 GQA 8/2, 8K", 8192, groups=2, bf16=True),
    StepCase("bf16 selective recompute, 8K", 8192, recompute="selective", bf16=True),
)
# the cases GPU_LOCAL_BF16 was fitted to (tests/plan/data/gpu_local_bf16_peaks.json): one GPU, CP 1
GPU_FIT: tuple[StepCase, ...] = (
    *GPU_CP1,
    StepCase("bf16, 4K", 4096, bf16=True),
    StepCase("bf16 hidden 512, 2K", 2048, hidden=512, bf16=True),
    StepCase("bf16 8 layers, 2K", 2048, layers=8, bf16=True),
    StepCase("bf16 micro batch 2, 2K", 2048, micro_batch=2, bf16=True),
)
CASES = {"full": GRID, "quick": QUICK, "gpu": GPU_CP1, "gpu-fit": GPU_FIT}


def device_model(case: StepCase, device: str) -> DeviceModel:
    if device == "cuda":
        return GPU_LOCAL_BF16 if case.bf16 else CPU_LOCAL_FP32  # fp32 on a GPU keeps what the CPU keeps
    return CPU_LOCAL_BF16 if case.bf16 else CPU_LOCAL_FP32


def predict(case: StepCase, device: str = "cpu") -> MemoryEstimate:
    """The model's bytes per process for `case` (the local trainer: no distributed optimizer, no SP)."""
    inp = MemoryInputs(
        arch=case.arch(),
        padded_vocab_size=case.vocab,
        seq_length=case.seq_length,
        micro_batch_size=case.micro_batch,
        tp=case.tp,
        pp=1,
        cp=case.cp,
        dp=1,
        num_microbatches=1,
        sequence_parallel=False,
        recompute=case.recompute,  # type: ignore[arg-type]
        distributed_optimizer=False,
        recompute_modules=("core_attn",) if case.recompute == "selective" else (),
        device=device_model(case, device),
    )
    return estimate(inp, gpu_memory_gib=1024.0, margin=0.0)


@dataclass
class MemoryRow:
    case: StepCase
    predicted: dict[str, float]  # the estimate's parts, bytes
    predicted_bytes: float
    measured_bytes: int  # largest steady peak of the case's processes
    ratio: float  # measured / predicted
    seconds_per_iteration: float
    ranks: list[StepMeasure] = field(default_factory=list)

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1.0) <= TOLERANCE


@dataclass
class MemoryReport:
    device: str
    device_model: str
    machine: dict[str, Any]
    rows: list[MemoryRow]
    tolerance: float = TOLERANCE

    @property
    def worst(self) -> float:
        return max((abs(r.ratio - 1.0) for r in self.rows), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "device_model": self.device_model,
            "machine": self.machine,
            "tolerance": self.tolerance,
            "worst_deviation": self.worst,
            "within_tolerance": sum(r.within for r in self.rows),
            "rows": [row_dict(r) for r in self.rows],
        }


def row_dict(r: MemoryRow) -> dict[str, Any]:
    return {
        "case": asdict(r.case),
        "predicted": r.predicted,
        "predicted_bytes": r.predicted_bytes,
        "measured_bytes": r.measured_bytes,
        "ratio": r.ratio,
        "within": r.within,
        "seconds_per_iteration": r.seconds_per_iteration,
        "ranks": [asdict(m) for m in r.ranks],
    }


def machine() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def measure_case(case: StepCase, iterations: int, threads: int) -> MemoryRow:
    ranks = measure_steps(case, iterations=iterations, threads=threads)
    est = predict(case, ranks[0].device)
    measured = max(m.steady_peak for m in ranks)
    seconds = statistics.median(t for m in ranks for t in m.times_s[1:] or m.times_s)
    parts = {k: getattr(est, k) for k in est.PARTS}
    return MemoryRow(case, parts, est.total, measured, measured / est.total, seconds, ranks)


def run_memory_bench(
    cases: tuple[StepCase, ...] = GRID,
    *,
    iterations: int = 3,
    threads: int = 1,
    advance: Callable[[], None] | None = None,
) -> MemoryReport:
    """Measure every case of the grid and set it beside the model; `advance()` after each case."""
    rows: list[MemoryRow] = []
    device = "cpu"
    for case in cases:
        rows.append(measure_case(case, iterations, threads))
        device = rows[-1].ranks[0].device
        if advance:
            advance()
    model = device_model(cases[0], device).name if cases else ""
    return MemoryReport(device=device, device_model=model, machine=machine(), rows=rows)


def main(argv: list[str] | None = None) -> int:
    """`python -m longctx.bench.memory_check --cases gpu --jsonl FILE`: each case measured and appended to FILE
    as one JSON line the moment it ends; a case that fails is a line with its error, and the next runs.
    Exits 1 when a case failed."""
    p = argparse.ArgumentParser(prog="python -m longctx.bench.memory_check")
    p.add_argument("--cases", choices=sorted(CASES), default="gpu")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jsonl", type=Path, required=True)
    ns = p.parse_args(argv)
    failed = 0
    for case in CASES[ns.cases]:
        try:
            record = {"ok": True, **row_dict(measure_case(case, ns.iterations, ns.threads))}
        except Exception as err:  # the case is a row with its cause; the others still run
            failed += 1
            record = {
                "ok": False,
                "case": asdict(case),
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=4),
            }
        with open(ns.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        print(
            f"{case.label}: " + (f"ratio {record['ratio']:.3f}" if record["ok"] else record["error"]),
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
