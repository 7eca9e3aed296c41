"""How text becomes ids: the Megatron tokenizer type and options, and a fingerprint of that behaviour.

The md5 of `tokenizer.model` says which model file a tokenizer has, not how Megatron-LM encodes with
it: `tools/preprocess_data.py --tokenizer-type HuggingFaceTokenizer` encodes through
`transformers.AutoTokenizer`, whose HF config decides the leading-space prefix, legacy mode and
BOS/EOS; `GPTSentencePieceTokenizer` calls the SentencePiece model itself. An `EncodingSpec` names the
way (type and Megatron's tokenizer options); an `EncodingFingerprint` records what that way does: the
ids of fixed multilingual probe texts, the EOD/BOS ids, the vocabulary size Megatron sees, and the
library and version that produced them. Two tokenizers with the same model file but different HF
configs have different fingerprints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from longctx.errors import TokenizerError
from longctx.megatron_versions import HfOption, facts

HF_TYPE = "HuggingFaceTokenizer"
SP_TYPE = "GPTSentencePieceTokenizer"
GPT2_TYPE = "GPT2BPETokenizer"
# megatron.core's tokenizers give these two the same SentencePiece library as GPTSentencePieceTokenizer
# (megatron/training's legacy ones do not: special-token splitting and an added <EOD>, BOS for Llama 2)
SP_ALIASES: tuple[str, ...] = ("SentencePieceTokenizer", "Llama2Tokenizer")
SP_TYPES: tuple[str, ...] = (SP_TYPE, *SP_ALIASES)
TOKENIZER_TYPES: tuple[str, ...] = (HF_TYPE, *SP_TYPES, GPT2_TYPE)

# Encoded one by one, each as a document. The first starts with a word (leading-space prefix), the
# second with a space; together they cover several scripts, digits, an emoji, runs of spaces, tabs and
# newlines, and the literal text of common special tokens (split as special tokens or not).
PROBE_TEXTS: tuple[str, ...] = (
    "the quick brown fox jumps over 12,345.67 lazy dogs; Grüße aus Köln, ça coûte 12 € à Noël.",
    " Hyvää päivää!  Zażółć gęślą jaźń. Καλημέρα κόσμε, Привет мир. 東京は日本の首都です。 🙂\n"
    "\tdef f(x):\n        return x * 2  # two spaces\n\n",
    "<s> </s> <bos> <eos> <pad> <unk> <|endoftext|> <start_of_turn>user hi<end_of_turn> end",
)


@dataclasses.dataclass(frozen=True)
class EncodingSpec:
    """The Megatron-LM tokenizer that encodes: `--tokenizer-type` and the options that change ids.

    `legacy` is `--legacy-tokenizer` (megatron/training's tokenizers; for HuggingFaceTokenizer it
    encodes with `tokenizer(text).input_ids`, so the HF config's BOS/EOS are added); the current path
    (megatron.core.tokenizers) encodes HuggingFaceTokenizer with `convert_tokens_to_ids(tokenize(text))`
    unless `hf_include_special_tokens` (`--tokenizer-hf-include-special-tokens`). `hf_use_fast` is
    `--tokenizer-hf-use-fast` (current path only; the legacy path takes AutoTokenizer's default).
    """

    tokenizer_type: str
    legacy: bool = False
    hf_use_fast: bool = False
    hf_include_special_tokens: bool = False

    def __post_init__(self) -> None:
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise TokenizerError(
                f"tokenizer type {self.tokenizer_type!r} is not supported for encoding",
                fix=f"use one of {', '.join(TOKENIZER_TYPES)} (Megatron's --tokenizer-type)",
            )
        if self.legacy and self.tokenizer_type in SP_ALIASES:
            raise TokenizerError(
                f"Megatron's legacy {self.tokenizer_type} (megatron/training) is not reproduced by longctx",
                fix="drop --legacy-tokenizer (the current path encodes as GPTSentencePieceTokenizer does), or "
                "use --tokenizer-type GPTSentencePieceTokenizer",
            )

    @property
    def adds_special_tokens(self) -> bool:
        """Whether the HF tokenizer's own special tokens (BOS/EOS per its config) are added."""
        return self.tokenizer_type == HF_TYPE and (self.legacy or self.hf_include_special_tokens)

    def megatron_flags(self, version: str | None = None) -> list[str]:
        """The `tools/preprocess_data.py` (and pretrain_gpt.py) flags of this spec besides the tokenizer
        files; with `version`, in that Megatron-LM's terms (see `version_flags`)."""
        if version is not None:
            return version_flags(self, version)
        flags = ["--tokenizer-type", self.tokenizer_type]
        if self.legacy:
            flags.append("--legacy-tokenizer")
        if self.tokenizer_type == HF_TYPE and not self.legacy:
            if self.hf_use_fast:
                flags.append("--tokenizer-hf-use-fast")
            if self.hf_include_special_tokens:
                flags.append("--tokenizer-hf-include-special-tokens")
        return flags

    def describe(self) -> str:
        return " ".join(self.megatron_flags()[1:])


class EncodingFingerprint(BaseModel):
    """What an `EncodingSpec` does with a tokenizer, as the manifest and the dataset sidecar record it.

    `digest` covers the behaviour only (probe ids, EOD, BOS, vocabulary size): equal digests mean the
    same ids for the probes whatever the library version. `probe_ids_with_special_tokens` (HF only) are
    the probes through `tokenizer(text).input_ids`, which shows the config's BOS/EOS flags even when the
    spec does not add them.
    """

    model_config = ConfigDict(extra="allow")

    tokenizer_type: str
    legacy_tokenizer: bool = False
    hf_use_fast: bool = False
    hf_include_special_tokens: bool = False
    library: str
    library_version: str
    tokenizer_class: str | None = None
    vocab_size: int
    eod_id: int | None
    bos_id: int | None
    probe_ids: list[list[int]]
    probe_ids_with_special_tokens: list[list[int]] | None = None
    digest: str = Field(min_length=64, max_length=64)

    def spec(self) -> EncodingSpec:
        return EncodingSpec(
            self.tokenizer_type,
            legacy=self.legacy_tokenizer,
            hf_use_fast=self.hf_use_fast,
            hf_include_special_tokens=self.hf_include_special_tokens,
        )

    def describe(self) -> str:
        cls = f", {self.tokenizer_class}" if self.tokenizer_class else ""
        return f"{self.spec().describe()} ({self.library} {self.library_version}{cls})"


def behaviour_digest(
    probe_ids: list[list[int]],
    with_special_tokens: list[list[int]] | None,
    *,
    vocab_size: int,
    eod_id: int | None,
    bos_id: int | None,
) -> str:
    data = {
        "probe_texts": list(PROBE_TEXTS),
        "probe_ids": probe_ids,
        "with_special_tokens": with_special_tokens,
        "vocab_size": vocab_size,
        "eod_id": eod_id,
        "bos_id": bos_id,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()


def _first_difference(a: list[list[int]], b: list[list[int]]) -> str:
    for t, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            k = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
            left = x[k] if k < len(x) else "end"
            right = y[k] if k < len(y) else "end"
            return f"probe text {t}, token {k}: {left} vs {right} ({len(x)} vs {len(y)} tokens)"
    return f"{len(a)} vs {len(b)} probe texts"


def encoding_differences(expected: EncodingFingerprint, found: EncodingFingerprint) -> list[str]:
    """Human-readable differences in behaviour ([] when the digests agree); `expected` comes first."""
    if expected.digest == found.digest:
        return []
    out: list[str] = []
    if expected.probe_ids != found.probe_ids:
        out.append(
            "the probe texts encode differently (first difference at "
            f"{_first_difference(expected.probe_ids, found.probe_ids)})"
        )
    e_sp, f_sp = expected.probe_ids_with_special_tokens, found.probe_ids_with_special_tokens
    if e_sp is not None and f_sp is not None and e_sp != f_sp and expected.probe_ids == found.probe_ids:
        out.append(
            "the HF config adds special tokens differently (BOS/EOS flags; first difference at "
            f"{_first_difference(e_sp, f_sp)})"
        )
    for key in ("eod_id", "bos_id", "vocab_size"):
        if getattr(expected, key) != getattr(found, key):
            out.append(f"{key} {getattr(expected, key)} vs {getattr(found, key)}")
    return out or ["the behaviour digests differ"]


def spec_from_options(
    tokenizer_type: str | None,
    *,
    legacy: bool = False,
    hf_use_fast: bool = False,
    hf_include_special_tokens: bool = False,
    version: str | None = None,
) -> EncodingSpec | None:
    """A spec from CLI-style options; None when nothing was chosen (the tokenizer's default applies, or
    with `version` that release's: `release_spec`). With `version`, the switches turn options on over the
    release's defaults (`release_spec`)."""
    if tokenizer_type is None:
        if legacy or hf_use_fast or hf_include_special_tokens:
            raise TokenizerError(
                "--legacy-tokenizer and --tokenizer-hf-* options need --tokenizer-type",
                fix="add --tokenizer-type HuggingFaceTokenizer (or the type the model uses)",
            )
        return None
    if version is not None:
        return release_spec(
            tokenizer_type,
            version,
            legacy=legacy,
            hf_use_fast=hf_use_fast,
            hf_include_special_tokens=hf_include_special_tokens,
        )
    return EncodingSpec(
        tokenizer_type,
        legacy=legacy,
        hf_use_fast=hf_use_fast,
        hf_include_special_tokens=hf_include_special_tokens,
    )


def version_spec(tokenizer_type: str, version: str) -> EncodingSpec:
    """What `--tokenizer-type T` alone encodes as on Megatron-LM `version`: HuggingFaceTokenizer takes
    that release's defaults (slow, no special tokens up to 0.16; fast, with special tokens from 0.17)."""
    if tokenizer_type != HF_TYPE:
        return EncodingSpec(tokenizer_type)
    d = facts(version).hf_defaults
    return EncodingSpec(
        HF_TYPE, hf_use_fast=d["use_fast"], hf_include_special_tokens=d["include_special_tokens"]
    )


def release_spec(
    tokenizer_type: str,
    version: str,
    *,
    legacy: bool = False,
    hf_use_fast: bool = False,
    hf_include_special_tokens: bool = False,
) -> EncodingSpec:
    """`--tokenizer-type T` on Megatron-LM `version` with longctx's switches: the release's defaults
    (`version_spec`), each switch turning its option on; TokenizerError when that release has no way to
    say the result (`version_flags`: --legacy-tokenizer from 0.17)."""
    default = version_spec(tokenizer_type, version)
    spec = EncodingSpec(
        tokenizer_type,
        legacy=legacy,
        hf_use_fast=default.hf_use_fast or hf_use_fast,
        hf_include_special_tokens=default.hf_include_special_tokens or hf_include_special_tokens,
    )
    version_flags(spec, version)
    return spec


def version_flags(spec: EncodingSpec, version: str) -> list[str]:
    """The flags that make Megatron-LM `version` encode as `spec`: a switch for each option that differs
    from that release's default; TokenizerError when the release has no way to say it."""
    known = facts(version)
    flags = ["--tokenizer-type", spec.tokenizer_type]
    if spec.legacy:
        if not known.legacy_tokenizer:
            raise TokenizerError(
                f"--legacy-tokenizer does not exist in Megatron-LM {version} (removed in 0.17)",
                where=f"Megatron-LM {version}",
                fix="encode with the current tokenizer path (drop legacy), or run a Megatron-LM ≤ 0.16",
            )
        return [*flags, "--legacy-tokenizer"]
    if spec.tokenizer_type != HF_TYPE:
        return flags
    wanted: dict[HfOption, bool] = {
        "use_fast": spec.hf_use_fast,
        "include_special_tokens": spec.hf_include_special_tokens,
    }
    for option, value in wanted.items():
        if value == known.hf_defaults[option]:
            continue
        switch = known.hf_switches.get(option)
        if switch is None:
            raise TokenizerError(
                f"HuggingFaceTokenizer with {option} = {value} cannot be asked of Megatron-LM {version}: its "
                f"default is {known.hf_defaults[option]} and it has no switch for it",
                where=f"Megatron-LM {version}",
                fix="re-tokenize with that release's defaults (and pin them in the manifest), or run a "
                "Megatron-LM that has the switch (≤ 0.16 or ≥ 0.19)",
            )
        flags.append(switch)
    return flags


def declared_spec(
    megatron_type: str | None, manifest: Any | None, version: str | None = None
) -> EncodingSpec | None:
    """The spec a plan declares: its `megatron_type` (else the manifest's type), with the options of
    the manifest's pinned encoding when that is of the same type; None when nothing is declared. With the
    plan's Megatron-LM `version`, a type without pinned options takes that release's defaults, and pinned
    options must be expressible there (TokenizerError otherwise)."""
    pinned = getattr(manifest, "encoding", None) if manifest is not None else None
    kind = megatron_type or (
        getattr(manifest, "megatron_tokenizer_type", None) if manifest is not None else None
    )
    if pinned is not None and (kind is None or kind == pinned.tokenizer_type):
        spec = pinned.spec()
        if version is not None:
            version_flags(spec, version)
        return spec
    if kind is None:
        return None
    return EncodingSpec(kind) if version is None else version_spec(kind, version)
