"""How fast the Men search and `suggest` are, against the plain definition measured in the same run."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from longctx.rope import cossum
from longctx.rope.suggest import suggest


@dataclass
class RopeBench:
    rotary_dim: int
    lengths: list[int]
    #: seconds of `suggest` over all lengths, starting from an empty search cache
    suggest_s: float
    #: seconds of the exact search per length
    search_s: dict[int, float] = field(default_factory=dict)
    baseline_length: int = 0
    #: the plain search (one cosine per position and frequency, ascending chunks) at baseline_length
    baseline_s: float = 0.0
    fast_at_baseline_s: float = 0.0
    same_answer: bool = True

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.fast_at_baseline_s if self.fast_at_baseline_s else float("nan")


def plain_first_pass(length: int, rotary_dim: int, chunk: int = 4096) -> int:
    """The search written the obvious way: same grid, Σcos evaluated position by position, ascending."""
    k = cossum.grid_index(cossum.scan_start(length))
    while True:
        base = float(cossum.grid_bases(k, 1)[0])
        theta = cossum.inv_freq(base, rotary_dim)
        ok = True
        for start in range(0, length, chunk):
            m = np.arange(start, min(length, start + chunk), dtype=np.float64)
            if (np.cos(np.outer(m, theta)).sum(axis=1) < 0).any():
                ok = False
                break
        if ok:
            return int(base)
        k += 1


def run(
    lengths: Sequence[int] = (16_384, 32_768, 65_536, 131_072),
    *,
    rotary_dim: int = 128,
    pretrain_base: int = 100_000,
    pretrain_length: int = 4_096,
    baseline_length: int = 4_096,
) -> RopeBench:
    start = min(pretrain_length, *lengths)  # short benchmark lengths start from themselves
    cossum.men_exact_bound.cache_clear()
    t0 = time.perf_counter()
    suggest(rotary_dim=rotary_dim, pretrain_base=pretrain_base, pretrain_length=start, lengths=lengths)
    out = RopeBench(rotary_dim, sorted(lengths), time.perf_counter() - t0, baseline_length=baseline_length)
    for n in out.lengths:
        cossum.men_exact_bound.cache_clear()
        t0 = time.perf_counter()
        cossum.men_exact_bound(n, rotary_dim)
        out.search_s[n] = time.perf_counter() - t0
    cossum.men_exact_bound.cache_clear()
    t0 = time.perf_counter()
    fast = cossum.men_exact_bound(baseline_length, rotary_dim)
    out.fast_at_baseline_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain = plain_first_pass(baseline_length, rotary_dim)
    out.baseline_s = time.perf_counter() - t0
    out.same_answer = fast == plain
    return out
