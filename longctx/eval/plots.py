"""Plots of an EvalReport (matplotlib, Agg): the NIAH heatmap and loss by position."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np

from longctx.eval.results import CheckpointEval, EvalReport
from longctx.util.fs import atomic_write_bytes
from longctx.util.units import human_length


def _plt():
    # matplotlib loads only when a plot is drawn (a slow import), with the Agg backend chosen first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


@dataclasses.dataclass
class NiahPanel:
    """What one checkpoint's heatmap panel shows: `colour[i, j]` (depth i, length j) is the greedy
    exact-match accuracy, the headline measure (the effective length is read from it); `text` is each
    cell's label (greedy, the log-likelihood accuracy when distractors were scored, the margin);
    `hatched` the cells whose greedy 95 % interval reaches chance (no key retrieved: the colour tells
    nothing apart from guessing); `~` before `ll` where the log-likelihood interval reaches chance.
    NaN / "" where nothing was measured."""

    colour: np.ndarray
    text: list[list[str]]
    hatched: list[tuple[int, int]]


def niah_panel(ce: CheckpointEval, depths: list[float], lengths: list[int]) -> NiahPanel:
    colour = np.full((len(depths), len(lengths)), np.nan)
    text = [["" for _ in lengths] for _ in depths]
    hatched: list[tuple[int, int]] = []
    for j, n in enumerate(lengths):
        r = ce.at(n)
        if r is None:
            continue
        greedy_chance, loglik_chance = (
            r.passkey.greedy_depths_at_chance(),
            r.passkey.loglik_depths_at_chance(),
        )
        for c in r.passkey.cells:
            i = depths.index(c.depth)
            colour[i, j] = c.greedy_accuracy
            margin = c.loglik_margin if c.loglik_margin is not None else c.token_margin
            if c.depth in greedy_chance:
                hatched.append((i, j))
            ll = ""
            if c.loglik_accuracy is not None:
                ll = f"{'~' if c.depth in loglik_chance else ''}ll {c.loglik_accuracy:.0%}  "
            text[i][j] = f"g {c.greedy_hits}/{c.keys}\n{ll}{margin:+.1f}"
    return NiahPanel(colour, text, hatched)


def task_panel(ce: CheckpointEval, task: str, depths: list[float], lengths: list[int]) -> NiahPanel:
    """A needle task's panel: colour = the share of hits per (depth, length) — for the absent-name control,
    the share of answers returning a present key — and each cell's count as text."""
    colour = np.full((len(depths), len(lengths)), np.nan)
    text = [["" for _ in lengths] for _ in depths]
    for j, n in enumerate(lengths):
        r = ce.at(n)
        t = None if r is None else r.task(task)
        if t is None:
            continue
        for c in t.cells:
            i = depths.index(c.depth)
            count = c.present if t.control else c.hits
            colour[i, j] = count / c.items if c.items else np.nan
            text[i][j] = f"{'p' if t.control else 'g'} {count}/{c.items}"
    return NiahPanel(colour, text, [])


