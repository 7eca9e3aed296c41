"""`longctx bench …`: benchmarks that print figures against a baseline measured in the same run."""

from __future__ import annotations

import os
import statistics
from typing import Any

import typer
from rich.table import Table

from longctx.cli._common import (
    cli_errors,
    console,
    fields_of,
    parse_int_list,
    positive_size,
    positive_sizes,
    print_json,
)
from longctx.cli._params import Json

# The benchmarks are imported inside the commands: they load torch, megatron-core and numpy, which
# `longctx --help` does not need.

app = typer.Typer(
    help=(
        "Benchmarks. Each prints ratios against a baseline measured in the same run; nothing is asserted.\n\n"
        "Examples:\n\n"
        "  longctx bench attention                       # CP=2 vs one process, S = 8K and 16K, causal\n\n"
        "  longctx bench attention --seq-lens 2K,4K --heads 8 --kv-heads 2 --threads 1 --json\n\n"
        "  longctx bench rope --lengths 16K,64K,128K                # suggest and the exact Men search\n\n"
        "  longctx bench trainer --megatron-lm ~/Megatron-LM        # local backend vs pretrain_gpt.py, CPU\n\n"
        "  longctx bench memory                                     # memory model vs measured peaks\n\n"
        "  longctx bench throughput --models demo,125m --cp 1,2     # local backend tokens/s and MFU\n\n"
        "  longctx bench tokenize --workers 2                       # data tokenize vs preprocess_data.py"
    ),
    no_args_is_help=True,
)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _machine_line(m: dict) -> str:
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs, torch {m['torch']}{gpu}, load avg {m['load_avg_1m']}"
    )


