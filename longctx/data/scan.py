"""Full scan of `.bin` token files: max id, out-of-range ids, EOD count, documents ending in EOD.

Each file is cut into tasks of `task_bytes`; a thread pool runs the tasks of all prefixes together
(parallel across and within files). A task reads its byte range with `preadv` into one reusable
buffer of `block_bytes` (small enough to stay in CPU cache) and runs two vectorised passes per
block: the maximum over the unsigned view (negative ids show up as huge values, so one pass
catches both ends) and the EOD count. Only blocks that fail get a closer look. Memory is bounded by
workers × block size plus per-task document boundaries; the file size does not matter.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from longctx.data.indexed import IndexInfo
from longctx.util.progress import progress_bar

BLOCK_BYTES = 4 * 1024 * 1024
TASK_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class ScanParams:
    vocab_size: int | None = None
    eod_id: int | None = None
    bos_id: int | None = None


@dataclasses.dataclass
class ScanResult:
    """What a full pass over one `.bin` found (token offsets are in tokens, not bytes)."""

    tokens_scanned: int = 0
    bytes_scanned: int = 0
    max_id: int | None = None
    min_id: int | None = None
    out_of_range: int = 0
    first_out_of_range: tuple[int, int] | None = None  # (token offset, id)
    eod_count: int = 0
    documents_checked: int = 0
    documents_without_eod: int = 0
    first_document_without_eod: int | None = None
    documents_starting_with_bos: int = 0
    seconds: float = 0.0

    def merge(self, other: ScanResult) -> None:
        self.tokens_scanned += other.tokens_scanned
        self.bytes_scanned += other.bytes_scanned
        if other.max_id is not None:
            self.max_id = other.max_id if self.max_id is None else max(self.max_id, other.max_id)
        if other.min_id is not None:
            self.min_id = other.min_id if self.min_id is None else min(self.min_id, other.min_id)
        self.out_of_range += other.out_of_range
        if other.first_out_of_range is not None and (
            self.first_out_of_range is None or other.first_out_of_range[0] < self.first_out_of_range[0]
        ):
            self.first_out_of_range = other.first_out_of_range
        self.eod_count += other.eod_count
        self.documents_checked += other.documents_checked
        self.documents_without_eod += other.documents_without_eod
        if other.first_document_without_eod is not None and (
            self.first_document_without_eod is None
            or other.first_document_without_eod < self.first_document_without_eod
        ):
            self.first_document_without_eod = other.first_document_without_eod
        self.documents_starting_with_bos += other.documents_starting_with_bos


def _seq_start_tokens(info: IndexInfo, k: np.ndarray) -> np.ndarray:
    """Token offset where sequence k starts; k == n means the end of the data."""
    n = info.sequence_count
    if n == 0:
        return np.zeros_like(k)
    safe = np.minimum(k, n - 1)
    starts = np.asarray(info.sequence_pointers[safe], dtype=np.int64) // info.itemsize
    return np.where(k < n, starts, info.tokens)


def _document_boundaries(info: IndexInfo, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(last-token offsets, their document ids, first-token offsets) of non-empty documents whose last /
    first token lies in tokens [t0, t1). Cost is proportional to the documents in that range."""
    item = info.itemsize
    n, total = info.sequence_count, info.tokens
    pointers, doc_idx = info.sequence_pointers, info.document_indices
    # sequences k whose start S(k) lies in [t0 + 1, t1 + 1): S(k) - 1 is a last token in range
    k_lo = int(np.searchsorted(pointers, (t0 + 1) * item, "left"))
    k_hi = int(np.searchsorted(pointers, (t1 + 1) * item, "left")) if t1 < total else n + 1
    m_lo = max(int(np.searchsorted(doc_idx, k_lo, "left")), 1)
    m_hi = int(np.searchsorted(doc_idx, k_hi, "left"))
    m = np.arange(m_lo, m_hi, dtype=np.int64)
    end_excl = _seq_start_tokens(info, np.asarray(doc_idx[m_lo:m_hi], dtype=np.int64))
    start = _seq_start_tokens(info, np.asarray(doc_idx[m_lo - 1 : m_hi - 1], dtype=np.int64))
    keep = end_excl > start
    last_tokens, last_docs = end_excl[keep] - 1, m[keep] - 1
    # documents whose first token lies in [t0, t1)
    s_lo = int(np.searchsorted(pointers, t0 * item, "left"))
    s_hi = int(np.searchsorted(pointers, t1 * item, "left"))
    j_lo = int(np.searchsorted(doc_idx, s_lo, "left"))
    j_hi = min(int(np.searchsorted(doc_idx, s_hi, "left")), info.documents)
    if j_hi > j_lo:
        firsts = _seq_start_tokens(info, np.asarray(doc_idx[j_lo:j_hi], dtype=np.int64))
        nexts = _seq_start_tokens(info, np.asarray(doc_idx[j_lo + 1 : j_hi + 1], dtype=np.int64))
        first_tokens = firsts[nexts > firsts]
    else:
        first_tokens = np.zeros(0, dtype=np.int64)
    return last_tokens, last_docs, first_tokens


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{dtype.itemsize}") if dtype.kind == "i" else dtype


