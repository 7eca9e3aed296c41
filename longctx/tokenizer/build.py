"""Tiny tokenizers for tests and the demo, with the layouts of the real ones.

`train_sentencepiece` reproduces the OpenEuroLLM special layout (`<unk>`=0 `<bos>`=1 `<eos>`=2,
user-defined `<start_of_turn>`=3 `<end_of_turn>`=4, optionally an HF directory with `<pad>` added at
id = vocab size) or Llama's (`<unk>`=0 `<s>`=1 `</s>`=2, a dummy-prefix model, no pad);
`train_gpt2_bpe` writes a GPT-2 style vocab.json + merges.txt with `<|endoftext|>` last. Both train in
about a second on `synthetic_corpus()`.
"""

from __future__ import annotations

import io
import json
import os
import random
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from longctx.errors import TokenizerError
from longctx.tokenizer.load import GPT2_EOD
from longctx.tokenizer.spm_proto import ModelType, PieceType, parse_model
from longctx.util.fs import atomic_write_bytes, atomic_write_json, atomic_write_text

OELLM_USER_DEFINED = ("<start_of_turn>", "<end_of_turn>")
OELLM_PAD = "<pad>"
# (unk, bos, eos) pieces of each layout
LAYOUT_SPECIALS = {"oellm": ("<unk>", "<bos>", "<eos>"), "llama": ("<unk>", "<s>", "</s>")}

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by data model long context token training "
    "der die das und ist nicht mit für über schön Straße Grüße Käse Übermut Köln "
    "le la les et est pas pour avec été élève Noël coûte à où "
    "ja on ei että hyvää päivää äiti söi jäätelöä kissa "
    "zażółć gęślą jaźń łódź żółw "
    "žluťoučký kůň úpěl ďábelské ódy "
    "καλημέρα κόσμε привет мир данные модель "
    "東京 日本 首都 です データ "
    "def return class import x y 3 14159 2025 01 31 12 50 € 🙂 : , . ! ? ( ) # * + -"
)
_WORDS = _WORD_TEXT.split()


def synthetic_corpus(
    lines: int = 2000, *, seed: int = 0, words_per_line: tuple[int, int] = (6, 24)
) -> list[str]:
    """Deterministic multilingual lines (Latin with diacritics, Greek, Cyrillic, CJK, digits, emoji)."""
    rng = random.Random(seed)
    lo, hi = words_per_line
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(lines)]


def _as_lines(texts_or_file: str | os.PathLike[str] | Iterable[str]) -> Iterable[str]:
    if isinstance(texts_or_file, (str, os.PathLike)):
        path = Path(texts_or_file)
        if not path.is_file():
            raise TokenizerError(f"training text not found: {path}", where=str(path))
        return path.read_text(encoding="utf-8").splitlines()
    return texts_or_file


def train_sentencepiece(
    texts_or_file: str | os.PathLike[str] | Iterable[str],
    out_dir: str | os.PathLike[str],
    vocab_size: int = 512,
    *,
    layout: str = "oellm",
    hf: bool = False,
    tokenizer_json: bool = False,
    user_defined: Sequence[str] | None = None,
    byte_fallback: bool = True,
    hf_class: str = "LlamaTokenizer",
    hf_legacy: bool = False,
    add_bos_token: bool = True,
    add_eos_token: bool = False,
) -> Path:
    """Train a small SentencePiece BPE model into `out_dir/tokenizer.model` and return that path.

    `layout="oellm"`: `<unk>`=0 `<bos>`=1 `<eos>`=2, then `user_defined` (default `<start_of_turn>`=3,
    `<end_of_turn>`=4), byte fallback, identity normalisation (exact round trips). `hf=True` also writes
    the HF side files (`tokenizer_config.json`, `special_tokens_map.json`, `added_tokens.json`) with
    `<pad>` added at id `vocab_size`, so `len(tokenizer)` = vocab_size + 1 as in the real tokenizer;
    `tokenizer_json=True` adds a `tokenizer.json` equivalent to the model. `byte_fallback=False` makes
    characters unseen in training decode as `<unk>` (for tests of failing round trips).

    `layout="llama"`: `<unk>`=0 `<s>`=1 `</s>`=2, no user-defined pieces (unless given), a dummy-prefix
    model (a leading "▁" on every text) and, with `hf=True`, no `<pad>`. `hf_class`, `hf_legacy`,
    `add_bos_token` and `add_eos_token` are written to tokenizer_config.json (`tokenizer_class`,
    `legacy`, …): what transformers' AutoTokenizer — and so Megatron's HuggingFaceTokenizer — obeys.
    """
    if layout not in LAYOUT_SPECIALS:
        raise TokenizerError(f"unknown tokenizer layout {layout!r}", fix="use layout='oellm' or 'llama'")
    specials = LAYOUT_SPECIALS[layout]
    if user_defined is None:
        user_defined = OELLM_USER_DEFINED if layout == "oellm" else ()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [line for line in _as_lines(texts_or_file) if line.strip()]
    model = out / "tokenizer.model"
    atomic_write_bytes(
        model,
        _train_bpe(
            lines,
            vocab_size,
            specials,
            user_defined=user_defined,
            byte_fallback=byte_fallback,
            dummy_prefix=layout == "llama",
        ),
    )
    added = {OELLM_PAD: vocab_size} if hf and layout == "oellm" else {}
    if hf:
        write_hf_side_files(
            model,
            out,
            added=added,
            specials=specials,
            tokenizer_class=hf_class,
            legacy=hf_legacy,
            add_bos_token=add_bos_token,
            add_eos_token=add_eos_token,
        )
    if tokenizer_json:
        # with the HF side files, tokenizer.json must add BOS/EOS as tokenizer_config.json says: transformers
        # 5 takes them from tokenizer.json's post-processor when there is one, from the config when it
        # converts tokenizer.model, and the two must give the same ids
        _, bos, eos = specials
        write_tokenizer_json(
            model,
            out / "tokenizer.json",
            added=added,
            bos=bos if hf and add_bos_token else None,
            eos=eos if hf and add_eos_token else None,
        )
    return model


