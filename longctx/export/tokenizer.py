"""The tokenizer files of the exported model: verified, copied, and proven to encode as Megatron did.

1. Identity: the plan's tokenizer must have the manifest's md5 and vocabulary size (and the md5 the
   checkpoint recorded, when it did) before anything is copied; the copy is hashed again.
2. Files: the identity files (`tokenizer.model`, or GPT-2's `vocab.json` + `merges.txt`) and the
   HF side files present next to them. What transformers needs and the source lacks is written:
   `tokenizer.json` for a bare SentencePiece model, `tokenizer_config.json` where there is none.
3. Proof: `AutoTokenizer` loads the written directory and must encode sample texts (the manifest's
   round-trip texts and more) to exactly the ids longctx's tokenizer gives — the ids the data was
   tokenized with. transformers ≥ 5 gives `LlamaTokenizer` a prefix space and its own pipeline even
   when `tokenizer.json` says otherwise; a SentencePiece tokenizer that encodes differently is made to
   load as `PreTrainedTokenizerFast` over its `tokenizer.json` (written from the model when absent),
   which encodes exactly what the file says, and checked again. A tokenizer that still differs is
   refused with the first difference.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from longctx.errors import ExportError, LongctxError
from longctx.tokenizer import DEFAULT_ROUND_TRIP, LoadedTokenizer, TokenizerManifest, tokenizer_md5
from longctx.tokenizer.build import write_tokenizer_json
from longctx.util.fs import atomic_write_json

SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json",
)  # fmt: skip
FAST_CLASS = "PreTrainedTokenizerFast"
_EXTRA_SAMPLES = (
    "The pass key is 12345. Remember it. What is the pass key? The pass key is 12345.",
    "  two  spaces,\ta tab and a\nnew line; digits 0123456789",
    " a leading space",
)


@dataclasses.dataclass
class TokenizerExport:
    md5: str
    copied: list[str]
    written: list[str]
    tokenizer_class: str
    samples_checked: int
    notes: list[str]


def check_identity(
    tok: LoadedTokenizer, manifest: TokenizerManifest, *, saved_md5: str | None, where: str
) -> None:
    """The tokenizer is the manifest's (md5, vocabulary) and the one the checkpoint recorded."""
    if manifest.md5 and tok.md5 != manifest.md5:
        raise ExportError(
            f"the tokenizer's md5 ({tok.md5} of {tok.md5_of}) is not the manifest's ({manifest.md5})",
            where=str(tok.path),
            fix="point the plan's tokenizer.path at the tokenizer the manifest describes",
        )
    if tok.vocab_size != manifest.vocab_size:
        raise ExportError(
            f"the tokenizer has {tok.vocab_size} tokens, the manifest says {manifest.vocab_size}",
            where=str(tok.path),
            fix="point the plan's tokenizer.path at the tokenizer the manifest describes",
        )
    if saved_md5 and saved_md5 != tok.md5:
        raise ExportError(
            f"the checkpoint was trained with another tokenizer (md5 {saved_md5}; the plan's is {tok.md5})",
            where=where,
            fix="export with the plan whose tokenizer trained this checkpoint",
        )


def _source_files(tok: LoadedTokenizer) -> list[Path]:
    if tok.kind == "sentencepiece":
        return [tok.path]
    files = list(tok.identity_files)
    files += [tok.path / n for n in SIDE_FILES if (tok.path / n).is_file()]
    return files


def _token(tok: LoadedTokenizer, idx: int | None) -> str | None:
    return None if idx is None else tok.id_to_token(idx)


def _fast_config(tok: LoadedTokenizer, max_length: int) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "tokenizer_class": FAST_CLASS,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    for key, idx in (
        ("bos_token", tok.bos_id),
        ("eos_token", tok.eos_id),
        ("unk_token", tok.unk_id),
        ("pad_token", tok.pad_id),
    ):
        if (name := _token(tok, idx)) is not None:
            cfg[key] = name
    return cfg


def _gpt2_config(tok: LoadedTokenizer, max_length: int) -> dict[str, Any]:
    eod = _token(tok, tok.eod_id)
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": eod,
        "eos_token": eod,
        "unk_token": eod,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }


def _tokenizer_json(tok: LoadedTokenizer, out: Path, written: list[str]) -> None:
    """Write tokenizer.json from the SentencePiece model (BPE with identity normalisation only)."""
    try:
        write_tokenizer_json(out / "tokenizer.model", out / "tokenizer.json", added=dict(tok.added_tokens))
    except LongctxError as err:
        raise ExportError(
            f"transformers needs a tokenizer.json that encodes like the model, and none can be written "
            f"from this SentencePiece model: {err.what}",
            where=str(tok.path),
            fix="put the tokenizer's tokenizer.json (one that encodes like tokenizer.model) next to it",
        ) from None
    written.append("tokenizer.json")


