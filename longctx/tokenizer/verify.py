"""Verify a tokenizer against a manifest (or an md5), and fingerprint a tokenizer into a manifest.

Identity is two facts: the md5 of the model file(s), and the encoding fingerprint — the ids Megatron's
tokenizer of the declared type gives for fixed probe texts. The second tells apart directories that
share a model file but differ in their HF config (prefix space, legacy mode, BOS/EOS flags).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from longctx.errors import TokenizerError, TokenizerMismatch
from longctx.report import Findings
from longctx.tokenizer.encoding import EncodingFingerprint, EncodingSpec, declared_spec, encoding_differences
from longctx.tokenizer.load import LoadedTokenizer, load_tokenizer
from longctx.tokenizer.manifest import TokenizerManifest
from longctx.tokenizer.padding import DEFAULT_DIVISIBLE_BY, padded_vocab_size, padding_table
from longctx.util.hashing import is_hex_digest

# Sample texts for round trips: several scripts, diacritics, punctuation, digits, an emoji. Single
# spaces and NFKC-stable characters only, so that tokenizers which normalise whitespace or compatibility
# characters still reproduce them exactly.
DEFAULT_ROUND_TRIP: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Grüße aus Köln: Straße, Käse und Übermut.",
    "Ça coûte 12,50 € à Noël, dit l'élève.",
    "Hyvää päivää! Äiti söi jäätelöä.",
    "Zażółć gęślą jaźń, łódź.",
    "Žluťoučký kůň úpěl ďábelské ódy.",
    "Καλημέρα κόσμε, Привет мир.",
    "東京は日本の首都です。",
    "def f(x): return x * 2 + 1 # code",
    "Emoji: 🙂 and numbers 3.14159, 2025-01-31.",
)


@dataclasses.dataclass
class TokenizerReport:
    """Findings of a verification plus the facts that were observed."""

    path: str
    manifest: str | None
    facts: dict[str, Any]
    findings: Findings

    @property
    def ok(self) -> bool:
        return self.findings.ok

    def raise_for_errors(self) -> None:
        """Raise `TokenizerMismatch` naming the first error (for callers that must not go on)."""
        if not self.ok:
            first = self.findings.errors[0]
            n = len(self.findings.errors)
            raise TokenizerMismatch(
                f"{first.message}" + (f" (and {n - 1} more mismatches)" if n > 1 else ""),
                where=self.path,
                fix="run `longctx tokenizer check` to see every mismatch; use the tokenizer the model was trained with",
            )


def tokenizer_facts(
    tok: LoadedTokenizer,
    *,
    tp: int = 1,
    divisible_by: int = DEFAULT_DIVISIBLE_BY,
    encoding: EncodingFingerprint | None = None,
) -> dict[str, Any]:
    return {
        "kind": tok.kind,
        "md5": tok.md5,
        "md5_of": tok.md5_of,
        "vocab_size": tok.vocab_size,
        "model_vocab_size": tok.model_vocab_size,
        "eod_id": tok.eod_id,
        "bos_id": tok.bos_id,
        "pad_id": tok.pad_id,
        "unk_id": tok.unk_id,
        "added_tokens": tok.added_tokens,
        "encoder": tok.encoder,
        "megatron_tokenizer_type": tok.megatron_tokenizer_type,
        "megatron_tokenizer_model": tok.megatron_tokenizer_model,
        "make_vocab_size_divisible_by": divisible_by,
        "tp": tp,
        "padded_vocab_size": padded_vocab_size(tok.vocab_size, divisible_by, tp),
        "padded_vocab_size_by_tp": padding_table(tok.vocab_size, divisible_by),
        "encoding": encoding.model_dump(mode="json") if encoding is not None else None,
    }


def _first_difference(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"first difference at character {i}: {a[i : i + 12]!r} became {b[i : i + 12]!r}"


def check_round_trip(tok: LoadedTokenizer, texts: list[str] | tuple[str, ...]) -> list[tuple[int, str, str]]:
    """(index, text, decoded) for every sample whose encode → decode does not give it back."""
    bad = []
    for i, text in enumerate(texts):
        decoded = tok.decode(tok.encode(text))
        if decoded != text:
            bad.append((i, text, decoded))
    return bad


def verify_tokenizer(
    path: str | os.PathLike[str] | LoadedTokenizer,
    manifest: TokenizerManifest | None = None,
    *,
    md5: str | None = None,
    tp: int = 1,
    divisible_by: int | None = None,
    spec: EncodingSpec | str | None = None,
) -> TokenizerReport:
    """Compare a tokenizer with a manifest and/or an expected md5.

    `spec` is how Megatron encodes with it (default: the manifest's pinned encoding, else its
    tokenizer type, else the layout's). Raises `TokenizerError` when the tokenizer cannot be loaded at
    all (missing, empty, not a SentencePiece model, HF directory without tokenizer.model) or the md5
    given is malformed; every mismatch of a loadable tokenizer is an error finding (expected vs found),
    the encoding fingerprint's included.
    """
    if md5 is not None and not is_hex_digest(md5, 32):
        raise TokenizerError(
            f"--md5 must be 32 hexadecimal digits, found {md5!r}",
            fix="copy the md5 exactly (e.g. from md5sum)",
        )
    wanted = spec if spec is not None else declared_spec(None, manifest)
    if isinstance(path, LoadedTokenizer):
        tok = path.with_spec(wanted) if wanted is not None else path
    else:
        tok = load_tokenizer(path, spec=wanted)
    div = divisible_by or (manifest.make_vocab_size_divisible_by if manifest else DEFAULT_DIVISIBLE_BY)
    f = Findings()

    encoding = _consistency(tok, f)
    facts = tokenizer_facts(tok, tp=tp, divisible_by=div, encoding=encoding)
    if encoding is not None:
        _compare_encoding(tok, manifest, encoding, f)
        _compare_pinned_options(manifest, encoding, "warning" if spec is not None else "error", f)
    _compare_md5(tok, md5.lower() if md5 else (manifest.md5 if manifest else None), f)

    if manifest is not None:
        _compare_manifest(tok, manifest, f)
        samples: tuple[str, ...] | list[str] = manifest.round_trip
        level = "error"
    else:
        samples = DEFAULT_ROUND_TRIP
        level = "warning"  # without a manifest we cannot know whether this tokenizer is meant to round-trip

    for i, text, decoded in check_round_trip(tok, samples) if encoding is not None else []:
        getattr(f, level)(
            "round-trip",
            f"sample {i} does not survive encode → decode ({_first_difference(text, decoded)})",
            expected=text,
            found=decoded,
        )
    if samples and not any(x.code == "round-trip" for x in f):
        f.info("round-trip", f"{len(samples)} sample texts survive encode → decode")
    if tok.encoder == "tokenizer.json":
        _compare_json_with_model(tok, samples, level, f)

    f.info(
        "padded-vocab",
        f"Megatron pads the vocabulary {tok.vocab_size} to {facts['padded_vocab_size']} "
        f"(multiple of {div} × TP {tp})",
    )
    return TokenizerReport(
        path=str(tok.path),
        manifest=manifest.name if manifest else None,
        facts=facts,
        findings=f,
    )


def _consistency(tok: LoadedTokenizer, f: Findings) -> EncodingFingerprint | None:
    """Findings on whether the tokenizer's files agree with each other and with its encoding backend;
    its encoding fingerprint (None when the declared type cannot encode with it)."""
    for problem in tok.problems:
        f.error("consistency", problem, where=str(tok.path))
    try:
        encoding = tok.encoding_fingerprint()
    except TokenizerError as err:
        f.error(
            "encoding",
            f"{tok.spec.tokenizer_type} cannot encode with this tokenizer: {err.what}",
            where=err.where or str(tok.path),
            fix=err.fix,
        )
        return None
    for problem in tok.backend_problems():
        f.error(
            "consistency",
            problem,
            where=str(tok.path),
            fix="take the HF files and the model from the same release",
        )
    return encoding


def _compare_md5(tok: LoadedTokenizer, expected: str | None, f: Findings) -> None:
    """The tokenizer's identity against the md5 given or pinned (a warning when there is none)."""
    if expected is None:
        f.warning(
            "md5",
            "no md5 to compare with: the tokenizer's identity is not checked",
            found=tok.md5,
            fix="pin md5 in the manifest or pass --md5",
        )
    elif tok.md5 != expected:
        f.error(
            "md5",
            f"md5 of {tok.md5_of} differs",
            expected=expected,
            found=tok.md5,
            where=str(tok.identity_files[0]),
            fix="use the exact tokenizer files the model was trained with",
        )
    else:
        f.info("md5", f"md5 of {tok.md5_of} matches", found=tok.md5)


def _compare_encoding(
    tok: LoadedTokenizer, manifest: TokenizerManifest | None, found: EncodingFingerprint, f: Findings
) -> None:
    pinned = manifest.encoding if manifest is not None else None
    if pinned is None:
        level = "warning" if manifest is not None else "info"
        getattr(f, level)(
            "encoding",
            f"no encoding fingerprint to compare with: how {found.describe()} turns text into ids is "
            f"not checked (digest {found.digest[:16]}…)",
            found=found.digest,
            fix="pin it: `longctx tokenizer fingerprint PATH --write FILE` writes the manifest's [encoding]"
            if manifest is not None
            else None,
        )
        return
    diffs = encoding_differences(pinned, found)
    if diffs:
        f.error(
            "encoding",
            "the tokenizer encodes differently from the manifest's fingerprint: " + "; ".join(diffs),
            where=str(tok.path),
            expected=f"{pinned.describe()} digest {pinned.digest}",
            found=f"{found.describe()} digest {found.digest}",
            fix="use the tokenizer directory the model was trained with (its HF config files and library "
            "decide the prefix space, legacy mode and BOS/EOS); pass the Megatron options it was used with "
            "(--tokenizer-type, --legacy-tokenizer, …)",
        )
    elif (pinned.library, pinned.library_version) != (found.library, found.library_version):
        f.info(
            "encoding",
            f"same probe ids as the manifest's fingerprint under {found.library} {found.library_version} "
            f"(pinned with {pinned.library} {pinned.library_version})",
        )
    else:
        f.info("encoding", f"encoding fingerprint matches ({found.describe()})", found=found.digest)


_SPEC_FIELDS = ("tokenizer_type", "legacy_tokenizer", "hf_use_fast", "hf_include_special_tokens")


def _compare_pinned_options(
    manifest: TokenizerManifest | None, found: EncodingFingerprint, level: str, f: Findings
) -> None:
    """The pinned fingerprint's digest covers behaviour only, so its Megatron options are compared on their
    own: a manifest whose [encoding] names other options than the ones it is checked (and data is
    tokenized) under describes an encoding nobody runs. An error when the options came from the manifest
    itself, a warning when the caller chose them."""
    pinned = manifest.encoding if manifest is not None else None
    if pinned is None:
        return
    diffs = [
        f"{k} {getattr(pinned, k)!r}, checked as {getattr(found, k)!r}"
        for k in _SPEC_FIELDS
        if getattr(pinned, k) != getattr(found, k)
    ]
    if diffs:
        getattr(f, level)(
            "encoding-options",
            "the manifest's [encoding] was pinned under other Megatron options: " + "; ".join(diffs),
            where=manifest.name if manifest is not None else None,
            fix="make megatron_tokenizer_type and [encoding] agree: re-pin with `longctx tokenizer fingerprint "
            "PATH --tokenizer-type TYPE --write FILE` under the options the data is tokenized with",
        )


def _compare_json_with_model(
    tok: LoadedTokenizer, samples: tuple[str, ...] | list[str], level: str, f: Findings
) -> None:
    """transformers encodes with tokenizer.json when there is one; identity is tokenizer.model's md5, so a
    tokenizer.json that encodes otherwise makes the pinned md5 vouch for an encoding it does not make (an
    error against a manifest, which pins both)."""
    for i, text in enumerate(samples):
        via_json, via_model = tok.encode_with_tokenizer_json(text), tok.encode_with_model_file(text)
        if via_json is not None and via_json != via_model:
            getattr(f, level)(
                "json-vs-model",
                f"tokenizer.json and tokenizer.model encode sample {i} differently "
                "(data tokenized through either would differ)",
                expected=via_model[:16],
                found=via_json[:16],
                fix="regenerate tokenizer.json from tokenizer.model, or take both from the same release",
            )
            return


def _compare_manifest(tok: LoadedTokenizer, m: TokenizerManifest, f: Findings) -> None:
    if tok.kind != m.kind:
        hint = ""
        if m.kind == "hf-sentencepiece" and tok.kind == "sentencepiece":
            hint = (
                " — pass the HF tokenizer directory (tokenizer.model + JSON files), not the bare model file"
            )
        f.error("kind", f"tokenizer layout differs{hint}", expected=m.kind, found=tok.kind)
    if tok.vocab_size != m.vocab_size:
        f.error(
            "vocab-size",
            "vocab size (len(tokenizer), Megatron's view) differs",
            expected=m.vocab_size,
            found=tok.vocab_size,
        )
    if m.model_vocab_size is not None and tok.model_vocab_size != m.model_vocab_size:
        f.error(
            "model-vocab-size",
            f"number of tokens in {tok.md5_of} differs",
            expected=m.model_vocab_size,
            found=tok.model_vocab_size,
        )
    for token, want in m.special_tokens.items():
        _compare_token(tok, "special", token, want, f)
    for token, want in m.added_tokens.items():
        _compare_token(tok, "added", token, want, f)
    for token, idx in tok.added_tokens.items():
        if token not in m.added_tokens:
            f.error("added-token", f"unexpected added token {token!r} at id {idx}", expected=None, found=idx)
    if tok.eod_id != m.eod_id:
        f.error("eod", "EOD id differs", expected=m.eod_id, found=tok.eod_id)
    if m.bos_id is not None and tok.bos_id != m.bos_id:
        f.error("bos", "BOS id differs", expected=m.bos_id, found=tok.bos_id)
    if m.pad_id is not None and tok.pad_id != m.pad_id:
        f.error("pad", "PAD id differs", expected=m.pad_id, found=tok.pad_id)


def _compare_token(tok: LoadedTokenizer, what: str, token: str, want: int, f: Findings) -> None:
    found = tok.token_to_id(token)
    if found is None:
        at = tok.id_to_token(want)
        suffix = f" (id {want} is {at!r})" if at is not None else ""
        f.error(f"{what}-token", f"{what} token {token!r} is missing{suffix}", expected=want, found=None)
    elif found != want:
        f.error(f"{what}-token", f"{what} token {token!r} is at id {found}", expected=want, found=found)


def fingerprint(
    path: str | os.PathLike[str] | LoadedTokenizer,
    *,
    name: str | None = None,
    round_trip: list[str] | tuple[str, ...] = DEFAULT_ROUND_TRIP,
    spec: EncodingSpec | str | None = None,
) -> TokenizerManifest:
    """Describe a tokenizer as a manifest, its encoding fingerprint under `spec` (default: the layout's
    Megatron tokenizer type) included; only sample texts that survive a round trip are pinned."""
    if isinstance(path, LoadedTokenizer):
        tok = path.with_spec(spec) if spec is not None else path
    else:
        tok = load_tokenizer(path, spec=spec)
    problems = tok.encoding_problems()
    if problems:
        raise TokenizerError(
            f"the tokenizer files are inconsistent: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            where=str(tok.path),
            fix="run `longctx tokenizer check PATH --md5 …` for every problem; take all files from one release",
        )
    if tok.eod_id is None:
        raise TokenizerError(
            "tokenizer has no EOS/EOD token; Megatron needs one to separate documents",
            where=str(tok.path),
            fix="use a tokenizer with an <eos> (SentencePiece) or <|endoftext|> (GPT-2) token",
        )
    failing = {i for i, _, _ in check_round_trip(tok, round_trip)}
    base = Path(tok.path).name
    return TokenizerManifest(
        name=name or (Path(tok.path).parent.name if base == "tokenizer.model" else base),
        description=f"fingerprint of {tok.path}",
        kind=tok.kind,
        megatron_tokenizer_type=tok.spec.tokenizer_type,
        md5=tok.md5,
        md5_of=tok.md5_of,
        vocab_size=tok.vocab_size,
        model_vocab_size=tok.model_vocab_size,
        eod_id=tok.eod_id,
        bos_id=tok.bos_id,
        pad_id=tok.pad_id,
        round_trip=[t for i, t in enumerate(round_trip) if i not in failing],
        special_tokens={k: v for k, v in tok.special_tokens.items() if v < tok.model_vocab_size},
        added_tokens=dict(tok.added_tokens),
        encoding=tok.encoding_fingerprint(),
    )