def _train_bpe(
    lines: list[str],
    vocab_size: int,
    specials: tuple[str, str, str],
    *,
    user_defined: Sequence[str],
    byte_fallback: bool,
    dummy_prefix: bool,
) -> bytes:
    """The serialized model SentencePiece trains on `lines`: BPE, (unk, bos, eos) at ids 0-2, no pad,
    identity normalisation, digits split."""
    import sentencepiece as spm  # lazy: a native library that only training needs

    unk, bos, eos = specials
    # writing to a buffer keeps temp paths out of the model's trainer_spec: same input, same md5
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        unk_piece=unk,
        bos_piece=bos,
        eos_piece=eos,
        user_defined_symbols=list(user_defined),
        byte_fallback=byte_fallback,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=dummy_prefix,
        split_digits=True,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return buffer.getvalue()


def write_hf_side_files(
    model: Path,
    out_dir: Path,
    *,
    added: dict[str, int],
    specials: tuple[str, str, str] = LAYOUT_SPECIALS["oellm"],
    tokenizer_class: str = "LlamaTokenizer",
    legacy: bool = False,
    add_bos_token: bool = True,
    add_eos_token: bool = False,
) -> None:
    """HF tokenizer files in the shape of the OpenEuroLLM tokenizer directory (LlamaTokenizer by
    default); `specials` are the (unk, bos, eos) pieces of the model."""
    unk, bos, eos = specials
    proto = parse_model(model.read_bytes())
    decoder: dict[str, dict[str, object]] = {}
    for idx, piece in enumerate(proto.pieces):
        if piece.type in (PieceType.UNKNOWN, PieceType.CONTROL, PieceType.USER_DEFINED):
            decoder[str(idx)] = _added_entry(piece.piece)
    for content, idx in added.items():
        decoder[str(idx)] = _added_entry(content)
    config = {
        "add_bos_token": add_bos_token,
        "add_eos_token": add_eos_token,
        "added_tokens_decoder": decoder,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": OELLM_PAD if OELLM_PAD in added else None,
        "unk_token": unk,
        "clean_up_tokenization_spaces": False,
        "legacy": legacy,
        "model_max_length": 1000000000000000019884624838656,
        "sp_model_kwargs": {},
        "tokenizer_class": tokenizer_class,
    }
    smap: dict[str, object] = {
        "bos_token": _special(bos),
        "eos_token": _special(eos),
        "unk_token": _special(unk),
    }
    if OELLM_PAD in added:
        smap["pad_token"] = _special(OELLM_PAD)
    atomic_write_json(out_dir / "tokenizer_config.json", config)
    atomic_write_json(out_dir / "special_tokens_map.json", smap)
    if added:
        atomic_write_json(out_dir / "added_tokens.json", added)


