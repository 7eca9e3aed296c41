"""Read and validate Megatron indexed datasets (`PREFIX.idx` + `PREFIX.bin`) without reading tokens.

`.idx` layout (little-endian, as megatron-core's `indexed_dataset.py` writes it): 9-byte magic
`MMIDIDX\\x00\\x00`, `<Q` version 1, `<B` dtype code, `<Q` sequence count n, `<Q` document-index count d,
then int32 sequence lengths[n], int64 byte pointers[n], int64 document indices[d] (d = documents + 1,
starting at 0 and ending at n), optionally int8 sequence modes[n] (multimodal). `.bin` is raw tokens.

Arrays are memory-mapped, so reading an index costs time and memory only for what is looked at;
validation walks them in chunks so a 100M-document index stays within a few hundred MB.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from longctx.errors import DatasetError
from longctx.report import Findings

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = 34  # magic 9 + version 8 + dtype 1 + sequence count 8 + document count 8

# megatron.core.datasets.indexed_dataset.DType
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
CODE_OF_DTYPE = {v: k for k, v in DTYPE_CODES.items()}
UINT16_VOCAB_LIMIT = 65500  # DType.optimal_dtype: uint16 when the vocabulary is smaller than this
CHUNK_ITEMS = 8 * 1024 * 1024


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """The token dtype Megatron's tools choose for a vocabulary (`DType.optimal_dtype`)."""
    return np.dtype(np.uint16 if vocab_size is not None and vocab_size < UINT16_VOCAB_LIMIT else np.int32)


def dtype_holds_vocab(dtype: np.dtype, vocab_size: int) -> bool:
    """True if every id in 0..vocab_size-1 is representable in `dtype`."""
    if dtype.kind not in "iu":
        return False
    return int(np.iinfo(dtype).max) >= vocab_size - 1


def idx_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def bin_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


@dataclasses.dataclass
class IndexInfo:
    """Facts of one indexed dataset, read from its `.idx` (and the `.bin` size)."""

    prefix: str
    idx_path: Path
    bin_path: Path
    version: int
    dtype_code: int
    dtype: np.dtype
    sequence_count: int
    document_index_count: int
    idx_size: int
    bin_size: int
    multimodal: bool
    trailing_idx_bytes: int
    sequence_lengths: np.ndarray = dataclasses.field(repr=False)  # int32[n] (memory-mapped)
    sequence_pointers: np.ndarray = dataclasses.field(repr=False)  # int64[n]
    document_indices: np.ndarray = dataclasses.field(repr=False)  # int64[d]
    tokens: int = 0  # sum of sequence lengths

    @property
    def documents(self) -> int:
        return max(self.document_index_count - 1, 0)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def expected_bin_size(self) -> int:
        return self.tokens * self.itemsize

    @property
    def one_sequence_per_document(self) -> bool:
        """True when document indices are 0..n (the usual case without --split-sentences)."""
        n = self.sequence_count
        if self.document_index_count != n + 1:
            return False
        for start in range(0, n + 1, CHUNK_ITEMS):
            chunk = self.document_indices[start : start + CHUNK_ITEMS]
            if not np.array_equal(chunk, np.arange(start, start + chunk.size, dtype=np.int64)):
                return False
        return True

    def iter_document_lengths(self, chunk_docs: int = CHUNK_ITEMS) -> Iterator[np.ndarray]:
        """Token count of every document, in chunks (int64), with bounded memory."""
        if self.documents == 0:
            return
        if self.one_sequence_per_document:
            for start in range(0, self.sequence_count, chunk_docs):
                yield self.sequence_lengths[start : start + chunk_docs].astype(np.int64)
            return
        for start in range(0, self.documents, chunk_docs):
            bounds = np.asarray(self.document_indices[start : start + chunk_docs + 1], dtype=np.int64)
            lo, hi = int(bounds[0]), int(bounds[-1])
            csum = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(self.sequence_lengths[lo:hi], out=csum[1:])
            yield csum[bounds[1:] - lo] - csum[bounds[:-1] - lo]

    def document_lengths(self) -> np.ndarray:
        """All document lengths in one array (4-8 bytes per document)."""
        if self.one_sequence_per_document:
            return self.sequence_lengths
        parts = list(self.iter_document_lengths())
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


EMPTY_FIX = "tokenize non-empty input, or drop this prefix from the blend"


def no_tokens_message(name: str, documents: int) -> str:
    """What is wrong with a dataset (or a part of one) that holds no token: one wording for every check
    and every loop that refuses it, since nothing can be cut from it however often it is walked."""
    if documents == 0:
        return f"dataset {name} has no document"
    return f"dataset {name} has {documents:,} zero-length documents and no token"