@app.command("attention")
@cli_errors
def attention_cmd(
    seq_lens: str = typer.Option(
        "8K,16K", "--seq-lens", help="Comma-separated sequence lengths (16K = 16384)."
    ),
    cp: int = typer.Option(2, "--cp", min=2, help="Context-parallel size (processes on this machine)."),
    heads: int = typer.Option(8, "--heads", min=1, help="Query heads."),
    kv_heads: int | None = typer.Option(None, "--kv-heads", min=1, help="KV heads (default: --heads)."),
    head_dim: int = typer.Option(64, "--head-dim", min=1, help="Head dimension."),
    batch: int = typer.Option(1, "--batch", min=1, help="Batch size."),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="Torch threads per process, CP ranks and the full run alike (default: cores/CP).",
    ),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed fwd+bwd iterations (median is reported)."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Untimed iterations first."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16."),
    variant: str = typer.Option("ring", "--variant", help="ring or allgather."),
    causal: bool = typer.Option(
        True, "--causal/--non-causal", help="Causal (default) or bidirectional attention."
    ),
    piece: int | None = typer.Option(
        None, "--piece", min=1, help="Ring keys per K/V message (default: the rule, or $LONGCTX_RING_PIECE)."
    ),
    documents: str | None = typer.Option(
        None,
        "--documents",
        help="Packed documents instead: FRACTION<LENGTH of the window's tokens in short documents, e.g. '10%<4K', "
        "long-tail (the 16K stage's tier mix of stages/baby_9b_dense.toml), or from:PATH[*N] (the document "
        "lengths of the indexed data set PATH, or of every .idx under the directory PATH, read from the "
        "index only; *N scales them).",
    ),
    time_max_len: int = typer.Option(
        16384, "--time-max-len", min=1, help="With --documents: time fwd+bwd (1 process) up to this length."
    ),
    processes: bool = typer.Option(
        False,
        "--processes",
        help="With --documents: also time ring attention fwd+bwd of both splits in CP real processes (gloo), "
        "up to --time-max-len.",
    ),
    json_out: Json = False,
) -> None:
    """Ring attention fwd+bwd per rank at CP = n (n processes, gloo) vs one process on the full sequence.

    With --documents: causal attention within documents on windows packed at that mix, on the zigzag and
    the document-balanced split at CP = n: per split the slowest rank / mean and busiest / idlest FLOPs
    (from the blocks each rank executes), FLOPs against dense, and the slowest rank's fwd+bwd compute
    timed rank by rank against dense zigzag, up to --time-max-len.
    Example: longctx bench attention --documents '10%<4K' --seq-lens 16K,128K --cp 8

    Prints parallel efficiency t_full / (CP · t_cp) with t_cp the slowest rank's median (the full run and the CP ranks are timed side by side, taking turns), per-rank peak memory vs the full run (peak RSS increase in a fresh process per measurement), and the per-rank block-FLOP balance max/min of the zigzag split vs a contiguous split, counted from the blocks each rank computes. Targets (not asserted): efficiency ≥ 0.92, memory ratio ≤ 0.55, zigzag balance ≤ 1.02.

    Example: longctx bench attention --seq-lens 8K,16K --threads 1 --repeats 3
    """
    from longctx.bench.attention import TARGETS, AttentionBenchSpec, run_attention_bench, validate_spec
    from longctx.util.progress import progress_bar

    lens = positive_sizes(seq_lens, "--seq-lens") or []
    if documents is not None:
        _documents_bench(
            documents, lens, cp, heads, kv_heads or heads, head_dim, repeats, time_max_len, json_out,
            processes=processes, threads=threads or max(1, (os.cpu_count() or 1) // cp), warmup=warmup,
        )  # fmt: skip
        return
    spec = AttentionBenchSpec(
        seq_lens=tuple(lens),
        cp=cp,
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        threads=threads or max(1, (os.cpu_count() or 1) // cp),
        repeats=repeats,
        warmup=warmup,
        dtype=dtype,
        variant=variant,
        piece=piece,
        causal=causal,
    )
    validate_spec(spec)
    with progress_bar("attention bench", total=len(lens), unit="lengths") as advance:
        report = run_attention_bench(spec, advance=advance)
    if json_out:
        print_json(report.to_dict())
        return
    table = Table(
        title=(
            f"{spec.variant} attention fwd+bwd, CP={spec.cp} vs 1 process, "
            f"{'causal' if spec.causal else 'non-causal'}, {spec.dtype}, b={spec.batch} "
            f"h={spec.heads}/{spec.n_kv_heads} d={spec.head_dim}, {spec.threads} thread(s)/process"
        )
    )
    columns = ("S", "piece", "t_full s", "t_cp s", "spread full/cp", "efficiency", "cpu eff", "peak full MiB", "peak/rank MiB", "peak ratio",
               "held ratio", "balance zigzag", "balance contiguous")  # fmt: skip
    for col in columns:
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
            _mib(c.mem_full_bytes),
            _mib(c.mem_cp_bytes),
            f"{c.memory_ratio:.3f}",
            f"{c.held_ratio:.3f}",
            f"{c.balance_zigzag:.4f}",
            f"{c.balance_contiguous:.3f}",
        )
    console.print(table)
    console.print(
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


def _documents_bench(
    mix: str,
    lens: list[int],
    cp: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    repeats: int,
    time_max_len: int,
    json_out: bool,
    *,
    processes: bool = False,
    threads: int = 1,
    warmup: int = 1,
) -> None:
    from dataclasses import asdict

    from longctx.bench.attention import parse_document_mix, read_data_mix, run_document_bench
    from longctx.bench.memory import machine

    data = read_data_mix(mix) if mix.strip().startswith("from:") else None
    fraction, short_max = (-1.0, 0) if data else parse_document_mix(mix)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cases = run_document_bench(
        tuple(lens), cp=cp, short_fraction=fraction, short_max=short_max, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, repeats=repeats, time_max_len=time_max_len, processes=processes, threads=threads,
        warmup=warmup, window=data.window if data else None,
    )  # fmt: skip
    if data:
        below, between, above = data.token_shares()
        data_line = (
            f"data {data.path} ({len(data.prefixes)} prefix(es), lengths × {data.scale}): "
            f"{len(data.lengths):,} documents, {int(data.lengths.sum()):,} tokens; tokens in documents "
            f"< 4K {below:.0%}, 4K–16K {between:.0%}, ≥ 16K {above:.0%} (pooled; each window packed from "
            "documents drawn from these lengths)"
        )
    if json_out:
        cases_json = [
            {**asdict(c), **({"processes": _process_json(c.processes)} if c.processes else {})} for c in cases
        ]
        shares = (
            dict(zip(("below_4k", "4k_16k", "from_16k"), data.token_shares(), strict=True)) if data else None
        )
        print_json(
            {
                "mix": mix,
                "cp": cp,
                "cases": cases_json,
                "data": None
                if data is None
                else {
                    "path": data.path,
                    "prefixes": len(data.prefixes),
                    "scale": data.scale,
                    "documents": len(data.lengths),
                    "tokens": int(data.lengths.sum()),
                    "token_shares": shares,
                },
                "machine": machine(),
                "load_avg_1m_before": load_before,
            }
        )
        return

    table = Table(
        title=f"causal attention within documents, {mix} of each window, CP={cp} ring: zigzag vs balanced split"
    )
    for col in ("S", "docs", "short tok", "split", "slowest/mean", "busiest/idlest", "FLOPs/dense", "calls/rank",
                "t slowest s", "t / dense zigzag"):  # fmt: skip
        table.add_column(col, justify="right")

    def t(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    for c in cases:
        for f in (c.zigzag, c.balanced):
            vs = None if f.t_slowest_s is None or c.t_dense_s is None else f.t_slowest_s / c.t_dense_s
            table.add_row(
                str(c.seq_len), str(c.documents), str(c.short_tokens), f.split, f"{f.slowest_mean:.3f}",
                f"{f.busiest_idlest:.3f}", f"{f.flops / c.flops_dense:.3f}", str(f.kernel_calls), t(f.t_slowest_s), t(vs),
            )  # fmt: skip
    console.print(table)
    if data:
        console.print(data_line, highlight=False, soft_wrap=True)
    speed = ", ".join(f"{c.seq_len}: {c.speedup:.2f}×" for c in cases if c.speedup is not None)
    console.print(
        "slowest/mean and busiest/idlest: FLOPs per rank from the blocks each rank executes (1.0 = even); "
        "FLOPs/dense: all ranks' FLOPs against dense causal attention; t slowest: fwd+bwd compute of the "
        f"slowest rank, timed rank by rank in this process (kernels only, median of {repeats}), against dense "
        f"causal attention on the zigzag split timed the same way; balanced vs zigzag slowest rank: {speed or '-'}\n"
        + _machine_line(machine()),
        highlight=False,
        soft_wrap=True,
    )
    timed = [c for c in cases if c.processes is not None]
    if timed:
        _document_process_table(mix, timed, repeats, warmup, machine(), load_before)


def _process_json(p: Any) -> dict[str, Any]:
    from dataclasses import asdict

    splits = {s.split: {**asdict(s), "rank_medians_s": s.rank_medians_s, "slowest_s": s.slowest_s,
                        "slowest_cpu_s": s.slowest_cpu_s} for s in (p.zigzag, p.balanced)}  # fmt: skip
    return {**asdict(p), **splits, "ratio": p.ratio, "cpu_ratio": p.cpu_ratio}


def _document_process_table(
    mix: str, cases: list[Any], repeats: int, warmup: int, m: dict, load_before: float | None
) -> None:
    p0 = cases[0].processes
    table = Table(
        title=f"ring attention fwd+bwd within documents, {mix}, CP={p0.cp} real processes (gloo), "
        f"h={p0.heads}/{p0.kv_heads} d={p0.head_dim} fp32, {p0.threads} thread(s)/process: balanced vs zigzag"
    )
    for col in ("S", "split", "median s per rank", "slowest rank s", "balanced / zigzag", "cpu s per rank",
                "cpu balanced / zigzag"):  # fmt: skip
        table.add_column(col, justify="right")
    for c in cases:
        p = c.processes
        for f in (p.zigzag, p.balanced):
            cpu = [statistics.median(t) for t in f.rank_cpu_s]
            last = f is p.balanced
            table.add_row(
                str(c.seq_len), f.split, " ".join(f"{x:.3f}" for x in f.rank_medians_s), f"{f.slowest_s:.3f}",
                f"{p.ratio:.3f}" if last else "", " ".join(f"{x:.3f}" for x in cpu),
                f"{p.cpu_ratio:.3f}" if last else "",
            )  # fmt: skip
    console.print(table)
    console.print(
        f"each split: median of {repeats} iterations per rank after {warmup} warm-up, the two splits alternating "
        "in the same processes on the same tensors (a barrier before each); slowest rank: the largest median; "
        "balanced / zigzag < 1: the balanced split's step is faster; cpu: the same on process CPU time (compute "
        "alone: on a busy machine wall time also holds the wait for a core)\n"
        + _machine_line(m)
        + f" at the end, {load_before:.2f} before; "
        f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else m['cpus']} CPUs usable",
        highlight=False,
        soft_wrap=True,
    )


@app.command("data-check")
@cli_errors
def data_check_cmd(
    size_gib: float = typer.Option(1.0, "--size-gib", min=0.01, help="Size of the int32 dataset to create."),
    tmp_dir: str | None = typer.Option(
        None, "--tmp-dir", help="Where to create it (default: the system temp dir)."
    ),
    workers: int | None = typer.Option(
        None, "--workers", "-w", min=1, help="Scan threads (default: CPUs, at most 8)."
    ),
    block_kib: int = typer.Option(4096, "--block-kib", min=64, help="Read block size of the scan, KiB."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed runs of each; the best is reported."),
    keep: bool = typer.Option(False, "--keep", help="Keep the dataset (its path is printed)."),
    json_out: Json = False,
) -> None:
    """`data check` throughput vs a plain sequential read of the same .bin, warm page cache.

    Creates an int32 dataset (megatron-core's builder), reads it once to warm the cache, then reports
    the best raw read (scan block size and 64 MiB) and the best full check; target ratio ≥ 0.8.

    Example: longctx bench data-check --size-gib 2 --tmp-dir /dev/shm
    """
    from longctx.bench.data_check import run_data_check_bench
    from longctx.util.progress import progress_bar

    with progress_bar("create dataset", int(size_gib * 2**30), unit="bytes") as advance:
        r = run_data_check_bench(
            size_gib, tmp_dir=tmp_dir, keep=keep, workers=workers, block_bytes=block_kib * 1024,
            repeats=repeats, advance=advance,
        )  # fmt: skip
    if json_out:
        print_json(r)
        return
    table = Table(
        title=f"data check vs raw read: {r.bin_bytes / 2**30:.2f} GiB int32, {r.documents:,} documents"
    )
    for col in ("what", "GB/s", "detail"):
        table.add_column(col)
    raw_detail = ", ".join(f"{b >> 10} KiB blocks: {v:.2f}" for b, v in r.raw_by_block.items())
    table.add_row("raw sequential read", f"{r.raw_gbps:.2f}", f"best of {repeats}; {raw_detail}")
    table.add_row(
        "data check (full)",
        f"{r.check_gbps:.2f}",
        f"{r.check_seconds:.3f} s; {r.workers} thread(s), {r.block_bytes >> 10} KiB blocks",
    )
    table.add_row("token scan alone", f"{r.scan_gbps:.2f}", "")
    console.print(table)
    status = "[green]meets[/]" if r.ratio >= r.target_ratio else "[yellow]below[/]"
    console.print(
        f"ratio check/raw = {r.ratio:.2f} ({status} target {r.target_ratio}) · check ok: {r.check_ok} · "
        f"{r.host['cpus']} CPUs, load avg {r.host['load_avg_1m']}" + (f" · kept {r.path}" if keep else ""),
        highlight=False,
    )


@app.command("ckpt")
@cli_errors
def ckpt_cmd(
    files: int = typer.Option(2049, "--files", min=1, help="Shard files of the sparse snapshot."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed runs (medians, each from a cold index)."),
    keep: str | None = typer.Option(None, "--keep", help="Build the snapshot in this directory and keep it."),
    dp: int = typer.Option(
        256, "--dp", min=1, help="DP ranks the optimizer state is split over (stored items)."
    ),
    json_out: Json = False,
) -> None:
    """`ckpt inspect` + `ckpt check` on a baby_9b_dense-sized snapshot (119 GiB, sparse) vs bare unpickle.

    Builds a flat snapshot whose .metadata is a real torch DCP Metadata of baby_9b_dense with
    distributed-optimizer state over 2049 sparse .distcp files, then times plain pickle.load of .metadata
    (torch's FileSystemReader), inspect, verify after inspect, verify alone; counts files opened during
    those calls (audit hook): no .distcp may be opened. Target (not asserted): inspect + verify < 1 s.

    Example: longctx bench ckpt --repeats 5
    """
    from longctx.bench.ckpt import run_ckpt_bench

    r = run_ckpt_bench(n_files=files, repeats=repeats, keep=keep, dp=dp)
    if json_out:
        print_json(r.to_dict())
        return
    table = Table(
        title=(
            f"ckpt inspect + verify: {r.files} shard files, {r.storage_items:,} stored items, "
            f"{r.logical_bytes / 2**30:.1f} GiB logical ({r.disk_bytes / 2**20:.1f} MiB on disk)"
        )
    )
    for col in ("what", "seconds", "vs baseline"):
        table.add_column(col)
    base = r.baseline_unpickle_s
    rows = [
        ("baseline: pickle.load(.metadata)", base),
        ("inspect (cold)", r.inspect_s),
        ("verify after inspect", r.verify_s),
        ("inspect + verify", r.total_s),
        ("verify alone (cold)", r.verify_cold_s),
    ]
    for name, sec in rows:
        table.add_row(name, f"{sec:.3f}", f"{sec / base:.2f}×" if base else "-")
    console.print(table)
    status = "[green]meets[/]" if r.total_s < 1.0 else "[yellow]misses[/]"
    console.print(
        f"inspect + verify {r.total_s:.3f} s ({status} target < 1 s) · .distcp files opened: {r.shard_opens} "
        f"(other files opened: {', '.join(r.other_opens)}) · shard atimes changed: {r.atime_changed} · "
        f"verify ok: {r.verify_ok} · fixture build {r.build_s:.1f} s · load avg {os.getloadavg()[0]:.1f}",
        highlight=False,
    )
    inferred = ", ".join(f"{k}={v}" for k, v in r.inferred.items())
    console.print(f"inferred: {inferred}" + (f" · kept {r.path}" if r.path else ""), highlight=False)


@app.command("index-check")
@cli_errors
def index_check_cmd(
    prefixes: int = typer.Option(2000, "--prefixes", min=1, help="Synthetic chunk prefixes to create."),
    lengths: str = typer.Option("16K,64K,128K", "--lengths", help="Stage lengths the check reports."),
    docs: int = typer.Option(16, "--docs", min=1, help="Documents per prefix (64–4K tokens each)."),
    tmp_dir: str | None = typer.Option(
        None, "--tmp-dir", help="Where to create them (default: system temp)."
    ),
    workers: int | None = typer.Option(None, "--workers", "-w", min=1, help="Threads (default: CPUs, ≤ 8)."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed runs of each; the best is reported."),
    big_gib: float = typer.Option(
        0.0, "--big-gib", min=0, help="Also run `bench data-check` on one file this big."
    ),
    keep: bool = typer.Option(False, "--keep", help="Keep the artifact (its path is printed)."),
    json_out: Json = False,
) -> None:
    """`data check ARTIFACT --index-only` over thousands of small prefixes; full scan vs raw read of the same files.

    Builds a streamed-layout artifact (chunk manifests, int32 prefixes), warms the page cache, then reports
    the best index-only check (prefixes per second) and the full check's throughput against a sequential
    read of every .bin.

    Example: longctx bench index-check --prefixes 2000 --tmp-dir /dev/shm
    """
    from longctx.bench.index_check import run_index_check_bench
    from longctx.util.progress import progress_bar

    with progress_bar("create prefixes", prefixes, unit="prefixes") as advance:
        r = run_index_check_bench(
            prefixes, lengths=positive_sizes(lengths, "--lengths") or [], docs_per_prefix=docs, tmp_dir=tmp_dir, keep=keep,
            workers=workers, repeats=repeats, big_gib=big_gib, advance=advance,
        )  # fmt: skip
    if json_out:
        print_json(r)
        return
    table = Table(
        title=f"data check ARTIFACT: {r.prefixes:,} prefixes, {r.documents:,} documents, "
        f"{r.bin_bytes / 2**20:.1f} MiB .bin, {r.idx_bytes / 2**20:.2f} MiB .idx"
    )
    for col in ("what", "seconds", "rate", "detail"):
        table.add_column(col)
    table.add_row("index-only check", f"{r.index_seconds:.3f}", f"{r.prefixes_per_second:,.0f} prefixes/s",
                  f"ok: {r.index_ok}; lengths {lengths}")  # fmt: skip
    table.add_row("raw sequential read", f"{r.bin_bytes / r.raw_gbps / 1e9:.3f}", f"{r.raw_gbps:.2f} GB/s",
                  "every .bin, open + read")  # fmt: skip
    table.add_row("full check", f"{r.full_seconds:.3f}", f"{r.full_gbps:.2f} GB/s", f"ok: {r.full_ok}")
    if r.big:
        table.add_row(
            "one big file: raw", "", f"{r.big['raw_gbps']:.2f} GB/s", f"{r.big['bin_bytes'] / 2**30:.2f} GiB"
        )
        table.add_row(
            "one big file: check", "", f"{r.big['check_gbps']:.2f} GB/s", f"ratio {r.big['ratio']:.2f}"
        )
    console.print(table)
    console.print(
        f"full check / raw read = {r.ratio:.2f} · {r.workers} thread(s) · {r.host['cpus']} CPUs, load avg "
        f"{r.host['load_avg_1m']} · created in {r.create_seconds:.1f} s"
        + (f" · kept {r.path}" if keep else ""),
        highlight=False,
    )


@app.command("rope")
@cli_errors
def rope_cmd(
    lengths: str = typer.Option("16K,32K,64K,128K", "--lengths", help="Target lengths for suggest."),
    rotary_dim: int = typer.Option(128, "--rotary-dim", min=4, help="Rotary dim."),
    baseline_length: str = typer.Option(
        "4K",
        "--baseline-length",
        help="Length at which the plain search is timed (it is slow: ~seconds at 4K).",
    ),
    json_out: Json = False,
) -> None:
    """Time `rope suggest` and the exact Men search, and compare the search with the plain definition (one cosine per position and frequency) on the same grid, measured in the same run.

    Example: longctx bench rope --lengths 16K,64K,128K
    """
    from longctx.rope import bench

    result = bench.run(
        positive_sizes(lengths, "--lengths") or [],
        rotary_dim=rotary_dim,
        baseline_length=positive_size(baseline_length, "--baseline-length") or 4096,
    )
    if json_out:
        print_json({**fields_of(result), "speedup": result.speedup})
        return
    console.print(
        f"suggest, {len(result.lengths)} lengths up to {max(result.lengths):,} (empty cache): "
        f"{result.suggest_s:.2f} s",
        highlight=False,
    )
    for n, s in result.search_s.items():
        console.print(f"  exact search {n:>9,}: {s:.3f} s", highlight=False)
    console.print(
        f"plain search at {result.baseline_length:,}: {result.baseline_s:.2f} s vs {result.fast_at_baseline_s:.3f} s "
        f"→ {result.speedup:.0f}× faster, same answer: {result.same_answer}",
        highlight=False,
    )


@app.command("trainer")
@cli_errors
def trainer_cmd(
    layers: int = typer.Option(2, "--layers", min=1, help="Transformer layers."),
    hidden: int = typer.Option(128, "--hidden", min=1, help="Hidden size (ffn = 3 × hidden, SwiGLU)."),
    heads: int = typer.Option(
        4, "--heads", min=1, help="Attention heads (heads / 2 query groups when even)."
    ),
    seq_length: str = typer.Option("256", "--seq-length", help="Sequence length (1K = 1024)."),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Micro batch size."),
    global_batch: int = typer.Option(8, "--global-batch", min=1, help="Global batch size."),
    iterations: int = typer.Option(10, "--iterations", min=2, help="Iterations of each backend."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="First iterations left out of the median."),
    processes: int = typer.Option(2, "--processes", min=1, help="Data-parallel processes of each backend."),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="Torch threads per process (default: cores / processes)."
    ),
    local_bf16: bool = typer.Option(
        True,
        "--local-bf16/--local-fp32",
        help="Precision of the local backend; Megatron-LM's argv always has --bf16 (fp32 is the local "
        "backend's CPU default).",
    ),
    megatron_lm: str | None = typer.Option(
        None,
        "--megatron-lm",
        help="Megatron-LM checkout with pretrain_gpt.py (default: $LONGCTX_MEGATRON_LM).",
    ),
    work_dir: str | None = typer.Option(
        None,
        "--work-dir",
        help="Build inputs and run directories here and keep them (default: temp, removed).",
    ),
    json_out: Json = False,
) -> None:
    """The local backend vs the real Megatron-LM pretrain_gpt.py on one tiny stage, on the CPU: tokens/s each.

    Builds a tokenizer, a dataset, a base checkpoint and a one-stage plan, then runs `longctx stage run
    --backend local` and `--backend megatron-lm` (Megatron-LM on the CPU through longctx's runner and CPU
    flags) on the same model, data, batch, length, processes and threads. Prints the median tokens/s of
    each over the iterations after the warm-up ones (start-up excluded), their ratio local / Megatron-LM,
    the machine and what differs. Target (not asserted): ratio ≥ 1.0.

    Example: longctx bench trainer --iterations 10 --warmup 2 --json
    """
    from longctx.bench.trainer import (
        TrainerBenchSettings,
        megatron_lm_checkout,
        progress_total,
        run_trainer_bench,
    )
    from longctx.util.progress import progress_bar

    settings = TrainerBenchSettings(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        seq_length=positive_size(seq_length, "--seq-length") or 256, micro_batch_size=micro_batch,
        global_batch_size=global_batch, iterations=iterations, warmup=warmup, processes=processes,
        threads=threads, local_bf16=local_bf16,
    )  # fmt: skip
    settings.validate()
    checkout = megatron_lm_checkout(megatron_lm)
    with progress_bar(
        "trainer bench (inputs, local, Megatron-LM)", progress_total(settings), unit="steps"
    ) as advance:
        r = run_trainer_bench(settings, megatron_lm=checkout, work_dir=work_dir, advance=advance)
    if json_out:
        print_json(r.to_dict())
        return
    s = r.settings
    table = Table(
        title=(
            f"trainer tokens/s on the CPU: {s['num_layers']} layers, hidden {s['hidden_size']}, "
            f"heads {s['num_attention_heads']}/{s['num_query_groups']}, seq {s['seq_length']}, "
            f"micro/global batch {s['micro_batch_size']}/{s['global_batch_size']}, "
            f"{s['processes']} process(es) × {s['threads']} thread(s)"
        )
    )
    for col in ("backend", "tokens/s (median)", "s/iteration", "measured", "min–max tokens/s", "launch s"):
        table.add_column(col, justify="right")
    for run in (r.local, r.megatron_lm):
        measured = run.iteration_tokens_per_s[settings.warmup :]
        table.add_row(
            run.backend,
            f"{run.tokens_per_s:,.0f}",
            f"{run.seconds_per_iteration:.3f}",
            f"{run.measured_iterations} of {len(run.iteration_tokens_per_s)}",
            f"{min(measured):,.0f}–{max(measured):,.0f}",
            f"{run.launch_seconds:.1f}",
        )
    console.print(table)
    status = "[green]meets[/]" if r.ratio >= r.target_ratio else "[yellow]below[/]"
    m = r.machine
    console.print(
        f"ratio local / Megatron-LM = {r.ratio:.2f} ({status} target ≥ {r.target_ratio}) · "
        f"local backend {'bf16' if settings.local_bf16 else 'fp32'}, Megatron-LM bf16\n"
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"{m['torch_threads_per_process']} torch thread(s) × {m['processes']} process(es), torch {m['torch']}, "
        f"megatron-core {m['megatron_core']}, load avg {m['load_avg_1m']}\n"
        f"Megatron-LM: {r.megatron_lm_checkout} · launch s: the whole `stage run` (start-up and the final save)"
        + (f" · kept {r.work_dir}" if r.work_dir else ""),
        highlight=False,
        soft_wrap=True,
    )
    console.print("what differs:", highlight=False)
    for line in r.differences:
        console.print(f"  - {line}", highlight=False, soft_wrap=True)


@app.command("memory")
@cli_errors
def memory_cmd(
    grid: str = typer.Option(
        "full", "--grid", help="full (16 configurations, ~11 min on 2 cores) or quick (2)."
    ),
    iterations: int = typer.Option(3, "--iterations", min=2, help="Training steps per configuration."),
    threads: int = typer.Option(1, "--threads", min=1, help="Torch threads per process."),
    json_out: Json = False,
) -> None:
    """The memory model against measured peaks: the local trainer over a grid of configurations.

    Each configuration (sequence 1K–8K, layers, hidden, GQA, micro batch, TP 1/2, CP 1/2, recompute
    none/selective/full, fp32/bf16) runs a few training steps in fresh processes; its steady peak per
    process (above the process before the trainer is built) is set beside the model's estimate for the
    same configuration with this machine's device description. Target (not asserted): every ratio
    measured / predicted within ±15 %.

    Example: longctx bench memory --json
    """
    from longctx.bench.memory import GRID, QUICK, run_memory_bench
    from longctx.errors import PlanError
    from longctx.util.progress import progress_bar

    grids = {"full": GRID, "quick": QUICK}
    if grid not in grids:
        raise PlanError(f"unknown grid {grid!r}", where="--grid", fix="pass --grid full or --grid quick")
    cases = grids[grid]
    with progress_bar("memory bench", total=len(cases), unit="configurations") as advance:
        report = run_memory_bench(cases, iterations=iterations, threads=threads, advance=advance)
    if json_out:
        print_json(report.to_dict())
        return
    table = Table(title=f"memory per process, predicted vs measured ({report.device_model})")
    for col in ("configuration", "procs", "weights+grads+optim MiB", "activations MiB", "logits MiB",
                "predicted MiB", "measured MiB", "ratio", "s/iteration"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in report.rows:
        p = r.predicted
        table.add_row(
            r.case.label, str(r.case.world), _mib(int(p["weights"] + p["grads"] + p["optimizer"])),
            _mib(int(p["activations"])), _mib(int(p["logits"])), _mib(int(r.predicted_bytes)),
            _mib(r.measured_bytes), f"[{'green' if r.within else 'yellow'}]{r.ratio:.3f}[/]",
            f"{r.seconds_per_iteration:.2f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"within ±{report.tolerance:.0%}: {sum(r.within for r in report.rows)} of {len(report.rows)}; "
        f"largest deviation {report.worst:.1%}\n"
        "base: 4 layers, hidden 256, 8 heads, SwiGLU 768, vocab 512, fp32; measured: the largest steady "
        f"peak of the configuration's processes ({report.rows[0].ranks[0].memory_method if report.rows else '-'})\n"
        + _machine_line(report.machine),
        highlight=False,
        soft_wrap=True,
    )


@app.command("throughput")
@cli_errors
def throughput_cmd(
    models: str = typer.Option(
        "demo,125m", "--models", help="Comma-separated: demo (stages/tiny.toml), 125m."
    ),
    seq_lens: str = typer.Option("1K", "--seq-lens", help="Comma-separated sequence lengths (4K = 4096)."),
    cps: str = typer.Option("1,2", "--cp", help="Comma-separated context-parallel sizes."),
    iterations: int = typer.Option(4, "--iterations", min=2, help="Training steps (the first is left out)."),
    bf16: bool = typer.Option(False, "--bf16/--fp32", help="Precision (fp32 is the CPU default)."),
    json_out: Json = False,
) -> None:
    """Local backend tokens/s and model FLOP utilisation, per model, length and CP size.

    CP 1 runs one process with every core's thread, CP n runs n processes sharing the cores, so the
    rows compare the same machine. MFU is against the matmul FLOP/s each process measures in the
    same dtype and threads (and a GPU's datasheet bf16 peak where known). Nothing is asserted.

    Example: longctx bench throughput --models demo --seq-lens 1K,4K --cp 1,2 --json
    """
    from longctx.bench.throughput import MODELS, run_throughput_bench
    from longctx.errors import PlanError
    from longctx.util.progress import progress_bar

    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        raise PlanError(
            f"unknown model(s) {', '.join(unknown) or '(none given)'}",
            where="--models",
            fix=f"pass a comma-separated subset of {', '.join(MODELS)}",
        )
    lens = positive_sizes(seq_lens, "--seq-lens") or [1024]
    cp_sizes = parse_int_list(cps) or [1]
    bad = [f"S = {s} with CP {c}" for s in lens for c in cp_sizes if c < 1 or s % (2 * c)]
    if bad:
        raise PlanError(
            f"{'; '.join(bad)}: CP must be ≥ 1 and the length a multiple of 2 × CP (zigzag chunks)",
            where="--seq-lens / --cp",
            fix="pick lengths divisible by 2 × CP",
        )
    total = len(names) * len(lens) * len(cp_sizes)
    with progress_bar("throughput bench", total=total, unit="runs") as advance:
        report = run_throughput_bench(
            names, lens, cp_sizes, iterations=iterations, bf16=bf16, advance=advance
        )
    if json_out:
        print_json(report.to_dict())
        return
    table = Table(title=f"local backend training throughput ({'bf16' if bf16 else 'fp32'})")
    for col in ("model", "S", "CP", "threads/proc", "tokens/s", "s/iteration", "MFU (matmul peak)", "MFU (datasheet)",
                "loss first→last"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in report.rows:
        table.add_row(
            r.model, str(r.seq_length), str(r.cp), str(r.threads), f"{r.tokens_per_s:,.0f}",
            f"{r.seconds_per_iteration:.3f}", f"{r.mfu:.3f}",
            "-" if r.mfu_datasheet is None else f"{r.mfu_datasheet:.3f}",
            f"{r.loss_first:.3f}→{r.loss_last:.3f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        _machine_line(report.machine) + " · tokens/s: the global batch over the median step after the first",
        highlight=False,
        soft_wrap=True,
    )


@app.command("tokenize")
@cli_errors
def tokenize_cmd(
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", "-t", help="Tokenizer (default: a demo-style HF directory, trained here)."
    ),
    input_path: str | None = typer.Option(
        None, "--input", help="JSONL to tokenize (default: --documents synthetic documents)."
    ),
    documents: int = typer.Option(400, "--documents", min=1, help="Synthetic documents when no --input."),
    workers: int = typer.Option(2, "--workers", "-w", min=1, help="Worker processes of each side."),
    repeats: int = typer.Option(2, "--repeats", min=1, help="Runs of each side; the fastest is reported."),
    json_key: str = typer.Option("text", "--json-key", help="JSON field holding the text."),
    tokenizer_type: str | None = typer.Option(
        None, "--tokenizer-type", help="Megatron's --tokenizer-type (default: the tokenizer layout's)."
    ),
    legacy_tokenizer: bool = typer.Option(False, "--legacy-tokenizer", help="Megatron's --legacy-tokenizer."),
    megatron_lm: str | None = typer.Option(
        None,
        "--megatron-lm",
        help="Megatron-LM checkout with tools/preprocess_data.py (default: $LONGCTX_MEGATRON_LM).",
    ),
    work_dir: str | None = typer.Option(
        None, "--work-dir", help="Build inputs and outputs here and keep them (default: temp, removed)."
    ),
    json_out: Json = False,
) -> None:
    """`data tokenize` vs Megatron-LM's tools/preprocess_data.py: same JSONL, tokenizer, options and workers; tokens/s each.

    Module imports are outside both clocks; tokenizer loading, worker start-up, encoding and writing are
    inside; the fastest of --repeats runs of each is reported, and tokens per CPU-second of all processes. Also reports whether the two .bin/.idx are
    byte-identical. Target (not asserted): ratio ≥ 1.0.

    Example: longctx bench tokenize --workers 2 --documents 400 --json
    """
    from longctx.bench.tokenize import run_tokenize_bench
    from longctx.tokenizer import spec_from_options

    spec = spec_from_options(tokenizer_type, legacy=legacy_tokenizer)
    with console.status("tokenizing with longctx and with Megatron-LM's preprocess_data.py"):
        r = run_tokenize_bench(
            tokenizer=tokenizer, input_path=input_path, spec=spec, documents=documents, workers=workers,
            repeats=repeats, json_key=json_key, megatron_lm=megatron_lm, work_dir=work_dir,
        )  # fmt: skip
    if json_out:
        print_json(r.to_dict())
        return
    table = Table(
        title=(
            f"tokenize {r.documents:,} documents, {r.tokens:,} tokens ({r.input_bytes / 2**20:.1f} MiB), "
            f"{r.workers} worker(s) each: {r.encoding}"
        )
    )
    for col in ("tool", "tokens/s (fastest run)", "seconds of each run", "tokens per CPU-second"):
        table.add_column(col, justify="right")
    for tool, seconds, runs, cpu in (
        ("longctx data tokenize", r.longctx_seconds, r.longctx_runs, r.longctx_cpu_seconds),
        ("Megatron-LM preprocess_data.py", r.megatron_seconds, r.megatron_runs, r.megatron_cpu_seconds),
    ):
        table.add_row(
            tool, f"{r.tokens / seconds:,.0f}", ", ".join(f"{s:.2f}" for s in runs), f"{r.tokens / cpu:,.0f}"
        )
    console.print(table)
    status = "[green]meets[/]" if r.ratio >= r.target_ratio else "[yellow]below[/]"
    same = "[green]byte-identical[/]" if r.identical else "[bold red]DIFFERENT[/]"
    m = r.machine
    console.print(
        f"ratio longctx / Megatron-LM = {r.ratio:.2f} ({status} target ≥ {r.target_ratio}; per CPU-second "
        f"{r.cpu_ratio:.2f}) · outputs {same}\n"
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), load avg {m['load_avg_1m']}, "
        f"transformers {m['transformers']}, sentencepiece {m['sentencepiece']}, tokenizers {m['tokenizers']}\n"
        f"Megatron-LM: {r.megatron_lm_checkout}",
        highlight=False,
        soft_wrap=True,
    )
