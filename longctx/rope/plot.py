"""Plot of the cos-sum B(m) for chosen bases, with the target lengths marked (matplotlib, Agg)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from longctx.errors import RopeError
from longctx.rope import cossum
from longctx.util.fs import atomic_write_bytes

if TYPE_CHECKING:  # matplotlib is loaded lazily, in plot_cos_sum
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


@dataclass
class PlotResult:
    out: Path
    rotary_dim: int
    head_dim: int | None
    lengths: list[int]
    max_position: int
    #: {base: first m < max_position with B(m) < 0, or None}
    first_failing_position: dict[int, int | None] = field(default_factory=dict)
    #: {base: min of B below max_position}
    min_cos_sum: dict[int, float] = field(default_factory=dict)


def _envelope(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin min and max, so that one-position dips stay visible at any zoom."""
    n = values.size
    bins = max(1, min(bins, n))
    edges = np.linspace(0, n, bins + 1).astype(int)
    lo = np.minimum.reduceat(values, edges[:-1])
    hi = np.maximum.reduceat(values, edges[:-1])
    return edges[:-1], lo, hi


def plot_cos_sum(
    bases: Sequence[int],
    rotary_dim: int,
    lengths: Sequence[int],
    out: str | Path,
    *,
    head_dim: int | None = None,
    max_position: int | None = None,
    bins: int = 1500,
) -> PlotResult:
    """Draw B(m) = Σ_i cos(m·θ_i) (+ unrotated pairs) for each base up to max_position (default 1.1 ×
    the longest length): the full curve on top, a zoom around zero below, target lengths as dashed
    lines and each base's first failing position as a dot. Writes `out` atomically (.png/.svg/.pdf)."""
    # lazy: matplotlib is slow to load, and only drawing a plot needs it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out)
    fmt, top = _check_request(bases, rotary_dim, lengths, out, head_dim, max_position)
    result = PlotResult(out, rotary_dim, head_dim, sorted(lengths), top)

    fig = Figure(figsize=(11, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    full, zoom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1.3))
    lowest = 0.0
    for i, base in enumerate(bases):
        lowest = min(
            lowest, _draw_base(full, zoom, f"C{i % 10}", base, rotary_dim, top, head_dim, bins, result)
        )
    _mark_lengths(full, zoom, lengths)
    _label(fig, full, zoom, lowest, rotary_dim, head_dim, len(bases))
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120)
    atomic_write_bytes(out, buf.getvalue())
    return result


def _check_request(
    bases: Sequence[int],
    rotary_dim: int,
    lengths: Sequence[int],
    out: Path,
    head_dim: int | None,
    max_position: int | None,
) -> tuple[str, int]:
    """(image format, the last position drawn), or RopeError for a bad request."""
    fmt = _FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise RopeError(
            f"cannot tell the image format of {out}", fix="end the file name in .png, .svg or .pdf"
        )
    if not bases:
        raise RopeError("no bases to plot", fix="e.g. --bases 1000000,5000000")
    if not lengths:
        raise RopeError("no target lengths to mark", fix="e.g. --lengths 16K,64K,128K")
    cossum.check_dims(rotary_dim, head_dim)
    for n in lengths:
        cossum.check_length(n)
    top = int(max_position) if max_position else int(max(lengths) * 1.1)
    cossum.check_length(top, "max position")
    return fmt, top


def _draw_base(
    full: Axes,
    zoom: Axes,
    color: str,
    base: int,
    rotary_dim: int,
    top: int,
    head_dim: int | None,
    bins: int,
    result: PlotResult,
) -> float:
    """One base's curve (its envelope) on both axes, recorded in `result`; returns the curve's minimum."""
    cossum.check_base(base)
    values = cossum.cos_sum_curve(base, rotary_dim, top, head_dim=head_dim)
    x, lo, hi = _envelope(values, bins)
    neg = np.flatnonzero(values < 0)
    first = int(neg[0]) if neg.size else None
    result.first_failing_position[int(base)] = first
    result.min_cos_sum[int(base)] = float(values.min())
    label = f"base {int(base):,}" + (f" (first < 0 at {first:,})" if first is not None else " (never < 0)")
    for ax in (full, zoom):
        ax.fill_between(x, lo, hi, color=color, alpha=0.25, linewidth=0)
        ax.plot(x, lo, color=color, linewidth=0.8, label=label if ax is full else None)
        if first is not None:
            ax.plot([first], [values[first]], "o", color=color, markersize=4)
    return float(values.min())


def _mark_lengths(full: Axes, zoom: Axes, lengths: Sequence[int]) -> None:
    """Zero line, grid, and a dashed line per target length (labelled on the full view)."""
    for ax in (full, zoom):
        ax.axhline(0.0, color="black", linewidth=0.8)
        for n in sorted(set(lengths)):
            ax.axvline(n, color="grey", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    for n in sorted(set(lengths)):
        full.annotate(
            f"{n:,}",
            (n, 1.0),
            xycoords=("data", "axes fraction"),
            ha="right",
            va="top",
            fontsize=8,
            rotation=90,
        )


def _label(
    fig: Figure, full: Axes, zoom: Axes, lowest: float, rotary_dim: int, head_dim: int | None, n_bases: int
) -> None:
    """The zoom's range (down to the lowest dip), axis labels, title and legend."""
    bottom = min(-1.0, 1.2 * lowest)
    zoom.set_ylim(bottom, -1.5 * bottom)
    full.set_ylabel("Σ cos(m·θ_i)")
    zoom.set_ylabel("zoom around 0")
    zoom.set_xlabel("relative position m")
    dims = f"rotary dim {rotary_dim}" + ("" if head_dim in (None, rotary_dim) else f" of head dim {head_dim}")
    fig.suptitle(f"RoPE cos-sum (Men et al.): must stay ≥ 0 below the context length — {dims}")
    fig.legend(loc="outside lower center", ncols=min(3, n_bases), fontsize=8)
