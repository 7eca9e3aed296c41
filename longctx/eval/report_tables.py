"""An EvalReport as a rich table (terminal) and a Markdown table (summary.md)."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from longctx.eval.results import EvalReport, TaskLength, TaskSummary
from longctx.util.table import TERMINAL_COLUMNS, narrow_table
from longctx.util.units import human_length

# a log or a pipe has no width: as wide as the CLI's console there (`longctx.cli._common`)
PIPE_COLUMNS = 180
# the NIAH heatmap (longctx.eval.plots.plot_niah) is coloured by the headline measure
HEATMAP_LEGEND = (
    "niah.png: colour = greedy exact-match accuracy, the log-likelihood accuracy in each cell's text"
)


def _cell(report: EvalReport, value: dict | None) -> str:
    """`~9/10 87% +1.20 │ 3.456*`: greedy exact keys / keys (the headline), the log-likelihood accuracy
    when distractors were scored, the margin, then the long-position loss (or a diffusion model's ELBO)."""
    if value is None:
        return "—"
    star = "*" if value["extrapolated"] else ""
    chance = "~" if value["depths_at_chance"] else ""
    acc = f"{chance}{value['greedy_hits']}/{value['keys']}"
    if report.settings.distractors:
        acc += f" ({value['passkey']:.0%} ll)"
    if value["long_loss"] is not None:
        return f"{acc} {value['margin']:+.2f} │ {value['long_loss']:.3f}{star}"
    # a diffusion model: the window's ELBO with the widest clean context instead of the long-position loss
    elbo = value.get("elbo_widest_context")
    return f"{acc} {value['margin']:+.2f} │ " + ("—" if elbo is None else f"elbo {elbo:.3f}") + star


def every_depth_header(report: EvalReport, sep: str = "\n") -> str:
    """The passkey table's effective-length column: its name and its rule (RULER's and the relative
    rule have their own columns in the needle-task table, so no two lengths share a heading)."""
    return f"effective{sep}all depths ≥{report.every_depth_threshold:.0%}"


def _effective(row: dict) -> str:
    n = row["every_depth_effective_length"]
    return "—" if n is None else human_length(n)


def _short(row: dict) -> str:
    if row["short_loss"] is None:
        return "—"
    delta, ci = row["short_delta_vs_base"], row.get("short_delta_interval")
    if delta is None:
        return f"{row['short_loss']:.3f}"
    interval = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
    return f"{row['short_loss']:.3f} ({delta:+.3f}{interval})"


def _packed(row: dict) -> str:
    pk = row.get("packed")
    if pk is None or pk["plain_later_loss"] is None:
        return "—"
    return f"{pk['plain_later_loss']:.3f} → {pk['within_later_loss']:.3f} @{pk['length']}"


def _has_packed(report: EvalReport) -> bool:
    return any(ce.packed_result() is not None for ce in report.checkpoints)


def _legend(report: EvalReport, *, terminal: bool = False) -> str:
    n = report.settings.distractors
    method = f"log-likelihood vs {n} distractors" if n else "greedy"
    if terminal:
        return _terminal_legend(report, method)
    text = (
        f"cells: greedy exact keys / keys (ll = accuracy by {method}) and margin in nats │ mean "
        "loss at positions ≥ length/2; ~ = the 95 % interval of some depth reaches chance; "
        f"* = beyond the checkpoint's trained window; {_every_depth_legend(report)}; "
        "short = loss on short held-out documents "
        f"(change vs base [95 % interval over the documents]); {HEATMAP_LEGEND}"
    )
    if any(r.context_elbo is not None for ce in report.checkpoints for r in ce.results):
        text += (
            "; elbo = diffusion models (passkey by infilling the restated key): the bound of a window "
            "(nats per token) with the widest clean context around it"
        )
    if _has_packed(report):
        text += (
            "; packed = windows of several held-out documents: loss on the documents after the "
            "first, attention across → within documents, @ window length"
        )
    return text


def _passkey_cell(report: EvalReport, value: dict | None) -> str:
    """`~9/10 87%*`: greedy exact keys / keys, the log-likelihood accuracy when distractors were scored;
    ~ when some depth's interval reaches chance, * beyond the trained window (margins are in --json)."""
    if value is None:
        return "—"
    chance = "~" if value["depths_at_chance"] else ""
    star = "*" if value["extrapolated"] else ""
    acc = f" {value['passkey']:.0%}" if report.settings.distractors else ""
    return f"{chance}{value['greedy_hits']}/{value['keys']}{acc}{star}"


def _loss_cell(value: dict | None) -> str:
    if value is None:
        return "—"
    star = "*" if value["extrapolated"] else ""
    if value["long_loss"] is not None:
        return f"{value['long_loss']:.3f}{star}"
    elbo = value.get("elbo_widest_context")  # a diffusion model: the window's bound with the widest context
    return ("—" if elbo is None else f"elbo {elbo:.3f}") + star


def _short_delta(row: dict) -> str:
    delta, ci = row["short_delta_vs_base"], row.get("short_delta_interval")
    if delta is None:
        return "—"
    return f"{delta:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def _title(report: EvalReport, what: str) -> str:
    return f"{what}{' — stage ' + report.stage if report.stage else ''} ({report.plan or 'no plan'})"


def report_tables(report: EvalReport) -> list[Table]:
    """The report in tables that fit 100 columns: passkey, loss by length, short-context/packed."""
    rows = report.table()
    lengths = [human_length(n) for n in report.lengths]
    passkey = narrow_table(_title(report, "passkey"))
    loss = narrow_table(_title(report, "loss at positions ≥ length/2"))
    for table in (passkey, loss):
        table.add_column("checkpoint", overflow="fold")
        table.add_column("trained", justify="right")
        for n in lengths:
            table.add_column(n, justify="right")
    passkey.add_column(every_depth_header(report), justify="right")
    short = narrow_table(_title(report, "short-context loss"))
    for col in (
        "checkpoint",
        "short loss",
        "vs base [95 %]",
        *(["packed across → within"] if _has_packed(report) else []),
    ):
        short.add_column(col, justify="left" if col == "checkpoint" else "right")
    for row in rows:
        head = (row["checkpoint"], str(row["trained_length"] or "?"))
        cells = [row[str(n)] for n in report.lengths]
        passkey.add_row(*head, *(_passkey_cell(report, v) for v in cells), _effective(row))
        loss.add_row(*head, *(_loss_cell(v) for v in cells))
        short_loss = "—" if row["short_loss"] is None else f"{row['short_loss']:.3f}"
        short.add_row(
            row["checkpoint"], short_loss, _short_delta(row), *([_packed(row)] if _has_packed(report) else [])
        )
    return [passkey, *([task_table(report)] if has_tasks(report) else []), loss, short]


def has_tasks(report: EvalReport) -> bool:
    """Tasks beyond `single` were measured: the report gets the needle-task table."""
    return report.settings.tasks != ["single"]


def _task_cell(x: TaskLength | None) -> str:
    """`9/10*` (hits / items, * beyond the trained window); the control: `p 3/10*` (answers returning a
    present key). Accuracies and intervals are in --json."""
    if x is None:
        return "—"
    star = "*" if x.extrapolated else ""
    if x.present is not None:
        return f"p {x.present}/{x.keys}{star}"
    return f"{x.hits}/{x.keys}{star}"


def _task_row(report: EvalReport, t: TaskSummary, first: bool) -> list[str]:
    at = {x.length: x for x in t.lengths}
    eff = [
        ("—" if n is None else human_length(n))
        for n in (t.ruler_effective_length, t.relative_effective_length)
    ]
    if t.control:
        eff = ["control", "control"]
    return [t.task if first else "", t.checkpoint, *(_task_cell(at.get(n)) for n in report.lengths), *eff]


def _task_headers(report: EvalReport, sep: str = "\n") -> list[str]:
    s = report.settings
    return [
        "task",
        "checkpoint",
        *(human_length(n) for n in report.lengths),
        f"effective{sep}RULER ≥{s.ruler_threshold:.1%}",
        f"effective{sep}rel ≥{s.relative_threshold:g}×",
    ]


def task_rows(report: EvalReport) -> list[list[list[str]]]:
    """The needle-task table's cells, one row group per task (settings order), a row per checkpoint."""
    groups: dict[str, list[list[str]]] = {}
    for t in report.task_summary:
        group = groups.setdefault(t.task, [])
        group.append(_task_row(report, t, not group))
    return list(groups.values())


def task_table(report: EvalReport) -> Table:
    """Greedy exact match per task and length (hits / items), the effective lengths by RULER's absolute
    and NoLiMa's relative rule; the absent-name control shows how often a present key was returned."""
    table = narrow_table(_title(report, "needle tasks"))
    for k, head in enumerate(_task_headers(report)):
        # a narrow terminal folds a task's or a checkpoint's name rather than cutting it short
        table.add_column(head, justify="left" if k < 2 else "right", overflow="fold")
    for group in task_rows(report):
        for row in group:
            table.add_row(*row)
        table.add_section()
    return table


TASK_LEGEND = (
    "needle tasks: hits / items of greedy exact match (every asked key returned, any order); effective "
    "RULER = the longest length up to which the task's score over all depths stays ≥ the threshold, "
    "effective rel = ≥ that fraction of the checkpoint's score at its shortest length; absent = a control "
    "whose question names no needle: p = answers returning a key stated in the haystack (never a hit, no "
    "effective length)"
)


def _every_depth_legend(report: EvalReport) -> str:
    return (
        f"effective all depths ≥{report.every_depth_threshold:.0%} = the every-depth effective length: the "
        f"longest length up to which greedy stays ≥ {report.every_depth_threshold:.0%} at every depth"
    )


def legend_lines(report: EvalReport, width: int = TERMINAL_COLUMNS) -> list[str]:
    """The tables' legend, wrapped to `width` columns (the terminal's)."""
    return textwrap.wrap(_legend(report, terminal=True), width=width)


def settings_line(report: EvalReport) -> str:
    """`settings: 20 keys per cell × 5 depths (…), … — the [eval] of plan tiny`."""
    origin = f" — {report.settings_origin}" if report.settings_origin else ""
    return f"settings: {report.settings.describe()}{origin}"


def print_tables(report: EvalReport, con: Console) -> None:
    """The tables, the settings and the legend, each line at most the console's width."""
    width = con.size.width
    for table in report_tables(report):
        con.print(table)
    lines = textwrap.wrap(settings_line(report), width=width, subsequent_indent="  ")
    for line in [*lines, *legend_lines(report, width)]:
        con.print(line, highlight=False, markup=False, soft_wrap=True)


def markdown_table(report: EvalReport) -> str:
    """summary.md: the tables, settings, legend, method, notes and plot paths."""
    title = f"# evaluation{' of stage ' + report.stage if report.stage else ''} ({report.plan or 'no plan'})"
    lines = [title, "", *markdown_tables(report)]
    lines += ["", settings_line(report), "", _legend(report), "", f"method: {report.method}"]
    lines += [f"- note: {n}" for n in report.notes]
    if report.plots:
        lines += [""] + [f"- {k}: {v}" for k, v in report.plots.items()]
    return "\n".join(lines) + "\n"


def markdown_tables(report: EvalReport) -> list[str]:
    """The passkey table and, where tasks were measured, the needle-task table in Markdown (summary.md's,
    and what a page quoting a stored report.json renders from it)."""
    packed = _has_packed(report)
    head = [
        "checkpoint",
        "trained",
        *(str(n) for n in report.lengths),
        every_depth_header(report, " "),
        "short loss",
        *(["packed"] if packed else []),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report.table():
        lengths = [_cell(report, row[str(n)]).replace("│", "/") for n in report.lengths]
        packed_cell = [_packed(row)] if packed else []
        cells = [row["checkpoint"], str(row["trained_length"] or "?"), *lengths, _effective(row), _short(row)]
        lines.append("| " + " | ".join([*cells, *packed_cell]) + " |")
    return lines + _markdown_tasks(report)


def _markdown_tasks(report: EvalReport) -> list[str]:
    """The needle-task table in Markdown (nothing when only `single` was measured)."""
    if not has_tasks(report):
        return []
    head = _task_headers(report, " ")
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for group in task_rows(report) for row in group]
    return [*lines, "", TASK_LEGEND]


def _terminal_legend(report: EvalReport, method: str) -> str:
    acc = f"; % = passkey accuracy by {method}" if report.settings.distractors else ""
    text = (
        f"passkey: greedy exact keys / keys{acc}; ~ = the 95 % interval of some depth reaches chance; "
        f"* = beyond the checkpoint's trained window; {_every_depth_legend(report)}. "
        "loss: mean loss at positions ≥ length/2. "
        "short: loss on short held-out documents and its change vs the base [95 % interval over the "
        f"documents]. Margins and every interval: --json. {HEATMAP_LEGEND}."
    )
    if any(r.context_elbo is not None for ce in report.checkpoints for r in ce.results):
        text += (
            " elbo (diffusion, passkey by infilling): a window's bound in nats/token, widest clean context."
        )
    if _has_packed(report):
        text += " packed: windows of several documents, loss after the first, attention across → within."
    if has_tasks(report):
        text += f" {TASK_LEGEND}."
    return text


def report_width(stream: TextIO) -> int:
    """The width the report is laid out to: COLUMNS where set, else the terminal's; logs and pipes get
    the CLI's wide console (`longctx.cli._common`), so tables stay whole there."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and 0 < int(columns) <= 10_000:
        return int(columns)
    return shutil.get_terminal_size().columns if stream.isatty() else PIPE_COLUMNS


def print_report(report: EvalReport, *, stderr: bool = False) -> None:
    """The tables, settings, legend, notes and plot paths, every line within the terminal's width."""
    stream = sys.stderr if stderr else sys.stdout
    con = Console(file=stream, width=report_width(stream))
    print_tables(report, con)
    for note in report.notes:  # wrapped (long paths folded) to the width, not soft-wrapped past it
        con.print(f"[yellow]note:[/] {escape(note)}", highlight=False, overflow="fold")
    for name, path in report.plots.items():
        con.print(f"{name}: {path}", highlight=False, markup=False, overflow="fold")