def _added_entry(content: str) -> dict[str, object]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def _special(content: str) -> dict[str, object]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def write_tokenizer_json(
    model: Path, out_path: Path, *, added: dict[str, int], bos: str | None = None, eos: str | None = None
) -> None:
    """A `tokenizers` JSON equivalent to a SentencePiece BPE model (what `LlamaTokenizerFast` would use).

    Merges are recovered from the vocabulary: every split of a piece into two pieces is a merge, ranked
    by the merged piece's score — the same rule SentencePiece's BPE applies when encoding. `bos` / `eos`
    (pieces of the model) write a post-processor that adds them around every encoded text.
    """
    # lazy: the `tokenizers` native library only for writing tokenizer.json, not for every import
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    proto = parse_model(model.read_bytes())
    if proto.model_type != ModelType.BPE or proto.has_precompiled_charsmap:
        raise TokenizerError(
            "only BPE models with identity normalisation can be converted to tokenizer.json here",
            where=str(model),
        )
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    score = {p.piece: p.score for p in proto.pieces}
    mergeable = {p.piece for p in proto.pieces if p.type == PieceType.NORMAL}
    merges: list[tuple[float, int, str, str]] = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                merges.append((-score[piece], vocab[piece], left, right))
    merges.sort()
    bpe = BPE(
        vocab=vocab,
        merges=[(a, b) for _, _, a, b in merges],
        unk_token=next(p.piece for p in proto.pieces if p.type == PieceType.UNKNOWN),
        fuse_unk=True,
        byte_fallback=True,
    )
    tk = Tokenizer(bpe)
    norm = [normalizers.Replace(" ", "▁")]
    if proto.add_dummy_prefix:
        norm.insert(0, normalizers.Prepend("▁"))
    tk.normalizer = normalizers.Sequence(norm)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if proto.add_dummy_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tk.decoder = decoders.Sequence(dec)
    specials = [
        p.piece
        for p in proto.pieces
        if p.type in (PieceType.UNKNOWN, PieceType.CONTROL, PieceType.USER_DEFINED)
    ]
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for content, idx in sorted(added.items(), key=lambda kv: kv[1]):
        tk.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        if tk.token_to_id(content) != idx:
            raise TokenizerError(f"added token {content!r} did not land at id {idx}", where=str(out_path))
    if bos or eos:
        tk.post_processor = _bos_eos_processor(vocab, bos=bos, eos=eos)
    atomic_write_text(out_path, tk.to_str(pretty=True))


def _bos_eos_processor(vocab: dict[str, int], *, bos: str | None, eos: str | None) -> Any:
    """The TemplateProcessing transformers builds for a Llama tokenizer with add_bos/add_eos_token."""
    from tokenizers import processors  # lazy: as in write_tokenizer_json

    def template(seq: str, type_id: int) -> str:
        return " ".join(
            [*([f"{bos}:{type_id}"] * bool(bos)), f"${seq}:{type_id}", *([f"{eos}:{type_id}"] * bool(eos))]
        )

    return processors.TemplateProcessing(
        single=template("A", 0),
        pair=f"{template('A', 0)} {template('B', 1)}",
        special_tokens=[(p, vocab[p]) for p in (bos, eos) if p],
    )


def train_gpt2_bpe(
    texts_or_file: str | os.PathLike[str] | Iterable[str],
    out_dir: str | os.PathLike[str],
    vocab_size: int = 400,
) -> Path:
    """Train a byte-level BPE and write GPT-2 style `vocab.json` + `merges.txt` into `out_dir`.

    `<|endoftext|>` is the last id (vocab_size - 1), as in GPT-2 (50256 of 50257). Returns `out_dir`.
    """
    from tokenizers import ByteLevelBPETokenizer  # lazy: the native library only when training

    if vocab_size < 258:
        raise TokenizerError("a byte-level BPE needs vocab_size ≥ 258 (256 bytes, one merge, <|endoftext|>)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [line for line in _as_lines(texts_or_file) if line.strip()]
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        lines, vocab_size=vocab_size - 1, min_frequency=2, special_tokens=[], show_progress=False
    )
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        bpe.save_model(tmp)
        vocab = json.loads(Path(tmp, "vocab.json").read_text(encoding="utf-8"))
        merges = Path(tmp, "merges.txt").read_text(encoding="utf-8")
    vocab = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    vocab[GPT2_EOD] = len(vocab)
    atomic_write_text(out / "vocab.json", json.dumps(vocab, ensure_ascii=False))
    atomic_write_text(out / "merges.txt", merges)
    return out