def samples(manifest: TokenizerManifest) -> list[str]:
    return list(dict.fromkeys([*manifest.round_trip, *DEFAULT_ROUND_TRIP, *_EXTRA_SAMPLES]))


def first_difference(out: Path, tok: LoadedTokenizer, texts: Sequence[str]) -> str | None:
    """How transformers' tokenizer for `out` differs from `tok` (None when it encodes every text alike)."""
    from transformers import AutoTokenizer  # lazy: transformers loads slowly; only export needs it

    try:
        hf = AutoTokenizer.from_pretrained(str(out))
    except Exception as err:  # transformers raises many types for unloadable tokenizers
        return f"transformers cannot load it ({type(err).__name__}: {err})"
    if len(hf) != tok.vocab_size:
        return f"transformers counts {len(hf)} tokens, Megatron {tok.vocab_size}"
    specials = bool(getattr(getattr(tok, "spec", None), "adds_special_tokens", False))
    for text in texts:
        a, b = list(hf.encode(text, add_special_tokens=specials)), tok.encode(text)
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return (
                f"{text!r} encodes to {a[k : k + 6]}… at token {k} in transformers, "
                f"{b[k : k + 6]}… in Megatron's"
            )
    if tok.eod_id is not None and hf.eos_token_id is not None and hf.eos_token_id != tok.eod_id:
        return f"transformers' eos id is {hf.eos_token_id}, the EOD Megatron appends is {tok.eod_id}"
    return None


def _class_of(out: Path) -> str:
    cfg = out / "tokenizer_config.json"
    data = json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else {}
    return str(data.get("tokenizer_class") or "")


def export_tokenizer(
    tok: LoadedTokenizer, manifest: TokenizerManifest, out: Path, *, max_length: int
) -> TokenizerExport:
    """Copy (and complete) the tokenizer files into `out`; raise ExportError unless transformers encodes
    exactly like `tok`."""
    copied: list[str] = []
    written: list[str] = []
    notes: list[str] = []
    for src in _source_files(tok):
        shutil.copyfile(src, out / ("tokenizer.model" if tok.kind == "sentencepiece" else src.name))
        copied.append(src.name)
    md5 = tokenizer_md5(out)
    if md5 != tok.md5:
        raise ExportError(
            f"the copied tokenizer's md5 {md5} differs from its source's {tok.md5}",
            where=str(out),
            fix="the copy was damaged (disk full?); run the export again",
        )
    if not (out / "tokenizer_config.json").is_file():
        if tok.kind == "gpt2-bpe":
            cfg = _gpt2_config(tok, max_length)
        else:  # a SentencePiece model loads in transformers as its tokenizer.json
            if not (out / "tokenizer.json").is_file():
                _tokenizer_json(tok, out, written)
            cfg = _fast_config(tok, max_length)
        atomic_write_json(out / "tokenizer_config.json", cfg)
        written.append("tokenizer_config.json")
    texts = samples(manifest)
    diff = first_difference(out, tok, texts)
    if diff is not None and tok.kind != "gpt2-bpe" and _class_of(out) != FAST_CLASS:
        before = _class_of(out) or "(none)"
        if not (out / "tokenizer.json").is_file():
            _tokenizer_json(tok, out, written)
        cfg_path = out / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg["tokenizer_class"] = FAST_CLASS
        atomic_write_json(cfg_path, cfg)
        if "tokenizer_config.json" not in written:
            written.append("tokenizer_config.json")
        notes.append(
            f"tokenizer_config.json: tokenizer_class {before} → {FAST_CLASS}, because transformers' {before} "
            f"encodes differently from the tokenizer the model was trained with ({diff})"
        )
        diff = first_difference(out, tok, texts)
    if diff is not None:
        raise ExportError(
            f"transformers would tokenize differently from Megatron: {diff}",
            where=str(tok.path),
            fix="give the plan a tokenizer directory whose tokenizer.json and tokenizer_config.json load in "
            "transformers as the model's tokenizer",
        )
    return TokenizerExport(
        md5=md5,
        copied=copied,
        written=written,
        tokenizer_class=_class_of(out),
        samples_checked=len(texts),
        notes=notes,
    )


__all__ = ["TokenizerExport", "check_identity", "export_tokenizer", "first_difference", "samples"]