def require_tokens(name: str, lengths: np.ndarray) -> None:
    """DatasetError when documents of these `lengths` hold no token: a loop that walks them until it has
    gathered tokens would never end."""
    if int(np.asarray(lengths, dtype=np.int64).sum()) <= 0:
        raise DatasetError(
            f"{no_tokens_message(name, int(np.asarray(lengths).size))}: no window can be cut from it",
            where=name,
            fix=EMPTY_FIX,
        )


def _index_error(code: str, what: str, *, where: str, fix: str) -> DatasetError:
    err = DatasetError(what, where=where, fix=fix)
    err.code = code  # type: ignore[attr-defined]  # the finding code `data check` reports
    return err


def read_index(prefix: str | os.PathLike[str]) -> IndexInfo:
    """Read the `.idx` header and map its arrays; raises `DatasetError` if the index is unreadable.

    Consistency between the arrays and with the `.bin` size is checked by `validate_index`.
    """
    prefix = os.fspath(prefix)
    ipath, bpath = idx_path(prefix), bin_path(prefix)
    _require_files(prefix, ipath, bpath)
    idx_size = ipath.stat().st_size
    bin_size = bpath.stat().st_size
    version, code, n, d = _read_header(ipath, idx_size)
    extra = idx_size - (HEADER_BYTES + 4 * n + 8 * n + 8 * d)
    multimodal = n > 0 and extra == n
    trailing = 0 if multimodal else extra

    def mapped(dt: type[np.generic], count: int, offset: int) -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=dt)
        return np.memmap(ipath, dtype=dt, mode="r", offset=offset, shape=(count,))

    lengths = mapped(np.int32, n, HEADER_BYTES)
    pointers = mapped(np.int64, n, HEADER_BYTES + 4 * n)
    doc_idx = mapped(np.int64, d, HEADER_BYTES + 12 * n)
    tokens = 0
    for start in range(0, n, CHUNK_ITEMS):
        tokens += int(lengths[start : start + CHUNK_ITEMS].sum(dtype=np.int64))
    return IndexInfo(
        prefix=prefix,
        idx_path=ipath,
        bin_path=bpath,
        version=version,
        dtype_code=code,
        dtype=DTYPE_CODES[code],
        sequence_count=n,
        document_index_count=d,
        idx_size=idx_size,
        bin_size=bin_size,
        multimodal=multimodal,
        trailing_idx_bytes=trailing,
        sequence_lengths=lengths,
        sequence_pointers=pointers,
        document_indices=doc_idx,
        tokens=tokens,
    )


def _require_files(prefix: str, ipath: Path, bpath: Path) -> None:
    missing = [p.name for p in (ipath, bpath) if not p.is_file()]
    if missing:
        hint = ""
        if prefix.endswith((".bin", ".idx")):
            hint = " (a prefix names the dataset without the .bin/.idx suffix)"
        raise _index_error(
            "missing-prefix",
            f"missing prefix: {prefix} ({' and '.join(missing)} not found){hint}",
            where=prefix,
            fix="check the path (Megatron resolves relative prefixes from the working directory)"
            + ("; drop the .bin/.idx suffix" if hint else ""),
        )


def _read_header(ipath: Path, idx_size: int) -> tuple[int, int, int, int]:
    """(version, dtype code, sequence count, document-index count) of a well-formed, long enough `.idx`."""
    with open(ipath, "rb") as fh:
        header = fh.read(HEADER_BYTES)
    if header[:9] != MAGIC and not (len(header) < 9 and MAGIC.startswith(header)):
        raise _index_error(
            "idx-magic",
            f"bad magic in .idx: expected {MAGIC!r}, found {header[:9]!r}",
            where=str(ipath),
            fix="this is not a Megatron indexed dataset index (or it is corrupt); re-create it",
        )
    if len(header) < HEADER_BYTES:
        raise _index_error(
            "idx-truncated",
            f"truncated .idx: {idx_size} bytes, shorter than the {HEADER_BYTES}-byte header",
            where=str(ipath),
            fix="the index was cut short (interrupted copy?); copy or re-create it",
        )
    (version,) = struct.unpack("<Q", header[9:17])
    if version != VERSION:
        raise _index_error(
            "idx-version",
            f"unsupported .idx version {version} (expected {VERSION})",
            where=str(ipath),
            fix="re-create the dataset with megatron-core's IndexedDatasetBuilder",
        )
    code = header[17]
    if code not in DTYPE_CODES:
        raise _index_error(
            "idx-dtype",
            f"unknown dtype code {code} in .idx (known: {sorted(DTYPE_CODES)})",
            where=str(ipath),
            fix="the index is corrupt; re-create it",
        )
    n, d = struct.unpack("<QQ", header[18:34])
    arrays = HEADER_BYTES + 4 * n + 8 * n + 8 * d
    if idx_size < arrays:
        raise _index_error(
            "idx-truncated",
            f"truncated .idx: {idx_size} bytes, but {n} sequences and {d} document indices need {arrays}",
            where=str(ipath),
            fix="the index was cut short (interrupted copy?); copy or re-create it",
        )
    return version, code, n, d


