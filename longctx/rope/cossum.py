"""The cos-sum B(m) = Σ_i cos(m·θ_i) of Men et al. and the searches built on it.

B(m) is, up to a constant, how much more attention a query gives a similar key than a random one at
relative distance m. Men et al. require B(m) ≥ 0 for every m below the context length. Partial rotary
embeddings add one term cos(0) = 1 per pair of dimensions left unrotated, so B carries an offset of
(head_dim − rotary_dim) / 2.

Everything is float64 with θ_i = base^(−2i/d). The position axis is evaluated as blocks
m = m0 + k, k < block, through cos(m0θ + kθ) = cos m0θ·cos kθ − sin m0θ·sin kθ: one small table of
cos/sin(kθ) per base, then a product with [cos m0θ, sin m0θ] per block. That costs 2F trigonometric
calls per block instead of one per (position, frequency). Values this
close to zero (|B| < `_REFINE_TOL`) are recomputed directly as Σ cos(m·θ_i) so that the sign matches
the plain definition.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from longctx.errors import RopeError
from longctx.rope.base_bound import MAX_BASE

# Positions per block; the per-base table is (_BLOCK, 2F) floats.
_BLOCK = 128
# Direct recomputation for values this close to zero: block products and the direct sum round
# m·θ differently and differ by ~3e-10 at m = 1e6, ~1.5e-9 at m = 4e6 (grows with m).
_REFINE_TOL = 1e-7
# Ratio of the geometric grid that the Men search walks (0.2 % steps).
GRID_RATIO = 1.002
# The search gives up above the largest base longctx accepts (float64 θ_i stay meaningful far beyond it).
_MAX_BASE = float(MAX_BASE)


def inv_freq(base: float, rotary_dim: int) -> np.ndarray:
    """θ_i = base^(−2i/d), i = 0 … d/2 − 1, in float64 (Megatron and HF use the same formula)."""
    return np.asarray(base, dtype=np.float64) ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def cos_sum_direct(theta: np.ndarray, positions: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """B(m) by the definition, one cosine per (position, frequency); the reference for the fast path."""
    m = np.asarray(positions, dtype=np.float64)
    return np.cos(np.multiply.outer(m, theta)).sum(axis=-1) + offset


class _Blocks:
    """Evaluates B over whole blocks of positions for one or more frequency vectors at once."""

    def __init__(self, thetas: np.ndarray, offset: float, block: int = _BLOCK) -> None:
        self.thetas = np.atleast_2d(np.asarray(thetas, dtype=np.float64))  # (n, F)
        self.offset = float(offset)
        self.block = block
        # cos/sin(kθ) for k < block by doubling: rows [h, 2h) are rows [0, h) turned by hθ, with
        # cos/sin(hθ) computed directly, so each entry is a product of at most log2(block) exact turns.
        n, f = self.thetas.shape
        table = np.empty((n, block, 2 * f))
        cos_k, nsin_k = table[:, :, :f], table[:, :, f:]  # columns [cos kθ, −sin kθ]
        cos_k[:, 0] = 1.0
        nsin_k[:, 0] = 0.0
        h = 1
        while h < block:
            w = min(h, block - h)
            c = np.cos(self.thetas * h)[:, None, :]
            s = np.sin(self.thetas * h)[:, None, :]
            cos_k[:, h : h + w] = cos_k[:, :w] * c + nsin_k[:, :w] * s
            nsin_k[:, h : h + w] = nsin_k[:, :w] * c - cos_k[:, :w] * s
            h *= 2
        # [cos m0θ, sin m0θ] · row k = Σ cos((m0 + k)θ)
        self.table = table  # (n, block, 2F)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the bases where mask is False (tables shrink as bases fail)."""
        self.thetas = self.thetas[mask]
        self.table = self.table[mask]

    def values(self, starts: np.ndarray) -> np.ndarray:
        """B at starts[r, g] + k for each base r, group g and k < block → (r, g, block)."""
        thetas, table = self.thetas, self.table
        starts = np.asarray(starts, dtype=np.float64)
        phase = starts[:, :, None] * thetas[:, None, :]  # (r, g, F)
        anchors = np.concatenate([np.cos(phase), np.sin(phase)], axis=2)  # (r, g, 2F)
        # einsum's own loop rather than BLAS: the products are small, and a threaded BLAS spends more
        # on waking (and spinning) its threads than on the arithmetic.
        out = np.einsum("rgf,rkf->rgk", anchors, table)  # (r, g, block)
        if self.offset:
            out += self.offset
        near = np.abs(out) < _REFINE_TOL
        if near.any():
            r_idx, g_idx, k_idx = np.nonzero(near)
            pos = starts[r_idx, g_idx] + k_idx
            out[r_idx, g_idx, k_idx] = np.cos(pos[:, None] * thetas[r_idx]).sum(axis=1) + self.offset
        return out


