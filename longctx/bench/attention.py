"""Context-parallel attention benchmark: fwd+bwd per rank at CP = n against one process on the full
sequence, with the same thread count per process.

Every measurement runs in fresh spawned processes (the CP ranks talk over gloo). Time: the full run
and the CP ranks are started together and take turns, one fwd+bwd each in alternation, so the
baseline and the ring see the same host (measured one after the other, a shared machine's drift
moved the 8K baseline alone by ±7 %); the full run exits only after the ranks' last turn, whose time
its teardown would otherwise share (it slowed that iteration by up to 50 % at 8K). Before the turns,
every process warms up (one fwd+bwd on a short sequence, which triggers one-off allocations such as
BLAS workspaces, then in the CP ranks one more over the process group, which pages in the
communication code and sets up gloo's buffers); the timed iterations run with the allocator as a
training process has it: glibc's defaults, which keep freed blocks for reuse, so an iteration pays
no page faults for memory an earlier one touched. Memory is measured in two more sets of fresh
processes, one fwd+bwd after the same warm-up, with glibc's mmap threshold pinned at 64 KiB from the
start (every tensor-sized block mmap'd, so the resident set follows live memory; see
`longctx.bench.processes`): the peak resident set (VmHWM, reset first) minus the resident set just
before the inputs. That covers everything torch allocated — inputs, kernel workspaces, ring buffers,
gradients — which Python-level tracers miss. Where the peak cannot be reset, the increase of
`getrusage` `ru_maxrss` is used and the report says so.

Figures (not asserted anywhere): parallel efficiency t_full / (CP · t_cp) with t_cp the slowest
rank's median wall time, and the same ratio on process CPU time (compute overhead only: on a busy
machine ranks that wait for each other lose wall time to the scheduler); per-rank peak memory and
memory held from forward to backward, each against the full run; and the per-rank block-FLOP
balance (max/min) of the zigzag split versus a contiguous split, counted from the blocks each rank
actually computes. The ring's K/V piece size (keys per message, `ring_piece`) is reported per case.

Packed documents (`run_document_bench`, `--documents`): windows stitched from documents of a mix —
FRACTION<LENGTH, the long-tail tiers, or the document lengths of real indexed data sets read from
their `.idx` (`read_data_mix`) — with causal attention within documents on the zigzag and the
document-balanced split: FLOPs per rank from the blocks each rank executes, each split's slowest rank
timed rank by rank in this process, and with `--processes` (`measure_document_processes`) ring
attention fwd+bwd of both splits in CP real processes over gloo, the two alternating iteration by
iteration in the same processes on the same tensors.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from longctx.attention.blocks import (
    Block,
    allgather_plan,
    contiguous_ring_plan,
    plan_pairs,
    ring_plan,
    ring_schedule,
)
from longctx.attention.documents import Documents
from longctx.attention.ring import FORWARD_PIECES, rank_work, ring_piece, ring_query_tile
from longctx.attention.split_cost import CPU_FLASH_COST, choose_split, work_seconds
from longctx.attention.zigzag import check_zigzag_len
from longctx.bench.processes import (
    MEMORY_METHODS,
    PeakMemory,
    fixed_mmap_threshold,
    guarded,
    run_ranks,
    trim_heap,
)
from longctx.errors import AttentionError

TARGETS = {"efficiency": 0.92, "memory_ratio": 0.55, "balance": 1.02}
_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class AttentionBenchSpec:
    seq_lens: tuple[int, ...] = (8192, 16384)
    cp: int = 2
    batch: int = 1
    heads: int = 8
    kv_heads: int | None = None  # None = heads (MHA)
    head_dim: int = 64
    threads: int = 1
    repeats: int = 3
    warmup: int = 1
    dtype: str = "float32"
    causal: bool = True
    variant: str = "ring"  # or "allgather"
    piece: int | None = None  # ring keys per K/V message; None = the automatic rule
    timeout_s: float = 3600.0

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads


@dataclass
class RankMeasure:
    rank: int
    times_s: list[float]
    cpu_times_s: list[float]  # process CPU time (all threads) of the same iterations
    peak_mem_bytes: int
    held_after_forward_bytes: int
    memory_method: str

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_times_s)

    @property
    def spread(self) -> float:
        """(slowest − fastest) / median of the timed iterations."""
        return (max(self.times_s) - min(self.times_s)) / self.median_s if self.times_s else 0.0


@dataclass
class AttentionBenchCase:
    seq_len: int
    piece: int | None  # ring keys per K/V message (None for the all-gather variant)
    t_full_s: float
    t_cp_s: float  # slowest rank's median
    spread_full: float  # (max − min) / median of the full run's timed iterations
    spread_cp: float  # the same for the slowest rank
    efficiency: float
    cpu_efficiency: float  # same ratio on process CPU time: compute overhead, blind to waiting
    mem_full_bytes: int
    mem_cp_bytes: int  # largest rank
    memory_ratio: float
    held_full_bytes: int  # resident after forward: saved activations, inputs, output
    held_cp_bytes: int
    held_ratio: float
    flops_per_rank_zigzag: list[int]
    flops_per_rank_contiguous: list[int]
    balance_zigzag: float
    balance_contiguous: float
    ranks: list[RankMeasure] = field(default_factory=list)
    full_times_s: list[float] = field(default_factory=list)  # the full run's timed iterations


@dataclass
class AttentionBenchReport:
    spec: AttentionBenchSpec
    cases: list[AttentionBenchCase]
    memory_method: str = MEMORY_METHODS["hwm"]
    targets: dict[str, float] = field(default_factory=lambda: dict(TARGETS))
    host: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "memory_method": self.memory_method,
            "targets": self.targets,
            "host": self.host,
            "cases": [
                {
                    **{k: v for k, v in asdict(c).items() if k != "ranks"},
                    "ranks": [asdict(r) for r in c.ranks],
                }
                for c in self.cases
            ],
        }


def validate_spec(spec: AttentionBenchSpec) -> None:
    if spec.cp < 2:
        raise AttentionError(f"the benchmark compares CP ≥ 2 with one process; got CP = {spec.cp}")
    for s in spec.seq_lens:
        check_zigzag_len(s, spec.cp)
    if spec.n_kv_heads < 1 or spec.heads % spec.n_kv_heads:
        raise AttentionError(
            f"KV heads ({spec.n_kv_heads}) do not divide query heads ({spec.heads})",
            fix="choose --kv-heads dividing --heads",
        )
    if spec.dtype not in _DTYPES:
        raise AttentionError(f"dtype {spec.dtype!r} not benchmarked", fix=f"use one of {', '.join(_DTYPES)}")
    if spec.variant not in ("ring", "allgather"):
        raise AttentionError(f"variant {spec.variant!r} unknown", fix="use ring or allgather")
    if spec.threads < 1 or spec.repeats < 1 or spec.warmup < 0 or spec.batch < 1:
        raise AttentionError("threads, repeats and batch must be ≥ 1 and warmup ≥ 0")
    if spec.variant == "ring":
        ring_piece(1, spec.piece)  # a bad piece size (argument or environment) fails here, named


def block_flops(blocks: list[Block], *, batch: int, heads: int, head_dim: int) -> int:
    """Forward matmul FLOPs of these blocks (QKᵀ and PV: 2·2·d per visible query-key pair and head)."""
    return 4 * batch * heads * head_dim * plan_pairs(blocks)


def ring_piece_for(spec: AttentionBenchSpec, seq_len: int) -> int | None:
    """Keys per K/V message the ring uses at this length (None for the all-gather variant)."""
    if spec.variant != "ring":
        return None
    return ring_piece(seq_len // spec.cp, spec.piece)


def executed_blocks(spec: AttentionBenchSpec, seq_len: int, rank: int) -> list[Block]:
    """The blocks `rank` computes: the ring's own chunk and every slot of its schedule, or the
    all-gather plan."""
    local = seq_len // spec.cp
    if spec.variant != "ring":
        return allgather_plan(rank, spec.cp, local, spec.causal)
    piece = ring_piece_for(spec, seq_len)
    assert piece is not None
    own = ring_plan(rank, spec.cp, local, spec.causal)[0]
    return [own] + [s.block for s in ring_schedule(rank, spec.cp, local, spec.causal, piece)]


def flop_balance(spec: AttentionBenchSpec, seq_len: int) -> tuple[list[int], list[int]]:
    local = seq_len // spec.cp
    kw = dict(batch=spec.batch, heads=spec.heads, head_dim=spec.head_dim)
    zig = [block_flops(executed_blocks(spec, seq_len, r), **kw) for r in range(spec.cp)]
    cont = [block_flops(contiguous_ring_plan(r, spec.cp, local, spec.causal), **kw) for r in range(spec.cp)]
    return zig, cont


def _safe_ratio(a: int, b: int) -> float:
    return a / b if b > 0 else float("nan")


def _ratio(values: list[int]) -> float:
    return max(values) / min(values) if min(values) > 0 else float("inf")


# ----------------------------------------------------------------------------------- measurement


def _worker(
    rank: int,
    world: int,
    init_file: str,
    spec: AttentionBenchSpec,
    seq_len: int,
    turns: _Turns | None,
    out: Any,
) -> None:
    """One process of a measurement: timed (taking `turns`) or, without turns, sized."""
    guarded(rank, out, lambda: _measure_rank(rank, world, init_file, spec, seq_len, turns))


@dataclass
class _Turns:
    """Turn-taking of the timed phase: the full run and the CP ranks, alive together, alternate
    iterations, so both see the same host (a shared machine's changing speed or load hits both alike;
    measured one after the other, the baseline alone moved by ±7 % between runs at 8K)."""

    cp: int
    ready: Any  # semaphores of one multiprocessing context
    full_turn: Any
    cp_turn: Any
    timeout_s: float

    def _take(self, sem: Any, what: str) -> None:
        if not sem.acquire(timeout=self.timeout_s):
            raise TimeoutError(f"no {what} within {self.timeout_s:.0f} s (another process failed?)")

    def warmed_up(self, full: bool) -> None:
        """After the warm-up: the CP ranks say so; the full run waits for all of them."""
        if not full:
            self.ready.release()
            return
        for _ in range(self.cp):
            self._take(self.ready, "warm-up of the CP ranks")

    def begin(self, full: bool) -> None:
        self._take(self.full_turn if full else self.cp_turn, "turn")

    def end(self, full: bool, rank: int) -> None:
        """The full run hands the turn to every CP rank; CP rank 0 (after a barrier) back to it."""
        if full:
            for _ in range(self.cp):
                self.cp_turn.release()
        elif rank == 0:
            self.full_turn.release()

    def finished(self, full: bool) -> None:
        """The full run stays until the CP ranks' last turn is over: its exit (freeing its tensors,
        tearing down the interpreter) would otherwise take a core from their last timed iteration."""
        if full:
            self.begin(full)


def _turns(spec: AttentionBenchSpec) -> _Turns:
    ctx = multiprocessing.get_context("spawn")  # the context run_ranks spawns with
    full_turn = ctx.Semaphore(1)  # the full run goes first
    return _Turns(spec.cp, ctx.Semaphore(0), full_turn, ctx.Semaphore(0), spec.timeout_s)


def _inputs(spec: AttentionBenchSpec, local: int, rank: int) -> tuple[Any, Any, Any, Any]:
    import torch  # see _measure_rank

    dtype = getattr(torch, spec.dtype)
    gen = torch.Generator().manual_seed(rank)

    def rows(heads: int, grad: bool = True) -> Any:
        x = torch.randn(spec.batch, local, heads, spec.head_dim, generator=gen).to(dtype)
        return x.requires_grad_() if grad else x

    return rows(spec.heads), rows(spec.n_kv_heads), rows(spec.n_kv_heads), rows(spec.heads, grad=False)


def _measure_rank(
    rank: int,
    world: int,
    init_file: str,
    spec: AttentionBenchSpec,
    seq_len: int,
    turns: _Turns | None,
) -> RankMeasure:
    # torch and the torch-based kernels load in the spawned worker only, not when the CLI imports this
    import torch
    import torch.distributed as dist

    from longctx.attention import allgather_attention, ring_attention

    if turns is None:  # the memory phase
        fixed_mmap_threshold()
    torch.set_num_threads(spec.threads)
    # the timed phase runs the CP ranks (0 … cp−1) and the full run (rank cp) side by side
    full = world == 1 or rank == spec.cp
    ranks = 1 if full else spec.cp
    group = None
    if ranks > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=ranks)
        group = dist.group.WORLD
    extra: dict[str, Any] = {"piece": spec.piece} if spec.variant == "ring" else {}
    fn = ring_attention if spec.variant == "ring" else allgather_attention
    dtype = getattr(torch, spec.dtype)
    # identical warm-up in every process: one-off allocations stay out
    warm_len = min(1024, seq_len // spec.cp)
    wq = torch.randn(1, warm_len, spec.heads, spec.head_dim, dtype=dtype, requires_grad=True)
    wkv = torch.randn(1, warm_len, spec.n_kv_heads, spec.head_dim, dtype=dtype, requires_grad=True)
    w_out = fn(wq, wkv, wkv, group=None, causal=spec.causal)
    w_out.backward(torch.randn_like(w_out))  # a dense upstream gradient, as in the timed runs
    if group is not None:  # and once through the communication path (several pieces per step)
        few = {"piece": 32} if spec.variant == "ring" else {}
        w_out = fn(wq[:, :256], wkv[:, :256], wkv[:, :256], group=group, causal=spec.causal, **few)
        w_out.backward(torch.randn_like(w_out))
    del wq, wkv, w_out
    trim_heap()
    local = seq_len // ranks

    def step(q: Any, k: Any, v: Any, dout: Any, memory: PeakMemory | None = None) -> tuple[float, float, int]:
        if group is not None:
            dist.barrier(group)
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn(q, k, v, group=group, causal=spec.causal, **extra)
        held = memory.current_increase() if memory is not None else 0  # what forward leaves for backward
        result.backward(dout)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        del result
        q.grad = k.grad = v.grad = None
        return elapsed, cpu, held

    if turns is not None:  # the allocator as a training process has it (glibc reuses freed blocks)
        q, k, v, dout = _inputs(spec, local, rank % spec.cp)
        turns.warmed_up(full)
        runs = []
        for _ in range(spec.warmup + spec.repeats):
            turns.begin(full)
            runs.append(step(q, k, v, dout))
            if group is not None:
                dist.barrier(group)  # every rank is done before the full run starts
            turns.end(full, rank)
        turns.finished(full)
        runs = runs[spec.warmup :]
        measure = RankMeasure(rank, [r[0] for r in runs], [r[1] for r in runs], 0, 0, "")
    else:  # one fwd+bwd with every tensor-sized block mmap'd (fixed_mmap_threshold, set first)
        memory = PeakMemory()
        memory.start()
        _, _, held = step(*_inputs(spec, local, rank), memory=memory)
        measure = RankMeasure(rank, [], [], memory.peak_increase(), held, memory.method)
    if group is not None:
        dist.barrier(group)
        dist.destroy_process_group()
    return measure


def _measure(spec: AttentionBenchSpec, seq_len: int) -> tuple[RankMeasure, list[RankMeasure]]:
    """(full run, CP ranks): timed side by side in one set of fresh processes taking turns,
    memory in two more sets, one fwd+bwd each (see the module docstring)."""

    def error(world: int) -> Callable[[str], AttentionError]:
        return lambda message: AttentionError(
            f"attention benchmark failed at S = {seq_len}, {world} process(es): {message}",
            where="longctx bench attention",
        )

    cp = spec.cp
    timed = run_ranks(
        _worker, (spec, seq_len, _turns(spec)), cp + 1, timeout_s=spec.timeout_s, error=error(cp + 1)
    )
    sized_full, sized_cp = (
        run_ranks(_worker, (spec, seq_len, None), w, timeout_s=spec.timeout_s, error=error(w))
        for w in (1, cp)
    )
    for t, m in zip(timed, sized_cp + sized_full, strict=True):  # timed: CP ranks, then the full run
        t.peak_mem_bytes, t.held_after_forward_bytes, t.memory_method = (
            m.peak_mem_bytes,
            m.held_after_forward_bytes,
            m.memory_method,
        )
    full = timed[cp]
    full.rank = 0
    return full, timed[:cp]


def run_attention_bench(
    spec: AttentionBenchSpec, *, advance: Callable[[], None] | None = None
) -> AttentionBenchReport:
    """Measure every sequence length of `spec`; `advance()` is called after each measurement."""
    validate_spec(spec)
    cases: list[AttentionBenchCase] = []
    for seq_len in spec.seq_lens:
        full, ranks = _measure(spec, seq_len)
        if advance:
            advance()
        slowest = max(ranks, key=lambda r: r.median_s)
        t_cp = slowest.median_s
        mem_cp = max(r.peak_mem_bytes for r in ranks)
        held_cp = max(r.held_after_forward_bytes for r in ranks)
        zig, cont = flop_balance(spec, seq_len)
        cases.append(
            AttentionBenchCase(
                seq_len=seq_len,
                piece=ring_piece_for(spec, seq_len),
                t_full_s=full.median_s,
                t_cp_s=t_cp,
                spread_full=full.spread,
                spread_cp=slowest.spread,
                efficiency=full.median_s / (spec.cp * t_cp),
                cpu_efficiency=full.median_cpu_s / (spec.cp * max(r.median_cpu_s for r in ranks)),
                mem_full_bytes=full.peak_mem_bytes,
                mem_cp_bytes=mem_cp,
                memory_ratio=_safe_ratio(mem_cp, full.peak_mem_bytes),
                held_full_bytes=full.held_after_forward_bytes,
                held_cp_bytes=held_cp,
                held_ratio=_safe_ratio(held_cp, full.held_after_forward_bytes),
                flops_per_rank_zigzag=zig,
                flops_per_rank_contiguous=cont,
                balance_zigzag=_ratio(zig),
                balance_contiguous=_ratio(cont),
                ranks=ranks,
                full_times_s=full.times_s,
            )
        )
    methods = {r.memory_method for c in cases for r in c.ranks}
    method = "; ".join(MEMORY_METHODS[m] for m in sorted(methods))
    return AttentionBenchReport(spec=spec, cases=cases, memory_method=method, host=_host())


def _host() -> dict[str, Any]:
    import torch  # see _worker

    return {
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# ------------------------------------------------------------------------------ packed documents


@dataclass(frozen=True)
class SplitFigures:
    """One split of a packed window at CP = n: work per rank and the slowest rank's fwd+bwd time."""

    split: str
    flops: int  # summed over ranks (forward QKᵀ and PV of the executed blocks)
    slowest_mean: float  # the slowest rank's FLOPs over the mean: what each step waits for
    busiest_idlest: float
    kernel_calls: int  # most sub-block calls of one rank
    t_slowest_s: float | None  # fwd+bwd compute of the slowest rank, timed rank by rank
    modelled_s: float = 0.0  # the split cost model's fwd+bwd seconds of the slowest rank (`split_cost`)


