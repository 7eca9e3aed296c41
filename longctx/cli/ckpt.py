"""`longctx ckpt …`: inspect, check, adopt, fetch and compare torch_dist checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from longctx.cli._common import cli_errors, console, exit_for, print_findings, print_json
from longctx.cli._params import Json

if TYPE_CHECKING:
    from longctx.checkpoint.family import FamilyReport
    from longctx.checkpoint.infer_arch import InferredArch
    from longctx.checkpoint.inspect import CheckpointReport

# The library is imported inside the commands: `longctx --help` need not load the checkpoint machinery.

app = typer.Typer(
    help=(
        "Megatron torch_dist checkpoints: what they are and whether they are whole, before hours of "
        "cluster time.\n\n"
        "A PATH is a save dir (with latest_checkpointed_iteration.txt), an iter_NNNNNNN or release dir, a "
        "flat snapshot dir (the files of one iteration, as downloaded), or a .tar / .tar.tar archive (read "
        "in place, not extracted).\n\n"
        "Examples:\n\n"
        "  longctx ckpt inspect /ckpt/baby_9b_dense --json\n\n"
        "  longctx ckpt check /ckpt/baby_9b_dense/iter_0076800\n\n"
        "  longctx ckpt check /ckpt/snapshot --deep --write-manifest /ckpt/snapshot.sha256\n\n"
        "  longctx ckpt adopt /downloads/baby_9b_dense --into /ckpt/base\n\n"
        "  longctx ckpt fetch org/ermine --include 'arm_1b_model_only.tar' --into /ckpt/ermine-arm\n\n"
        "  longctx ckpt compare /ckpt/base /ckpt/stage1\n\n"
        "  longctx ckpt compare /ckpt/base /models/tokenizer"
    ),
    no_args_is_help=True,
)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _kv(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for k, v in rows:
        table.add_row(k, "-" if v is None else str(v))
    return table


@app.command("inspect")
@cli_errors
def inspect_cmd(
    path: Path = typer.Argument(
        ..., help="Save dir, iter_NNNNNNN/release dir, flat snapshot dir, or .tar archive."
    ),
    head_dim: int | None = typer.Option(
        None, "--head-dim", min=1, help="Head dim (kv_channels) when neither QK-norm nor saved args give it."
    ),
    all_args: bool = typer.Option(False, "--all-args", help="Also list every saved Megatron argument."),
    json_out: Json = False,
) -> None:
    """What the checkpoint is, from its metadata alone (no tensor is read).

    Backend and megatron-core era (common.pt up to 0.18, common_state from 0.19), iteration, model only or
    with optimizer (and which distributed-optimizer layout), tensor count and bytes, the architecture
    inferred from tensor shapes (layers, hidden, FFN, heads/groups/kv_channels, padded vocab, tied or
    untied, QK-norm, MoE), and the saved args that matter for context extension. Exit 2 if incomplete.

    Example: longctx ckpt inspect /ckpt/baby_9b_dense/iter_0076800 --json
    """
    from longctx.checkpoint import inspect_checkpoint

    report = inspect_checkpoint(path, head_dim=head_dim)
    if json_out:
        print_json(report.to_json())
        exit_for(report.findings)
        return
    console.print(_summary(report))
    console.print(_arch_table(report.arch))
    console.print(_family_table(report.family))
    if report.saved_args:
        console.print(_kv("saved args (for extension)", list(report.saved_args.items())))
    if all_args and report.args:
        console.print(_kv("all saved args", sorted(report.args.items())))
    print_findings(report.findings)
    exit_for(report.findings)


def _summary(report: CheckpointReport) -> Table:
    """What and where the save is: kind, iteration, completeness, backend, optimizer and sizes."""
    opt = report.optimizer
    backend = report.backend
    return _kv(
        "checkpoint",
        [
            ("location", report.location),
            ("kind", report.kind),
            (
                "iteration",
                f"{report.iteration} ({report.iteration_source})" if report.iteration is not None else None,
            ),
            (
                "tracker",
                report.tracker and ("release" if report.tracker["release"] else report.tracker["iteration"]),
            ),
            ("complete", "yes" if report.complete else f"NO: {report.incomplete_reason}"),
            ("backend", backend and f"{backend.sharded_backend} v{backend.sharded_backend_version}"),
            ("megatron-core era", f"{report.megatron_core_era} ({report.common_state_format})"),
            ("contents", report.contents),
            (
                "optimizer layout",
                opt
                and f"{opt.layout} ({opt.layout_source}); dp groups {opt.dp_groups}; {', '.join(opt.state_names)}",
            ),
            ("optimizer bytes", opt and _gib(opt.bytes)),
            (
                "RNG state / scheduler",
                f"{'yes' if report.has_rng_state else 'no'} / {'yes' if report.has_opt_param_scheduler else 'no'}",
            ),
            (
                "tensors",
                f"{report.tensor_count} ({report.model_tensor_count} model), {_gib(report.tensor_bytes)}",
            ),
            ("model bytes", f"{_gib(report.model_tensor_bytes)} {report.dtypes}"),
            ("shard files", f"{report.shard_files}, {_gib(report.files_bytes)} on disk"),
            ("TP at save (layout)", report.tensor_model_parallel_size_from_layout),
        ],
    )


def _arch_table(arch: InferredArch) -> Table:
    """The architecture inferred from tensor shapes, in Megatron's argument names, with where each came from."""
    table = Table(title="architecture (Megatron argument names)", title_justify="left")
    table.add_column("argument", style="bold")
    table.add_column("value")
    table.add_column("from", style="dim")
    for name in (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
        "normalization",
        "swiglu",
        "qk_layernorm",
        "untie_embeddings_and_output_weights",
        "add_bias_linear",
        "add_qkv_bias",
        "position_embedding_type",
        "padded_vocab_size",
        "num_experts",
        "moe_ffn_hidden_size",
        "moe_shared_expert_intermediate_size",
        "moe_router_topk",
        "norm_epsilon",
        "rotary_percent",
    ):
        value = getattr(arch, name)
        if value is None and name.startswith("moe_") and not arch.num_experts:
            continue
        table.add_row(name, "-" if value is None else str(value), arch.sources.get(name, ""))
    return table