def _draw_panel(plt, ax, panel: NiahPanel, ce: CheckpointEval, depths: list[float], lengths: list[int]):
    for i, j in panel.hatched:  # hatched: the interval reaches chance, the colour means nothing
        ax.add_patch(
            plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="////", edgecolor="0.45", linewidth=0)
        )
    for i, row in enumerate(panel.text):
        for j, label in enumerate(row):
            if label:
                ax.text(j, i, label, ha="center", va="center", fontsize=7, color="black")
    image = ax.imshow(panel.colour, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels(
        [human_length(n) + ("*" if (r := ce.at(n)) is not None and r.extrapolated else "") for n in lengths]
    )
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    return image


def _task_title(report: EvalReport, ce: CheckpointEval, task: str) -> str:
    t = next(x for x in report.task_summary if x.checkpoint == ce.label and x.task == task)
    if t.control:
        return f"{task} — {ce.label}\ncontrol: colour = answers returning a present key"
    eff = [human_length(n) if n else "none" for n in (t.ruler_effective_length, t.relative_effective_length)]
    return f"{task} — {ce.label}\neffective: RULER {eff[0]}, relative {eff[1]}"


def plot_niah(report: EvalReport, path: Path) -> Path:
    """`niah_figure`, saved as a PNG at `path`."""
    return _save(niah_figure(report), path)


def niah_figure(report: EvalReport):
    """One panel per checkpoint: needle depth (rows) × length (columns), colour = greedy exact-match
    accuracy (`niah_panel`), the measure the effective length is read from; with needle tasks beyond
    `single`, one row of panels per task (`task_panel`).

    Each cell shows the greedy count, the mean margin and the log-likelihood accuracy; lengths beyond a
    checkpoint's trained window are marked with '*'."""
    plt = _plt()
    evals = [ce for ce in report.checkpoints if ce.results]
    depths = sorted({c.depth for ce in evals for r in ce.results for c in r.passkey.cells})
    lengths = report.lengths
    tasks = report.settings.tasks
    fig, axes = plt.subplots(
        len(tasks),
        len(evals),
        figsize=(
            1.2 + 1.25 * len(lengths) * len(evals) + 0.6 * len(evals),
            (1.2 + 0.62 * len(depths)) * len(tasks),
        ),
        squeeze=False,
    )
    image = None
    for ax, ce in zip(axes[0], evals, strict=True):
        image = _draw_panel(plt, ax, niah_panel(ce, depths, lengths), ce, depths, lengths)
        window = f"trained ≤ {human_length(ce.trained_length)}" if ce.trained_length else ""
        every = ce.every_depth_effective_length
        eff = human_length(every) if every else "none"
        head = "single — " if len(tasks) > 1 else ""
        ax.set_title(
            f"{head}{ce.label}: all depths ≥90 % to {eff}\n{window}, θ = {ce.rotary_base:,}", fontsize=9
        )
    for row, task in enumerate(tasks[1:], start=1):
        for ax, ce in zip(axes[row], evals, strict=True):
            _draw_panel(plt, ax, task_panel(ce, task, depths, lengths), ce, depths, lengths)
            ax.set_title(_task_title(report, ce, task), fontsize=9)
    for row in axes:
        row[0].set_ylabel("needle depth")
    if len(tasks) > 1:  # room for each row's two-line titles under the x labels of the row above
        fig.subplots_adjust(hspace=0.6, top=1.0 - 0.9 / fig.get_figheight())
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), fraction=0.04, pad=0.02, label="greedy exact-match accuracy")
    ll = (
        f"; ll = log-likelihood vs {report.settings.distractors} distractors"
        if report.settings.distractors
        else ""
    )
    fig.suptitle(
        f"passkey retrieval (colour = greedy exact match; g = greedy exact keys, ± = margin in nats{ll}; "
        "* beyond trained window)\nhatched = greedy 95 % interval reaches chance, ~ll = its log-likelihood "
        "interval does; all depths ≥90 % to N = the every-depth effective length, greedy ≥ "
        f"{report.every_depth_threshold:.0%} at every depth up to N",
        fontsize=9,
        y=1.0 + 0.35 / fig.get_figheight(),
    )
    return fig


def _common_length(evals: list[CheckpointEval], lengths: list[int]) -> int | None:
    for n in sorted(lengths, reverse=True):
        if all(ce.at(n) is not None for ce in evals):
            return n
    return None


