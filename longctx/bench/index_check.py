"""`data check ARTIFACT` over thousands of small prefixes: index-only speed, full scan vs raw read.

Builds an artifact with the streamed layout (runs/<run>/bin + one chunk manifest per prefix) of
`prefixes` small int32 prefixes (vocab 262145, documents of 64–4K tokens ending in EOD), then times,
best of `repeats`, with a warm page cache:

- index-only: `check_artifact(..., index_only=True)` — manifests, every .idx, structure, document
  lengths at the stage lengths, token spot checks — reported as prefixes per second;
- full: `check_artifact(...)` — the full token scan of every .bin — against a plain sequential read
  of the same .bin files (the baseline; per-file costs included in both).

Optionally (`big_gib` > 0) the single-file figure of `longctx bench data-check` is added. Nothing is asserted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longctx.bench.data_check import run_data_check_bench
from longctx.data.artifact.check import check_artifact
from longctx.data.indexed import HEADER_BYTES, MAGIC, VERSION

VOCAB = 262145
EOD = 2
BOS = 1
RUN = "bench_run"
LANGS = ("en", "de", "fr", "es", "it", "pl", "fi", "sv")
TIERS = ("16k_plus", "4_16k", "under4k")


@dataclasses.dataclass
class IndexCheckBench:
    path: str
    prefixes: int
    documents: int
    idx_bytes: int
    bin_bytes: int
    lengths: list[int]
    create_seconds: float
    index_seconds: float
    prefixes_per_second: float
    index_ok: bool
    full_seconds: float
    full_gbps: float
    raw_gbps: float
    ratio: float
    full_ok: bool
    workers: int
    big: dict[str, Any] | None
    host: dict[str, Any]


def write_prefix(prefix: str, documents: Sequence[np.ndarray]) -> tuple[int, int]:
    """Write an int32 Megatron dataset (one sequence per document) in the .idx layout megatron-core's
    builder produces; returns (bin bytes, idx bytes)."""
    lengths = np.asarray([len(d) for d in documents], dtype=np.int32)
    pointers = np.zeros(len(documents), dtype=np.int64)
    if len(documents) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * 4, out=pointers[1:])
    doc_idx = np.arange(len(documents) + 1, dtype=np.int64)
    with open(prefix + ".bin", "wb") as fh:
        for d in documents:
            fh.write(np.asarray(d, dtype=np.int32).tobytes())
    with open(prefix + ".idx", "wb") as fh:
        fh.write(MAGIC + struct.pack("<Q", VERSION) + struct.pack("<B", 4))
        fh.write(struct.pack("<QQ", len(documents), len(doc_idx)))
        fh.write(lengths.tobytes() + pointers.tobytes() + doc_idx.tobytes())
    return int(lengths.sum(dtype=np.int64)) * 4, HEADER_BYTES + 12 * len(documents) + 8 * len(doc_idx)


def make_artifact(
    root: Path,
    n_prefixes: int,
    *,
    docs_per_prefix: int = 16,
    seed: int = 0,
    advance: Callable[[int], None] | None = None,
) -> tuple[int, int, int]:
    """An artifact of `n_prefixes` chunks; returns (documents, bin bytes, idx bytes)."""
    rng = np.random.default_rng(seed)
    bin_dir = root / "runs" / RUN / "bin"
    chunk_dir = root / "runs" / RUN / "manifests" / "chunks"
    bin_dir.mkdir(parents=True)
    chunk_dir.mkdir(parents=True)
    docs = bin_total = idx_total = 0
    for i in range(n_prefixes):
        lang, tier = LANGS[i % len(LANGS)], TIERS[(i // len(LANGS)) % len(TIERS)]
        name = f"{RUN}_{lang}_s{i // 1000:04d}_c{i % 1000:05d}_{tier}"
        documents = []
        for _ in range(docs_per_prefix):
            n = int(2 ** rng.uniform(6, 12))
            d = rng.integers(EOD + 1, VOCAB - 1, size=n, dtype=np.int32)
            d[0], d[-1] = BOS, EOD
            documents.append(d)
        prefix = str(bin_dir / f"{name}_text_document")
        b, x = write_prefix(prefix, documents)
        entry = {
            "name": name,
            "language": lang,
            "tier": tier,
            "docs": docs_per_prefix,
            "bin_bytes": b,
            "idx_bytes": x,
            "bin_sha256": hashlib.sha256(Path(prefix + ".bin").read_bytes()).hexdigest(),
            "idx_sha256": hashlib.sha256(Path(prefix + ".idx").read_bytes()).hexdigest(),
        }
        (chunk_dir / f"{name}.json").write_text(json.dumps(entry), encoding="utf-8")
        docs += docs_per_prefix
        bin_total += b
        idx_total += x
        if advance is not None:
            advance(1)
    info = {"artifact_format": "openeuro-longctx-megatron-v1", "tokenizer_type": "HuggingFaceTokenizer",
            "tokenizer_model": "openeurollm/tokenizer-256k", "vocab_size": VOCAB}  # fmt: skip
    (root / "manifests").mkdir()
    (root / "manifests" / "build_info.json").write_text(json.dumps(info), encoding="utf-8")
    return docs, bin_total, idx_total


def raw_read_files(paths: Sequence[Path], block_bytes: int = 4 * 2**20) -> float:
    """Seconds to read the files sequentially into one reusable buffer (open and close included)."""
    buf = bytearray(block_bytes)
    view = memoryview(buf)
    start = time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            pos = 0
            while (n := os.preadv(fd, [view], pos)) > 0:
                pos += n
        finally:
            os.close(fd)
    return time.perf_counter() - start


def run_index_check_bench(
    n_prefixes: int = 2000,
    *,
    lengths: Sequence[int] = (16384, 65536, 131072),
    docs_per_prefix: int = 16,
    tmp_dir: str | None = None,
    keep: bool = False,
    workers: int | None = None,
    repeats: int = 3,
    big_gib: float = 0.0,
    advance: Callable[[int], None] | None = None,
) -> IndexCheckBench:
    workdir = Path(tempfile.mkdtemp(prefix="longctx-bench-index-", dir=tmp_dir))
    try:
        root = workdir / "artifact"
        t0 = time.perf_counter()
        docs, bin_bytes, idx_bytes = make_artifact(
            root, n_prefixes, docs_per_prefix=docs_per_prefix, advance=advance
        )
        create_s = time.perf_counter() - t0
        bins = sorted((root / "runs" / RUN / "bin").glob("*.bin"))
        raw_read_files(bins)  # warm the page cache
        kw = dict(lengths=lengths, vocab_size=VOCAB, eod_id=EOD, workers=workers, progress=False)
        best_index, index_ok = float("inf"), True
        for _ in range(repeats):
            start = time.perf_counter()
            rep = check_artifact(root, index_only=True, **kw)  # type: ignore[arg-type]
            best_index = min(best_index, time.perf_counter() - start)
            index_ok = index_ok and rep.ok and rep.checked == n_prefixes
        best_raw = min(raw_read_files(bins) for _ in range(repeats))
        best_full, full_ok = float("inf"), True
        for _ in range(repeats):
            start = time.perf_counter()
            rep = check_artifact(root, **kw)  # type: ignore[arg-type]
            best_full = min(best_full, time.perf_counter() - start)
            full_ok = full_ok and rep.ok
        big = None
        if big_gib > 0:
            r = run_data_check_bench(big_gib, tmp_dir=tmp_dir, workers=workers, repeats=repeats)
            big = {
                "bin_bytes": r.bin_bytes,
                "raw_gbps": r.raw_gbps,
                "check_gbps": r.check_gbps,
                "ratio": r.ratio,
            }
        return IndexCheckBench(
            path=str(root),
            prefixes=n_prefixes,
            documents=docs,
            idx_bytes=idx_bytes,
            bin_bytes=bin_bytes,
            lengths=list(lengths),
            create_seconds=create_s,
            index_seconds=best_index,
            prefixes_per_second=n_prefixes / best_index,
            index_ok=index_ok,
            full_seconds=best_full,
            full_gbps=bin_bytes / best_full / 1e9,
            raw_gbps=bin_bytes / best_raw / 1e9,
            ratio=best_raw / best_full,
            full_ok=full_ok,
            workers=workers or min(os.cpu_count() or 1, 8),
            big=big,
            host={"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        )
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