def _family_table(f: FamilyReport) -> Table:
    """The model family with its evidence and what the weights leave undecided."""
    vocab = f"input {f.input_vocab_rows}, output {'tied' if f.tied else f.output_vocab_rows}"
    rows: list[tuple[str, Any]] = [
        ("family", f.label),
        ("layers stored under", f.block and f"{f.block}."),
        ("attention", f.attention),
        ("objective", f.objective or "unknown (the plan must say)"),
        ("mask id", f"{f.mask_id} ({f.mask_id_source})" if f.mask_id is not None else "-"),
        ("vocabulary rows", f"{vocab}; {'padded' if f.vocab_padded else 'unpadded'}"),
    ]
    if f.moe:
        rows.append(("experts", f.expert_layout))
    rows += [("evidence", item) for item in f.evidence]
    rows += [("unknown", item) for item in f.unknown]
    return _kv("model family", rows)


@app.command("check")
@cli_errors
def verify_cmd(
    path: Path = typer.Argument(..., help="Save dir, iter/release dir, flat snapshot dir, or .tar archive."),
    deep: bool = typer.Option(False, "--deep", help="Read every byte (in parallel) and compute sha256."),
    manifest: Path | None = typer.Option(
        None, "--manifest", help="With --deep: compare with this sha256sum-style manifest."
    ),
    write_manifest: Path | None = typer.Option(
        None,
        "--write-manifest",
        help="With --deep: write the digests here (sha256sum format; never implied).",
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Parallel readers for --deep (default ≤ 8)."
    ),
    json_out: Json = False,
) -> None:
    """Check the checkpoint is whole; exit 0 only if it is, else 2. Nothing in it is written.

    Without --deep (seconds, no shard is read): the tracker names an existing, finished iteration (else the
    newest complete one is named); metadata.json says torch_dist; .metadata unpickles; every shard it
    references exists and is at least as long as the largest offset+length stored in it; the common state
    unpickles through the allow-list; archives hold no member extraction would refuse.

    With --deep every byte is read. Digests are compared with --manifest FILE, else with a SHA256SUMS file
    shipped inside the checkpoint directory; --write-manifest FILE records them (check later with
    `cd CKPT && sha256sum -c FILE`).

    Example: longctx ckpt check /ckpt/base --deep --write-manifest /ckpt/base.sha256
    """
    from longctx.checkpoint import verify_checkpoint

    report = verify_checkpoint(
        path, deep=deep, manifest=manifest, write_manifest=write_manifest, workers=workers
    )
    if json_out:
        print_json(report.to_json())
        exit_for(report.findings)
        return
    rows: list[tuple[str, Any]] = [
        ("location", report.location),
        ("kind", report.kind),
        ("iteration", report.iteration),
        ("complete iterations", ", ".join(map(str, report.complete_iterations)) or None),
        ("shard files", f"{report.shard_files}, {_gib(report.shard_bytes)}"),
    ]
    if report.deep is not None:
        d = report.deep
        rate = d.bytes / d.seconds / 2**20 if d.seconds > 0 else 0.0
        rows += [
            ("read (sha256)", f"{d.files} files, {_gib(d.bytes)} in {d.seconds:.1f} s ({rate:.0f} MiB/s)"),
            ("manifest checked", d.manifest_checked),
            ("manifest written", d.manifest_written),
        ]
    rows.append(("result", "[green]whole[/]" if report.ok else "[bold red]NOT whole[/]"))
    console.print(_kv("verify", rows))
    print_findings(report.findings)
    exit_for(report.findings)