@dataclass(frozen=True)
class ProcessSplitTimes:
    """One split's fwd+bwd of ring attention within documents, timed in CP real processes (gloo)."""

    split: str
    rank_times_s: list[list[float]]  # per rank, the wall time of each timed iteration
    rank_cpu_s: list[list[float]]  # the same iterations' process CPU time

    @property
    def rank_medians_s(self) -> list[float]:
        return [statistics.median(t) for t in self.rank_times_s]

    @property
    def slowest_s(self) -> float:
        """The slowest rank's median: what a training step waits for."""
        return max(self.rank_medians_s)

    @property
    def slowest_cpu_s(self) -> float:
        """The largest median CPU time of a rank: its compute alone, blind to waiting (for peers, or
        for a core on a busy machine)."""
        return max(statistics.median(t) for t in self.rank_cpu_s)


@dataclass(frozen=True)
class DocumentProcessCase:
    """Both splits of the same window timed side by side in the same CP processes, alternating."""

    cp: int
    threads: int
    heads: int
    kv_heads: int
    head_dim: int
    zigzag: ProcessSplitTimes
    balanced: ProcessSplitTimes

    @property
    def ratio(self) -> float:
        """Balanced over zigzag, slowest-rank medians (< 1: the balanced split is faster)."""
        return self.balanced.slowest_s / self.zigzag.slowest_s

    @property
    def cpu_ratio(self) -> float:
        """The same ratio on the busiest rank's CPU time."""
        return self.balanced.slowest_cpu_s / self.zigzag.slowest_cpu_s


