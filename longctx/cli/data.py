"""`longctx data …`: tokenize JSONL into Megatron datasets, check datasets and blends, fingerprint them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from longctx.cli._common import (
    cli_errors,
    console,
    exit_for,
    parse_int_list,
    parse_size,
    print_findings,
    print_json,
    resolved_plan,
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

# the options of `data check` that apply to an artifact directory
ArtifactRun = Annotated[
    str | None, typer.Option("--run", help="Artifact: the streamed run to check (runs/RUN).")
]
ArtifactLanguages = Annotated[
    str | None, typer.Option("--languages", help="Artifact: only these languages, e.g. en,de.")
]
ArtifactTiers = Annotated[
    str | None, typer.Option("--tiers", help="Artifact: only these tiers, e.g. 16k_plus,4_16k.")
]
IndexOnly = Annotated[
    bool,
    typer.Option(
        "--index-only", help="Artifact: read the .idx files only (+ a token spot check); seconds, not hours."
    ),
]
ArtifactManifest = Annotated[
    Path | None,
    typer.Option(
        "--tokenizer-manifest", help="Artifact: tokenization/*.toml naming the tokenizer (for build_info)."
    ),
]

app = typer.Typer(
    help=(
        "Megatron indexed datasets (.bin/.idx): tokenize, check, fingerprint.\n\n"
        "Examples:\n\n"
        "  longctx data tokenize docs/*.jsonl --tokenizer /models/tokenizer-256k "
        "--output-prefix data/books_text_document --workers 8\n\n"
        "  longctx data check data/books_text_document --tokenizer /models/tokenizer-256k --lengths 16K,64K,128K\n\n"
        '  longctx data check --data-path "0.7 data/books_text_document 0.3 data/code_text_document" '
        "--tokenizer /models/tokenizer-256k --budget stage2=20B\n\n"
        "  longctx data check --data-args-path datamix.txt --tokenizer /models/tokenizer-256k --strict --json\n\n"
        "  longctx data fetch birgermoell/oellm-longctx-tokenized-streamed-all-v2 --into /data/oellm-longctx "
        "--run lc16k_full_20260507 --tiers 16k_plus --languages en,de,fi\n\n"
        "  longctx data check /data/oellm-longctx --tokenizer /models/tokenizer-256k --lengths 16K,64K,128K "
        "--index-only"
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
        inputs,
        tokenizer,
        output_prefix,
        json_key=json_key,
        workers=workers,
        force=force,
        add_bos=add_bos,
        append_eod=append_eod,
        spec=spec,
        megatron_version=version,
    )
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


# `data check`'s own options, as types: the command's signature reads as the list of what it takes.
CheckPrefixes = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dataset prefixes (size-weighted), instead of a blend; or one tokenized artifact directory.",
        show_default=False,
    ),
]
CheckDataPath = Annotated[
    str | None, typer.Option("--data-path", help='Megatron blend: "W1 P1 W2 P2 …" or "P1 P2 …".')
]
CheckDataArgsPath = Annotated[
    Path | None, typer.Option("--data-args-path", help="File holding a blend (Megatron's --data-args-path).")
]
CheckTokenizer = Annotated[
    Path | None, typer.Option("--tokenizer", "-t", help="The model's tokenizer (vocab, EOD, md5).")
]
CheckPlan = Annotated[
    Path | None, typer.Option("--plan", help="Stage plan: takes stage lengths and token budgets from it.")
]
CheckLengths = Annotated[
    str | None, typer.Option("--lengths", help="Stage sequence lengths, e.g. 16K,64K,128K.")
]
CheckBudget = Annotated[
    list[str] | None, typer.Option("--budget", help="STAGE=TOKENS (e.g. stage2=20B); repeat per stage.")
]
CheckVocabSize = Annotated[
    int | None, typer.Option("--vocab-size", min=1, help="Override the vocabulary size.")
]
CheckEodId = Annotated[int | None, typer.Option("--eod-id", min=0, help="Override the EOD id.")]
CheckStrict = Annotated[
    bool, typer.Option("--strict", help="Treat warnings (e.g. a missing sidecar) as errors.")
]
CheckNoScan = Annotated[bool, typer.Option("--no-scan", help="Index checks only; skip the full token scan.")]
CheckWorkers = Annotated[
    int | None, typer.Option("--workers", "-w", min=1, help="Scan threads (default: CPUs, at most 8).")
]


@app.command("check")
@cli_errors
def check_cmd(
    prefixes: CheckPrefixes = None,
    data_path: CheckDataPath = None,
    data_args_path: CheckDataArgsPath = None,
    tokenizer: CheckTokenizer = None,
    plan: CheckPlan = None,
    lengths: CheckLengths = None,
    budget: CheckBudget = None,
    vocab_size: CheckVocabSize = None,
    eod_id: CheckEodId = None,
    strict: CheckStrict = False,
    no_scan: CheckNoScan = False,
    workers: CheckWorkers = None,
    run: ArtifactRun = None,
    languages: ArtifactLanguages = None,
    tiers: ArtifactTiers = None,
    index_only: IndexOnly = False,
    tokenizer_manifest: ArtifactManifest = None,
    tokenizer_type: TokenizerType = None,
    legacy_tokenizer: LegacyTokenizer = False,
    hf_use_fast: HfUseFast = False,
    hf_include_special_tokens: HfIncludeSpecial = False,
    json_out: Json = False,
) -> None:
    """Check datasets for a stage: format, token ids vs vocab, EOD, document lengths, budgets, tokenizer
    md5 and encoding.

    The sidecar's encoding fingerprint must be the tokenizer's under --tokenizer-type (default: the
    tokenizer layout's): the same model file with another HF config or type is refused.

    Given one directory holding a tokenized artifact (mix/, manifests/, runs/), checks its manifests'
    tokenizer against --tokenizer and reports per language × tier: documents, tokens, share of tokens
    in documents ≥ each --lengths; --index-only reads only the .idx files.

    Exit 2 on any error (any warning too with --strict). Nothing on disk is changed.

    Example:
    longctx data check --data-args-path mix.txt -t /models/tokenizer-256k --lengths 64K --budget s64k=20B
    """
    from longctx.cli.data_artifact import names
    from longctx.data.check_request import DataCheckRequest

    request = DataCheckRequest(
        prefixes=tuple(prefixes or ()),
        data_path=data_path,
        data_args_path=data_args_path,
        tokenizer=tokenizer,
        spec=encoding_spec(tokenizer_type, legacy_tokenizer, hf_use_fast, hf_include_special_tokens),
        lengths=parse_int_list(lengths) or [],
        budgets=_parse_budgets(budget),
        vocab_size=vocab_size,
        eod_id=eod_id,
        strict=strict,
        scan=not no_scan,
        workers=workers,
        run=run,
        languages=names(languages),
        tiers=names(tiers),
        index_only=index_only,
        tokenizer_manifest=tokenizer_manifest,
    )
    _print_check(_run_check(request, plan), json_out)


def _print_check(report: Any, json_out: bool) -> None:
    """A data check's report (a tokenized artifact's or the data sets'), then its exit code."""
    from longctx.cli.data_artifact import print_artifact_report
    from longctx.data.artifact.check import ArtifactReport

    if isinstance(report, ArtifactReport):
        if json_out:
            print_json({"ok": report.ok, **vars(report), "prefixes_per_second": report.prefixes_per_second})
        else:
            print_artifact_report(report)
        exit_for(report.findings)
        return
    if json_out:
        print_json({"ok": report.ok, **vars(report)})
    else:
        render_report(report)
    exit_for(report.all_findings())


def _run_check(request: Any, plan: Path | None) -> Any:
    """The data check, with a plan's stage lengths and budgets, and each stage's distance coverage."""
    from longctx.data.artifact.check import ArtifactReport
    from longctx.data.check_request import run_data_check

    if plan is None:
        return run_data_check(request)
    from longctx.plan.coverage_check import datasets_coverage_findings
    from longctx.plan.stage_data import data_needs

    rp = resolved_plan(plan)
    report = run_data_check(request.with_needs(*data_needs(rp)))
    if not isinstance(report, ArtifactReport) and report.prefixes:
        # which distances each stage's windows would train, from these datasets' document lengths
        report.findings.extend(datasets_coverage_findings(rp, [p.prefix for p in report.prefixes]))
    return report


def render_report(report: Any) -> None:
    from longctx.data.check_tables import blend_table, prefix_table, status_line

    for p in report.prefixes:
        console.print(prefix_table(report, p))
        _print_problems(p.findings)
    summary = blend_table(report)
    if summary is not None:
        console.print(summary)
        _print_problems(report.findings, show_info=True)
    else:  # one dataset: its problems, and what each stage's windows would train from it
        _print_problems(
            Findings(f for f in report.findings if f.level != "info" or f.code == "distance-coverage"),
            show_info=True,
        )
    console.print(status_line(len(report.all_findings().errors)), highlight=False)


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
