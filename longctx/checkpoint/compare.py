"""`compare`: do two checkpoints share an architecture; does a tokenizer fit a checkpoint's embedding?

Stage transitions continue one model, so every architecture field must match. The padded vocab may
differ (Megatron pads to a multiple of make_vocab_size_divisible_by × TP and loads embeddings with
`allow_shape_mismatch`), which is a warning. RoPE settings and sequence length are expected to change
between stages and are listed as information.

A tokenizer fits when its vocab (Megatron's view, `len(tokenizer)`) is at most the embedding rows and
the rows equal Megatron's padding of that vocab (`longctx.tokenizer.padded_vocab_size`) at the TP the
checkpoint was saved with; rows that match the rule at another TP only are a warning, rows that match
no TP are an error (likely a different tokenizer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint.inspect import CheckpointReport, inspect_checkpoint
from longctx.errors import CheckpointError
from longctx.report import Findings

ARCH_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "normalization", "swiglu", "qk_layernorm", "untie_embeddings_and_output_weights", "add_bias_linear",
    "add_qkv_bias", "position_embedding_type", "num_experts", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
)  # fmt: skip
STAGE_FIELDS = ("rotary_base", "seq_length", "max_position_embeddings", "rotary_percent", "tokenizer_model")
TP_CANDIDATES = (1, 2, 4, 8, 16, 32)


@dataclass
class VocabCheck:
    vocab_size: int
    padded_rows: int
    make_vocab_size_divisible_by: int
    tensor_model_parallel_size: int
    expected_padded_vocab_size: int
    matching_tp: list[int]
    fits: bool
    padding_matches: bool


@dataclass
class CompareReport:
    a: str
    b: str | None
    mode: str  # "checkpoints" | "tokenizer" | "vocab-size"
    same_architecture: bool | None
    differences: dict[str, list[Any]] = field(default_factory=dict)
    stage_changes: dict[str, list[Any]] = field(default_factory=dict)
    vocab: VocabCheck | None = None
    findings: Findings = field(default_factory=Findings)

    @property
    def ok(self) -> bool:
        return self.findings.ok


def _looks_like_tokenizer(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".model" or path.name in ("vocab.json", "merges.txt", "tokenizer.json")
    return path.is_dir() and any(
        (path / n).is_file() for n in ("tokenizer.model", "vocab.json", "tokenizer.json")
    )


def check_vocab(report: CheckpointReport, vocab_size: int, findings: Findings) -> VocabCheck:
    from longctx.tokenizer import padded_vocab_size  # longctx.tokenizer loads pydantic: not at import

    rows = report.padded_vocab_size
    if rows is None:
        raise CheckpointError(
            "the checkpoint has no embedding or output layer, so its vocab rows are unknown",
            where=report.location,
        )
    args = report.args
    div = int(args.get("make_vocab_size_divisible_by") or 128)
    tp = int(args.get("tensor_model_parallel_size") or report.tensor_model_parallel_size_from_layout or 1)
    expected = padded_vocab_size(vocab_size, div, tp)
    matching = [t for t in TP_CANDIDATES if padded_vocab_size(vocab_size, div, t) == rows]
    fits = vocab_size <= rows
    if not fits:
        findings.error(
            "vocab-too-large",
            f"the tokenizer has {vocab_size} tokens but the embedding has only {rows} rows",
            where=report.location,
            fix="use the tokenizer the checkpoint was trained with",
            expected=f"<= {rows}",
            found=vocab_size,
        )
    elif rows == expected:
        findings.info(
            "vocab-padding",
            f"{vocab_size} tokens pad to {rows} rows (multiple of {div} × TP {tp}), as in the checkpoint",
        )
    elif matching:
        findings.warning(
            "vocab-padding-tp",
            f"{vocab_size} tokens pad to {rows} rows only at TP {', '.join(map(str, matching))}; "
            f"at the saved TP {tp} Megatron pads to {expected}",
            where=report.location,
            fix="fine when resharding (embeddings load with allow_shape_mismatch); check the tokenizer otherwise",
        )
    else:
        findings.error(
            "vocab-padding",
            f"{rows} embedding rows are not Megatron's padding of {vocab_size} tokens (multiple of {div} × TP): "
            f"expected {expected} at TP {tp}",
            where=report.location,
            fix="this is probably not the tokenizer the checkpoint was trained with",
            expected=expected,
            found=rows,
        )
    saved_vocab = args.get("vocab_size")
    if isinstance(saved_vocab, int) and saved_vocab != vocab_size:
        findings.warning(
            "vocab-args",
            f"the saved args say vocab_size {saved_vocab}; the tokenizer has {vocab_size}",
            where=report.location,
        )
    return VocabCheck(
        vocab_size=vocab_size,
        padded_rows=rows,
        make_vocab_size_divisible_by=div,
        tensor_model_parallel_size=tp,
        expected_padded_vocab_size=expected,
        matching_tp=matching,
        fits=fits,
        padding_matches=rows == expected,
    )


def compare_reports(a: CheckpointReport, b: CheckpointReport) -> CompareReport:
    out = CompareReport(a=a.path, b=b.path, mode="checkpoints", same_architecture=None)
    for name in ARCH_FIELDS:
        va, vb = getattr(a.arch, name), getattr(b.arch, name)
        if va != vb:
            out.differences[name] = [va, vb]
            out.findings.error(
                "arch-differs",
                f"{name}: {va!r} vs {vb!r}",
                fix="a stage must continue the same architecture; compare the right checkpoints",
            )
    out.same_architecture = not out.differences
    if a.padded_vocab_size != b.padded_vocab_size:
        out.differences["padded_vocab_size"] = [a.padded_vocab_size, b.padded_vocab_size]
        out.findings.warning(
            "padded-vocab-differs",
            f"padded_vocab_size: {a.padded_vocab_size} vs {b.padded_vocab_size} (TP-dependent padding; "
            "Megatron loads embeddings with allow_shape_mismatch)",
        )
    for name in STAGE_FIELDS:
        va, vb = a.args.get(name), b.args.get(name)
        if va != vb:
            out.stage_changes[name] = [va, vb]
            out.findings.info("stage-change", f"{name}: {va!r} → {vb!r}")
    if a.iteration is not None and b.iteration is not None:
        out.findings.info("iterations", f"iteration {a.iteration} vs {b.iteration}")
    if out.same_architecture:
        out.findings.info("same-arch", "same architecture")
    return out


def compare(
    a: str | os.PathLike[str], b: str | os.PathLike[str] | None = None, *, vocab_size: int | None = None
) -> CompareReport:
    """Compare checkpoint A with checkpoint B, or with a tokenizer B, or with `vocab_size` tokens."""
    ra = inspect_checkpoint(a)
    if b is None and vocab_size is None:
        raise CheckpointError(
            "nothing to compare with", fix="pass a second checkpoint, a tokenizer, or --vocab-size N"
        )
    if b is not None and _looks_like_tokenizer(Path(b)):
        from longctx.tokenizer import load_tokenizer  # loads pydantic: only when a tokenizer is compared

        tok = load_tokenizer(b)
        out = CompareReport(a=str(a), b=str(b), mode="tokenizer", same_architecture=None)
        out.vocab = check_vocab(ra, tok.vocab_size, out.findings)
        return out
    if b is not None:
        out = compare_reports(ra, inspect_checkpoint(b))
        if vocab_size is not None:
            out.vocab = check_vocab(ra, vocab_size, out.findings)
        return out
    assert vocab_size is not None
    out = CompareReport(a=str(a), b=None, mode="vocab-size", same_architecture=None)
    out.vocab = check_vocab(ra, vocab_size, out.findings)
    return out


__all__ = ["ARCH_FIELDS", "CompareReport", "VocabCheck", "check_vocab", "compare", "compare_reports"]
