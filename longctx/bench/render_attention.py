"""`longctx bench attention` as rich tables: CP against one process, and packed documents on both splits."""

from __future__ import annotations

import os
import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from longctx.bench.attention import TARGETS, AttentionBenchReport, AttentionBenchSpec
from longctx.bench.documents_run import DocumentsRun
from longctx.bench.kernel_cost import Calibration
from longctx.bench.tables import machine_line, mib

_COLUMNS = ("S", "piece", "t_full s", "t_cp s", "spread full/cp", "efficiency", "cpu eff", "peak full MiB",
            "peak/rank MiB", "peak ratio", "held ratio", "balance zigzag", "balance contiguous")  # fmt: skip


def attention_table(spec: AttentionBenchSpec, report: AttentionBenchReport) -> Table:
    table = Table(
        title=(
            f"{spec.variant} attention fwd+bwd, CP={spec.cp} vs 1 process, "
            f"{'causal' if spec.causal else 'non-causal'}, {spec.dtype}, b={spec.batch} "
            f"h={spec.heads}/{spec.n_kv_heads} d={spec.head_dim}, {spec.threads} thread(s)/process"
        )
    )
    for col in _COLUMNS:
        table.add_column(col, justify="right")
    for c in report.cases:
        table.add_row(
            str(c.seq_len),
            "-" if c.piece is None else str(c.piece),
            f"{c.t_full_s:.3f}",
            f"{c.t_cp_s:.3f}",
            f"{c.spread_full:.2f}/{c.spread_cp:.2f}",
            f"{c.efficiency:.3f}",
            f"{c.cpu_efficiency:.3f}",
            mib(c.mem_full_bytes),
            mib(c.mem_cp_bytes),
            f"{c.memory_ratio:.3f}",
            f"{c.held_ratio:.3f}",
            f"{c.balance_zigzag:.4f}",
            f"{c.balance_contiguous:.3f}",
        )
    return table


def print_attention(spec: AttentionBenchSpec, report: AttentionBenchReport, con: Console) -> None:
    con.print(attention_table(spec, report))
    con.print(
        f"targets: efficiency ≥ {TARGETS['efficiency']}, memory ratio ≤ {TARGETS['memory_ratio']}, "
        f"balance ≤ {TARGETS['balance']}\n"
        "peak: largest per-rank peak during fwd+bwd (inputs, ring buffers, gradients) vs the full run; "
        "held: what forward leaves resident for backward (inputs, output, LSE), which is what stacks up "
        "over layers in a model; cpu eff: efficiency on process CPU time (compute overhead only); "
        f"times: medians of {spec.repeats} iterations, spread (max − min) / median\n"
        f"memory method: {report.memory_method} · load avg {report.host.get('load_avg_1m')}",
        highlight=False,
        soft_wrap=True,
    )