@app.command("adopt")
@cli_errors
def adopt_cmd(
    src: Path = typer.Argument(
        ..., help="Flat snapshot dir, iter/release dir, save dir, or .tar/.tar.tar archive."
    ),
    into: Path = typer.Option(..., "--into", help="Save dir to create or fill: INTO/iter_NNNNNNN + tracker."),
    iteration: int | None = typer.Option(
        None, "--iteration", min=1, help="Iteration when neither the common state nor the dir name has it."
    ),
    move: bool = typer.Option(False, "--move", help="Move the files instead of hard-linking them."),
    allow_copy: bool = typer.Option(
        False, "--allow-copy", help="Copy when a hard link or move is impossible (another filesystem)."
    ),
    no_tracker: bool = typer.Option(
        False, "--no-tracker", help="Do not write latest_checkpointed_iteration.txt."
    ),
    json_out: Json = False,
) -> None:
    """Arrange a flat snapshot or an archive into Megatron's layout (INTO/iter_NNNNNNN + tracker).

    Directories are hard-linked (or moved with --move): no data is copied unless --allow-copy. Archives are
    extracted after every member is checked: absolute paths, '..', links leaving INTO and devices make the
    whole archive refused. The source is verified first, the result after. Nothing existing is overwritten.

    Example: longctx ckpt adopt /downloads/baby_9b_dense --into /ckpt/base
    """
    from longctx.checkpoint import adopt

    r = adopt(
        src,
        into,
        iteration=iteration,
        mode="move" if move else "link",
        allow_copy=allow_copy,
        write_tracker=not no_tracker,
    )
    if json_out:
        print_json(_adopt_json(r))
        return
    console.print(
        _kv(
            "adopted",
            [
                ("checkpoint", r.checkpoint_dir),
                (
                    "iteration",
                    f"{'release' if r.iteration is None else r.iteration} (from {r.iteration_source})",
                ),
                ("files", f"{r.files}, {_gib(r.bytes)} by {r.method}"),
                ("tracker", "written" if r.tracker_written else "not written (--no-tracker)"),
                ("verify", "whole" if r.verify is None or r.verify.ok else "NOT whole"),
            ],
        )
    )
    if r.verify is not None:
        print_findings(r.verify.findings)
        exit_for(r.verify.findings)


def _adopt_json(r: Any) -> dict[str, Any]:
    from longctx.report import to_jsonable

    return {
        "source": r.source,
        "save_dir": str(r.save_dir),
        "checkpoint_dir": str(r.checkpoint_dir),
        "iteration": r.iteration,
        "iteration_source": r.iteration_source,
        "method": r.method,
        "files": r.files,
        "bytes": r.bytes,
        "tracker_written": r.tracker_written,
        "verify": r.verify.to_json() if r.verify is not None else None,
        "ok": r.verify.ok if r.verify is not None else True,
        "findings": to_jsonable(r.verify.findings) if r.verify is not None else [],
    }


