"""`data check` throughput against a plain sequential read of the same file, in the same run.

Builds an int32 dataset of `size_gib` with megatron-core's builder (vocab 262145, documents of 1K–256K
tokens, each ending in EOD), reads it once to warm the page cache, then times (best of `repeats`):

- raw: sequential reads of the whole `.bin` into a reusable buffer, at the scan's block size and at
  64 MiB — the faster of the two is the baseline;
- check: the full `check_datasets` run on the prefix (index validation, token scan, length stats).

The ratio check/raw is the figure (target ≥ 0.8 with a warm cache). Nothing is asserted.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from longctx.data.check import check_datasets
from longctx.data.scan import BLOCK_BYTES

TARGET_RATIO = 0.8
VOCAB = 262145
EOD = 2


@dataclasses.dataclass
class DataCheckBench:
    path: str
    bin_bytes: int
    documents: int
    raw_gbps: float
    raw_block_bytes: int
    raw_by_block: dict[int, float]
    check_gbps: float
    check_seconds: float
    scan_gbps: float
    ratio: float
    workers: int
    block_bytes: int
    check_ok: bool
    create_seconds: float
    host: dict[str, Any]
    target_ratio: float = TARGET_RATIO


def make_int32_dataset(
    prefix: str, size_gib: float, *, seed: int = 0, advance: Callable[[int], None] | None = None
) -> int:
    """Write `prefix.{bin,idx}` (int32, ~size_gib) with megatron-core's builder; returns the document count."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder  # megatron-core: build only

    total = int(size_gib * 2**30) // 4
    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    written = docs = 0
    while written < total:
        n = int(min(total - written, 2 ** rng.uniform(10, 18)))  # 1K..256K tokens, log-uniform
        doc = rng.integers(EOD + 1, VOCAB, size=n, dtype=np.int32)  # no EOD inside documents
        doc[-1] = EOD
        builder.add_document(doc, [n])
        written += n
        docs += 1
        if advance is not None:
            advance(n * 4)
    builder.finalize(prefix + ".idx")
    return docs


def raw_read_gbps(path: str, block_bytes: int) -> float:
    size = os.path.getsize(path)
    buf = bytearray(block_bytes)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        pos = 0
        while (n := os.preadv(fd, [view], pos)) > 0:
            pos += n
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return size / elapsed / 1e9


def run_data_check_bench(
    size_gib: float = 1.0,
    *,
    tmp_dir: str | None = None,
    keep: bool = False,
    workers: int | None = None,
    block_bytes: int = BLOCK_BYTES,
    repeats: int = 3,
    advance: Callable[[int], None] | None = None,
) -> DataCheckBench:
    workdir = Path(tempfile.mkdtemp(prefix="longctx-bench-data-", dir=tmp_dir))
    try:
        prefix = str(workdir / "bench_text_document")
        t0 = time.perf_counter()
        docs = make_int32_dataset(prefix, size_gib, advance=advance)
        create_s = time.perf_counter() - t0
        bin_file = prefix + ".bin"
        size = os.path.getsize(bin_file)
        raw_read_gbps(bin_file, 64 * 2**20)  # warm the page cache
        blocks = sorted({block_bytes, 64 * 2**20})
        raw = {b: max(raw_read_gbps(bin_file, b) for _ in range(repeats)) for b in blocks}
        best_block = max(raw, key=lambda b: raw[b])
        best_check = float("inf")
        best_scan = float("inf")
        ok = True
        for _ in range(repeats):
            start = time.perf_counter()
            report = check_datasets(
                [prefix],
                vocab_size=VOCAB,
                eod_id=EOD,
                workers=workers,
                progress=False,
                block_bytes=block_bytes,
            )
            best_check = min(best_check, time.perf_counter() - start)
            scan = report.prefixes[0].scan
            if scan is not None:
                best_scan = min(best_scan, scan.seconds)
            ok = ok and report.ok
        check_gbps = size / best_check / 1e9
        return DataCheckBench(
            path=prefix,
            bin_bytes=size,
            documents=docs,
            raw_gbps=raw[best_block],
            raw_block_bytes=best_block,
            raw_by_block=raw,
            check_gbps=check_gbps,
            check_seconds=best_check,
            scan_gbps=size / best_scan / 1e9 if best_scan < float("inf") else 0.0,
            ratio=check_gbps / raw[best_block],
            workers=workers or min(os.cpu_count() or 1, 8),
            block_bytes=block_bytes,
            check_ok=ok,
            create_seconds=create_s,
            host={"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        )
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