def _t(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def documents_table(run: DocumentsRun) -> Table:
    o = run.options
    table = Table(
        title=f"causal attention within documents, {o.mix} of each window, CP={o.cp} ring: zigzag vs balanced split"
    )
    for col in (
        "S",
        "docs",
        "short tok",
        "split",
        "slowest/mean",
        "busiest/idlest",
        "FLOPs/dense",
        "calls/rank",
        "model s",
        "t slowest s",
        "t / dense zigzag",
    ):
        table.add_column(col, justify="right")
    for c in run.cases:
        for f in (c.zigzag, c.balanced):
            vs = None if f.t_slowest_s is None or c.t_dense_s is None else f.t_slowest_s / c.t_dense_s
            table.add_row(
                str(c.seq_len),
                str(c.documents),
                str(c.short_tokens),
                f.split + (" (chosen)" if f.split == c.chosen else ""),
                f"{f.slowest_mean:.3f}",
                f"{f.busiest_idlest:.3f}",
                f"{f.flops / c.flops_dense:.3f}",
                str(f.kernel_calls),
                f"{f.modelled_s:.3f}",
                _t(f.t_slowest_s),
                _t(vs),
            )
    return table


def print_documents(run: DocumentsRun, con: Console) -> None:
    con.print(documents_table(run))
    data_line = run.data_line()
    if data_line:
        con.print(data_line, highlight=False, soft_wrap=True)
    speed = ", ".join(f"{c.seq_len}: {c.speedup:.2f}×" for c in run.cases if c.speedup is not None)
    won = ", ".join(
        f"{c.seq_len}: {c.chosen} {c.chosen_vs_other:.3f}" for c in run.cases if c.chosen_vs_other is not None
    )
    con.print(
        "slowest/mean and busiest/idlest: FLOPs per rank from the blocks each rank executes (1.0 = even); "
        "FLOPs/dense: all ranks' FLOPs against dense causal attention; model s: the split cost model's fwd+bwd "
        "seconds of the slowest rank (one thread), which picks the trainer's split (chosen); t slowest: fwd+bwd "
        f"compute of that rank, timed in this process ({run.options.threads} thread(s), kernels only, median of "
        f"{run.options.repeats}, the splits and dense causal attention on zigzag interleaved); balanced vs zigzag "
        f"slowest rank: {speed or '-'}; the chosen split's time over the other's: {won or '-'}\n"
        + machine_line(run.machine),
        highlight=False,
        soft_wrap=True,
    )
    if any(c.processes is not None for c in run.cases):
        con.print(document_process_table(run))
        con.print(_process_note(run), highlight=False, soft_wrap=True)


def document_process_table(run: DocumentsRun) -> Table:
    cases = [c for c in run.cases if c.processes is not None]
    p0 = cases[0].processes
    table = Table(
        title=f"ring attention fwd+bwd within documents, {run.options.mix}, CP={p0.cp} real processes (gloo), "
        f"h={p0.heads}/{p0.kv_heads} d={p0.head_dim} fp32, {p0.threads} thread(s)/process: balanced vs zigzag"
    )
    for col in (
        "S",
        "split",
        "median s per rank",
        "slowest rank s",
        "balanced / zigzag",
        "cpu s per rank",
        "cpu balanced / zigzag",
    ):
        table.add_column(col, justify="right")
    for c in cases:
        p: Any = c.processes
        for f in (p.zigzag, p.balanced):
            cpu = [statistics.median(t) for t in f.rank_cpu_s]
            last = f is p.balanced
            table.add_row(
                str(c.seq_len),
                f.split,
                " ".join(f"{x:.3f}" for x in f.rank_medians_s),
                f"{f.slowest_s:.3f}",
                f"{p.ratio:.3f}" if last else "",
                " ".join(f"{x:.3f}" for x in cpu),
                f"{p.cpu_ratio:.3f}" if last else "",
            )
    return table


def _process_note(run: DocumentsRun) -> str:
    o, m = run.options, run.machine
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else m["cpus"]
    return (
        f"each split: median of {o.repeats} iterations per rank after {o.warmup} warm-up, the two splits alternating "
        "in the same processes on the same tensors (a barrier before each); slowest rank: the largest median; "
        "balanced / zigzag < 1: the balanced split's step is faster; cpu: the same on process CPU time (compute "
        "alone: on a busy machine wall time also holds the wait for a core)\n"
        + machine_line(m)
        + f" at the end, {run.load_before:.2f} before; {usable} CPUs usable"
    )


def print_kernel_cost(cal: Calibration, con: Console) -> None:
    """The fitted and the shipped coefficients of the split cost model, and each one's error per call."""
    table = Table(title="split cost model: seconds of one kernel call = call + pair · pairs + row terms")
    for col in (
        "coefficients",
        "pass",
        "call µs",
        "full pair ns",
        "diag pair ns",
        "q row µs",
        "k row µs",
        "median err",
    ):
        table.add_column(col, justify="right")
    for label, cost, err in (
        ("fitted here", cal.fitted, cal.median_error),
        ("shipped", cal.shipped, cal.shipped_median_error),
    ):
        for name in ("forward", "backward"):
            c = getattr(cost, name)
            table.add_row(
                label,
                name,
                f"{c.call_s * 1e6:.1f}",
                f"{c.full_pair_s * 1e9:.1f}",
                f"{c.diagonal_pair_s * 1e9:.1f}",
                f"{c.query_row_s * 1e6:.3f}",
                f"{c.key_row_s * 1e6:.3f}",
                f"{err[name]:.0%}",
            )
    con.print(table)
    worst = ", ".join(f"{n} {cal.max_error[n]:.0%}" for n in ("forward", "backward"))
    con.print(
        f"{len(cal.timings)} block shapes, median of each; largest error of the fit per call: {worst}\n"
        + machine_line(cal.machine),
        highlight=False,
        soft_wrap=True,
    )
