"""`longctx data …`: tokenize JSONL into Megatron datasets, check datasets and blends, fingerprint them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from longctx.cli._common import (
    cli_errors,
    console,
    exit_for,
    parse_int_list,
    parse_size,
    print_findings,
    print_json,
)
from longctx.cli._params import Json, force
from longctx.cli.tokenizer import (
    HfIncludeSpecial,
    HfUseFast,
    LegacyTokenizer,
    TokenizerType,
    encoding_spec,
)
from longctx.errors import DatasetError, LongctxError
from longctx.report import Findings

# The library is imported inside the commands: `longctx --help` need not load the data machinery.

Overwrite = force("Overwrite an existing prefix.")
ReplaceSidecar = force("Replace an existing sidecar.")

app = typer.Typer(
    help=(
        "Megatron indexed datasets (.bin/.idx): tokenize, check, fingerprint.\n\n"
        "Examples:\n\n"
        "  longctx data tokenize docs/*.jsonl --tokenizer /models/tokenizer-256k --output-prefix data/books_text_document "
        "--workers 8\n\n"
        "  longctx data check data/books_text_document --tokenizer /models/tokenizer-256k --lengths 16K,64K,128K\n\n"
        '  longctx data check --data-path "0.7 data/books_text_document 0.3 data/code_text_document" '
        "--tokenizer /models/tokenizer-256k --budget stage2=20B\n\n"
        "  longctx data check --data-args-path datamix.txt --tokenizer /models/tokenizer-256k --strict --json\n\n"
        "  longctx data fetch birgermoell/oellm-longctx-tokenized-streamed-all-v2 --into /data/oellm-longctx "
        "--run lc16k_full_20260507 --tiers 16k_plus --languages en,de,fi\n\n"
        "  longctx data check /data/oellm-longctx --tokenizer /models/tokenizer-256k --lengths 16K,64K,128K --index-only"
    ),
    no_args_is_help=True,
)


@app.command("tokenize")
@cli_errors
def tokenize_cmd(
    inputs: list[Path] = typer.Argument(..., help="JSONL files (one document per line; .gz allowed)."),
    tokenizer: Path = typer.Option(
        ..., "--tokenizer", "-t", help="tokenizer.model, HF tokenizer dir, or GPT-2 dir."
    ),
    output_prefix: str = typer.Option(
        ..., "--output-prefix", "-o", help="Writes PREFIX.bin, PREFIX.idx, PREFIX.longctx.json."
    ),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="Tokenizer processes."),
    json_key: str = typer.Option(
        "text", "--json-key", help="JSON field holding the text (Megatron's --json-keys)."
    ),
    append_eod: bool = typer.Option(
        True, "--append-eod/--no-append-eod", help="EOD after every document (Megatron's --append-eod)."
    ),
    add_bos: bool = typer.Option(
        False,
        "--add-bos",
        help="Prepend BOS to every document (no Megatron equivalent; see --legacy-tokenizer).",
    ),
    tokenizer_type: TokenizerType = None,
    legacy_tokenizer: LegacyTokenizer = False,
    hf_use_fast: HfUseFast = False,
    hf_include_special_tokens: HfIncludeSpecial = False,
    megatron_version: str | None = typer.Option(
        None,
        "--megatron-version",
        help="Encode as this Megatron-LM release does by default (e.g. 0.16.1, 0.19.0: HuggingFaceTokenizer "
        "is slow without special tokens up to 0.16, fast with them from 0.17), the switches above turning "
        "options on; recorded in the sidecar with the preprocess_data.py flags in its terms.",
    ),
    force: Overwrite = False,
    json_out: Json = False,
) -> None:
    """Tokenize JSONL into a Megatron dataset: the same .bin/.idx as Megatron-LM's tools/preprocess_data.py.

    Encodes through the backend of Megatron's --tokenizer-type (HuggingFaceTokenizer: transformers'
    AutoTokenizer; GPTSentencePieceTokenizer: SentencePiece; GPT2BPETokenizer: GPT-2 BPE), default the
    one of the tokenizer's layout, with the same options (with --megatron-version, over that release's
    defaults). The token dtype follows Megatron's vocabulary size (uint16 below 65500, else int32). The
    sidecar records the encoding fingerprint, the release and the preprocess_data.py flags that give the
    same files. Output appears atomically; an existing prefix is refused unless --force.

    Example: longctx data tokenize a.jsonl b.jsonl.gz -t /models/tokenizer-256k -o data/mix_text_document -w 8
    --megatron-version 0.19.0
    """
    from longctx.data import tokenize_jsonl

    version = _release(megatron_version)
    spec = encoding_spec(tokenizer_type, legacy_tokenizer, hf_use_fast, hf_include_special_tokens, version)
    sidecar = tokenize_jsonl(
        inputs, tokenizer, output_prefix, json_key=json_key, workers=workers, force=force, add_bos=add_bos,
        append_eod=append_eod, spec=spec, megatron_version=version,
    )  # fmt: skip
    if json_out:
        print_json(sidecar)
        return
    enc = sidecar.tokenizer.encoding
    console.print(
        f"[green]wrote[/] {escape(output_prefix)}.bin/.idx: {sidecar.documents:,} documents, {sidecar.tokens:,} tokens "
        f"({sidecar.dtype}), tokenizer md5 {sidecar.tokenizer.md5}"
        + (f", encoded as {escape(enc.describe())}" if enc is not None else "")
        + (f" for Megatron-LM {version}" if version else ""),
        highlight=False,
    )


def _release(version: str | None) -> str | None:
    """A --megatron-version the release table knows, as its full label (0.19 → 0.19.0)."""
    if version is None:
        return None
    from longctx.megatron_versions import facts

    try:
        return facts(version).label
    except LongctxError as err:
        raise DatasetError(
            err.what, where="--megatron-version", fix="give a megatron-core release such as 0.16.1 or 0.19.0"
        ) from None


def _parse_budgets(values: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for raw in values or []:
        name, sep, amount = raw.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(
                f"expected STAGE=TOKENS (e.g. stage2=20B), got {raw!r}", param_hint="--budget"
            )
        out[name.strip()] = parse_size(amount)
    return out


def _needs_from_plan(path: Path) -> tuple[list[int], dict[str, int]]:
    """Stage lengths and token budgets of a plan (the plan module is optional at this layer)."""
    try:
        from longctx.plan.load import load_plan
    except ImportError:
        raise DatasetError(
            "--plan needs the plan module (longctx.plan.load_plan), which this installation lacks",
            where=str(path),
            fix="pass the stage lengths and budgets directly: --lengths 16K,64K --budget stage2=20B",
        ) from None
    plan = load_plan(path)
    if hasattr(plan, "data_needs"):
        lengths, budgets = plan.data_needs()
        return list(lengths), dict(budgets)
    lengths, budgets = [], {}
    for stage in getattr(plan, "stages", []):
        length = getattr(stage, "seq_length", None)
        tokens = getattr(stage, "tokens", None) or getattr(stage, "train_tokens", None)
        if length is None or tokens is None:
            raise DatasetError(
                "cannot read stage lengths and token budgets from this plan",
                where=str(path),
                fix="pass --lengths and --budget instead",
            )
        lengths.append(int(length))
        budgets[str(getattr(stage, "name", f"stage{len(budgets) + 1}"))] = int(tokens)
    return lengths, budgets


@app.command("check")
@cli_errors
def check_cmd(
    prefixes: list[str] = typer.Argument(
        None,
        help="Dataset prefixes (size-weighted), instead of a blend; or one tokenized artifact directory.",
    ),
    data_path: str | None = typer.Option(
        None, "--data-path", help='Megatron blend: "W1 P1 W2 P2 …" or "P1 P2 …".'
    ),
    data_args_path: Path | None = typer.Option(
        None, "--data-args-path", help="File holding a blend (Megatron's --data-args-path)."
    ),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", "-t", help="The model's tokenizer (vocab, EOD, md5)."
    ),
    plan: Path | None = typer.Option(
        None, "--plan", help="Stage plan: takes stage lengths and token budgets from it."
    ),
    lengths: str | None = typer.Option(None, "--lengths", help="Stage sequence lengths, e.g. 16K,64K,128K."),
    budget: list[str] = typer.Option(
        None, "--budget", help="STAGE=TOKENS (e.g. stage2=20B); repeat per stage."
    ),
    vocab_size: int | None = typer.Option(None, "--vocab-size", min=1, help="Override the vocabulary size."),
    eod_id: int | None = typer.Option(None, "--eod-id", min=0, help="Override the EOD id."),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings (e.g. a missing sidecar) as errors."),
    no_scan: bool = typer.Option(False, "--no-scan", help="Index checks only; skip the full token scan."),
    workers: int | None = typer.Option(
        None, "--workers", "-w", min=1, help="Scan threads (default: CPUs, at most 8)."
    ),
    run: str | None = typer.Option(None, "--run", help="Artifact: the streamed run to check (runs/RUN)."),
    languages: str | None = typer.Option(
        None, "--languages", help="Artifact: only these languages, e.g. en,de."
    ),
    tiers: str | None = typer.Option(
        None, "--tiers", help="Artifact: only these tiers, e.g. 16k_plus,4_16k."
    ),
    index_only: bool = typer.Option(
        False,
        "--index-only",
        help="Artifact: read the .idx files only (+ a token spot check); seconds, not hours.",
    ),
    tokenizer_manifest: Path | None = typer.Option(
        None,
        "--tokenizer-manifest",
        help="Artifact: tokenization/*.toml naming the tokenizer (for build_info).",
    ),
    tokenizer_type: TokenizerType = None,
    legacy_tokenizer: LegacyTokenizer = False,
    hf_use_fast: HfUseFast = False,
    hf_include_special_tokens: HfIncludeSpecial = False,
    json_out: Json = False,
) -> None:
    """Check datasets for a stage: format, token ids vs vocab, EOD, document lengths, budgets, tokenizer md5 and encoding.

    The sidecar's encoding fingerprint must be the tokenizer's under --tokenizer-type (default: the
    tokenizer layout's): the same model file with another HF config or type is refused.

    Given one directory holding a tokenized artifact (mix/, manifests/, runs/), checks its manifests'
    tokenizer against --tokenizer and reports per language × tier: documents, tokens, share of tokens
    in documents ≥ each --lengths; --index-only reads only the .idx files.

    Exit 2 on any error (any warning too with --strict). Nothing on disk is changed.

    Example: longctx data check --data-args-path mix.txt -t /models/tokenizer-256k --lengths 64K --budget s64k=20B
    """
    from longctx.cli.data_artifact import check_artifact_cmd, names
    from longctx.data import check_datasets, read_data_args
    from longctx.data.artifact.layout import looks_like_artifact

    if (
        prefixes
        and len(prefixes) == 1
        and data_path is None
        and data_args_path is None
        and looks_like_artifact(prefixes[0])
    ):
        stage_lengths = parse_int_list(lengths) or []
        if plan is not None:
            stage_lengths = sorted(set(stage_lengths) | set(_needs_from_plan(plan)[0]))
        check_artifact_cmd(
            prefixes[0], run=run, languages=names(languages), tiers=names(tiers), tokenizer=tokenizer,
            manifest=tokenizer_manifest, vocab_size=vocab_size, eod_id=eod_id, lengths=stage_lengths,
            index_only=index_only, workers=workers, strict=strict, json_out=json_out,
        )  # fmt: skip
        return
    if index_only or run or languages or tiers:
        raise DatasetError(
            "--index-only, --run, --languages and --tiers apply to an artifact directory",
            fix="pass one artifact directory (with mix/, manifests/ or runs/), or use --no-scan for prefixes",
        )
    sources = sum(x is not None and x != [] for x in (prefixes or None, data_path, data_args_path))
    if sources != 1:
        raise DatasetError(
            "give the datasets one way",
            fix="pass PREFIX arguments, or --data-path 'W P …', or --data-args-path FILE (exactly one)",
        )
    datasets: Any
    if data_args_path is not None:
        datasets = read_data_args(data_args_path, check_exists=False)
    elif data_path is not None:
        datasets = data_path
    else:
        datasets = list(prefixes)
    stage_lengths = parse_int_list(lengths) or []
    budgets = _parse_budgets(budget)
    if plan is not None:
        plan_lengths, plan_budgets = _needs_from_plan(plan)
        stage_lengths = sorted(set(stage_lengths) | set(plan_lengths))
        budgets = {**plan_budgets, **budgets}
    spec = encoding_spec(tokenizer_type, legacy_tokenizer, hf_use_fast, hf_include_special_tokens)
    if spec is not None and tokenizer is None:
        raise DatasetError(
            "--tokenizer-type needs --tokenizer", fix="pass --tokenizer PATH (the model's tokenizer)"
        )
    tok: Any = tokenizer
    if spec is not None:
        from longctx.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer, spec=spec)  # type: ignore[arg-type]
    report = check_datasets(
        datasets,
        tokenizer=tok,
        vocab_size=vocab_size,
        eod_id=eod_id,
        lengths=stage_lengths,
        budgets=budgets,
        strict=strict,
        workers=workers,
        scan=not no_scan,
    )
    if json_out:
        print_json({"ok": report.ok, **vars(report)})
    else:
        render_report(report)
    exit_for(report.all_findings())


def render_report(report: Any) -> None:
    from longctx.data.stats import label

    for p in report.prefixes:
        table = Table(title=escape(p.prefix), show_header=False, title_justify="left")
        table.add_column("fact", style="bold")
        table.add_column("value", overflow="fold")
        if p.weight is not None or p.share is not None:
            w = f"{p.weight:g}" if p.weight is not None else "by size"
            table.add_row("weight", f"{w} (share {p.share:.3f})" if p.share is not None else w)
        if p.index:
            ix = p.index
            table.add_row(
                "format", f"{ix['dtype']}, {ix['documents']:,} documents, {ix['sequences']:,} sequences"
            )
            table.add_row("tokens", f"{ix['tokens']:,} ({_size(ix['bin_bytes'])} .bin)")
        if p.scan is not None:
            s = p.scan
            vocab = f" (vocab {report.vocab_size})" if report.vocab_size is not None else ""
            table.add_row("max token id", f"{s.max_id}{vocab}")
            if report.eod_id is not None and p.index:
                ended = p.index["documents"] - s.documents_without_eod
                table.add_row(
                    "EOD",
                    f"{s.eod_count:,} EOD tokens; {ended:,}/{p.index['documents']:,} documents end with it",
                )
            rate = s.bytes_scanned / s.seconds / 1e9 if s.seconds else 0.0
            table.add_row(
                "scan", f"{_size(s.bytes_scanned)} in {s.seconds:.2f} s ({rate:.2f} GB/s over all datasets)"
            )
        if p.lengths is not None and p.lengths.documents:
            ls = p.lengths
            pct = ", ".join(f"p{k} {v:,}" for k, v in (ls.percentiles or {}).items())
            table.add_row(
                "doc length",
                f"min {ls.min_length:,}, {pct + ', ' if pct else ''}max {ls.max_length:,}, mean {ls.mean_length:,.0f}",
            )
            bins = [
                f"{'<' + label(b.hi) if b.lo == 0 else label(b.lo) + ('–' + label(b.hi) if b.hi else '+')}: "
                f"{b.tokens / ls.tokens:.0%}"
                for b in ls.histogram
                if b.documents
            ]
            table.add_row("tokens by doc length", ", ".join(bins))
            for cov in ls.coverage:
                table.add_row(
                    f"≥ {label(cov.length)}",
                    f"{cov.token_share:.1%} of tokens in {cov.documents_at_least:,} docs; "
                    f"{cov.single_document_samples:,} single-doc / {cov.packed_samples:,} packed samples",
                )
        for stage, epochs in p.epochs.items():
            style = "yellow" if epochs > 1 else ""
            table.add_row(f"epochs {stage}", f"[{style}]{epochs:.2f}[/]" if style else f"{epochs:.2f}")
        if p.sidecar:
            enc = p.sidecar["tokenizer"].get("encoding")
            how = f", encoded as {enc['tokenizer_type']}" if enc else ""
            table.add_row(
                "sidecar",
                f"tokenizer md5 {p.sidecar['tokenizer']['md5']}{escape(how)} ({p.sidecar['origin']})",
            )
        console.print(table)
        _print_problems(p.findings)
    if len(report.prefixes) > 1 or report.findings:
        summary = Table(title="blend", title_justify="left")
        for col in (
            "prefix",
            "weight",
            "share",
            "tokens",
            *[f"epochs {s}" for s in report.budgets],
            "status",
        ):
            summary.add_column(col)
        for p in report.prefixes:
            n_err = len(p.findings.errors)
            summary.add_row(
                escape(p.prefix),
                f"{p.weight:g}" if p.weight is not None else "size",
                f"{p.share:.3f}" if p.share is not None else "-",
                f"{p.index['tokens']:,}" if p.index else "-",
                *[f"{p.epochs[s]:.2f}" if s in p.epochs else "-" for s in report.budgets],
                "[green]ok[/]" if n_err == 0 else f"[red]{n_err} error(s)[/]",
            )
        console.print(summary)
        _print_problems(report.findings, show_info=True)
    errors = len(report.all_findings().errors)
    console.print(
        f"data check: {'[green]OK[/]' if errors == 0 else f'[bold red]{errors} error(s)[/]'}", highlight=False
    )


def _size(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _print_problems(findings: Findings, *, show_info: bool = False) -> None:
    shown = Findings(f for f in findings if show_info or f.level != "info")
    if shown:
        print_findings(shown)


@app.command("fingerprint")
@cli_errors
def fingerprint_cmd(
    prefix: str = typer.Argument(
        ..., help="Dataset prefix made elsewhere (e.g. by Megatron's preprocess_data.py)."
    ),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="The tokenizer the dataset was made with."),
    tokenizer_type: TokenizerType = None,
    legacy_tokenizer: LegacyTokenizer = False,
    hf_use_fast: HfUseFast = False,
    hf_include_special_tokens: HfIncludeSpecial = False,
    force: ReplaceSidecar = False,
    json_out: Json = False,
) -> None:
    """Write PREFIX.longctx.json for a dataset made elsewhere, after a full check with the tokenizer passes.

    Pass the Megatron tokenizer options the data was made with (--tokenizer-type, --legacy-tokenizer, …):
    the sidecar records their encoding fingerprint.

    Example: longctx data fingerprint data/books_text_document -t /models/tokenizer-256k
    """
    from longctx.data import fingerprint_dataset

    spec = encoding_spec(tokenizer_type, legacy_tokenizer, hf_use_fast, hf_include_special_tokens)
    sidecar = fingerprint_dataset(prefix, tokenizer, force=force, spec=spec)
    if json_out:
        print_json(sidecar)
    else:
        console.print(
            f"[green]wrote[/] {escape(prefix)}.longctx.json (tokenizer md5 {sidecar.tokenizer.md5})",
            highlight=False,
        )


def _register_artifact_commands() -> None:
    from longctx.cli.data_artifact import fetch_cmd

    app.command("fetch")(fetch_cmd)


_register_artifact_commands()