@dataclass(frozen=True)
class CosSumScan:
    """B over positions [0, length): its minimum and where it is first negative."""

    minimum: float
    argmin: int
    first_negative: int | None


def check_dims(rotary_dim: int, head_dim: int | None = None) -> float:
    """Validate the dimensions; return the cos-sum offset of the unrotated pairs."""
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, np.integer)) or rotary_dim < 4:
        raise RopeError(
            f"rotary dim must be an even integer of at least 4, got {rotary_dim!r}",
            fix="pass kv_channels × rotary_percent, e.g. 128 for head dim 128 with full rotary",
        )
    if rotary_dim % 2:
        raise RopeError(
            f"rotary dim must be even (RoPE turns pairs of dimensions), got {rotary_dim}",
            fix="pass kv_channels × rotary_percent, which Megatron requires to be even",
        )
    if head_dim is None:
        return 0.0
    if head_dim < rotary_dim or head_dim % 2:
        raise RopeError(
            f"head dim must be even and at least the rotary dim, got head dim {head_dim}, rotary dim {rotary_dim}",
            fix="head dim is kv_channels; rotary dim is kv_channels × rotary_percent",
        )
    return (head_dim - rotary_dim) / 2.0


# 16M tokens: beyond every released context window; a scan over every offset takes about a minute there
MAX_LENGTH = 1 << 24


def check_length(length: int, what: str = "length") -> None:
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length <= 0:
        raise RopeError(
            f"{what} must be a positive integer, got {length!r}", fix="e.g. 16384 or 16K on the CLI"
        )
    if length > MAX_LENGTH:
        raise RopeError(
            f"{what} {length:,} is beyond what longctx plans for ({MAX_LENGTH:,} tokens; the cos-sum "
            "scan visits every offset up to it)",
            fix=f"use lengths up to {MAX_LENGTH:,} (16M) tokens",
        )


def check_base(base: float) -> None:
    if not (isinstance(base, (int, float, np.integer, np.floating)) and math.isfinite(base) and base > 1):
        raise RopeError(
            f"rotary base must be a number greater than 1, got {base!r}", fix="e.g. 10000 or 1000000"
        )


