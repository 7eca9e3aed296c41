"""The benchmarks' reports as rich tables and the lines under them (`longctx bench …` prints them).

Each `print_*` takes the report its bench returns and the console to print on; `*_table` builds the table
alone, for tests and other callers.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table


def mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def machine_line(m: dict) -> str:
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs, torch {m['torch']}{gpu}, load avg {m['load_avg_1m']}"
    )


def _meets(ok: bool) -> str:
    return "[green]meets[/]" if ok else "[yellow]below[/]"


def _table(
    title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]], justify: JustifyMethod = "right"
) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify=justify)
    for row in rows:
        table.add_row(*row)
    return table


def print_data_check(r: Any, con: Console, *, repeats: int, keep: bool) -> None:
    raw_detail = ", ".join(f"{b >> 10} KiB blocks: {v:.2f}" for b, v in r.raw_by_block.items())
    rows = [
        ("raw sequential read", f"{r.raw_gbps:.2f}", f"best of {repeats}; {raw_detail}"),
        (
            "data check (full)",
            f"{r.check_gbps:.2f}",
            f"{r.check_seconds:.3f} s; {r.workers} thread(s), {r.block_bytes >> 10} KiB blocks",
        ),
        ("token scan alone", f"{r.scan_gbps:.2f}", ""),
    ]
    title = f"data check vs raw read: {r.bin_bytes / 2**30:.2f} GiB int32, {r.documents:,} documents"
    con.print(_table(title, ("what", "GB/s", "detail"), rows, justify="left"))
    con.print(
        f"ratio check/raw = {r.ratio:.2f} ({_meets(r.ratio >= r.target_ratio)} target {r.target_ratio}) · check ok: "
        f"{r.check_ok} · {r.host['cpus']} CPUs, load avg {r.host['load_avg_1m']}"
        + (f" · kept {r.path}" if keep else ""),
        highlight=False,
    )


def print_ckpt(r: Any, con: Console) -> None:
    title = (
        f"ckpt inspect + verify: {r.files} shard files, {r.storage_items:,} stored items, "
        f"{r.logical_bytes / 2**30:.1f} GiB logical ({r.disk_bytes / 2**20:.1f} MiB on disk)"
    )
    base = r.baseline_unpickle_s
    timed = [
        ("baseline: pickle.load(.metadata)", base),
        ("inspect (cold)", r.inspect_s),
        ("verify after inspect", r.verify_s),
        ("inspect + verify", r.total_s),
        ("verify alone (cold)", r.verify_cold_s),
    ]
    rows = [(name, f"{sec:.3f}", f"{sec / base:.2f}×" if base else "-") for name, sec in timed]
    con.print(_table(title, ("what", "seconds", "vs baseline"), rows, justify="left"))
    status = "[green]meets[/]" if r.total_s < 1.0 else "[yellow]misses[/]"
    con.print(
        f"inspect + verify {r.total_s:.3f} s ({status} target < 1 s) · .distcp files opened: {r.shard_opens} "
        f"(other files opened: {', '.join(r.other_opens)}) · shard atimes changed: {r.atime_changed} · "
        f"verify ok: {r.verify_ok} · fixture build {r.build_s:.1f} s · load avg {os.getloadavg()[0]:.1f}",
        highlight=False,
    )
    inferred = ", ".join(f"{k}={v}" for k, v in r.inferred.items())
    con.print(f"inferred: {inferred}" + (f" · kept {r.path}" if r.path else ""), highlight=False)


def print_index_check(r: Any, con: Console, *, lengths: str, keep: bool) -> None:
    title = (
        f"data check ARTIFACT: {r.prefixes:,} prefixes, {r.documents:,} documents, "
        f"{r.bin_bytes / 2**20:.1f} MiB .bin, {r.idx_bytes / 2**20:.2f} MiB .idx"
    )
    rows = [
        (
            "index-only check",
            f"{r.index_seconds:.3f}",
            f"{r.prefixes_per_second:,.0f} prefixes/s",
            f"ok: {r.index_ok}; lengths {lengths}",
        ),
        (
            "raw sequential read",
            f"{r.bin_bytes / r.raw_gbps / 1e9:.3f}",
            f"{r.raw_gbps:.2f} GB/s",
            "every .bin, open + read",
        ),
        ("full check", f"{r.full_seconds:.3f}", f"{r.full_gbps:.2f} GB/s", f"ok: {r.full_ok}"),
    ]
    if r.big:
        rows += [
            (
                "one big file: raw",
                "",
                f"{r.big['raw_gbps']:.2f} GB/s",
                f"{r.big['bin_bytes'] / 2**30:.2f} GiB",
            ),
            ("one big file: check", "", f"{r.big['check_gbps']:.2f} GB/s", f"ratio {r.big['ratio']:.2f}"),
        ]
    con.print(_table(title, ("what", "seconds", "rate", "detail"), rows, justify="left"))
    con.print(
        f"full check / raw read = {r.ratio:.2f} · {r.workers} thread(s) · {r.host['cpus']} CPUs, load avg "
        f"{r.host['load_avg_1m']} · created in {r.create_seconds:.1f} s"
        + (f" · kept {r.path}" if keep else ""),
        highlight=False,
    )


def print_greedy(r: Any, con: Console) -> None:
    title = (
        f"greedy answers of {r.items} {r.task} items at {r.length:,} tokens (batch {r.batch_size}, "
        f"{r.misses} missed), {r.repeats} run(s) each"
    )
    full, cached = statistics.median(r.full_seconds), statistics.median(r.cached_seconds)
    rows = [
        ("baseline: whole sequences rerun", f"{full:.2f}", str(r.full_forwards), "1.00×"),
        (
            "prefix cache: answer positions rerun",
            f"{cached:.2f}",
            str(r.cached_full_forwards),
            f"{r.ratio:.2f}×",
        ),
    ]
    con.print(_table(title, ("mode", "median s", "full forwards", "speed-up"), rows, justify="left"))
    con.print(
        f"same answers token for token: {r.same_answers} · {r.checkpoint} · machine: {r.machine}, "
        f"{r.threads} torch threads, load avg {os.getloadavg()[0]:.1f}",
        highlight=False,
    )


def print_rope_bench(result: Any, con: Console) -> None:
    con.print(
        f"suggest, {len(result.lengths)} lengths up to {max(result.lengths):,} (empty cache): "
        f"{result.suggest_s:.2f} s",
        highlight=False,
    )
    for n, s in result.search_s.items():
        con.print(f"  exact search {n:>9,}: {s:.3f} s", highlight=False)
    con.print(
        f"plain search at {result.baseline_length:,}: {result.baseline_s:.2f} s vs {result.fast_at_baseline_s:.3f} s "
        f"→ {result.speedup:.0f}× faster, same answer: {result.same_answer}",
        highlight=False,
    )


def trainer_table(r: Any, *, warmup: int) -> Table:
    s = r.settings
    title = (
        f"trainer tokens/s on the CPU: {s['num_layers']} layers, hidden {s['hidden_size']}, "
        f"heads {s['num_attention_heads']}/{s['num_query_groups']}, seq {s['seq_length']}, "
        f"micro/global batch {s['micro_batch_size']}/{s['global_batch_size']}, "
        f"{s['processes']} process(es) × {s['threads']} thread(s)"
    )
    rows = []
    for run in (r.local, r.megatron_lm):
        measured = run.iteration_tokens_per_s[warmup:]
        rows.append(
            (
                run.backend,
                f"{run.tokens_per_s:,.0f}",
                f"{run.seconds_per_iteration:.3f}",
                f"{run.measured_iterations} of {len(run.iteration_tokens_per_s)}",
                f"{min(measured):,.0f}–{max(measured):,.0f}",
                f"{run.launch_seconds:.1f}",
            )
        )
    columns = ("backend", "tokens/s (median)", "s/iteration", "measured", "min–max tokens/s", "launch s")
    return _table(title, columns, rows)


def print_trainer(r: Any, con: Console, *, warmup: int, local_bf16: bool) -> None:
    con.print(trainer_table(r, warmup=warmup))
    m = r.machine
    con.print(
        f"ratio local / Megatron-LM = {r.ratio:.2f} "
        f"({_meets(r.ratio >= r.target_ratio)} target ≥ {r.target_ratio}) · "
        f"local backend {'bf16' if local_bf16 else 'fp32'}, Megatron-LM bf16\n"
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"{m['torch_threads_per_process']} torch thread(s) × {m['processes']} process(es), torch {m['torch']}, "
        f"megatron-core {m['megatron_core']}, load avg {m['load_avg_1m']}\n"
        f"Megatron-LM: {r.megatron_lm_checkout} · launch s: the whole `stage run` (start-up and the final save)"
        + (f" · kept {r.work_dir}" if r.work_dir else ""),
        highlight=False,
        soft_wrap=True,
    )
    con.print("what differs:", highlight=False)
    for line in r.differences:
        con.print(f"  - {line}", highlight=False, soft_wrap=True)


def print_memory(report: Any, con: Console) -> None:
    rows = []
    for r in report.rows:
        p = r.predicted
        rows.append(
            (
                r.case.label,
                str(r.case.world),
                mib(int(p["weights"] + p["grads"] + p["optimizer"])),
                mib(int(p["activations"])),
                mib(int(p["logits"])),
                mib(int(r.predicted_bytes)),
                mib(r.measured_bytes),
                f"[{'green' if r.within else 'yellow'}]{r.ratio:.3f}[/]",
                f"{r.seconds_per_iteration:.2f}",
            )
        )
    columns = ("configuration", "procs", "weights+grads+optim MiB", "activations MiB", "logits MiB",
               "predicted MiB", "measured MiB", "ratio", "s/iteration")  # fmt: skip
    con.print(_table(f"memory per process, predicted vs measured ({report.device_model})", columns, rows))
    method = report.rows[0].ranks[0].memory_method if report.rows else "-"
    con.print(
        f"within ±{report.tolerance:.0%}: {sum(r.within for r in report.rows)} of {len(report.rows)}; "
        f"largest deviation {report.worst:.1%}\n"
        "base: 4 layers, hidden 256, 8 heads, SwiGLU 768, vocab 512, fp32; measured: the largest steady "
        f"peak of the configuration's processes ({method})\n" + machine_line(report.machine),
        highlight=False,
        soft_wrap=True,
    )


def print_throughput(report: Any, con: Console, *, bf16: bool) -> None:
    rows = [
        (
            r.model,
            str(r.seq_length),
            str(r.cp),
            str(r.threads),
            f"{r.tokens_per_s:,.0f}",
            f"{r.seconds_per_iteration:.3f}",
            f"{r.mfu:.3f}",
            "-" if r.mfu_datasheet is None else f"{r.mfu_datasheet:.3f}",
            f"{r.loss_first:.3f}→{r.loss_last:.3f}",
        )
        for r in report.rows
    ]
    columns = ("model", "S", "CP", "threads/proc", "tokens/s", "s/iteration", "MFU (matmul peak)", "MFU (datasheet)",
               "loss first→last")  # fmt: skip
    con.print(_table(f"local backend training throughput ({'bf16' if bf16 else 'fp32'})", columns, rows))
    con.print(
        machine_line(report.machine) + " · tokens/s: the global batch over the median step after the first",
        highlight=False,
        soft_wrap=True,
    )


def print_tokenize(r: Any, con: Console) -> None:
    title = (
        f"tokenize {r.documents:,} documents, {r.tokens:,} tokens ({r.input_bytes / 2**20:.1f} MiB), "
        f"{r.workers} worker(s) each: {r.encoding}"
    )
    rows = [
        (tool, f"{r.tokens / seconds:,.0f}", ", ".join(f"{s:.2f}" for s in runs), f"{r.tokens / cpu:,.0f}")
        for tool, seconds, runs, cpu in (
            ("longctx data tokenize", r.longctx_seconds, r.longctx_runs, r.longctx_cpu_seconds),
            ("Megatron-LM preprocess_data.py", r.megatron_seconds, r.megatron_runs, r.megatron_cpu_seconds),
        )
    ]
    columns = ("tool", "tokens/s (fastest run)", "seconds of each run", "tokens per CPU-second")
    con.print(_table(title, columns, rows))
    same = "[green]byte-identical[/]" if r.identical else "[bold red]DIFFERENT[/]"
    m = r.machine
    con.print(
        f"ratio longctx / Megatron-LM = {r.ratio:.2f} "
        f"({_meets(r.ratio >= r.target_ratio)} target ≥ {r.target_ratio}; "
        f"per CPU-second {r.cpu_ratio:.2f}) · outputs {same}\n"
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), load avg {m['load_avg_1m']}, "
        f"transformers {m['transformers']}, sentencepiece {m['sentencepiece']}, tokenizers {m['tokenizers']}\n"
        f"Megatron-LM: {r.megatron_lm_checkout}",
        highlight=False,
        soft_wrap=True,
    )
