"""Training steps of the local backend in fresh processes: time and peak memory per iteration.

The trainer is longctx's own (`longctx.train.loop.Trainer`: megatron-core GPTModel, AdamW, the
gradient reductions over DP × CP), built from a `TrainSpec` as `stage run` builds it, and stepped
with `train_step` on synthetic token batches (uniform random ids, every position a loss position),
so a measurement needs no tokenizer, dataset or checkpoint on disk. Nothing is saved.

Memory is measured above the resident set of the process just before the trainer is built (after
the process group and a warm-up matmul): on the CPU the peak RSS of each iteration (VmHWM, reset
before it), on CUDA `torch.cuda.max_memory_allocated` above the allocation before the build. The
first iteration creates Adam's state, so the steady figure is the largest of the later ones.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from longctx.arch import ModelArch
from longctx.bench.processes import PeakMemory, fixed_mmap_threshold, guarded, run_ranks, trim_heap
from longctx.errors import LongctxError
from longctx.mcore.parallel import backend, training_device
from longctx.train.loop import Trainer
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec

Recompute = str  # "none" | "selective" | "full"


@dataclass(frozen=True)
class StepCase:
    """One model and parallel layout of the local trainer."""

    label: str
    seq_length: int
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    groups: int | None = None  # None: MHA
    ffn: int | None = None  # None: 3 × hidden (SwiGLU)
    vocab: int = 512  # padded vocabulary
    tp: int = 1
    cp: int = 1
    micro_batch: int = 1
    recompute: Recompute = "none"
    bf16: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.cp

    def arch(self) -> ModelArch:
        return ModelArch(
            num_layers=self.layers,
            hidden_size=self.hidden,
            ffn_hidden_size=self.ffn or 3 * self.hidden,
            num_attention_heads=self.heads,
            num_query_groups=self.groups,
        )

    def spec(self, iterations: int, threads: int) -> TrainSpec:
        """The trainer's spec; the paths are never read (no load, no data on disk, no save)."""
        return TrainSpec(
            stage="bench",
            arch=self.arch(),
            seq_length=self.seq_length,
            max_position_embeddings=self.seq_length,
            rotary_base=10_000,
            padded_vocab_size=self.vocab,
            tokenizer=TokenizerInfo(path="-", md5="0" * 32, vocab_size=self.vocab, eod_id=0),
            data=[(None, "-")],
            data_cache_path="-",
            micro_batch_size=self.micro_batch,
            global_batch_size=self.micro_batch,
            train_iters=iterations,
            lr=LRSchedule(lr=1e-4, min_lr=1e-5, decay_iters=max(1, iterations)),
            tensor_parallel=self.tp,
            context_parallel=self.cp,
            recompute=self.recompute,  # type: ignore[arg-type]
            bf16=self.bf16,
            save="-",
            save_interval=iterations + 1,
            threads_per_process=threads,
        )


@dataclass
class StepMeasure:
    rank: int
    device: str
    times_s: list[float]
    peaks_bytes: list[int]  # per iteration, above the process before the trainer was built
    built_bytes: int  # resident after building the trainer (weights, rotary tables, buffers)
    params: int  # parameters on this rank
    memory_method: str
    losses: list[float] = field(default_factory=list)  # the loss of each step (same on every rank)
    gemm_flops_per_s: float = 0.0  # a square matmul in this process, same dtype and threads: its peak

    @property
    def steady_seconds(self) -> float:
        """Median time of the steps after the first (which allocates the optimizer state)."""
        return statistics.median(self.times_s[1:] or self.times_s)

    @property
    def steady_peak(self) -> int:
        """The largest peak after the first iteration (which creates the optimizer state)."""
        return max(self.peaks_bytes[1:] or self.peaks_bytes)


class SyntheticSamples:
    """Samples as the trainer's dataset returns them: random ids, every position a loss position."""

    def __init__(self, seq_length: int, vocab: int) -> None:
        self.seq_length, self.vocab = seq_length, vocab

    def __getitem__(self, i: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq_length + 1,), generator=gen)
        return {
            "tokens": ids[:-1],
            "labels": ids[1:],
            "loss_mask": torch.ones(self.seq_length),
            "position_ids": torch.arange(self.seq_length),
        }


class _CudaPeak:
    """`PeakMemory`'s interface over the CUDA caching allocator's statistics."""

    method = "cuda max_memory_allocated"

    def start(self) -> None:
        torch.cuda.synchronize()
        self.base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def current_increase(self) -> int:
        return max(0, torch.cuda.memory_allocated() - self.base)

    def peak_increase(self) -> int:
        torch.cuda.synchronize()
        return max(0, torch.cuda.max_memory_allocated() - self.base)


def gemm_flops_per_s(device: Any, dtype: Any, *, n: int | None = None, seconds: float = 0.5) -> float:
    """FLOP/s of repeated n×n matmuls on `device` in `dtype` (the median of 5 timed batches): the
    achievable peak that model FLOP utilisation is measured against on this process's threads."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    sync()
    t0 = time.perf_counter()
    reps = 0
    while time.perf_counter() - t0 < seconds / 5 or reps < 1:  # calls per batch for ~seconds/5
        a @ b
        sync()
        reps += 1
    rates = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        rates.append(2.0 * n**3 * reps / (time.perf_counter() - t0))
    return statistics.median(rates)


def _measure(
    rank: int, world: int, init_file: str, case: StepCase, iterations: int, threads: int
) -> StepMeasure:
    fixed_mmap_threshold()
    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group(backend(), init_method=f"file://{init_file}", rank=rank, world_size=world)
    device = training_device()
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    warm = torch.randn(256, 256, device=device, requires_grad=True)
    (warm @ warm).sum().backward()  # BLAS and autograd workspaces stay out of the figure
    del warm
    gemm = gemm_flops_per_s(device, torch.bfloat16 if case.bf16 else torch.float32)
    trim_heap()
    memory: PeakMemory | _CudaPeak = _CudaPeak() if device.type == "cuda" else PeakMemory()
    memory.start()
    trainer = Trainer(case.spec(iterations, threads))
    built = memory.current_increase()
    trainer.dataset = SyntheticSamples(case.seq_length, case.vocab)  # type: ignore[assignment]
    trainer.model.train()
    times: list[float] = []
    peaks: list[int] = []
    losses: list[float] = []
    for _ in range(iterations):
        dist.barrier()
        memory.reset_peak()
        t0 = time.perf_counter()
        loss, _ = trainer.train_step()
        losses.append(loss)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peaks.append(memory.peak_increase())
    params = sum(p.numel() for p in trainer.model.parameters())
    dist.barrier()
    dist.destroy_process_group()
    return StepMeasure(rank, device.type, times, peaks, built, params, memory.method, losses, gemm)


def _worker(
    rank: int, world: int, init_file: str, case: StepCase, iterations: int, threads: int, out: Any
) -> None:
    guarded(rank, out, lambda: _measure(rank, world, init_file, case, iterations, threads))


def measure_steps(
    case: StepCase, *, iterations: int, threads: int, timeout_s: float = 1800.0
) -> list[StepMeasure]:
    """`iterations` training steps of `case` on TP × CP fresh processes; one measure per rank."""

    def error(message: str) -> LongctxError:
        return LongctxError(
            f"training-step benchmark failed for {case.label} ({case.world} process(es)): {message}",
            where="longctx bench",
            fix="run the case alone with --json to see the worker's traceback",
        )

    return run_ranks(_worker, (case, iterations, threads), case.world, timeout_s=timeout_s, error=error)