def scan_range(
    info: IndexInfo,
    params: ScanParams,
    t0: int,
    t1: int,
    *,
    block_bytes: int = BLOCK_BYTES,
    advance: Callable[[int], None] | None = None,
    per_document: bool = True,
) -> ScanResult:
    """Scan tokens [t0, t1) of one `.bin`."""
    started = time.perf_counter()
    res = ScanResult()
    dtype, item = info.dtype, info.itemsize
    udtype = _unsigned(dtype)
    sign_limit = 1 << (8 * item - 1) if dtype.kind == "i" else None
    vocab, eod, bos = params.vocab_size, params.eod_id, params.bos_id
    if per_document and (eod is not None or bos is not None):
        ends, end_docs, firsts = _document_boundaries(info, t0, t1)
    else:
        ends = end_docs = firsts = np.zeros(0, dtype=np.int64)
    block_items = max(block_bytes // item, 1)
    buf = bytearray(block_items * item)
    view = memoryview(buf)
    fd = os.open(info.bin_path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, t0 * item, (t1 - t0) * item, os.POSIX_FADV_SEQUENTIAL)
        pos = t0
        while pos < t1:
            want = min(block_items, t1 - pos)
            got = os.preadv(fd, [view[: want * item]], pos * item)
            if got < want * item:
                raise OSError(
                    f"short read at byte {pos * item + got} of {info.bin_path} (file changed during the scan?)"
                )
            block = np.frombuffer(buf, dtype=dtype, count=want)
            _scan_block(block, pos, res, udtype, sign_limit, vocab, eod)
            if ends.size and eod is not None:
                lo, hi = np.searchsorted(ends, [pos, pos + want])
                if hi > lo:
                    bad = block[ends[lo:hi] - pos] != eod
                    nbad = int(np.count_nonzero(bad))
                    res.documents_checked += int(hi - lo)
                    if nbad:
                        res.documents_without_eod += nbad
                        first = int(end_docs[lo + int(np.argmax(bad))])
                        if res.first_document_without_eod is None:
                            res.first_document_without_eod = first
            if firsts.size and bos is not None:
                lo, hi = np.searchsorted(firsts, [pos, pos + want])
                if hi > lo:
                    res.documents_starting_with_bos += int(
                        np.count_nonzero(block[firsts[lo:hi] - pos] == bos)
                    )
            pos += want
            res.tokens_scanned += want
            res.bytes_scanned += want * item
            if advance is not None:
                advance(want * item)
    finally:
        os.close(fd)
    res.seconds = time.perf_counter() - started
    return res


def _scan_block(
    block: np.ndarray,
    pos: int,
    res: ScanResult,
    udtype: np.dtype,
    sign_limit: int | None,
    vocab: int | None,
    eod: int | None,
) -> None:
    umax = int(block.view(udtype).max())
    if sign_limit is not None and umax >= sign_limit:  # negative ids present
        bmax, bmin = int(block.max()), int(block.min())
    else:
        bmax, bmin = umax, None
    res.max_id = bmax if res.max_id is None else max(res.max_id, bmax)
    if bmin is not None:
        res.min_id = bmin if res.min_id is None else min(res.min_id, bmin)
    if vocab is not None and umax >= vocab:  # ids >= vocab, or negative (huge when unsigned)
        bad = block.view(udtype) >= vocab
        res.out_of_range += int(np.count_nonzero(bad))
        if res.first_out_of_range is None:
            i = int(np.argmax(bad))
            res.first_out_of_range = (pos + i, int(block[i]))
    if eod is not None:
        res.eod_count += int(np.count_nonzero(block == eod))


def scan_datasets(
    infos: Sequence[IndexInfo],
    params: Sequence[ScanParams],
    *,
    workers: int | None = None,
    block_bytes: int = BLOCK_BYTES,
    task_bytes: int | None = None,
    progress: bool = True,
    per_document: bool = True,
) -> list[ScanResult]:
    """Scan several `.bin` files in parallel; one merged `ScanResult` per input, in order."""
    workers = workers or min(os.cpu_count() or 1, 8)
    total = sum(info.tokens * info.itemsize for info in infos)
    if task_bytes is None:
        # enough tasks to keep every worker busy to the end, none so small that setup dominates
        task_bytes = max(min(TASK_BYTES, total // (4 * workers)), 16 * 1024 * 1024)
    tasks: list[tuple[int, int, int]] = []
    for i, info in enumerate(infos):
        per_task = max(task_bytes // info.itemsize, 1)
        tasks += [(i, t0, min(t0 + per_task, info.tokens)) for t0 in range(0, info.tokens, per_task)]
    results = [ScanResult() for _ in infos]
    lock = threading.Lock()
    started = time.perf_counter()

    def desc() -> str:
        return (
            f"scan {len(infos)} dataset(s)"
            if len(infos) != 1
            else f"scan {os.path.basename(infos[0].prefix)}"
        )

    with progress_bar(desc(), total, unit="bytes") if progress else _null_progress() as advance:

        def run(task: tuple[int, int, int]) -> None:
            i, t0, t1 = task
            part = scan_range(
                infos[i],
                params[i],
                t0,
                t1,
                block_bytes=block_bytes,
                advance=advance,
                per_document=per_document,
            )
            with lock:
                results[i].merge(part)

        if workers == 1 or len(tasks) <= 1:
            for task in tasks:
                run(task)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="longctx-scan") as pool:
                for fut in [pool.submit(run, t) for t in tasks]:
                    fut.result()
    elapsed = time.perf_counter() - started
    for r in results:
        r.seconds = elapsed
    return results


class _null_progress:
    def __enter__(self) -> Callable[[int], None]:
        return lambda n=1: None

    def __exit__(self, *exc: object) -> None:
        return None
