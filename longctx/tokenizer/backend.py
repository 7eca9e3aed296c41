"""The encoders behind Megatron-LM's tokenizer types, reproducing what `tools/preprocess_data.py` writes.

- `GPTSentencePieceTokenizer`: the SentencePiece model's own `encode` (legacy and current paths alike;
  without `--tokenizer-special-tokens` neither splits special tokens out of the text). EOD = `eos_id`,
  vocabulary = the model's pieces. `SentencePieceTokenizer` and `Llama2Tokenizer` on the current path
  are the same library call.
- `HuggingFaceTokenizer`: `transformers.AutoTokenizer` on the directory. Current path: loaded with
  `use_fast=--tokenizer-hf-use-fast`, Megatron's special-token completion applied (a missing SEP
  becomes EOS, a missing CLS becomes BOS and the reverse, no additional tokens), ids from
  `convert_tokens_to_ids(tokenize(text))` — or `tokenizer(text).input_ids` with
  `--tokenizer-hf-include-special-tokens`. Legacy path: AutoTokenizer's defaults and
  `tokenizer(text).input_ids` (the config's BOS/EOS included). EOD = the EOS token's id, vocabulary =
  `len(tokenizer)`.
- `GPT2BPETokenizer`: byte-level BPE on vocab.json + merges.txt with GPT-2's pre-tokenization, the
  merges read as Megatron's GPT-2 tokenizer reads them (every line but the first and the last). EOD =
  `<|endoftext|>`, vocabulary = `len(vocab.json)`.

For a tokenizers-backed HF tokenizer whose token↔id maps are one bijection, the ids come from the Rust
encoder directly: `tokenize` is that encoder's tokens and `convert_tokens_to_ids` maps them back
through the same vocabulary, so the ids are the same; the probe texts are checked both ways at load
and any disagreement falls back to Megatron's exact calls.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from longctx.errors import TokenizerError
from longctx.tokenizer.encoding import (
    GPT2_TYPE,
    HF_TYPE,
    PROBE_TEXTS,
    SP_TYPES,
    EncodingFingerprint,
    EncodingSpec,
    behaviour_digest,
)

GPT2_EOD = "<|endoftext|>"


class Backend(Protocol):
    """Encodes as Megatron-LM's tokenizer of `spec` does; the facts `preprocess_data.py` uses."""

    spec: EncodingSpec
    library: str
    library_version: str
    tokenizer_class: str | None
    vocab_size: int  # Megatron's tokenizer.vocab_size: it picks the token dtype
    eod_id: int | None
    bos_id: int | None

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_with_special_tokens(self, texts: Sequence[str]) -> list[list[int]] | None: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- GPTSentencePieceTokenizer -------------------------------------------------------------------------
class SentencePieceBackend:
    library = "sentencepiece"
    tokenizer_class = None

    def __init__(self, model_path: Path, spec: EncodingSpec) -> None:
        import sentencepiece as spm  # lazy: a native library only SentencePiece tokenizers need

        self.spec = spec
        self.library_version = _version("sentencepiece")
        self._sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.vocab_size = int(self._sp.get_piece_size())
        self.eod_id = _opt(self._sp.eos_id())
        self.bos_id = _opt(self._sp.bos_id())

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # one thread: a worker process is one core, as Megatron's are
        return [list(ids) for ids in self._sp.encode(list(texts), num_threads=1)]

    def encode_with_special_tokens(self, texts: Sequence[str]) -> list[list[int]] | None:
        return None

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._sp.decode([int(i) for i in ids]))


def _opt(value: int) -> int | None:
    return None if value < 0 else int(value)


