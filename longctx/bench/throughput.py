"""Training throughput of the local backend: tokens/s and model FLOP utilisation, CP 1 and CP 2.

Each model × length × CP runs a few training steps of the local trainer in fresh processes
(`longctx.bench.steps`) with the machine's cores shared out evenly (CP 1: one process with every
thread; CP 2: two processes with half each), so the CP columns compare the same machine. Figures:
tokens/s of the global batch (median of the steps after the first), and MFU = model FLOPs per
second over the peak — the matmul FLOP/s each process measures for itself in the same dtype and
threads (an achievable peak, so the CPU and a GPU are judged alike), and on a GPU whose datasheet
peak is known, that too.

Model FLOPs per token are the training FLOPs of the work a causal LM needs (3 × forward):
6 × the matmul parameters (the layers and the output layer; the embedding lookup is no matmul) plus
6 · L · s · a · k for attention (QKᵀ and PV, causal: half the s × s scores).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from longctx.bench.memory_check import machine
from longctx.bench.steps import StepCase, StepMeasure, measure_steps

# bf16 dense tensor-core peaks (FLOP/s) from the vendors' datasheets, by a name torch reports
DATASHEET_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362.05e12}

MODELS: dict[str, StepCase] = {
    # stages/tiny.toml, the demo's model (vocab 320 padded to 384)
    "demo": StepCase("demo", 1024, layers=4, hidden=128, heads=4, groups=2, ffn=384, vocab=384),
    # a GPT-2-small-sized model with the project's layer (SwiGLU, GQA, QK-norm, untied): 134M parameters
    "125m": StepCase("125m", 1024, layers=12, hidden=768, heads=12, groups=4, ffn=2048, vocab=32768),
}


def matmul_params(case: StepCase) -> int:
    """Parameters that take part in matmuls: every layer's linear weights and the output layer."""
    arch = case.arch()
    h, a, g, k, f = arch.widths
    per_layer = h * (a + 2 * g) * k + a * k * h + h * f * (2 if arch.swiglu else 1) + f * h
    return arch.num_layers * per_layer + case.vocab * h


def flops_per_token(case: StepCase) -> float:
    """Training FLOPs per token (module docstring)."""
    arch = case.arch()
    attention = 6.0 * arch.num_layers * case.seq_length * arch.num_attention_heads * arch.head_dim
    return 6.0 * matmul_params(case) + attention


@dataclass
class ThroughputRow:
    model: str
    seq_length: int
    cp: int
    threads: int  # per process
    tokens_per_s: float
    seconds_per_iteration: float
    mfu: float  # against the processes' own measured matmul peak
    mfu_datasheet: float | None
    loss_first: float
    loss_last: float
    ranks: list[StepMeasure]


@dataclass
class ThroughputReport:
    machine: dict[str, Any]
    rows: list[ThroughputRow]

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "rows": [asdict(r) for r in self.rows]}


def datasheet_peak(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    return next((v for k, v in DATASHEET_BF16.items() if k in gpu_name), None)


def measure(case: StepCase, *, iterations: int, cores: int, gpu: str | None) -> ThroughputRow:
    threads = max(1, cores // case.world)
    ranks = measure_steps(case, iterations=iterations, threads=threads)
    seconds = max(r.steady_seconds for r in ranks)
    tokens = case.micro_batch * case.seq_length
    achieved = flops_per_token(case) * tokens / seconds
    peak = sum(r.gemm_flops_per_s for r in ranks)
    sheet = datasheet_peak(gpu) if ranks[0].device == "cuda" and case.bf16 else None
    return ThroughputRow(
        model=case.label,
        seq_length=case.seq_length,
        cp=case.cp,
        threads=threads,
        tokens_per_s=tokens / seconds,
        seconds_per_iteration=seconds,
        mfu=achieved / peak,
        mfu_datasheet=achieved / (sheet * case.world) if sheet else None,
        loss_first=ranks[0].losses[0],
        loss_last=ranks[0].losses[-1],
        ranks=ranks,
    )


def run_throughput_bench(
    models: list[str],
    seq_lengths: list[int],
    cps: list[int],
    *,
    iterations: int = 4,
    bf16: bool = False,
    advance: Callable[[], None] | None = None,
) -> ThroughputReport:
    """Every model × length × CP; `advance()` after each."""
    info = machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if info.get("gpu"):
        cores = os.cpu_count() or 1
    rows: list[ThroughputRow] = []
    for name in models:
        for seq in seq_lengths:
            for cp in cps:
                case = replace(MODELS[name], seq_length=seq, cp=cp, bf16=bf16)
                rows.append(measure(case, iterations=iterations, cores=cores, gpu=info.get("gpu")))
                if advance:
                    advance()
    return ThroughputReport(machine=info, rows=rows)
