"""`longctx export …`: a plan's checkpoint as a Hugging Face transformers model directory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from longctx.cli._common import cli_errors, console, print_json, stdout_to_stderr
from longctx.cli._params import PLAN_HELP, Json, RunDir
from longctx.errors import ExportError

# The library is imported inside the command: it loads torch, and transformers to check what it wrote.

app = typer.Typer(
    help=(
        "Export a torch_dist checkpoint of a plan's stage (or its base) as a Hugging Face transformers "
        "model: config.json, model.safetensors (sharded above --max-shard-size) and the tokenizer files, "
        "for lm-evaluation-harness, vLLM or the Hub.\n\n"
        "Examples:\n\n"
        "  longctx export hf RUN/stages/128k/checkpoints --plan stages/baby_9b_dense.toml --out hf/baby-128k\n\n"
        "  longctx export hf /ckpt/base --plan stages/baby_9b_dense.toml --stage base --out hf/baby-base --json"
    ),
    no_args_is_help=True,
)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
MAX_SHARD_BYTES = 10**15  # beyond any file system's file
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_bytes(text: str) -> int:
    """'5GB' (decimal, as transformers spells shard sizes), '2GiB', '500MB', '1000000' → bytes."""
    m = _SIZE.match(text)
    value = float(m.group(1)) * _UNITS[(m.group(2) or "B").upper()] if m else 0.0
    if not value < MAX_SHARD_BYTES:  # inf and NaN too: float() of 400 nines is inf
        raise ExportError(
            f"--max-shard-size {text[:40]!r} is beyond any shard ({MAX_SHARD_BYTES // 10**12} TB at most)",
            where="--max-shard-size",
            fix="give a size such as 5GB, 2GiB or 500MB",
        )
    if value < 1:
        raise ExportError(
            f"--max-shard-size {text!r} is not a size of at least one byte",
            where="--max-shard-size",
            fix="give a size such as 5GB, 2GiB or 500MB",
        )
    return int(value)


def _rope_type(rope: dict[str, Any]) -> str:
    """'default', or 'yarn, factor 4 from 32,768 positions'."""
    kind = str(rope.get("rope_type", "default"))
    if kind != "yarn":
        return kind
    return f"yarn, factor {rope['factor']:g} from {rope['original_max_position_embeddings']:,} positions"


@app.command("hf")
@cli_errors
def hf(
    checkpoint: Path = typer.Argument(..., help="save dir (with its tracker) or iter_NNNNNNN / release dir"),
    plan: Path = typer.Option(..., "--plan", help=f"{PLAN_HELP}: tokenizer, manifest, stages' RoPE bases"),
    out: Path = typer.Option(..., "--out", help="output directory (new or empty)"),
    stage: str | None = typer.Option(
        None,
        "--stage",
        help="the stage the checkpoint belongs to, or `base` (default: from its args or path)",
    ),
    dtype: str = typer.Option(
        "auto", "--dtype", help="auto (the checkpoint's), bfloat16, float16 or float32"
    ),
    max_shard_size: str = typer.Option("5GB", "--max-shard-size", help="largest safetensors file, e.g. 5GB"),
    run_dir: RunDir = None,
    json_out: Json = False,
) -> None:
    """Write CHECKPOINT as a transformers model (Qwen3ForCausalLM with QK-norm, else LlamaForCausalLM).

    RoPE base and max_position_embeddings are the stage's; padded vocabulary rows are cut to the
    tokenizer's size; the tokenizer is md5-checked against the plan's manifest before it is copied,
    and transformers must encode like it. Tensors are read one layer at a time. Refused (exit 2,
    nothing written): an architecture without a transformers class (MoE, LayerNorm, biases, diffusion
    LMs …), a rotary base other than the stage's, a vocabulary smaller than the tokenizer's, an output
    directory that is not empty.

    Example: longctx export hf runs/tiny/stages/4k/checkpoints --plan stages/tiny.toml --out hf/tiny-4k
    """
    shard_bytes = parse_bytes(max_shard_size)
    from longctx.export import export_hf

    with stdout_to_stderr(json_out):
        report = export_hf(
            checkpoint, plan, out=out, stage=stage, dtype=dtype, max_shard_bytes=shard_bytes, run_dir=run_dir
        )
    if json_out:
        print_json(report.to_json())
        return
    table = Table(title=f"exported {escape(report.architecture)}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("out", report.out),
        ("checkpoint", f"{report.checkpoint} (iteration {report.iteration})"),
        ("stage", f"{report.stage} ({report.stage_source})"),
        ("rope_theta / max positions", f"{report.rotary_base:,} / {report.max_position_embeddings:,}"),
        ("rope_type", _rope_type(report.rope_parameters)),
        ("vocabulary", f"{report.vocab_size:,} (checkpoint rows {report.padded_vocab_size:,})"),
        (
            "weights",
            f"{report.parameters:,} parameters, {report.dtype}, {report.weight_bytes / 2**20:,.1f} MiB "
            f"in {report.shards} file(s)",
        ),
        (
            "tokenizer",
            f"{report.tokenizer.tokenizer_class}, md5 {report.tokenizer.md5}; "
            f"{report.tokenizer.samples_checked} texts encode as in Megatron",
        ),
        ("largest read", f"{report.largest_read_bytes / 2**20:,.1f} MiB"),
        ("time", f"{report.seconds:.1f} s"),
    ]
    for k, v in rows:
        table.add_row(k, escape(str(v)))
    console.print(table)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
