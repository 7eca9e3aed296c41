"""`longctx tokenizer …`: fingerprint a tokenizer, check it against a manifest, Megatron vocab padding."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from longctx.cli._common import cli_errors, console, exit_for, print_findings, print_json
from longctx.cli._params import Json
from longctx.errors import TokenizerError

# The library is imported inside the commands: `longctx --help` need not load the tokenizer machinery.

# How Megatron-LM encodes, spelled as its own flags (tools/preprocess_data.py, pretrain_gpt.py).
TokenizerType = Annotated[
    str | None,
    typer.Option(
        "--tokenizer-type",
        help="Megatron's --tokenizer-type to encode as: HuggingFaceTokenizer, GPTSentencePieceTokenizer or "
        "GPT2BPETokenizer (default: the manifest's, else the layout's).",
    ),
]
LegacyTokenizer = Annotated[
    bool,
    typer.Option("--legacy-tokenizer", help="Megatron's --legacy-tokenizer (HF: adds the config's BOS/EOS)."),
]
HfUseFast = Annotated[
    bool, typer.Option("--tokenizer-hf-use-fast", help="Megatron's --tokenizer-hf-use-fast.")
]
HfIncludeSpecial = Annotated[
    bool,
    typer.Option(
        "--tokenizer-hf-include-special-tokens", help="Megatron's --tokenizer-hf-include-special-tokens."
    ),
]


def encoding_spec(
    tokenizer_type: str | None, legacy: bool, hf_use_fast: bool, hf_special: bool, version: str | None = None
) -> Any:
    """The EncodingSpec of the Megatron tokenizer options (None: the default applies); with a Megatron-LM
    `version`, the switches turn options on over that release's defaults."""
    from longctx.tokenizer import spec_from_options

    return spec_from_options(
        tokenizer_type,
        legacy=legacy,
        hf_use_fast=hf_use_fast,
        hf_include_special_tokens=hf_special,
        version=version,
    )


app = typer.Typer(
    help=(
        "Tokenizer identity: the model must be extended with exactly the tokenizer it was trained with.\n\n"
        "A PATH is a tokenizer.model, an HF tokenizer directory (tokenizer.model + tokenizer_config.json, "
        "special_tokens_map.json, added_tokens.json), or a GPT-2 directory (vocab.json + merges.txt).\n\n"
        "Examples:\n\n"
        "  longctx tokenizer check /models/tokenizer-256k --manifest tokenization/oellm-256k.toml --tp 4\n\n"
        "  longctx tokenizer check tok/tokenizer.model --md5 07295117baaf7a55d5924428e59925d6\n\n"
        "  longctx tokenizer fingerprint /models/tokenizer-256k --write tokenization/mine.toml\n\n"
        "  longctx tokenizer padded-vocab 262145 --tp 4"
    ),
    no_args_is_help=True,
)


