"""One figure of a plan's training (matplotlib, Agg): loss against consumed tokens across every stage,
stage boundaries labelled with length and RoPE base, each launch of the ledger marked, and the learning
rate and tokens/s in panels below."""

from __future__ import annotations

import io
from pathlib import Path

from longctx.stage.curves import LaunchMark, PlanCurves, StageCurve
from longctx.util.fs import atomic_write_bytes
from longctx.util.units import human_length

# how each launch is marked: (marker, colour, legend label)
START_STYLE = {"first-launch": ("^", "tab:green", "first launch"), "resume": ("o", "tab:blue", "resume")}
END_STYLE = {
    "signal": ("v", "tab:orange", "stopped by a signal"),
    "stopped": ("s", "tab:gray", "stopped early (time/exit interval)"),
    "failed": ("X", "tab:red", "failed"),
}


def _plt():
    # matplotlib loads only when a figure is drawn (a slow import), with the Agg backend chosen first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tokens(x: float, _pos: object = None) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def _loss_at(curve: StageCurve, iteration: int) -> float | None:
    """The loss at (or just after) `iteration`, to place a launch's marker on its curve."""
    after = [p for p in curve.loss if p[0] >= iteration] or curve.loss[-1:]
    return after[0][2] if after else None


def _mark_launches(ax, curves: PlanCurves) -> None:
    by_name = {c.stage: c for c in curves.stages}
    seen: set[str] = set()
    for m in curves.launches:
        _mark(ax, by_name[m.stage], m, seen)


def _mark(ax, curve: StageCurve, m: LaunchMark, seen: set[str]) -> None:
    style = START_STYLE.get(m.action)
    y = _loss_at(curve, m.start_iteration)
    if style and y is not None:
        marker, colour, label = style
        ax.axvline(m.start_tokens, color=colour, lw=0.8, ls=":", alpha=0.7)
        # hollow and larger: a resume's ring surrounds the mark of the launch that stopped at the same point
        ax.plot(
            [m.start_tokens],
            [y],
            marker,
            color=colour,
            ms=14,
            mfc="none",
            mew=2,
            clip_on=False,
            label=None if label in seen else label,
        )
        seen.add(label)
    end = END_STYLE.get(m.ended)
    if end and m.end_tokens is not None and m.end_iteration is not None:
        y = _loss_at(curve, m.end_iteration)
        if y is not None:
            marker, colour, label = end
            ax.plot([m.end_tokens], [y], marker, color=colour, ms=9, label=None if label in seen else label)
            seen.add(label)


def _boundaries(axes, curves: PlanCurves) -> None:
    top = axes[0]
    for c in curves.stages:
        for ax in axes:
            ax.axvline(c.token_offset, color="black", lw=1.0, alpha=0.5)
        name = "" if c.stage == human_length(c.seq_length) or c.stage == str(c.seq_length) else f"{c.stage}: "
        top.annotate(
            f"{name}length {human_length(c.seq_length)}\nRoPE base {c.rotary_base:,}",
            xy=(c.token_offset, 0.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, 4),
            textcoords="offset points",
            va="bottom",
            ha="left",
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.7", "alpha": 0.85},
        )


def plot_curves(curves: PlanCurves, path: Path) -> Path:
    """Write the figure of `curves` to `path` (PNG, written atomically)."""
    plt = _plt()
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(3, 1, figsize=(10, 7.2), sharex=True, height_ratios=[3, 1.2, 1.2])
    loss_ax, lr_ax, tps_ax = axes
    for i, c in enumerate(curves.stages):
        colour = f"C{i % 10}"
        if c.loss:
            loss_ax.plot(
                [p[1] for p in c.loss],
                [p[2] for p in c.loss],
                color=colour,
                lw=1.4,
                label=f"{c.stage} loss ({c.source})",
            )
        if c.validation:
            loss_ax.plot(
                [p[1] for p in c.validation],
                [p[2] for p in c.validation],
                "D--",
                color=colour,
                ms=4,
                lw=1,
                label=f"{c.stage} validation loss ({human_length(c.seq_length)})",
            )
        if c.lr:
            lr_ax.plot([p[1] for p in c.lr], [p[2] for p in c.lr], color=colour, lw=1.2)
        if c.tokens_per_s:
            tps_ax.plot(
                [p[1] for p in c.tokens_per_s], [p[2] for p in c.tokens_per_s], ".", color=colour, ms=3
            )
    _boundaries(axes, curves)
    _mark_launches(loss_ax, curves)
    loss_ax.set_ylabel("lm loss")
    loss_ax.legend(fontsize=8, loc="upper right", framealpha=0.9)
    loss_ax.set_title(f"{curves.plan}: training across stages ({curves.run_dir})", fontsize=10)
    lr_ax.set_ylabel("learning rate")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    tps_ax.set_ylabel("tokens/s")
    tps_ax.yaxis.set_major_formatter(FuncFormatter(_tokens))
    tps_ax.set_xlabel("consumed tokens (plan)")
    tps_ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
    end = max(
        (c.token_offset + c.target_iterations * c.tokens_per_iteration for c in curves.stages), default=1
    )
    tps_ax.set_xlim(0, end * 1.01)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
