"""`PREFIX.longctx.json`: how a dataset was made — tokenizer identity, encoding, dtype, counts, inputs.

Written by `data tokenize` (and `data fingerprint` for datasets made elsewhere); read by `data check`
to prove the dataset was tokenized with the model's tokenizer. The tokenizer's identity is the md5 of
its model file(s) plus the md5 of every file it was loaded from, and its encoding fingerprint: the
Megatron tokenizer type and options, the library and version, and the ids of fixed probe texts.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from longctx.errors import DatasetError
from longctx.tokenizer import EncodingFingerprint, LoadedTokenizer
from longctx.util.fs import atomic_write_json

SIDECAR_SUFFIX = ".longctx.json"
SIDECAR_FORMAT = "longctx-dataset/1"


class SidecarTokenizer(BaseModel):
    model_config = ConfigDict(extra="allow")

    md5: str
    md5_of: str
    kind: str
    vocab_size: int
    eod_id: int | None
    bos_id: int | None = None
    path: str | None = None
    files: dict[str, str] | None = None  # file name -> md5, every file the tokenizer is loaded from
    encoding: EncodingFingerprint | None = None

    @classmethod
    def of(cls, tok: LoadedTokenizer) -> SidecarTokenizer:
        """The identity of a loaded tokenizer, its encoding fingerprint included, as a sidecar records it."""
        return cls(
            md5=tok.md5,
            md5_of=tok.md5_of,
            kind=tok.kind,
            vocab_size=tok.vocab_size,
            eod_id=tok.eod_id,
            bos_id=tok.bos_id,
            path=str(Path(tok.path).resolve()),
            files=tok.file_md5s(),
            encoding=tok.encoding_fingerprint(),
        )


class SidecarInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    path: str
    bytes: int
    sha256: str | None = None
    documents: int = 0
    skipped_empty: int = 0  # blank lines (Megatron's preprocess_data.py stops at them)
    empty_documents: int = 0  # written without tokens, as Megatron writes them


class DatasetSidecar(BaseModel):
    model_config = ConfigDict(extra="allow")

    format: str = SIDECAR_FORMAT
    origin: Literal["tokenize", "fingerprint"] = "tokenize"
    created: str = Field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    longctx_version: str | None = None
    tokenizer: SidecarTokenizer
    dtype: str
    documents: int
    sequences: int
    tokens: int
    append_eod: bool = True
    add_bos: bool = False
    json_key: str | None = None
    # the Megatron-LM release asked for (`data tokenize --megatron-version`): the encoding took its
    # tokenizer defaults and megatron_flags are in its terms (None: none asked, 0.16's spelling)
    megatron_version: str | None = None
    # the tools/preprocess_data.py flags that give the same .bin/.idx (None: no such equivalent)
    megatron_flags: list[str] | None = None
    inputs: list[SidecarInput] = Field(default_factory=list)


def sidecar_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(prefix) + SIDECAR_SUFFIX)


def read_sidecar(prefix: str | os.PathLike[str]) -> DatasetSidecar | None:
    """The sidecar of a prefix, or None if there is none; a malformed one raises `DatasetError`."""
    path = sidecar_path(prefix)
    if not path.is_file():
        return None
    try:
        return DatasetSidecar.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as err:
        detail = str(err).splitlines()[0]
        raise DatasetError(
            f"malformed dataset sidecar: {detail}",
            where=str(path),
            fix="delete it and re-create it with `longctx data fingerprint PREFIX --tokenizer PATH`",
        ) from None


def write_sidecar(
    prefix: str | os.PathLike[str], sidecar: DatasetSidecar, *, path: Path | None = None
) -> Path:
    target = path or sidecar_path(prefix)
    atomic_write_json(target, sidecar.model_dump(mode="json"))
    # temp files are created 0600; a sidecar sits beside shared data and must be as readable as it
    os.chmod(target, 0o666 & ~_umask())
    return target


def _umask() -> int:
    try:  # Linux: read it without the set-and-restore race of os.umask
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
