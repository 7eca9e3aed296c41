"""`longctx bench attention --documents MIX`: the document bench from its options to one record.

run = run_documents(DocumentsOptions(mix="10%<4K", seq_lens=(16384,), cp=2, heads=8, kv_heads=8, head_dim=64))
run.to_json()    # the --json document
run.cases        # DocumentBenchCase per length (see `run_document_bench`)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from longctx.bench.attention import (
    DataMix,
    DocumentBenchCase,
    parse_document_mix,
    read_data_mix,
    run_document_bench,
)
from longctx.bench.memory_check import machine


@dataclasses.dataclass(frozen=True)
class DocumentsOptions:
    """What `bench attention --documents` measures."""

    mix: str
    """FRACTION<LENGTH, long-tail, or from:PATH[*N] (see `parse_document_mix`, `read_data_mix`)."""
    seq_lens: tuple[int, ...]
    cp: int
    heads: int
    kv_heads: int
    head_dim: int
    repeats: int = 3
    time_max_len: int = 16384
    processes: bool = False
    threads: int = 1
    warmup: int = 1


@dataclasses.dataclass
class DocumentsRun:
    """One document bench: its options, the data set's lengths (from:PATH), the cases and the machine."""

    options: DocumentsOptions
    data: DataMix | None
    cases: list[DocumentBenchCase]
    machine: dict[str, Any]
    load_before: float | None

    def data_line(self) -> str | None:
        """What the data set's document lengths look like (None: a synthetic mix)."""
        data = self.data
        if data is None:
            return None
        below, between, above = data.token_shares()
        return (
            f"data {data.path} ({len(data.prefixes)} prefix(es), lengths × {data.scale}): "
            f"{len(data.lengths):,} documents, {int(data.lengths.sum()):,} tokens; tokens in documents "
            f"< 4K {below:.0%}, 4K–16K {between:.0%}, ≥ 16K {above:.0%} (pooled; each window packed from "
            "documents drawn from these lengths)"
        )

    def to_json(self) -> dict[str, Any]:
        """The --json document."""
        cases = [
            {**asdict(c), **({"processes": _process_json(c.processes)} if c.processes else {})}
            for c in self.cases
        ]
        return {
            "mix": self.options.mix,
            "cp": self.options.cp,
            "cases": cases,
            "data": _data_json(self.data),
            "machine": self.machine,
            "load_avg_1m_before": self.load_before,
        }


def run_documents(options: DocumentsOptions, advance: Callable[[], None] = lambda: None) -> DocumentsRun:
    """Read the mix (or the data set's lengths), run the document bench, note the machine before and after."""
    o = options
    data = read_data_mix(o.mix) if o.mix.strip().startswith("from:") else None
    fraction, short_max = (-1.0, 0) if data else parse_document_mix(o.mix)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cases = run_document_bench(
        o.seq_lens,
        cp=o.cp,
        short_fraction=fraction,
        short_max=short_max,
        heads=o.heads,
        kv_heads=o.kv_heads,
        head_dim=o.head_dim,
        repeats=o.repeats,
        time_max_len=o.time_max_len,
        processes=o.processes,
        threads=o.threads,
        warmup=o.warmup,
        window=data.window if data else None,
        advance=advance,
    )
    return DocumentsRun(o, data, cases, machine(), load_before)


def _data_json(data: DataMix | None) -> dict[str, Any] | None:
    if data is None:
        return None
    shares = dict(zip(("below_4k", "4k_16k", "from_16k"), data.token_shares(), strict=True))
    return {
        "path": data.path,
        "prefixes": len(data.prefixes),
        "scale": data.scale,
        "documents": len(data.lengths),
        "tokens": int(data.lengths.sum()),
        "token_shares": shares,
    }


def _process_json(p: Any) -> dict[str, Any]:
    splits = {
        s.split: {
            **asdict(s),
            "rank_medians_s": s.rank_medians_s,
            "slowest_s": s.slowest_s,
            "slowest_cpu_s": s.slowest_cpu_s,
        }
        for s in (p.zigzag, p.balanced)
    }
    return {**asdict(p), **splits, "ratio": p.ratio, "cpu_ratio": p.cpu_ratio}
