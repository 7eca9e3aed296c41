"""Which distances a stage's training actually shows the model, from the document lengths alone.

With `packing = "documents"` attention stays inside a document, so a window of S tokens trains the
distances its document pieces span, not 0 … S − 1: a piece cut from a document by the window's edges
spans fewer. RoPE is relative, so what a model has seen is a distance, whatever `reset_position_ids`
says. megatron-core tiles the stream of (shuffled) documents into windows of S + 1 tokens; this module
does the same with the lengths from the indexes (no token is read) and counts, per distance d, the
share of the training tokens that attend to a token d positions away:

- causal: a token at offset o of its piece sees the distances 0 … o;
- bidirectional: a token at offset o of a piece of ℓ sees 0 … max(o, ℓ − 1 − o).

With `packing = "concat"` every window is one piece of S. A distance that almost no training token
sees is where an evaluation at the full window meets attention it was never trained on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from longctx.data.indexed import require_tokens

# the top of the window: its last 1/TOP_FRACTION of distances
TOP_FRACTION = 32
# enough windows for shares of a fraction of a percent; a dataset with fewer is tiled whole
MAX_WINDOWS = 4096


@dataclasses.dataclass(frozen=True)
class DistanceCoverage:
    """Shares of training tokens that see at least each distance (`edges`), for one stage."""

    seq_length: int
    packing: str
    causal: bool
    windows: int
    edges: list[int]
    share: list[float]  # share[i]: fraction of the training tokens that see a distance ≥ edges[i]
    longest_piece: int  # the longest document piece any sampled window held

    @property
    def top_edge(self) -> int:
        return self.seq_length - self.seq_length // TOP_FRACTION

    @property
    def top_share(self) -> float:
        """Share of the tokens that see a distance in the top 1/TOP_FRACTION of the window."""
        return self.share_at(self.top_edge)

    def share_at(self, distance: int) -> float:
        i = int(np.searchsorted(np.asarray(self.edges), distance, side="right")) - 1
        return self.share[max(i, 0)]

    def summary(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "top_edge": self.top_edge, "top_share": self.top_share}


def _edges(seq_length: int) -> list[int]:
    step = max(1, seq_length // 64)
    return sorted({*range(0, seq_length, step), seq_length - seq_length // TOP_FRACTION, seq_length - 1})


def _pieces(
    lengths: np.ndarray, seq_length: int, windows: int, rng: np.random.Generator, name: str
) -> np.ndarray:
    """Lengths of the document pieces in `windows` consecutive windows of a shuffled pass over the
    documents (repeated passes when the data holds fewer tokens than the windows ask)."""
    require_tokens(name, lengths)  # each pass below then adds at least one token
    need = windows * seq_length + 1
    order: list[np.ndarray] = []
    total = 0
    while total < need:
        perm = lengths[rng.permutation(lengths.size)]
        order.append(perm)
        total += int(perm.sum())
    stream = np.concatenate(order)
    ends = np.cumsum(stream)
    starts = ends - stream
    out: list[np.ndarray] = []
    for w in range(windows):
        lo, hi = w * seq_length, (w + 1) * seq_length
        first, last = np.searchsorted(ends, lo, side="right"), np.searchsorted(starts, hi, side="left")
        pieces = np.minimum(ends[first:last], hi) - np.maximum(starts[first:last], lo)
        out.append(pieces[pieces > 0])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _seen(pieces: np.ndarray, edges: Sequence[int], causal: bool) -> np.ndarray:
    """Tokens that see a distance ≥ each edge, summed over the pieces."""
    counts = np.zeros(len(edges), dtype=np.float64)
    for i, d in enumerate(edges):
        if causal:  # offsets o ≥ d: ℓ − d of them
            counts[i] = np.clip(pieces - d, 0, None).sum()
        else:  # max(o, ℓ − 1 − o) ≥ d: all ℓ when ℓ − 1 ≥ 2d, else the 2(ℓ − d) outer ones
            full = pieces >= 2 * d + 1
            outer = np.clip(2 * (pieces - d), 0, None)
            counts[i] = np.where(full, pieces, np.minimum(outer, pieces)).sum()
    return counts


def distance_coverage(
    lengths: Sequence[np.ndarray],
    weights: Sequence[float],
    seq_length: int,
    *,
    packing: str,
    causal: bool,
    seed: int = 1234,
    names: Sequence[str] | None = None,
) -> DistanceCoverage:
    """The coverage of a blend: each dataset's document `lengths`, mixed by `weights` (`names` name them
    in the DatasetError refusing one without a token)."""
    edges = _edges(seq_length)
    if packing != "documents":
        share = [(seq_length - d) / seq_length if causal else 1.0 for d in edges]
        return DistanceCoverage(seq_length, packing, causal, 0, edges, share, seq_length)
    rng = np.random.default_rng(seed)
    total = np.zeros(len(edges))
    longest, used = 0, 0
    weight_sum = float(sum(weights)) or 1.0
    labels = list(names) if names is not None else [f"#{i + 1} of the blend" for i in range(len(lengths))]
    for lens, w, name in zip(lengths, weights, labels, strict=True):
        lens = np.asarray(lens, dtype=np.int64)
        windows = int(min(MAX_WINDOWS, max(1, lens.sum() // seq_length)))
        pieces = _pieces(lens, seq_length, windows, rng, name)
        if pieces.size == 0:
            continue
        used += windows
        longest = max(longest, int(pieces.max()))
        total += (w / weight_sum) * _seen(pieces, edges, causal) / float(windows * seq_length)
    return DistanceCoverage(seq_length, packing, causal, used, edges, [float(x) for x in total], longest)


__all__ = ["TOP_FRACTION", "DistanceCoverage", "distance_coverage"]
