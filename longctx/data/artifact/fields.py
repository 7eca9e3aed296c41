"""The typed fields longctx reads from an artifact's JSON manifests (the producer's files, not ours).

The producer's manifests are evidence, not instructions: a field of the wrong type is reported as a
warning naming the field and the file, and read as absent, so the rest of the manifest still counts.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from longctx.report import Findings

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$", to_lower=True)]
SHA256 = TypeAdapter(Sha256)


class _Fields(BaseModel):
    # the producer's files carry many more keys than longctx reads
    model_config = ConfigDict(extra="ignore", frozen=True)


class ChunkFields(_Fields):
    """A chunk's sizes, digests and counts, as a chunk manifest, the stream manifest or data_mix.json give them."""

    bin_bytes: int | None = None
    idx_bytes: int | None = None
    bin_sha256: Sha256 | None = None
    idx_sha256: Sha256 | None = None
    documents: int | None = Field(default=None, validation_alias=AliasChoices("docs", "documents"))
    source_tokens: int | None = Field(default=None, validation_alias="source_token_count")


class ChecksumFields(_Fields):
    """One file's entry of checksums.json."""

    bytes: int | None = None
    sha256: Sha256 | None = None


class TierFields(_Fields):
    """One tier of a `tiers` table: source-token bounds and the producer's default weight."""

    min: int | None = None
    max: int | None = None
    weight: float | None = Field(default=None, strict=True)


class BuildInfoFields(_Fields):
    """The numbers of a build info longctx compares (its names are read as text)."""

    vocab_size: int | None = None


M = TypeVar("M", bound=_Fields)


def read_fields(model: type[M], raw: dict[str, Any], *, where: str, findings: Findings) -> M:
    """`model` from `raw`; each field of the wrong type is a warning naming it and `where`, and read as absent."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        bad = set()
        for e in err.errors():
            key = str(e["loc"][0])
            bad.add(key)
            findings.warning(
                "manifest-field", f"{key} {raw.get(key)!r:.60}: {e['msg']}; read as absent", where=where
            )
        return model.model_validate({k: v for k, v in raw.items() if k not in bad})


def is_sha256(value: Any) -> bool:
    try:
        SHA256.validate_python(value)
    except ValidationError:
        return False
    return True