# -- HuggingFaceTokenizer ------------------------------------------------------------------------------
class HuggingFaceBackend:
    library = "transformers"

    def __init__(self, directory: Path, spec: EncodingSpec) -> None:
        try:  # lazy: transformers is large and only HF tokenizer directories need it
            from transformers import AutoTokenizer
        except ImportError:
            raise TokenizerError(
                "Megatron's HuggingFaceTokenizer encodes with transformers, which is not installed",
                where=str(directory),
                fix="pip install 'longctx[megatron-lm]' (or transformers), the library Megatron-LM uses",
            ) from None
        self.spec = spec
        self.library_version = _version("transformers")
        try:
            if spec.legacy:
                tok = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
            else:
                tok = AutoTokenizer.from_pretrained(
                    str(directory), use_fast=spec.hf_use_fast, trust_remote_code=False
                )
                _complete_special_tokens(tok)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            raise TokenizerError(
                f"transformers.AutoTokenizer cannot load this directory ({err})",
                where=str(directory),
                fix="Megatron's HuggingFaceTokenizer needs what AutoTokenizer loads: tokenizer_config.json "
                "with its tokenizer files; restore them from the original tokenizer",
            ) from None
        self._tok = tok
        self._with_specials = spec.adds_special_tokens
        self.tokenizer_class = type(tok).__name__
        self.vocab_size = len(tok)
        eos = getattr(tok, "eos_token", None)
        self.eod_id = None if eos is None else int(tok.convert_tokens_to_ids(eos))
        self.bos_id = None if tok.bos_token_id is None else int(tok.bos_token_id)
        self._rust = self._rust_encoder()

    # Megatron's exact calls
    def _exact(self, text: str) -> list[int]:
        if self._with_specials:
            return list(self._tok(text).input_ids)
        return list(self._tok.convert_tokens_to_ids(self._tok.tokenize(text)))

    def _rust_encoder(self) -> Any:
        """The Rust tokenizer when its ids are provably those of the exact calls, else None."""
        try:
            from transformers.tokenization_utils_base import PreTrainedTokenizerBase
            from transformers.tokenization_utils_tokenizers import TokenizersBackend
        except ImportError:
            return None
        tok = self._tok
        cls = type(tok)
        if not isinstance(tok, TokenizersBackend):
            return None
        same = [
            cls._encode_plus is TokenizersBackend._encode_plus,
            cls.__call__ is PreTrainedTokenizerBase.__call__,
            cls.tokenize is TokenizersBackend.tokenize,
            cls.convert_tokens_to_ids is PreTrainedTokenizerBase.convert_tokens_to_ids,
            cls._convert_token_to_id_with_added_voc is TokenizersBackend._convert_token_to_id_with_added_voc,
        ]
        if not all(same):
            return None
        rust = tok.backend_tokenizer
        vocab = rust.get_vocab(with_added_tokens=True)
        if len(set(vocab.values())) != len(vocab) or any(rust.id_to_token(i) != t for t, i in vocab.items()):
            return None
        # what transformers' encode sets on every call: no truncation or padding, its special-token split
        if rust.truncation is not None:
            rust.no_truncation()
        if rust.padding is not None:
            rust.no_padding()
        rust.encode_special_tokens = bool(tok.split_special_tokens)
        probe = list(PROBE_TEXTS)
        fast = [list(e.ids) for e in rust.encode_batch(probe, add_special_tokens=self._with_specials)]
        if fast != [self._exact(t) for t in probe]:
            return None
        return rust

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._rust is None:
            return [self._exact(t) for t in texts]
        add = self._with_specials
        return [list(self._rust.encode(t, add_special_tokens=add).ids) for t in texts]

    def encode_with_special_tokens(self, texts: Sequence[str]) -> list[list[int]] | None:
        return [list(self._tok(t).input_ids) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))


def _complete_special_tokens(tok: Any) -> None:
    """The special tokens megatron.core's HuggingFaceTokenizer sets on every tokenizer it loads (no
    explicit tokens given): SEP from EOS or EOS from SEP, BOS from CLS, CLS from BOS, and an empty
    list of additional special tokens."""
    extra: dict[str, Any] = {}
    if tok.sep_token is None and tok.eos_token:
        extra["sep_token"] = tok.eos_token
    elif tok.eos_token is None and tok.sep_token:
        extra["eos_token"] = tok.sep_token
    if tok.bos_token is None and tok.cls_token:
        extra["bos_token"] = tok.cls_token
    if tok.cls_token is None and tok.bos_token:
        extra["cls_token"] = tok.bos_token
    extra["additional_special_tokens"] = []
    tok.add_special_tokens(extra)


