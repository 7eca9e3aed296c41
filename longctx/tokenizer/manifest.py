"""Tokenizer manifests (`tokenization/*.toml`): what "the right tokenizer" means for a model.

A manifest pins the identity md5, Megatron's vocabulary size, every special id, the EOD id, the added
tokens, sample texts that must survive an encode → decode round trip, and (`[encoding]`) the encoding
fingerprint: how Megatron-LM's tokenizer of the declared type turns fixed probe texts into ids.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from longctx.errors import OutputError, TokenizerError
from longctx.tokenizer.encoding import EncodingFingerprint, behaviour_digest
from longctx.tokenizer.load import MD5_OF, Kind
from longctx.tokenizer.padding import DEFAULT_DIVISIBLE_BY
from longctx.util.confine import is_within
from longctx.util.fs import atomic_write_text
from longctx.util.hashing import is_hex_digest


class TokenizerManifest(BaseModel):
    """Expected facts of a tokenizer; `vocab_size` is Megatron's view (`len(tokenizer)`)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    source: str = ""
    kind: Kind
    megatron_tokenizer_type: str
    md5: str | None = None
    md5_of: str | None = None
    vocab_size: int = Field(gt=0)
    model_vocab_size: int | None = Field(default=None, gt=0)
    eod_id: int = Field(ge=0)
    bos_id: int | None = Field(default=None, ge=0)
    pad_id: int | None = Field(default=None, ge=0)
    make_vocab_size_divisible_by: int = Field(default=DEFAULT_DIVISIBLE_BY, gt=0)
    round_trip: list[str] = Field(default_factory=list)
    special_tokens: dict[str, int] = Field(default_factory=dict)
    added_tokens: dict[str, int] = Field(default_factory=dict)
    encoding: EncodingFingerprint | None = None

    @field_validator("md5")
    @classmethod
    def _md5_hex(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not is_hex_digest(value, 32):
            raise ValueError(f"must be 32 hexadecimal digits, found {value!r}")
        return value.lower()

    @model_validator(mode="after")
    def _consistent(self) -> TokenizerManifest:
        if self.md5_of is None:
            self.md5_of = MD5_OF[self.kind]
        for table in ("special_tokens", "added_tokens"):
            for token, idx in getattr(self, table).items():
                if idx < 0 or idx >= self.vocab_size:
                    raise ValueError(f"{table}: {token!r} has id {idx}, outside 0..{self.vocab_size - 1}")
        if self.eod_id >= self.vocab_size:
            raise ValueError(f"eod_id {self.eod_id} is not below vocab_size {self.vocab_size}")
        if self.encoding is not None:
            _check_encoding_digest(self.encoding)
        return self


def _check_encoding_digest(enc: EncodingFingerprint) -> None:
    """[encoding]'s digest is computed from its fields: an edited field (or digest) no longer matches, and
    comparisons by digest alone would trust fields nobody measured."""
    digest = behaviour_digest(
        enc.probe_ids,
        enc.probe_ids_with_special_tokens,
        vocab_size=enc.vocab_size,
        eod_id=enc.eod_id,
        bos_id=enc.bos_id,
    )
    if digest != enc.digest:
        raise ValueError(
            f"[encoding] digest {enc.digest[:16]}… is not the digest of its own fields ({digest[:16]}…): the "
            "probe ids, vocab_size, eod_id or bos_id were edited; write the manifest again with "
            "`longctx tokenizer fingerprint`"
        )


def load_manifest(path: str | os.PathLike[str]) -> TokenizerManifest:
    """Read and validate a manifest; every problem becomes a `TokenizerError` naming the field."""
    p = Path(path)
    if not p.is_file():
        raise TokenizerError(
            f"tokenizer manifest not found: {p}",
            where=str(p),
            fix="pass one of tokenization/*.toml, or write one with `longctx tokenizer fingerprint PATH --write FILE`",
        )
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise TokenizerError(
            f"tokenizer manifest is not valid TOML: {err}",
            where=str(p),
            fix="restore it, or write it again with `longctx tokenizer fingerprint PATH --write FILE`",
        ) from None
    return manifest_from_dict(data, where=str(p))


def manifest_from_dict(data: dict[str, Any], *, where: str | None = None) -> TokenizerManifest:
    try:
        return TokenizerManifest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "manifest"
        msg = first["msg"].removeprefix("Value error, ")
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise TokenizerError(
            f"invalid tokenizer manifest: {loc}: {msg}{more}",
            where=where,
            fix="correct the field (an md5 is 32 hexadecimal digits), or regenerate the manifest with "
            "`longctx tokenizer fingerprint PATH --write FILE`",
        ) from None


# -- TOML output -----------------------------------------------------------------------------------
def manifest_to_toml(manifest: TokenizerManifest, *, header: str | None = None) -> str:
    """The manifest as TOML: scalars, round_trip, then [special_tokens], [added_tokens], [encoding];
    unset fields and an empty description/source are left out. `header` becomes leading comments."""
    data = manifest.model_dump(exclude_none=True)
    for key in ("description", "source"):
        if data.get(key) == "":
            del data[key]
    comments = "".join(f"# {line}\n" if line else "#\n" for line in (header or "").splitlines())
    return (comments + "\n" if comments else "") + tomli_w.dumps(data, indent=2)


def write_manifest(
    manifest: TokenizerManifest, path: str | os.PathLike[str], *, header: str | None = None
) -> None:
    atomic_write_text(path, manifest_to_toml(manifest, header=header))


def check_manifest_target(target: Path, tokenizer: Path, *, force: bool) -> None:
    """Where `tokenizer fingerprint --write` may write: never over one of the tokenizer's own files
    (a manifest beside them is fine), and over an existing file only with `force`."""
    if target.exists() and target.is_dir():
        raise TokenizerError(f"{target} is a directory", where=str(target), fix="give --write a file path")
    own = target.suffix != ".toml" or (tokenizer.is_file() and target.resolve() == tokenizer.resolve())
    if own and is_within(target, tokenizer):
        raise OutputError(
            f"--write {target} would be written inside the input {tokenizer}, over the tokenizer's files",
            where=str(target),
            fix=f"write the manifest as a .toml file, e.g. --write {tokenizer.parent / (tokenizer.name + '.toml')}",
        )
    if target.exists() and not force:
        raise TokenizerError(
            f"{target} exists; a manifest is not replaced silently",
            where=str(target),
            fix="pass --force to replace it, or choose another --write path",
        )
