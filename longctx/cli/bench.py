"""`longctx bench …`: benchmarks that print figures against a baseline measured in the same run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from longctx.bench.tables import (
    print_ckpt,
    print_data_check,
    print_greedy,
    print_index_check,
    print_memory,
    print_rope_bench,
    print_throughput,
    print_tokenize,
    print_trainer,
)
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
        "  longctx bench tokenize --workers 2                       # data tokenize vs preprocess_data.py\n\n"
        "  longctx bench greedy CKPT --tokenizer TOK --length 16K   # needle answers with the prefix cache"
    ),
    no_args_is_help=True,
)


# `bench attention`'s options, as types: the command's signature then reads as the list of what it takes.
AttnSeqLens = Annotated[
    str, typer.Option("--seq-lens", help="Comma-separated sequence lengths (16K = 16384).")
]
AttnCp = Annotated[
    int, typer.Option("--cp", min=2, help="Context-parallel size (processes on this machine).")
]
AttnHeads = Annotated[int, typer.Option("--heads", min=1, help="Query heads.")]
AttnKvHeads = Annotated[int | None, typer.Option("--kv-heads", min=1, help="KV heads (default: --heads).")]
AttnHeadDim = Annotated[int, typer.Option("--head-dim", min=1, help="Head dimension.")]
AttnBatch = Annotated[int, typer.Option("--batch", min=1, help="Batch size.")]
AttnThreads = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="Torch threads per process, CP ranks and the full run alike (default: cores/CP).",
    ),
]
AttnRepeats = Annotated[
    int, typer.Option("--repeats", min=1, help="Timed fwd+bwd iterations (median is reported).")
]
AttnWarmup = Annotated[int, typer.Option("--warmup", min=0, help="Untimed iterations first.")]
AttnDtype = Annotated[str, typer.Option("--dtype", help="float32 or bfloat16.")]
AttnVariant = Annotated[str, typer.Option("--variant", help="ring or allgather.")]
AttnCausal = Annotated[
    bool, typer.Option("--causal/--non-causal", help="Causal (default) or bidirectional attention.")
]
AttnPiece = Annotated[
    int | None,
    typer.Option(
        "--piece", min=1, help="Ring keys per K/V message (default: the rule, or $LONGCTX_RING_PIECE)."
    ),
]
AttnDocuments = Annotated[
    str | None,
    typer.Option(
        "--documents",
        help="Packed documents instead: FRACTION<LENGTH of the window's tokens in short documents, e.g. '10%<4K', "
        "long-tail (the 16K stage's tier mix of stages/baby_9b_dense.toml), or from:PATH[*N] (the document "
        "lengths of the indexed data set PATH, or of every .idx under the directory PATH, read from the "
        "index only; *N scales them).",
    ),
]
AttnTimeMaxLen = Annotated[
    int,
    typer.Option(
        "--time-max-len", min=1, help="With --documents: time fwd+bwd (1 process) up to this length."
    ),
]
AttnProcesses = Annotated[
    bool,
    typer.Option(
        "--processes",
        help="With --documents: also time ring attention fwd+bwd of both splits in CP real processes (gloo), "
        "up to --time-max-len.",
    ),
]


@app.command("attention")
@cli_errors
def attention_cmd(
    seq_lens: AttnSeqLens = "8K,16K",
    cp: AttnCp = 2,
    heads: AttnHeads = 8,
    kv_heads: AttnKvHeads = None,
    head_dim: AttnHeadDim = 64,
    batch: AttnBatch = 1,
    threads: AttnThreads = None,
    repeats: AttnRepeats = 3,
    warmup: AttnWarmup = 1,
    dtype: AttnDtype = "float32",
    variant: AttnVariant = "ring",
    causal: AttnCausal = True,
    piece: AttnPiece = None,
    documents: AttnDocuments = None,
    time_max_len: AttnTimeMaxLen = 16384,
    processes: AttnProcesses = False,
    json_out: Json = False,
) -> None:
    """Ring attention fwd+bwd per rank at CP = n (n processes, gloo) vs one process on the full sequence.

    With --documents: causal attention within documents on windows packed at that mix, on the zigzag and
    the document-balanced split at CP = n: per split the slowest rank / mean and busiest / idlest FLOPs
    (from the blocks each rank executes), FLOPs against dense, and the slowest rank's fwd+bwd compute
    timed rank by rank against dense zigzag, up to --time-max-len.
    Example: longctx bench attention --documents '10%<4K' --seq-lens 16K,128K --cp 8

    Prints parallel efficiency t_full / (CP · t_cp) with t_cp the slowest rank's median (the full run and
    the CP ranks are timed side by side, taking turns), per-rank peak memory vs the full run (peak RSS
    increase in a fresh process per measurement), and the per-rank block-FLOP balance max/min of the zigzag
    split vs a contiguous split, counted from the blocks each rank computes. Targets (not asserted):
    efficiency ≥ 0.92, memory ratio ≤ 0.55, zigzag balance ≤ 1.02.

    Example: longctx bench attention --seq-lens 8K,16K --threads 1 --repeats 3
    """
    from longctx.bench.attention import AttentionBenchSpec, run_attention_bench, validate_spec
    from longctx.bench.render_attention import print_attention
    from longctx.util.progress import progress_bar

    lens = positive_sizes(seq_lens, "--seq-lens") or []
    threads = threads or max(1, (os.cpu_count() or 1) // cp)
    if documents is not None:
        _documents_bench(
            documents,
            lens,
            cp,
            heads,
            kv_heads or heads,
            head_dim,
            repeats,
            time_max_len,
            json_out,
            processes=processes,
            threads=threads,
            warmup=warmup,
        )
        return
    spec = AttentionBenchSpec(
        seq_lens=tuple(lens),
        cp=cp,
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        threads=threads,
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
        print_json(report.to_json())
    else:
        print_attention(spec, report, console)


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
    processes: bool,
    threads: int,
    warmup: int,
) -> None:
    from longctx.bench.attention import document_bench_steps
    from longctx.bench.documents_run import DocumentsOptions, run_documents
    from longctx.bench.render_attention import print_documents
    from longctx.util.progress import progress_bar

    steps = document_bench_steps(tuple(lens), repeats, time_max_len)
    with progress_bar("document attention bench", total=steps, unit="steps") as advance:
        run = run_documents(
            DocumentsOptions(
                mix,
                tuple(lens),
                cp=cp,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                repeats=repeats,
                time_max_len=time_max_len,
                processes=processes,
                threads=threads,
                warmup=warmup,
            ),
            advance,
        )
    if json_out:
        print_json(run.to_json())
    else:
        print_documents(run, console)


@app.command("kernel-cost")
@cli_errors
def kernel_cost_cmd(
    threads: int = typer.Option(1, "--threads", min=1, help="Torch threads (a CP rank's, in the trainer)."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed calls per shape (median is reported)."),
    json_out: Json = False,
) -> None:
    """Fit the CP split cost model to this machine's attention kernel (about 15 s).

    Times the block kernel's forward and backward on the block shapes the ring calls, fits the model's
    coefficients (call + pair · pairs + q_row · queries + k_row · keys) and prints them next to the
    shipped ones (`longctx.attention.split_cost.CPU_FLASH_COST`), with the error per call of each.

    Example: longctx bench kernel-cost --json
    """
    from longctx.bench.kernel_cost import calibrate
    from longctx.bench.render_attention import print_kernel_cost

    cal = calibrate(threads=threads, repeats=repeats)
    if json_out:
        print_json(cal.to_json())
    else:
        print_kernel_cost(cal, console)


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
            size_gib,
            tmp_dir=tmp_dir,
            keep=keep,
            workers=workers,
            block_bytes=block_kib * 1024,
            repeats=repeats,
            advance=advance,
        )
    if json_out:
        print_json(r)
    else:
        print_data_check(r, console, repeats=repeats, keep=keep)


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
    those calls (audit hook): no .distcp may be opened. Nothing is asserted on time: the checked Python
    unpickler reads the index about ten times slower than the C one (2.5 s in all on 2 CPU cores).

    Example: longctx bench ckpt --repeats 5
    """
    from longctx.bench.ckpt import run_ckpt_bench

    r = run_ckpt_bench(n_files=files, repeats=repeats, keep=keep, dp=dp)
    if json_out:
        print_json(r.to_json())
    else:
        print_ckpt(r, console)


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
            prefixes,
            lengths=positive_sizes(lengths, "--lengths") or [],
            docs_per_prefix=docs,
            tmp_dir=tmp_dir,
            keep=keep,
            workers=workers,
            repeats=repeats,
            big_gib=big_gib,
            advance=advance,
        )
    if json_out:
        print_json(r)
    else:
        print_index_check(r, console, lengths=lengths, keep=keep)


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
    """Time `rope suggest` and the exact Men search, and compare the search with the plain definition
    (one cosine per position and frequency) on the same grid, measured in the same run.

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
    else:
        print_rope_bench(result, console)


@app.command("greedy")
@cli_errors
def greedy_cmd(
    checkpoint: Path = typer.Argument(
        ..., help="A causal checkpoint (its iteration dir or checkpoints dir)."
    ),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="The checkpoint's tokenizer (dir or .model)."),
    length: str = typer.Option("16K", "--length", help="Item length in tokens."),
    task: str = typer.Option("multikey-2", "--task", help="A generated needle task (not single)."),
    per_depth: int = typer.Option(2, "--items", min=1, help="Items per depth (five depths)."),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="Items per forward."),
    repeats: int = typer.Option(1, "--repeats", min=1, help="Timed runs of each mode (medians)."),
    json_out: Json = False,
) -> None:
    """Greedy answers of needle items with the prefix cache (the answer positions rerun alone after the
    first forward) vs whole sequences rerun until they settle, in one process; the answers must agree.

    Example: longctx bench greedy RUN/stages/4k/checkpoints --tokenizer RUN/tokenizer --length 16K
    """
    from longctx.eval.greedy_bench import run_greedy_bench

    r = run_greedy_bench(
        checkpoint,
        tokenizer,
        length=positive_size(length, "--length") or 16384,
        task=task,
        per_depth=per_depth,
        batch_size=batch_size,
        repeats=repeats,
    )
    if json_out:
        print_json(r.to_json())
    else:
        print_greedy(r, console)


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
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        seq_length=positive_size(seq_length, "--seq-length") or 256,
        micro_batch_size=micro_batch,
        global_batch_size=global_batch,
        iterations=iterations,
        warmup=warmup,
        processes=processes,
        threads=threads,
        local_bf16=local_bf16,
    )
    settings.validate()
    checkout = megatron_lm_checkout(megatron_lm)
    with progress_bar(
        "trainer bench (inputs, local, Megatron-LM)", progress_total(settings), unit="steps"
    ) as advance:
        r = run_trainer_bench(settings, megatron_lm=checkout, work_dir=work_dir, advance=advance)
    if json_out:
        print_json(r.to_json())
    else:
        print_trainer(r, console, warmup=settings.warmup, local_bf16=settings.local_bf16)


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
    from longctx.bench.memory_check import GRID, QUICK, run_memory_bench
    from longctx.errors import PlanError
    from longctx.util.progress import progress_bar

    grids = {"full": GRID, "quick": QUICK}
    if grid not in grids:
        raise PlanError(f"unknown grid {grid!r}", where="--grid", fix="pass --grid full or --grid quick")
    cases = grids[grid]
    with progress_bar("memory bench", total=len(cases), unit="configurations") as advance:
        report = run_memory_bench(cases, iterations=iterations, threads=threads, advance=advance)
    if json_out:
        print_json(report.to_json())
    else:
        print_memory(report, console)


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
        print_json(report.to_json())
    else:
        print_throughput(report, console, bf16=bf16)


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
    """`data tokenize` vs Megatron-LM's tools/preprocess_data.py: same JSONL, tokenizer, options and
    workers; tokens/s each.

    Module imports are outside both clocks; tokenizer loading, worker start-up, encoding and writing are
    inside; the fastest of --repeats runs of each is reported, and tokens per CPU-second of all
    processes. Also reports whether the two .bin/.idx are byte-identical. Target (not asserted): ratio ≥ 1.0.

    Example: longctx bench tokenize --workers 2 --documents 400 --json
    """
    from longctx.bench.tokenize import run_tokenize_bench
    from longctx.tokenizer import spec_from_options

    spec = spec_from_options(tokenizer_type, legacy=legacy_tokenizer)
    with console.status("tokenizing with longctx and with Megatron-LM's preprocess_data.py"):
        r = run_tokenize_bench(
            tokenizer=tokenizer,
            input_path=input_path,
            spec=spec,
            documents=documents,
            workers=workers,
            repeats=repeats,
            json_key=json_key,
            megatron_lm=megatron_lm,
            work_dir=work_dir,
        )
    if json_out:
        print_json(r.to_json())
    else:
        print_tokenize(r, console)