# -- GPT2BPETokenizer ----------------------------------------------------------------------------------
class Gpt2Backend:
    library = "tokenizers"
    tokenizer_class = None

    def __init__(self, directory: Path, spec: EncodingSpec, vocab: dict[str, int]) -> None:
        # lazy: the native library only for GPT-2 BPE tokenizers
        from tokenizers import Tokenizer, decoders, pre_tokenizers
        from tokenizers.models import BPE

        self.spec = spec
        self.library_version = _version("tokenizers")
        text = (directory / "merges.txt").read_text(encoding="utf-8")
        # Megatron's GPT-2 tokenizer drops the first line (the "#version" header) and the last (empty
        # after the final newline), whatever they hold
        merges = [tuple(line.split()) for line in text.split("\n")[1:-1]]
        pairs = [(m[0], m[1]) for m in merges if len(m) == 2]
        if len(pairs) != len(merges):
            raise TokenizerError(
                "merges.txt has lines that are not one pair of tokens",
                where=str(directory / "merges.txt"),
                fix="restore merges.txt from the original tokenizer",
            )
        tk = Tokenizer(BPE(vocab=dict(vocab), merges=pairs))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tk.decoder = decoders.ByteLevel()
        self._tk = tk
        self.vocab_size = len(vocab)
        self.eod_id = vocab.get(GPT2_EOD)
        self.bos_id = self.eod_id

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(self._tk.encode(t, add_special_tokens=False).ids) for t in texts]

    def encode_with_special_tokens(self, texts: Sequence[str]) -> list[list[int]] | None:
        return None

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tk.decode([int(i) for i in ids], skip_special_tokens=False))


# -- building and fingerprinting -----------------------------------------------------------------------
def build_backend(
    spec: EncodingSpec,
    *,
    path: Path,
    model_file: Path | None,
    gpt2_vocab: dict[str, int] | None,
    hf_dir: bool,
) -> Backend:
    """The backend of `spec` for a tokenizer at `path`; refuses a type its files cannot serve."""
    if spec.tokenizer_type in SP_TYPES:
        if model_file is None:
            raise TokenizerError(
                f"{spec.tokenizer_type} needs a SentencePiece tokenizer.model",
                where=str(path),
                fix="use --tokenizer-type GPT2BPETokenizer (or HuggingFaceTokenizer) for this tokenizer",
            )
        return SentencePieceBackend(model_file, spec)
    if spec.tokenizer_type == HF_TYPE:
        if not hf_dir:
            raise TokenizerError(
                "HuggingFaceTokenizer needs an HF tokenizer directory (with tokenizer_config.json)",
                where=str(path),
                fix="pass the HF directory, or use --tokenizer-type GPTSentencePieceTokenizer for a bare "
                "tokenizer.model",
            )
        return HuggingFaceBackend(path, spec)
    if spec.tokenizer_type == GPT2_TYPE:
        if gpt2_vocab is None:
            raise TokenizerError(
                "GPT2BPETokenizer needs a directory with vocab.json + merges.txt",
                where=str(path),
                fix="use the tokenizer type of this tokenizer's files (GPTSentencePieceTokenizer or "
                "HuggingFaceTokenizer)",
            )
        return Gpt2Backend(path, spec, gpt2_vocab)
    raise TokenizerError(f"no backend for tokenizer type {spec.tokenizer_type}")  # EncodingSpec refuses first


def fingerprint_backend(backend: Backend) -> EncodingFingerprint:
    texts = list(PROBE_TEXTS)
    probe = backend.encode_batch(texts)
    specials = backend.encode_with_special_tokens(texts)
    spec = backend.spec
    return EncodingFingerprint(
        tokenizer_type=spec.tokenizer_type,
        legacy_tokenizer=spec.legacy,
        hf_use_fast=spec.hf_use_fast,
        hf_include_special_tokens=spec.hf_include_special_tokens,
        library=backend.library,
        library_version=backend.library_version,
        tokenizer_class=backend.tokenizer_class,
        vocab_size=backend.vocab_size,
        eod_id=backend.eod_id,
        bos_id=backend.bos_id,
        probe_ids=probe,
        probe_ids_with_special_tokens=specials,
        digest=behaviour_digest(
            probe, specials, vocab_size=backend.vocab_size, eod_id=backend.eod_id, bos_id=backend.bos_id
        ),
    )


def single_threaded() -> None:
    """One encoding thread in this process (a tokenizer worker): the Rust tokenizers' thread pool off."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
