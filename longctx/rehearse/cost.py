"""The cost of length in a rehearsal: seconds per token from stage to stage against what the FLOPs say,
and the FLOP/s each stage achieved against a large matmul measured in the same process.

A training iteration of the micro model costs attention (∝ S² per sequence: 2·S²·d per head forward when
causal, twice that bidirectional) and everything else (∝ S: 6 FLOPs per parameter per token, forward and
backward); the backward of attention is counted as twice its forward, as for the matmuls."""

from __future__ import annotations

import os
import time

import torch
from pydantic import BaseModel, ConfigDict, Field

from longctx.arch import ModelArch

MATMUL_SIZE = 2048
MATMUL_REPEATS = 5


class StageCost(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stage: str
    seq_length: int
    attention_flops: float  # per training iteration (one sequence)
    other_flops: float
    achieved_flops_per_s: float | None = None


class LengthCost(BaseModel):
    """Seconds per token of the longest stage over the shortest, against the FLOPs per token's ratio."""

    model_config = ConfigDict(extra="forbid")

    stages: list[StageCost] = Field(default_factory=list)
    matmul_flops_per_s: float
    matmul: str
    seconds_per_token_ratio: float | None = None
    flops_per_token_ratio: float | None = None
    attention_flops_ratio: float | None = None


def iteration_flops(
    arch: ModelArch, seq_length: int, *, causal: bool, vocab_rows: int
) -> tuple[float, float]:
    """(attention, everything else) FLOPs of one training iteration on one sequence of `seq_length`."""
    heads, d = arch.num_attention_heads, arch.head_dim
    forward = (2.0 if causal else 4.0) * seq_length**2 * d * heads * arch.num_layers
    other = 6.0 * seq_length * (arch.param_count(vocab_rows) - vocab_rows * arch.hidden_size)
    return 3.0 * forward, other


def matmul_flops_per_s() -> tuple[float, str]:
    """The median FLOP/s of a float32 square matmul with this process's threads (the machine's ceiling
    for the kernels' arithmetic)."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    a @ b
    times = []
    for _ in range(MATMUL_REPEATS):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    times.sort()
    what = f"float32 {MATMUL_SIZE}² matmul, {torch.get_num_threads()} threads of {os.cpu_count()} cores"
    return 2.0 * MATMUL_SIZE**3 / times[len(times) // 2], what


def length_cost(
    arch: ModelArch, stages: list[tuple[str, int, float | None]], *, causal: bool, vocab_rows: int
) -> LengthCost:
    """`stages`: (name, length, seconds per iteration) in plan order."""
    peak, what = matmul_flops_per_s()
    out = LengthCost(matmul_flops_per_s=peak, matmul=what)
    for name, length, seconds in stages:
        attention, other = iteration_flops(arch, length, causal=causal, vocab_rows=vocab_rows)
        achieved = (attention + other) / seconds if seconds else None
        out.stages.append(
            StageCost(
                stage=name,
                seq_length=length,
                attention_flops=attention,
                other_flops=other,
                achieved_flops_per_s=achieved,
            )
        )
    first, last = stages[0], stages[-1]
    if len(stages) > 1 and first[2] and last[2]:
        short, long = out.stages[0], out.stages[-1]
        out.seconds_per_token_ratio = (last[2] / last[1]) / (first[2] / first[1])
        per_token = [(s.attention_flops + s.other_flops) / s.seq_length for s in (short, long)]
        out.flops_per_token_ratio = per_token[1] / per_token[0]
        out.attention_flops_ratio = (long.attention_flops / long.seq_length) / (
            short.attention_flops / short.seq_length
        )
    return out