def validate_index(info: IndexInfo) -> Findings:
    """Structural checks that need no token reads: sizes, pointers, document indices, dtype."""
    f = Findings()
    where = info.prefix
    if info.dtype.kind not in "iu":
        f.error(
            "dtype",
            f"token dtype {info.dtype.name} is not an integer type",
            where=where,
            fix="re-create the dataset; token files hold integer ids",
        )
    if info.trailing_idx_bytes:
        f.warning(
            "idx-size",
            f".idx has {info.trailing_idx_bytes} unexpected trailing bytes",
            where=str(info.idx_path),
        )
    if info.documents == 0 or info.tokens == 0:
        what = no_tokens_message(Path(where).name, info.documents)
        f.error("empty", f"{what}: it is empty", where=where, fix=EMPTY_FIX)
    if info.bin_size != info.expected_bin_size:
        what = "truncated .bin" if info.bin_size < info.expected_bin_size else ".bin larger than its index"
        f.error(
            "bin-size",
            f"{what}: {info.bin_size} bytes, but the index describes {info.tokens} tokens × "
            f"{info.itemsize} bytes ({info.dtype.name}) = {info.expected_bin_size} bytes",
            where=str(info.bin_path),
            expected=info.expected_bin_size,
            found=info.bin_size,
            fix="the .bin and .idx do not belong together or a copy was interrupted; copy or re-create both",
        )
    _check_lengths_and_pointers(info, f)
    _check_document_indices(info, f)
    return f


def _check_lengths_and_pointers(info: IndexInfo, f: Findings) -> None:
    item = np.int64(info.itemsize)
    carry = np.int64(0)
    for start in range(0, info.sequence_count, CHUNK_ITEMS):
        lengths = np.asarray(info.sequence_lengths[start : start + CHUNK_ITEMS], dtype=np.int64)
        if lengths.size and lengths.min() < 0:
            bad = start + int(np.argmax(lengths < 0))
            f.error(
                "lengths",
                f"sequence {bad} has a negative length {int(lengths[bad - start])}",
                where=str(info.idx_path),
            )
            return
        expected = np.empty_like(lengths)
        expected[0] = carry
        np.cumsum(lengths[:-1] * item, out=expected[1:])
        expected[1:] += carry
        pointers = np.asarray(info.sequence_pointers[start : start + CHUNK_ITEMS])
        if not np.array_equal(pointers, expected):
            bad = int(np.argmax(pointers != expected))
            f.error(
                "pointers",
                f"sequence pointer {start + bad} is {int(pointers[bad])}, but the lengths before it give "
                f"{int(expected[bad])} (pointers must be cumulative length × {info.itemsize} bytes)",
                where=str(info.idx_path),
                expected=int(expected[bad]),
                found=int(pointers[bad]),
                fix="the index is corrupt; re-create it",
            )
            return
        carry = expected[-1] + lengths[-1] * item


def _check_document_indices(info: IndexInfo, f: Findings) -> None:
    d, n = info.document_index_count, info.sequence_count
    where = str(info.idx_path)
    if d == 0:
        f.error("doc-indices", "document indices are empty (they must start with 0)", where=where)
        return
    first, last = int(info.document_indices[0]), int(info.document_indices[-1])
    if first != 0 or last != n:
        f.error(
            "doc-indices",
            f"document indices run from {first} to {last}, expected 0 to {n} (the sequence count)",
            where=where,
            fix="the index is corrupt; re-create it",
        )
        return
    prev = np.int64(0)
    empty = 0
    for start in range(0, d, CHUNK_ITEMS):
        chunk = np.asarray(info.document_indices[start : start + CHUNK_ITEMS])
        steps = np.diff(chunk, prepend=prev)
        if steps.size and steps.min() < 0:
            bad = start + int(np.argmax(steps < 0))
            f.error(
                "doc-indices",
                f"document indices decrease at position {bad}",
                where=where,
                fix="the index is corrupt; re-create it",
            )
            return
        empty += int(np.count_nonzero(steps == 0)) - (1 if start == 0 else 0)
        prev = chunk[-1]
    if empty:
        f.warning("doc-indices", f"{empty} documents have no sequences", where=where)