@app.command("fingerprint")
@cli_errors
def fingerprint_cmd(
    path: Path = typer.Argument(
        ..., help="tokenizer.model, HF tokenizer directory, or GPT-2 vocab.json+merges.txt directory."
    ),
    write: Path | None = typer.Option(None, "--write", help="Save the manifest (TOML) to this file."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --write file."),
    name: str | None = typer.Option(None, "--name", help="Manifest name (default: the directory name)."),
    tokenizer_type: TokenizerType = None,
    legacy_tokenizer: LegacyTokenizer = False,
    hf_use_fast: HfUseFast = False,
    hf_include_special_tokens: HfIncludeSpecial = False,
    json_out: Json = False,
) -> None:
    """Describe a tokenizer as a manifest (TOML; with --json, as JSON): md5, vocab size, special ids, EOD,
    added tokens, round-trip texts, encoding fingerprint.

    The [encoding] table records how Megatron's tokenizer of --tokenizer-type encodes fixed probe texts
    (ids, EOD, BOS, vocabulary size, library version): what tells apart two directories with the same
    tokenizer.model but different HF configs.

    Example: longctx tokenizer fingerprint /models/tokenizer-256k --write tokenization/mine.toml
    """
    from longctx.tokenizer import check_manifest_target, fingerprint, manifest_to_toml, write_manifest

    spec = encoding_spec(tokenizer_type, legacy_tokenizer, hf_use_fast, hf_include_special_tokens)
    if write is not None:
        check_manifest_target(write, path, force=force)
    manifest = fingerprint(path, name=name, spec=spec)
    if write is not None:
        write_manifest(manifest, write)
    if json_out:
        print_json(manifest)
    else:
        typer.echo(manifest_to_toml(manifest), nl=False)
        if write is not None:
            console.print(f"[green]wrote[/] {escape(str(write))}", highlight=False)


@app.command("check")
@cli_errors
def verify_cmd(
    path: Path = typer.Argument(..., help="tokenizer.model, HF tokenizer directory, or GPT-2 directory."),
    manifest: Path | None = typer.Option(
        None, "--manifest", "-m", help="Manifest TOML (e.g. tokenization/oellm-256k.toml)."
    ),
    md5: str | None = typer.Option(
        None, "--md5", help="Expected md5 of the identity file(s); overrides the manifest's."
    ),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel size, for the padded vocab size."),
    divisible_by: int | None = typer.Option(
        None,
        "--make-vocab-size-divisible-by",
        min=1,
        help="Megatron's padding multiple (default: manifest's, else 128).",
    ),
    tokenizer_type: TokenizerType = None,
    legacy_tokenizer: LegacyTokenizer = False,
    hf_use_fast: HfUseFast = False,
    hf_include_special_tokens: HfIncludeSpecial = False,
    json_out: Json = False,
) -> None:
    """Check a tokenizer against a manifest or an md5; exit 0 only if everything matches, else 2.

    Checks the md5, vocab size (len(tokenizer)), every special id, added tokens, EOD, the encoding
    fingerprint (the ids Megatron's tokenizer gives for fixed probe texts: HF config, prefix space,
    BOS/EOS) and a round trip of the manifest's sample texts; reports Megatron's padded vocab size for
    --tp.

    Example: longctx tokenizer check /models/tokenizer-256k -m tokenization/oellm-256k.toml --tp 4
    """
    from longctx.tokenizer import load_manifest, verify_tokenizer

    if manifest is None and md5 is None:
        raise TokenizerError(
            "nothing to verify against", fix="pass --manifest tokenization/NAME.toml or --md5 HEX (or both)"
        )
    m = load_manifest(manifest) if manifest is not None else None
    spec = encoding_spec(tokenizer_type, legacy_tokenizer, hf_use_fast, hf_include_special_tokens)
    report = verify_tokenizer(path, m, md5=md5, tp=tp, divisible_by=divisible_by, spec=spec)
    if json_out:
        print_json({"ok": report.ok, **{k: v for k, v in vars(report).items()}})
    else:
        facts = Table(title=escape(f"tokenizer {report.path}"), show_header=False)
        facts.add_column("fact")
        facts.add_column("value", overflow="fold")
        for key in (
            "kind",
            "md5",
            "vocab_size",
            "model_vocab_size",
            "eod_id",
            "bos_id",
            "pad_id",
            "megatron_tokenizer_type",
            "padded_vocab_size",
        ):
            facts.add_row(key, str(report.facts[key]))
        facts.add_row(
            "padded by TP",
            ", ".join(f"TP{k}: {v}" for k, v in report.facts["padded_vocab_size_by_tp"].items()),
        )
        enc = report.facts.get("encoding")
        if enc:
            facts.add_row(
                "encoding", f"{enc['library']} {enc['library_version']}, digest {enc['digest'][:16]}"
            )
        console.print(facts)
        print_findings(report.findings, title="checks")
        status = "[green]OK[/]" if report.ok else f"[bold red]{len(report.findings.errors)} mismatch(es)[/]"
        console.print(f"verify against {escape(report.manifest or 'md5')}: {status}", highlight=False)
    exit_for(report.findings)


@app.command("padded-vocab")
@cli_errors
def padded_vocab_cmd(
    vocab_size: int = typer.Argument(..., help="Tokenizer vocab size (len(tokenizer))."),
    tp: list[int] = typer.Option([1, 2, 4, 8], "--tp", help="Tensor-parallel size(s); repeat the option."),
    divisible_by: int = typer.Option(128, "--make-vocab-size-divisible-by", min=1),
    json_out: Json = False,
) -> None:
    """Megatron's padded vocab: round up to a multiple of divisible_by × TP.

    Example: longctx tokenizer padded-vocab 262145 --tp 1 --tp 4 --tp 8   (262272, 262656, 263168)
    """
    from longctx.tokenizer import padded_vocab_size

    sizes = {t: padded_vocab_size(vocab_size, divisible_by, t) for t in tp}
    if json_out:
        print_json({"vocab_size": vocab_size, "make_vocab_size_divisible_by": divisible_by, "padded": sizes})
        return
    for t, size in sizes.items():
        typer.echo(f"TP {t}: {vocab_size} -> {size} (+{size - vocab_size})")