def _block_starts(stop: int, block: int, start: int = 0) -> Iterator[np.ndarray]:
    """Ascending groups of block starts covering [start, stop), doubling the group size as it goes."""
    first = start - start % block
    n_blocks = -(-(stop - first) // block)
    done, group = 0, 1
    while done < n_blocks:
        take = min(group, n_blocks - done)
        yield first + (done + np.arange(take)) * block
        done += take
        group = min(group * 2, 256)


def scan_frequencies(theta: np.ndarray, length: int, *, offset: float = 0.0) -> CosSumScan:
    """Minimum of B over m < length and the first m < length where B < 0, for any θ vector."""
    check_length(length)
    blocks = _Blocks(theta, offset)
    best, best_at, first_neg = math.inf, 0, None
    for starts in _block_starts(length, blocks.block):
        vals = blocks.values(starts[None, :])[0].ravel()
        pos0 = int(starts[0])
        vals = vals[: length - pos0]
        i = int(np.argmin(vals))
        if vals[i] < best:
            best, best_at = float(vals[i]), pos0 + i
        if first_neg is None:
            neg = np.flatnonzero(vals < 0)
            if neg.size:
                first_neg = pos0 + int(neg[0])
    return CosSumScan(minimum=best, argmin=best_at, first_negative=first_neg)


def first_negative(theta: np.ndarray, cap: int, *, offset: float = 0.0, start: int = 0) -> int | None:
    """First m in [start, cap) where B(m) < 0 for a θ vector, or None; stops at the first negative
    block. With start > 0 the caller vouches that B ≥ 0 below start."""
    if cap <= start:
        return None
    blocks = _Blocks(theta, offset)
    for starts in _block_starts(cap, blocks.block, start):
        vals = blocks.values(starts[None, :])[0].ravel()
        pos0 = int(starts[0])
        neg = np.flatnonzero(vals[: cap - pos0] < 0)
        if neg.size:
            return pos0 + int(neg[0])
    return None


def first_failing_position(
    base: float, rotary_dim: int, cap: int, *, head_dim: int | None = None
) -> int | None:
    """First position m < cap with Σ_i cos(m·base^(−2i/d)) < 0 (None if there is none below cap).

    This is L_max(base) of Men et al.: the longest context the base supports by their criterion.
    It is not monotone in the base (10 000 → 1707, 5e6 → 82 999 but 8e6 → 61 936 at d = 128).
    """
    offset = check_dims(rotary_dim, head_dim)
    check_base(base)
    check_length(cap, "search cap")
    return first_negative(inv_freq(base, rotary_dim), cap, offset=offset)


def cos_sum_scan(base: float, rotary_dim: int, length: int, *, head_dim: int | None = None) -> CosSumScan:
    """Minimum of the cos-sum below `length` (and where), plus its first negative position."""
    offset = check_dims(rotary_dim, head_dim)
    check_base(base)
    return scan_frequencies(inv_freq(base, rotary_dim), length, offset=offset)


def cos_sum(
    base: float, rotary_dim: int, positions: np.ndarray, *, head_dim: int | None = None
) -> np.ndarray:
    """B(m) at the given positions (direct evaluation; meant for plots and spot checks)."""
    offset = check_dims(rotary_dim, head_dim)
    return cos_sum_direct(inv_freq(base, rotary_dim), np.asarray(positions), offset)


def cos_sum_curve(base: float, rotary_dim: int, length: int, *, head_dim: int | None = None) -> np.ndarray:
    """B(m) for every m < length through the block evaluator (fast, for plots of long ranges)."""
    offset = check_dims(rotary_dim, head_dim)
    blocks = _Blocks(inv_freq(base, rotary_dim), offset)
    n_blocks = -(-length // blocks.block)
    out = np.empty(n_blocks * blocks.block)
    step = 256
    for g0 in range(0, n_blocks, step):
        starts = (g0 + np.arange(min(step, n_blocks - g0))) * blocks.block
        vals = blocks.values(starts[None, :])[0].ravel()
        out[g0 * blocks.block : g0 * blocks.block + vals.size] = vals
    return out[:length]


# --- the Men lower bound by search ----------------------------------------------------------------


def grid_index(base: float, ratio: float = GRID_RATIO) -> int:
    """Smallest k with ratio^k ≥ base."""
    return math.ceil(math.log(base) / math.log(ratio) - 1e-12)


def grid_bases(k0: int, count: int, ratio: float = GRID_RATIO) -> np.ndarray:
    """The integer bases round(ratio^k) for k0 ≤ k < k0 + count, ascending (repeats dropped).

    The grid is anchored at ratio^0 = 1, not at the length, so every length walks the same lattice.
    """
    bases = np.unique(np.rint(ratio ** np.arange(k0, k0 + count, dtype=np.float64)))
    return bases[bases >= 2]


def _survivors(blocks: _Blocks, lo: int, hi: int, max_group: int) -> np.ndarray:
    """Indices of the bases in `blocks` whose cos-sum stays ≥ 0 on [lo, hi), visiting blocks top-down.

    `blocks` is consumed: its tables shrink to the survivors.
    """
    size = blocks.block
    alive = np.arange(len(blocks.thetas))
    n_blocks = -(-(hi - lo) // size)
    done, group = 0, 1
    while alive.size and done < n_blocks:
        take = min(group, n_blocks - done)
        starts = hi - (done + 1 + np.arange(take)) * size  # descending; the last may start below lo
        vals = blocks.values(np.broadcast_to(starts, (alive.size, take)))
        if starts[-1] < lo:
            vals[:, -1, : lo - int(starts[-1])] = np.inf
        ok = (vals >= 0).all(axis=(1, 2))
        if not ok.all():
            alive = alive[ok]
            blocks.keep(ok)
        done += take
        group = min(group * 2, max_group)
    return alive


# (block size, positions from the top covered with it): most failing bases dip below zero within the
# top few dozen positions, so a cheap small-block table sorts them out; survivors get a larger table.
_SCAN_PHASES = ((32, 1024), (128, None))


def _first_passing(bases: np.ndarray, rotary_dim: int, length: int, offset: float) -> int | None:
    """Index of the smallest base whose cos-sum stays ≥ 0 on [0, length), or None.

    Failing bases mostly dip below zero near the top of the range (and bases far below the bound are
    negative almost everywhere), so blocks are visited from the top down, in growing groups, and a base
    leaves at its first negative value. The first phase screens the whole batch; the survivors then go
    on in ascending order, a few at a time, so that larger bases that also pass are not scanned in full.
    """
    alive = np.arange(len(bases))
    thetas = np.stack([inv_freq(b, rotary_dim) for b in bases])
    (size, depth), *rest = _SCAN_PHASES
    hi = length
    lo = 0 if depth is None else max(0, hi - depth)
    alive = alive[_survivors(_Blocks(thetas, offset, size), lo, hi, max_group=64)]
    for start in range(0, alive.size, _FINAL_CHUNK):
        chunk, chunk_hi = alive[start : start + _FINAL_CHUNK], lo
        for size, depth in rest:
            if not chunk.size or chunk_hi <= 0:
                break
            chunk_lo = 0 if depth is None else max(0, chunk_hi - depth)
            chunk = chunk[_survivors(_Blocks(thetas[chunk], offset, size), chunk_lo, chunk_hi, max_group=64)]
            chunk_hi = chunk_lo
        if chunk.size:
            return int(chunk[0])
    return None


# Survivors of the first phase finish in ascending chunks of this many bases.
_FINAL_CHUNK = 4


def scan_start(length: int) -> float:
    """Where the grid walk starts: the length itself.

    Walking from base 2 instead gives the same answers for rotary dims 4 … 256 and lengths 8 … 16K
    (tests/rope/test_cossum.py checks a sample); starting at L skips ~700–1000 hopeless grid points.
    """
    return float(max(length, 2))


@functools.lru_cache(maxsize=256)
def men_exact_bound(
    length: int, rotary_dim: int, *, head_dim: int | None = None, ratio: float = GRID_RATIO
) -> int:
    """Men et al.'s lower bound for `length`, by exact search: the first base on the grid that passes.

    The grid is the integer bases round(1.002^k) (0.2 % steps) from `length` upwards; the answer is
    the smallest one whose cos-sum is ≥ 0 at every m < length. The cos-sum is not monotone in the
    base: many grid points above the answer fail again through small dips near m ≈ length, and a
    finer grid can find a passing island slightly below it. The result is therefore a floor to the
    nearest 0.2 %, not a threshold above which every base passes.

    Returns 2 when the unrotated dimensions alone keep the sum non-negative (then no base can fail).
    """
    offset = check_dims(rotary_dim, head_dim)
    check_length(length)
    if offset >= rotary_dim / 2:
        return 2
    k, batch = grid_index(scan_start(length), ratio), 32
    k_max = grid_index(_MAX_BASE, ratio)
    while True:
        if k > k_max:
            raise RopeError(
                f"no base up to {_MAX_BASE:.0e} keeps the cos-sum non-negative below {length} "
                f"with rotary dim {rotary_dim}",
                fix="use a larger rotary dim or a shorter length",
            )
        bases = grid_bases(k, batch, ratio)
        first = _first_passing(bases, rotary_dim, length, offset)
        if first is not None:
            return int(bases[first])
        k += batch
        batch = min(batch * 2, 64)
