"""Document-length statistics from an index: histogram, long-document shares, samples per length.

Everything is accumulated over chunks of document lengths, so memory stays bounded. Exact
percentiles need all lengths at once and are computed only up to `PERCENTILE_MAX_DOCS` documents.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from longctx.data.indexed import IndexInfo
from longctx.errors import DatasetError

# histogram edges (tokens): <512, 512-1K, …, 512K-1M, ≥1M
HIST_EDGES: tuple[int, ...] = tuple(512 << k for k in range(12))
PERCENTILE_MAX_DOCS = 64 * 1024 * 1024
PERCENTILES = (50, 90, 99)
MAX_DOC_TOKENS = 2**31 - 1  # a Megatron .idx stores sequence lengths as int32


@dataclasses.dataclass
class LengthCoverage:
    """How well a dataset serves samples of `length` tokens."""

    length: int
    documents_at_least: int  # documents with ≥ length tokens
    tokens_in_documents_at_least: int
    token_share: float  # of all tokens, the share sitting in documents ≥ length
    single_document_samples: int  # Σ ⌊len/length⌋: samples that lie within one document
    packed_samples: int  # ⌊(tokens − 1)/length⌋: samples per epoch as Megatron's GPTDataset packs them


@dataclasses.dataclass
class HistogramBin:
    lo: int
    hi: int | None  # None: unbounded
    documents: int
    tokens: int


@dataclasses.dataclass
class LengthStats:
    documents: int
    tokens: int
    min_length: int | None
    max_length: int | None
    mean_length: float | None
    percentiles: dict[int, int] | None
    histogram: list[HistogramBin]
    coverage: list[LengthCoverage]


def checked_lengths(lengths: Sequence[int]) -> list[int]:
    """Stage lengths sorted and deduplicated; refused when not positive or longer than any document."""
    wanted = sorted({int(n) for n in lengths})
    if any(n <= 0 for n in wanted):
        raise DatasetError(
            f"stage lengths must be positive, got {wanted}",
            where="--lengths",
            fix="give the stage sequence lengths, e.g. --lengths 16K,64K,128K",
        )
    if wanted and wanted[-1] > MAX_DOC_TOKENS:
        raise DatasetError(
            f"stage length {wanted[-1]:,} is longer than any Megatron document can be ({MAX_DOC_TOKENS:,} tokens)",
            where="--lengths",
            fix="give the stage sequence lengths, e.g. --lengths 16K,64K,128K",
        )
    return wanted


def label(n: int) -> str:
    """16384 → '16K', 1048576 → '1M'."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def length_stats(info: IndexInfo, lengths: Sequence[int] = ()) -> LengthStats:
    return stats_from_chunks(info.iter_document_lengths(), info.documents, lengths)


def stats_from_chunks(
    chunks: Iterable[np.ndarray], documents: int, lengths: Sequence[int] = ()
) -> LengthStats:
    edges = np.asarray(HIST_EDGES, dtype=np.int64)
    nbins = len(HIST_EDGES) + 1
    hist_docs = np.zeros(nbins, dtype=np.int64)
    hist_tokens = np.zeros(nbins, dtype=np.int64)
    wanted = sorted(set(int(x) for x in lengths))
    at_least = np.zeros(len(wanted), dtype=np.int64)
    tokens_at_least = np.zeros(len(wanted), dtype=np.int64)
    single = np.zeros(len(wanted), dtype=np.int64)
    total_docs = total_tokens = 0
    lo = hi = None
    keep = documents <= PERCENTILE_MAX_DOCS
    kept: list[np.ndarray] = []
    for chunk in chunks:
        if chunk.size == 0:
            continue
        c = np.asarray(chunk, dtype=np.int64)
        total_docs += c.size
        total_tokens += int(c.sum())
        cmin, cmax = int(c.min()), int(c.max())
        lo = cmin if lo is None else min(lo, cmin)
        hi = cmax if hi is None else max(hi, cmax)
        b = np.searchsorted(edges, c, side="right")
        hist_docs += np.bincount(b, minlength=nbins)
        hist_tokens += np.bincount(b, weights=c, minlength=nbins).astype(np.int64)
        for i, n in enumerate(wanted):
            mask = c >= n
            at_least[i] += int(np.count_nonzero(mask))
            sel = c[mask]
            tokens_at_least[i] += int(sel.sum())
            single[i] += int((sel // n).sum())
        if keep:
            kept.append(c.astype(np.int32) if cmax < 2**31 else c)
    pct = None
    if keep and kept:
        allv = np.concatenate(kept)
        pct = {
            p: int(v)
            for p, v in zip(PERCENTILES, np.percentile(allv, PERCENTILES, method="lower"), strict=True)
        }
    bounds = [0, *HIST_EDGES]
    histogram = [
        HistogramBin(
            lo=bounds[i],
            hi=HIST_EDGES[i] if i < len(HIST_EDGES) else None,
            documents=int(hist_docs[i]),
            tokens=int(hist_tokens[i]),
        )
        for i in range(nbins)
    ]
    coverage = [
        LengthCoverage(
            length=n,
            documents_at_least=int(at_least[i]),
            tokens_in_documents_at_least=int(tokens_at_least[i]),
            token_share=(int(tokens_at_least[i]) / total_tokens) if total_tokens else 0.0,
            single_document_samples=int(single[i]),
            packed_samples=max(total_tokens - 1, 0) // n,
        )
        for i, n in enumerate(wanted)
    ]
    return LengthStats(
        documents=total_docs,
        tokens=total_tokens,
        min_length=lo,
        max_length=hi,
        mean_length=(total_tokens / total_docs) if total_docs else None,
        percentiles=pct,
        histogram=histogram,
        coverage=coverage,
    )