def plot_loss_by_position(report: EvalReport, path: Path) -> Path:
    """One line per checkpoint: mean held-out loss per position bucket at the longest length all of
    them were evaluated at; dotted verticals at each checkpoint's trained window. With packed-window
    results, a second panel: loss by window position on windows of several documents, attention
    across documents (solid) vs within documents (dashed)."""
    plt = _plt()
    evals = [ce for ce in report.checkpoints if any(r.position is not None for r in ce.results)]
    n = _common_length(evals, report.lengths) or max(r.length for ce in evals for r in ce.results)
    shown = {ce.label: ce.at(n) or max(ce.results, key=lambda x: x.length) for ce in evals}
    packed_of = {label: r.packed for label, r in shown.items() if r.packed is not None}
    # left: the curves over the change from the previous checkpoint; right (packed windows): across vs within
    fig = plt.figure(figsize=(13.5 if packed_of else 7.5, 6.4))
    grid = fig.add_gridspec(2, 2 if packed_of else 1, height_ratios=(2.2, 1))
    ax = fig.add_subplot(grid[0, 0])
    axd = fig.add_subplot(grid[1, 0], sharex=ax)
    ax2 = fig.add_subplot(grid[:, 1]) if packed_of else None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    packed = False
    for k, ce in enumerate(evals):
        r = ce.at(n) or max(ce.results, key=lambda x: x.length)
        pos = r.position
        packed = packed or pos.packed
        xs = [x for x, y in zip(pos.centers(), pos.loss, strict=True) if y is not None]
        ys = [y for y in pos.loss if y is not None]
        color = colors[k % len(colors)]
        ax.plot(xs, ys, marker="o", markersize=3, color=color, label=f"{ce.label} (θ {ce.rotary_base:,})")
        if ce.trained_length and ce.trained_length < pos.length:
            ax.axvline(ce.trained_length, color=color, linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_ylabel("mean token loss (nats)")
    source = "held-out documents packed back to back" if packed else "held-out documents"
    ax.set_title(
        f"loss by position at length {human_length(n)} ({source}); dotted: trained window", fontsize=9
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _difference_panel(axd, [shown[ce.label].position for ce in evals], [ce.label for ce in evals], colors)
    if ax2 is not None:
        _packed_panel(ax2, evals, packed_of, colors)
    return _save(fig, path)


def _difference_panel(ax, positions: list, labels: list[str], colors: list[str]) -> None:
    """Each checkpoint's loss minus the previous one's, per position bucket (same buckets and documents):
    where along the sequence a stage gained (below 0) or lost."""
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    for k in range(1, len(positions)):
        cur, prev = positions[k], positions[k - 1]
        if cur.buckets != prev.buckets:
            continue  # measured at different lengths: no bucket-by-bucket difference
        pts = [
            (x, a - b)
            for x, a, b in zip(cur.centers(), cur.loss, prev.loss, strict=True)
            if a is not None and b is not None
        ]
        if pts:
            ax.plot(
                *zip(*pts, strict=True),
                marker="o",
                markersize=3,
                color=colors[k % len(colors)],
                label=f"{labels[k]} − {labels[k - 1]}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the sequence (tokens)")
    ax.set_ylabel("Δ loss vs previous")
    ax.grid(True, which="both", alpha=0.3)
    if len(positions) > 1:
        ax.legend(fontsize=7)


def _packed_panel(ax, evals: list[CheckpointEval], packed_of: dict, colors: list[str]) -> None:
    length = 0
    for k, ce in enumerate(evals):
        pk = packed_of.get(ce.label)
        if pk is None:
            continue
        length = max(length, pk.length)
        color = colors[k % len(colors)]
        for ys_all, style, how in ((pk.plain, "-", "across"), (pk.within, "--", "within")):
            xs = [x for x, y in zip(pk.centers(), ys_all, strict=True) if y is not None]
            ys = [y for y in ys_all if y is not None]
            ax.plot(
                xs, ys, linestyle=style, marker="o", markersize=2.5, color=color, label=f"{ce.label}, {how}"
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window (tokens)")
    ax.set_ylabel("mean token loss (nats)")
    ax.set_title(
        f"windows of several held-out documents at {human_length(length)}: attention across (solid) "
        "vs within documents (dashed)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


def plot_elbo_by_context(report: EvalReport, path: Path) -> Path:
    """Diffusion models: one line per checkpoint, the ELBO of the target window (nats per token) against
    the clean context around it, at the longest length each was evaluated at; left the mean over the
    noise levels, right the lowest level alone (the window almost clean: what the context adds)."""
    plt = _plt()
    fig, (ax, ax_low) = plt.subplots(1, 2, figsize=(12.5, 5.0))
    low = report.settings.elbo_levels[0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, ce in enumerate(report.checkpoints):
        measured = [r for r in ce.results if r.context_elbo is not None]
        if not measured:
            continue
        r = max(measured, key=lambda x: x.length)
        ce_elbo = r.context_elbo
        if ce_elbo is None:
            continue
        xs = [max(c, 1) for c in ce_elbo.contexts]  # 0 on a log axis at 1
        color = colors[k % len(colors)]
        label = f"{ce.label} ({human_length(r.length)})"
        ax.plot(xs, ce_elbo.elbo, marker="o", markersize=3, color=color, label=label)
        ax_low.plot(
            xs, [row[0] for row in ce_elbo.elbo_by_t], marker="o", markersize=3, color=color, label=label
        )
        if ce.trained_length:
            for a in (ax, ax_low):
                a.axvline(ce.trained_length, color=color, linestyle=":", linewidth=1)
    for a, title in ((ax, "mean over the noise levels"), (ax_low, f"lowest noise level t = {low:g}")):
        a.set_xscale("log", base=2)
        a.set_xlabel("clean context around the window (tokens; 0 at the left edge)")
        a.set_ylabel("ELBO of the window (nats per token)")
        a.set_title(title, fontsize=9)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    return _save(fig, path)
