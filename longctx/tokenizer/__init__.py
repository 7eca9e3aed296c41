"""Tokenizer identity and Megatron's view of it: load, fingerprint, verify, vocabulary padding.

Public API::

    load_tokenizer(path) -> LoadedTokenizer        # .encode .decode .vocab_size .eod_id .md5 .kind …
    load_manifest(path) -> TokenizerManifest       # tokenization/*.toml
    verify_tokenizer(path, manifest, md5=, tp=, divisible_by=) -> TokenizerReport
    fingerprint(path) -> TokenizerManifest
    EncodingSpec(type, legacy=…)                    # how Megatron-LM encodes: load_tokenizer(path, spec)
    tok.encoding_fingerprint() -> EncodingFingerprint   # what that encoding does (probe ids, EOD, BOS)
    padded_vocab_size(vocab_size, divisible_by=128, tp=1) -> int
    train_sentencepiece(...), train_gpt2_bpe(...), synthetic_corpus()   # tiny tokenizers for tests/demo
"""

from longctx.tokenizer.build import synthetic_corpus, train_gpt2_bpe, train_sentencepiece
from longctx.tokenizer.encoding import (
    PROBE_TEXTS,
    TOKENIZER_TYPES,
    EncodingFingerprint,
    EncodingSpec,
    declared_spec,
    encoding_differences,
    spec_from_options,
)
from longctx.tokenizer.load import (
    KINDS,
    MEGATRON_TOKENIZER_TYPE,
    Kind,
    LoadedTokenizer,
    load_tokenizer,
    tokenizer_md5,
)
from longctx.tokenizer.manifest import (
    TokenizerManifest,
    check_manifest_target,
    load_manifest,
    manifest_from_dict,
    manifest_to_toml,
    write_manifest,
)
from longctx.tokenizer.padding import DEFAULT_DIVISIBLE_BY, padded_vocab_size, padding_table
from longctx.tokenizer.verify import DEFAULT_ROUND_TRIP, TokenizerReport, fingerprint, verify_tokenizer

__all__ = [
    "DEFAULT_DIVISIBLE_BY",
    "DEFAULT_ROUND_TRIP",
    "KINDS",
    "MEGATRON_TOKENIZER_TYPE",
    "PROBE_TEXTS",
    "TOKENIZER_TYPES",
    "EncodingFingerprint",
    "EncodingSpec",
    "Kind",
    "LoadedTokenizer",
    "TokenizerManifest",
    "TokenizerReport",
    "check_manifest_target",
    "declared_spec",
    "encoding_differences",
    "fingerprint",
    "load_manifest",
    "load_tokenizer",
    "manifest_from_dict",
    "manifest_to_toml",
    "padded_vocab_size",
    "padding_table",
    "spec_from_options",
    "synthetic_corpus",
    "tokenizer_md5",
    "train_gpt2_bpe",
    "train_sentencepiece",
    "verify_tokenizer",
    "write_manifest",
]