@dataclass(frozen=True)
class DocumentBenchCase:
    """Attention within documents vs dense causal on one window, zigzag vs the balanced split."""

    seq_len: int
    documents: int
    short_tokens: int  # tokens in documents shorter than 4K
    flops_dense: int  # dense causal on the zigzag split
    t_dense_s: float | None  # its slowest rank, timed the same way
    zigzag: SplitFigures
    balanced: SplitFigures
    processes: DocumentProcessCase | None = None  # timed in CP real processes (`--processes`)
    chosen: str = "zigzag"  # the split the trainer takes for this window (`split_cost.choose_split`)

    @property
    def speedup(self) -> float | None:
        """Slowest-rank time of zigzag over balanced, both within documents."""
        z, b = self.zigzag.t_slowest_s, self.balanced.t_slowest_s
        return None if z is None or b is None else z / b

    @property
    def chosen_vs_other(self) -> float | None:
        """Measured slowest-rank time of the chosen split over the other one's (≤ 1: the choice won)."""
        z, b = self.zigzag.t_slowest_s, self.balanced.t_slowest_s
        if z is None or b is None:
            return None
        return b / z if self.chosen == "balanced" else z / b


def document_lengths(seq_len: int, short_fraction: float, short_max: int, seed: int = 0) -> list[int]:
    """A window of `seq_len` tokens: about `short_fraction` of them in documents shorter than
    `short_max` (lengths uniform in [short_max/16, short_max)), the rest in one long document cut by
    the window, at a random place among them."""
    if not 0 <= short_fraction < 1 or short_max < 16:
        raise AttentionError(
            f"document mix {short_fraction:.0%} < {short_max} is not benchmarkable",
            fix="give a fraction in [0, 1) and a short length ≥ 16, e.g. --documents 10%<4K",
        )
    rng = random.Random(seed)
    budget = int(seq_len * short_fraction)
    short: list[int] = []
    while sum(short) < budget:
        short.append(min(rng.randrange(short_max // 16, short_max), budget - sum(short)))
    lengths = [*short]
    lengths.insert(rng.randrange(len(lengths) + 1), seq_len - sum(short))
    return [n for n in lengths if n > 0]


# token shares of the long-context tiers of stages/baby_9b_dense.toml's first stage, and each tier's
# document lengths (log-uniform): a long-tailed mix where most documents are short and most tokens long
LONG_TAIL = {(64, 4096): 0.10, (4096, 16384): 0.15, (16384, 262144): 0.75}


def long_tail_lengths(seq_len: int, seed: int = 0) -> list[int]:
    """A window stitched from documents of the `LONG_TAIL` tiers: each tier's share of the window filled
    with documents drawn from its lengths (the last one cut to fit), in a random order."""
    rng = random.Random(seed)
    lengths: list[int] = []
    for (lo, hi), share in LONG_TAIL.items():
        room = int(seq_len * share) if (lo, hi) != max(LONG_TAIL) else seq_len - sum(lengths)
        while room > 0:
            n = min(room, int(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
            lengths.append(n)
            room -= n
    rng.shuffle(lengths)
    return lengths


@dataclass(frozen=True)
class DataMix:
    """The document lengths of real data sets, read from their Megatron `.idx` files only."""

    path: str
    prefixes: tuple[str, ...]
    lengths: Any  # numpy int64 array: every document's tokens, times `scale`
    scale: int = 1

    def window(self, seq_len: int, seed: int = 0) -> list[int]:
        """A window of `seq_len` tokens as a packing dataset cuts one from a shuffled stream of these
        documents: it starts at a uniformly random token of the stream, so in a document drawn with
        probability proportional to its length, at a uniform offset in it; the documents after it
        are drawn uniformly (with replacement), the last one cut by the window's end."""
        import numpy as np

        rng = np.random.default_rng(seed)
        lengths = self.lengths
        first = int(rng.choice(lengths, p=lengths / lengths.sum()))
        out = [min(first - int(rng.integers(first)), seq_len)]
        while sum(out) < seq_len:
            out.append(min(int(lengths[rng.integers(len(lengths))]), seq_len - sum(out)))
        return out

    def token_shares(self, edges: tuple[int, ...] = (4096, 16384)) -> list[float]:
        """Share of all tokens in documents below each edge, between edges and above the last."""
        import numpy as np

        bins = np.searchsorted(np.asarray(edges), self.lengths, side="right")
        tokens = np.bincount(bins, weights=self.lengths, minlength=len(edges) + 1)
        return [float(t) for t in tokens / tokens.sum()]


def read_data_mix(text: str) -> DataMix:
    """`from:PATH` or `from:PATH*N`: PATH an indexed dataset's prefix (`PATH.idx`) or a directory,
    every `.idx` under it; `*N` multiplies every length by N (for data whose lengths were scaled
    down, as the test artifact's are 16 ×). The documents of all prefixes are pooled, as the data
    check's histogram pools them (a Megatron blend packs each prefix's windows from its own documents:
    give one prefix for one data set's windows)."""
    import numpy as np

    from longctx.data.index_scan import read_index_only

    spec = text.strip().removeprefix("from:")
    path, _, factor = spec.rpartition("*") if "*" in spec else (spec, "", "1")
    fix = (
        "give --documents from:PREFIX (PREFIX.idx exists) or from:DIRECTORY (holding .idx files), "
        "e.g. from:data/en*16"
    )
    if not factor.isdigit() or int(factor) < 1:
        raise AttentionError(f"document mix {text!r}: the scale after * must be a positive integer", fix=fix)
    if os.path.isdir(path):
        found = sorted(
            os.path.join(root, f)[: -len(".idx")]
            for root, _, files in os.walk(path)
            for f in files
            if f.endswith(".idx")
        )
    else:
        found = [path] if os.path.exists(path + ".idx") else []
    if not found:
        raise AttentionError(f"document mix {text!r}: no indexed dataset at {path}", fix=fix)
    parts = []
    for prefix in found:
        info, _ = read_index_only(prefix)
        parts += list(info.iter_document_lengths())
    lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    lengths = lengths[lengths > 0].astype(np.int64) * int(factor)
    if not len(lengths):
        raise AttentionError(f"document mix {text!r}: the data sets under {path} hold no document", fix=fix)
    return DataMix(path, tuple(found), lengths, int(factor))


def parse_document_mix(text: str) -> tuple[float, int]:
    """'10%<4K' → (0.10, 4096); 'long-tail' → (-1, 0) (see `long_tail_lengths`)."""
    if text.strip() == "long-tail":
        return -1.0, 0
    try:
        frac, short = text.replace(" ", "").split("<")
        value = float(frac.rstrip("%")) / (100 if frac.endswith("%") else 1)
        n = short.upper()
        mult = 1024 if n.endswith("K") else 1
        return value, int(n.rstrip("K")) * mult
    except ValueError:
        raise AttentionError(
            f"document mix {text!r} is neither FRACTION<LENGTH nor long-tail",
            fix="e.g. --documents '10%<4K' or --documents long-tail",
        ) from None


@dataclass(frozen=True)
class _RankWork:
    """The blocks one rank of a split executes, as the ring calls them (see `ring.rank_work`)."""

    own: list[tuple[slice, Block]]
    remote: list[tuple[slice, Block]]
    local: int
    tile: tuple[int, int]


def _rank_pass(work: _RankWork, heads: int, kv_heads: int, head_dim: int) -> Callable[[], None]:
    """One fwd+bwd pass over a rank's blocks (kernels only, as the ring calls them; no messages)."""
    import torch  # see _worker

    from longctx.attention.blocks import query_tiles
    from longctx.attention.kernels import select_kernel

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, work.local, heads, head_dim, generator=gen)
    k, v = (torch.randn(1, work.local, kv_heads, head_dim, generator=gen) for _ in range(2))
    blk = select_kernel(q.device, q.dtype, None)
    scale = head_dim**-0.5

    def run() -> None:
        for rows, sub in work.own:
            out, lse = blk.forward(q[rows, sub.q], k[rows, sub.k], v[rows, sub.k], sub.causal, scale)
            blk.backward(out, q[rows, sub.q], k[rows, sub.k], v[rows, sub.k], out, lse, sub.causal, scale)
        for rows, sub in work.remote:
            out, lse = blk.forward(q[rows, sub.q], k[rows, sub.k], v[rows, sub.k], False, scale)
            for q0, q1 in query_tiles(sub, *work.tile):
                s_ = slice(q0 - sub.q_start, q1 - sub.q_start)
                blk.backward(
                    out[:, s_],
                    q[rows, q0:q1],
                    k[rows, sub.k],
                    v[rows, sub.k],
                    out[:, s_],
                    lse[:, :, s_],
                    False,
                    scale,
                )

    return run


def _time_interleaved(
    passes: dict[str, Callable[[], None]],
    repeats: int,
    threads: int,
    advance: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Median seconds of each pass over `repeats` rounds after one warm-up round; each round runs every
    pass once, in an order that alternates between rounds, so a machine's drift hits them all alike (in
    a fixed order the pass timed second ran up to 1.2× slower at 16K on a shared host)."""
    import torch  # see _worker

    torch.set_num_threads(threads)
    times: dict[str, list[float]] = {name: [] for name in passes}
    names = list(passes)
    for i in range(repeats + 1):
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            passes[name]()
            if i:
                times[name].append(time.perf_counter() - t0)
        advance()
    return {name: statistics.median(t) for name, t in times.items()}


def _split_figures(
    split: str, s: int, cp: int, bounds: tuple[int, ...] | None, heads: int, head_dim: int
) -> tuple[SplitFigures, _RankWork]:
    """A split's work per rank (untimed), and the blocks of its slowest rank by the cost model."""
    local = s // cp
    piece = ring_piece(local)
    docs = None if bounds is None else Documents(s, ((0, 1, bounds),))
    causal = True
    work = [rank_work(r, cp, local, causal, piece, docs, split) for r in range(cp)]
    pairs = [plan_pairs([b for _, b in own + remote]) for own, remote in work]
    modelled = [
        work_seconds(
            CPU_FLASH_COST,
            rank_work(r, cp, local, causal, piece * FORWARD_PIECES, docs, split),
            work[r],
            piece,
        )
        for r in range(cp)
    ]
    slowest = max(range(cp), key=lambda r: modelled[r])
    figures = SplitFigures(
        split=split,
        flops=4 * heads * head_dim * sum(pairs),
        slowest_mean=max(pairs) * cp / sum(pairs),
        busiest_idlest=_ratio(pairs),
        kernel_calls=max(len(own) + len(remote) for own, remote in work),
        t_slowest_s=None,
        modelled_s=max(modelled),
    )
    return figures, _RankWork(*work[slowest], local, ring_query_tile(piece))


# the order of the two splits in even and odd iterations of `measure_document_processes`
SPLIT_ORDER = (("zigzag", "balanced"), ("balanced", "zigzag"))


def _document_worker(
    rank: int,
    world: int,
    init_file: str,
    seq_len: int,
    bounds: tuple[int, ...],
    heads: int,
    kv_heads: int,
    head_dim: int,
    threads: int,
    warmup: int,
    repeats: int,
    out: Any,
) -> None:
    """One CP rank of `measure_document_processes` (spawned by `run_ranks`)."""
    guarded(
        rank,
        out,
        lambda: _time_document_splits(
            rank, world, init_file, seq_len, bounds, heads, kv_heads, head_dim, threads, warmup, repeats
        ),
    )


def _time_document_splits(
    rank: int,
    world: int,
    init_file: str,
    seq_len: int,
    bounds: tuple[int, ...],
    heads: int,
    kv_heads: int,
    head_dim: int,
    threads: int,
    warmup: int,
    repeats: int,
) -> dict[str, tuple[list[float], list[float]]]:
    import torch  # see _measure_rank
    import torch.distributed as dist

    from longctx.attention import ring_attention, zigzag_split
    from longctx.attention.documents import balanced_split

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.group.WORLD
    gen = torch.Generator().manual_seed(0)  # the same full sequence on every rank, then cut
    full = {
        name: torch.randn(1, seq_len, h, head_dim, generator=gen)
        for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads), ("dout", heads))
    }
    cu = torch.tensor(bounds)
    shards = {
        "zigzag": {n: zigzag_split(x, rank, world).contiguous() for n, x in full.items()},
        "balanced": {n: balanced_split(x, cu, rank, world, causal=True) for n, x in full.items()},
    }
    for split in shards.values():
        for n in ("q", "k", "v"):
            split[n].requires_grad_()
    del full
    times: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s in shards}
    for i in range(warmup + repeats):
        # the two splits alternate, and which goes first too: a shared machine's drift hits both alike
        for split in SPLIT_ORDER[i % 2]:
            x = shards[split]
            dist.barrier(group)
            t0, c0 = time.perf_counter(), time.process_time()
            o = ring_attention(x["q"], x["k"], x["v"], group=group, causal=True, cu_seqlens=cu, split=split)
            o.backward(x["dout"])
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            x["q"].grad = x["k"].grad = x["v"].grad = None
            if i >= warmup:
                times[split][0].append(elapsed)
                times[split][1].append(cpu)
    dist.barrier(group)
    dist.destroy_process_group()
    return times


def measure_document_processes(
    seq_len: int,
    bounds: tuple[int, ...],
    *,
    cp: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    threads: int,
    warmup: int,
    repeats: int,
    timeout_s: float = 1800.0,
) -> DocumentProcessCase:
    """Ring attention fwd+bwd within the documents `bounds` of one window, in `cp` fresh processes over
    gloo: the zigzag and the balanced split of the same tensors, iterations alternating between them
    (each after a barrier; the first `warmup` of each left out), every rank's wall and CPU time."""
    check_zigzag_len(seq_len, cp)

    def error(message: str) -> AttentionError:
        return AttentionError(
            f"document attention benchmark failed at S = {seq_len}, CP = {cp}: {message}",
            where="longctx bench attention --documents --processes",
        )

    args = (seq_len, tuple(bounds), heads, kv_heads, head_dim, threads, warmup, repeats)
    ranks = run_ranks(_document_worker, args, cp, timeout_s=timeout_s, error=error)

    def split(name: str) -> ProcessSplitTimes:
        return ProcessSplitTimes(name, [r[name][0] for r in ranks], [r[name][1] for r in ranks])

    return DocumentProcessCase(cp, threads, heads, kv_heads, head_dim, split("zigzag"), split("balanced"))


def document_bench_steps(seq_lens: tuple[int, ...], repeats: int, time_max_len: int) -> int:
    """How many times `run_document_bench` calls `advance`."""
    return sum(1 + (repeats + 1 if s <= time_max_len else 0) for s in seq_lens)


def run_document_bench(
    seq_lens: tuple[int, ...],
    *,
    cp: int,
    short_fraction: float,
    short_max: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    repeats: int,
    time_max_len: int,
    processes: bool = False,
    threads: int = 1,
    warmup: int = 1,
    window: Callable[[int], list[int]] | None = None,
    advance: Callable[[], None] = lambda: None,
) -> list[DocumentBenchCase]:
    """Per length, on a window packed at the mix (`short_fraction` < 0: `long_tail_lengths`; `window`,
    when given, makes the window's document lengths instead): causal attention within documents on the
    zigzag and the balanced split at `cp`, FLOPs counted from the blocks each rank executes, and where
    S ≤ `time_max_len` the fwd+bwd compute of each split's slowest rank (by the cost model of
    `split_cost`) timed in this process with `threads` threads, with dense causal attention on zigzag
    alongside, the three interleaved (`_time_interleaved`); the split the trainer would choose; with
    `processes`, also both splits timed in `cp` real processes (`measure_document_processes`, `threads`
    each). `advance()` is called after each timing round and each length (`document_bench_steps`)."""
    cases = []
    for s in seq_lens:
        check_zigzag_len(s, cp)
        if window is not None:
            lengths = window(s)
        elif short_fraction < 0:
            lengths = long_tail_lengths(s)
        else:
            lengths = document_lengths(s, short_fraction, short_max)
        bounds = (0, *itertools.accumulate(lengths))
        figures = {
            name: _split_figures(split, s, cp, b, heads, head_dim)
            for name, split, b in (
                ("dense", "zigzag", None),
                ("zigzag", "zigzag", bounds),
                ("balanced", "balanced", bounds),
            )
        }
        if s <= time_max_len:
            passes = {
                name: _rank_pass(work, heads, kv_heads, head_dim) for name, (_, work) in figures.items()
            }
            times = _time_interleaved(passes, repeats, threads, advance)
            figures = {
                name: (replace(f, t_slowest_s=times[name]), work) for name, (f, work) in figures.items()
            }
        measured = None
        if processes and s <= time_max_len:
            measured = measure_document_processes(
                s,
                bounds,
                cp=cp,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                threads=threads,
                warmup=warmup,
                repeats=repeats,
            )
        dense = figures["dense"][0]
        cases.append(
            DocumentBenchCase(
                seq_len=s,
                documents=len(lengths),
                short_tokens=sum(n for n in lengths if n < 4096),
                flops_dense=dense.flops,
                t_dense_s=dense.t_slowest_s,
                zigzag=figures["zigzag"][0],
                balanced=figures["balanced"][0],
                processes=measured,
                chosen=choose_split(bounds, batch=1, seq_len=s, world=cp, causal=True),
            )
        )
        advance()
    return cases
