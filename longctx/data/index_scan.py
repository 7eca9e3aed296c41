"""Index-only checks over many prefixes: structure, document lengths and a token spot check, no full read.

For thousands of chunk prefixes the full token scan takes hours; the `.idx` files alone say the
dtype, the document and token counts, every document's length (so the long-document shares per
stage length) and whether the `.bin` has the size the index promises. `scan_indexes` reads them in
parallel. A `.bin` that is absent (a download of the indexes only) is allowed and reported as such.

The spot check reads a handful of tokens per prefix — the first and last token of a few documents
and the first block — so a wrong EOD id or a larger vocabulary shows up without the full scan.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from longctx.data.doc_lengths import LengthStats, length_stats
from longctx.data.indexed import (
    DTYPE_CODES,
    HEADER_BYTES,
    MAGIC,
    VERSION,
    IndexInfo,
    bin_path,
    idx_path,
    read_index,
    validate_index,
)
from longctx.data.scan import ScanParams
from longctx.errors import DatasetError
from longctx.report import Findings
from longctx.util.progress import progress_bar

SPOT_DOCUMENTS = 8  # documents whose first and last token the spot check reads (half at each end)
SPOT_BLOCK_BYTES = 64 * 1024  # first block of the .bin checked for the id range


@dataclasses.dataclass
class SpotCheck:
    documents: int = 0  # documents sampled
    ending_in_eod: int = 0
    starting_with_bos: int = 0
    tokens: int = 0  # tokens read
    max_id: int | None = None
    out_of_range: int = 0


@dataclasses.dataclass
class IndexSummary:
    prefix: str
    dtype: str | None
    documents: int
    sequences: int
    tokens: int
    idx_bytes: int
    bin_bytes: int | None  # None: no .bin here
    lengths: LengthStats | None
    spot: SpotCheck | None
    findings: Findings

    @property
    def ok(self) -> bool:
        return self.findings.ok


SMALL_IDX_BYTES = 16 * 1024 * 1024  # smaller indexes are read in one go (cheaper than three memory maps)


def read_index_only(prefix: str | os.PathLike[str]) -> tuple[IndexInfo, bool]:
    """(IndexInfo, whether the .bin is present), reading only the `.idx`.

    The header is checked as `read_index` checks it; a small index is read into memory at once, a
    large one is mapped (`read_index`). Without a .bin, `bin_size` is 0."""
    prefix = os.fspath(prefix)
    ipath, bpath = idx_path(prefix), bin_path(prefix)
    try:
        bin_size: int | None = os.stat(bpath).st_size
    except FileNotFoundError:
        bin_size = None
    try:
        size = os.stat(ipath).st_size
    except FileNotFoundError:
        raise DatasetError(
            f"missing prefix: {prefix} ({ipath.name} not found)",
            where=prefix,
            fix="fetch the indexes (longctx data fetch … --idx-only) or check the path",
        ) from None
    if size > SMALL_IDX_BYTES and bin_size is not None:
        return read_index(prefix), True
    with open(ipath, "rb") as fh:
        data = fh.read() if size <= SMALL_IDX_BYTES else fh.read(HEADER_BYTES)
    header = data[:HEADER_BYTES]
    if header[:9] != MAGIC:
        raise DatasetError(
            f"bad magic in .idx: {header[:9]!r}", where=str(ipath), fix="re-fetch or re-create it"
        )
    if len(header) < HEADER_BYTES:
        raise DatasetError(f"truncated .idx: {size} bytes", where=str(ipath), fix="re-fetch or re-create it")
    (version,) = struct.unpack("<Q", header[9:17])
    code = header[17]
    if version != VERSION or code not in DTYPE_CODES:
        raise DatasetError(
            f"unsupported .idx (version {version}, dtype code {code})", where=str(ipath), fix="re-create it"
        )
    n, d = struct.unpack("<QQ", header[18:34])
    need = HEADER_BYTES + 12 * n + 8 * d
    if size < need:
        raise DatasetError(
            f"truncated .idx: {size} bytes, but {n} sequences and {d} document indices need {need}",
            where=str(ipath),
            fix="the index was cut short (interrupted copy?); fetch it again",
        )

    def array(dt: type[np.generic], count: int, offset: int) -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=dt)
        if len(data) >= size:
            return np.frombuffer(data, dtype=dt, count=count, offset=offset)
        return np.memmap(ipath, dtype=dt, mode="r", offset=offset, shape=(count,))

    lengths = array(np.int32, n, HEADER_BYTES)
    extra = size - need
    multimodal = n > 0 and extra == n
    info = IndexInfo(
        prefix=prefix,
        idx_path=ipath,
        bin_path=bpath,
        version=version,
        dtype_code=code,
        dtype=DTYPE_CODES[code],
        sequence_count=n,
        document_index_count=d,
        idx_size=size,
        bin_size=bin_size or 0,
        multimodal=multimodal,
        trailing_idx_bytes=0 if multimodal else extra,
        sequence_lengths=lengths,
        sequence_pointers=array(np.int64, n, HEADER_BYTES + 4 * n),
        document_indices=array(np.int64, d, HEADER_BYTES + 12 * n),
        tokens=int(lengths.sum(dtype=np.int64)) if n else 0,
    )
    return info, bin_size is not None


def _document_bounds(info: IndexInfo, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token offsets [start, end) of the given documents."""
    doc_idx = info.document_indices
    first_seq = np.asarray(doc_idx[docs], dtype=np.int64)
    last_seq = np.asarray(doc_idx[docs + 1], dtype=np.int64) - 1
    item = info.itemsize
    starts = np.asarray(info.sequence_pointers[first_seq], dtype=np.int64) // item
    ends = np.asarray(info.sequence_pointers[last_seq], dtype=np.int64) // item + np.asarray(
        info.sequence_lengths[last_seq], dtype=np.int64
    )
    return starts, ends