@app.command("fetch")
@cli_errors
def download_cmd(
    repo_id: str = typer.Argument(..., help="Hub repository, e.g. org/name."),
    into: Path = typer.Option(
        ..., "--into", help="Save dir for the adopted checkpoint (INTO/iter_N + tracker)."
    ),
    revision: str | None = typer.Option(None, "--revision", help="Branch, tag or commit (default main)."),
    include: list[str] | None = typer.Option(
        None, "--include", help="Allow-pattern (repeatable), e.g. 'tokenizer/*' or one archive's name."
    ),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Hub cache (default HF_HOME's); same filesystem as INTO avoids copies."
    ),
    offline: bool = typer.Option(
        False, "--offline", help="Use the local cache only (also: HF_HUB_OFFLINE=1)."
    ),
    iteration: int | None = typer.Option(
        None, "--iteration", min=1, help="Iteration if the checkpoint does not say."
    ),
    allow_copy: bool = typer.Option(
        False, "--allow-copy", help="Copy from the cache when hard links are impossible."
    ),
    json_out: Json = False,
) -> None:
    """Download from the Hugging Face Hub (resumable, only --include patterns), then verify + adopt.

    A downloaded .tar is extracted into INTO/iter_N; a checkpoint directory is hard-linked there from the
    cache. Other matching files (e.g. a tokenizer) are linked into INTO under their repository paths.
    Re-running resumes an interrupted download. Offline (HF_HUB_OFFLINE=1 or --offline) the populated cache
    is used.

    Example: longctx ckpt fetch org/ermine --include 'arm_1b_model_only.tar' --into /ckpt/ermine-arm
    """
    from longctx.checkpoint import download

    r = download(
        repo_id,
        into,
        revision=revision,
        include=include or None,
        cache_dir=cache_dir,
        offline=offline,
        iteration=iteration,
        allow_copy=allow_copy,
    )
    if json_out:
        print_json(
            {
                "repo_id": r.repo_id,
                "revision": r.revision,
                "snapshot_dir": str(r.snapshot_dir),
                "files": r.files,
                "checkpoint_source": r.checkpoint_source,
                "adopted": _adopt_json(r.adopted) if r.adopted else None,
                "extra_files": r.extra_files,
            }
        )
        if r.adopted is not None and r.adopted.verify is not None:
            exit_for(r.adopted.verify.findings)
        return
    rows: list[tuple[str, Any]] = [
        ("snapshot", r.snapshot_dir),
        ("files", len(r.files)),
        ("checkpoint", r.checkpoint_source if r.checkpoint_source is not None else "none among the files"),
    ]
    if r.adopted is not None:
        rows += [
            ("adopted as", r.adopted.checkpoint_dir),
            ("iteration", r.adopted.iteration),
            ("verify", "whole" if r.adopted.verify is None or r.adopted.verify.ok else "NOT whole"),
        ]
    if r.extra_files:
        rows.append(("other files linked", ", ".join(r.extra_files[:10])))
    console.print(_kv("download", rows))
    if r.adopted is not None and r.adopted.verify is not None:
        print_findings(r.adopted.verify.findings)
        exit_for(r.adopted.verify.findings)


@app.command("compare")
@cli_errors
def compare_cmd(
    a: Path = typer.Argument(..., help="A checkpoint."),
    b: Path | None = typer.Argument(
        None, help="Another checkpoint, or a tokenizer (tokenizer.model / HF dir)."
    ),
    vocab_size: int | None = typer.Option(
        None, "--vocab-size", min=1, help="Check this vocab against A's rows."
    ),
    json_out: Json = False,
) -> None:
    """Same architecture? Or: does a tokenizer's vocab fit A's embedding rows with Megatron's padding?

    Two checkpoints: every architecture field must match (exit 2 otherwise); a different padded vocab is a
    warning (TP-dependent padding); RoPE/length changes are listed. Checkpoint + tokenizer (or --vocab-size):
    vocab ≤ padded rows, and rows = vocab rounded up to make_vocab_size_divisible_by × TP at save.

    Example: longctx ckpt compare /ckpt/base /models/tokenizer-256k
    """
    from longctx.checkpoint import compare

    r = compare(a, b, vocab_size=vocab_size)
    if json_out:
        from longctx.report import to_jsonable

        print_json({**to_jsonable(r), "ok": r.ok})
        exit_for(r.findings)
        return
    if r.differences:
        table = Table(title="differences", title_justify="left")
        table.add_column("argument", style="bold")
        table.add_column(str(a))
        table.add_column(str(b))
        for k, (va, vb) in r.differences.items():
            table.add_row(k, str(va), str(vb))
        console.print(table)
    if r.vocab is not None:
        v = r.vocab
        console.print(
            _kv(
                "vocab",
                [
                    ("tokenizer vocab", v.vocab_size),
                    ("embedding rows", v.padded_rows),
                    (
                        "Megatron padding",
                        f"{v.expected_padded_vocab_size} "
                        f"(÷{v.make_vocab_size_divisible_by} × TP {v.tensor_model_parallel_size})",
                    ),
                    ("rows match at TP", ", ".join(map(str, v.matching_tp)) or "none"),
                ],
            )
        )
    print_findings(r.findings)
    if r.ok:
        console.print("[green]compatible[/]")
    exit_for(r.findings)