def spot_check(info: IndexInfo, params: ScanParams, *, documents: int = SPOT_DOCUMENTS) -> SpotCheck:
    """First/last token of a few documents at both ends and the first block: EOD, BOS, id range."""
    res = SpotCheck()
    if info.documents == 0 or info.tokens == 0:
        return res
    half = max(documents // 2, 1)
    docs = np.unique(
        np.concatenate(
            [np.arange(min(half, info.documents)), np.arange(max(info.documents - half, 0), info.documents)]
        )
    )
    starts, ends = _document_bounds(info, docs)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    item, dtype = info.itemsize, info.dtype
    seen: list[int] = []
    fd = os.open(info.bin_path, os.O_RDONLY)
    try:
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            first = np.frombuffer(os.pread(fd, item, s * item), dtype=dtype)
            last = np.frombuffer(os.pread(fd, item, (e - 1) * item), dtype=dtype)
            if first.size == 0 or last.size == 0:
                raise DatasetError(
                    f"short read in .bin at token {e - 1} (the .bin is shorter than its index)",
                    where=str(info.bin_path),
                    fix="fetch the file again",
                )
            res.documents += 1
            res.starting_with_bos += int(params.bos_id is not None and int(first[0]) == params.bos_id)
            res.ending_in_eod += int(params.eod_id is not None and int(last[0]) == params.eod_id)
            seen += [int(first[0]), int(last[0])]
        block = np.frombuffer(os.pread(fd, min(SPOT_BLOCK_BYTES, info.tokens * item), 0), dtype=dtype)
    finally:
        os.close(fd)
    values = np.concatenate([np.asarray(seen, dtype=np.int64), block.astype(np.int64)])
    res.tokens = int(values.size)
    res.max_id = int(values.max()) if values.size else None
    if params.vocab_size is not None:
        res.out_of_range = int(np.count_nonzero((values < 0) | (values >= params.vocab_size)))
    return res


def scan_index(
    prefix: str, lengths: Sequence[int] = (), *, params: ScanParams | None = None, validate: bool = True
) -> IndexSummary:
    """Index-only facts of one prefix; every problem is a finding (nothing raises)."""
    f = Findings()
    try:
        info, has_bin = read_index_only(prefix)
    except DatasetError as err:
        f.error(getattr(err, "code", "index"), err.what, where=err.where, fix=err.fix)
        return IndexSummary(prefix, None, 0, 0, 0, 0, None, None, None, f)
    structural = validate_index(info) if validate else Findings()
    if not has_bin:  # an index-only download: the .bin size cannot be compared
        structural = Findings(x for x in structural if x.code != "bin-size")
    f.extend(structural)
    usable = not any(
        x.level == "error" and x.code in ("pointers", "lengths", "doc-indices") for x in structural
    )
    stats = length_stats(info, lengths) if usable else None
    spot = None
    if (
        has_bin
        and params is not None
        and usable
        and not any(x.code == "bin-size" and x.level == "error" for x in f)
    ):
        try:
            spot = spot_check(info, params)
        except (DatasetError, OSError) as err:
            f.error("spot", str(err), where=str(info.bin_path))
        else:
            _spot_findings(spot, params, info, f)
    return IndexSummary(
        prefix=prefix,
        dtype=info.dtype.name,
        documents=info.documents,
        sequences=info.sequence_count,
        tokens=info.tokens,
        idx_bytes=info.idx_size,
        bin_bytes=info.bin_size if has_bin else None,
        lengths=stats,
        spot=spot,
        findings=f,
    )


def _spot_findings(spot: SpotCheck, params: ScanParams, info: IndexInfo, f: Findings) -> None:
    if params.eod_id is not None and spot.documents and spot.ending_in_eod < spot.documents:
        f.error(
            "spot-eod",
            f"{spot.documents - spot.ending_in_eod} of {spot.documents} sampled documents do not end with EOD id "
            f"{params.eod_id}",
            where=str(info.bin_path),
            fix="the data was made without --append-eod or with another tokenizer; re-tokenize it",
        )
    if spot.out_of_range:
        top = params.vocab_size - 1  # type: ignore[operator]
        f.error(
            "spot-range",
            f"{spot.out_of_range} of {spot.tokens} sampled token ids are outside 0..{top} (max {spot.max_id})",
            where=str(info.bin_path),
            fix="the data was tokenized with another (larger) vocabulary; re-tokenize it",
        )


def scan_indexes(
    prefixes: Sequence[str],
    lengths: Sequence[int] = (),
    *,
    params: ScanParams | None = None,
    workers: int | None = None,
    progress: bool = True,
    validate: bool = True,
) -> tuple[list[IndexSummary], float]:
    """`scan_index` over many prefixes in parallel; returns the summaries (in order) and the seconds."""
    workers = workers or min(os.cpu_count() or 1, 8)
    started = time.perf_counter()
    out: list[IndexSummary | None] = [None] * len(prefixes)
    with (
        progress_bar(f"index {len(prefixes)} prefixes", len(prefixes), unit="prefixes")
        if progress
        else _null() as adv
    ):

        def one(i: int) -> None:
            out[i] = scan_index(prefixes[i], lengths, params=params, validate=validate)
            adv(1)

        if workers == 1 or len(prefixes) < 2:
            for i in range(len(prefixes)):
                one(i)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="longctx-idx") as pool:
                for fut in [pool.submit(one, i) for i in range(len(prefixes))]:
                    fut.result()
    return [s for s in out if s is not None], time.perf_counter() - started


class _null:
    def __enter__(self):  # type: ignore[no-untyped-def]
        return lambda n=1: None

    def __exit__(self, *exc: object) -> None:
        return None


__all__ = ["IndexSummary", "SpotCheck", "read_index_only", "scan_index", "scan_indexes", "spot_check"]
