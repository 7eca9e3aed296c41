"""An EvalReport as a rich table (terminal) and a Markdown table (summary.md)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from longctx.eval.results import EvalReport


def _cell(report: EvalReport, value: dict | None) -> str:
    if value is None:
        return "—"
    star = "*" if value["extrapolated"] else ""
    chance = "~" if value["depths_at_chance"] else ""
    acc = f"{chance}{value['passkey']:.0%}"
    if report.settings.distractors:
        acc += f" (g {value['greedy_hits']}/{value['keys']})"
    else:
        acc = f"{chance}{value['greedy_hits']}/{value['keys']}"
    if value["long_loss"] is not None:
        return f"{acc} {value['margin']:+.2f} │ {value['long_loss']:.3f}{star}"
    # a diffusion model: the window's ELBO with the widest clean context instead of the long-position loss
    elbo = value.get("elbo_widest_context")
    return f"{acc} {value['margin']:+.2f} │ " + ("—" if elbo is None else f"elbo {elbo:.3f}") + star


def _effective(row: dict) -> str:
    n = row["effective_length"]
    return "—" if n is None else str(n)


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


def _legend(report: EvalReport) -> str:
    n = report.settings.distractors
    method = f"log-likelihood vs {n} distractors" if n else "greedy"
    text = (f"cells: passkey accuracy ({method}; g = greedy exact keys / keys) and margin in nats │ mean "
            "loss at positions ≥ length/2; ~ = the 95 % interval of some depth reaches chance; "
            "* = beyond the checkpoint's trained window; effective = longest length up to which every depth "
            f"keeps greedy ≥ {report.effective_threshold:.0%}; short = loss on short held-out documents "
            "(change vs base [95 % interval over the documents])")  # fmt: skip
    if any(r.context_elbo is not None for ce in report.checkpoints for r in ce.results):
        text += ("; elbo = diffusion models (passkey by infilling the restated key): the bound of a window "
                 "(nats per token) with the widest clean context around it")  # fmt: skip
    if _has_packed(report):
        text += ("; packed = windows of several held-out documents: loss on the documents after the "
                 "first, attention across → within documents, @ window length")  # fmt: skip
    return text


def report_table(report: EvalReport) -> Table:
    title = f"evaluation{' of stage ' + report.stage if report.stage else ''} ({report.plan or 'no plan'})"
    table = Table(title=title, caption=_legend(report), caption_justify="left")
    table.add_column("checkpoint")
    table.add_column("trained", justify="right")
    for n in report.lengths:
        table.add_column(str(n), justify="right")
    table.add_column("effective", justify="right")
    table.add_column("short loss", justify="right")
    packed = _has_packed(report)
    if packed:
        table.add_column("packed", justify="right")
    for row in report.table():
        table.add_row(row["checkpoint"], str(row["trained_length"] or "?"),
                      *(_cell(report, row[str(n)]) for n in report.lengths), _effective(row), _short(row),
                      *([_packed(row)] if packed else []))  # fmt: skip
    return table


def markdown_table(report: EvalReport) -> str:
    packed = _has_packed(report)
    head = [
        "checkpoint",
        "trained",
        *(str(n) for n in report.lengths),
        "effective",
        "short loss",
        *(["packed"] if packed else []),
    ]
    lines = [f"# evaluation{' of stage ' + report.stage if report.stage else ''} ({report.plan or 'no plan'})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for row in report.table():
        cells = [row["checkpoint"], str(row["trained_length"] or "?"),
                 *(_cell(report, row[str(n)]).replace("│", "/") for n in report.lengths), _effective(row),
                 _short(row),
                 *([_packed(row)] if packed else [])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _legend(report), "", f"method: {report.method}"]
    lines += [f"- note: {n}" for n in report.notes]
    if report.plots:
        lines += [""] + [f"- {k}: {v}" for k, v in report.plots.items()]
    return "\n".join(lines) + "\n"


def print_report(report: EvalReport, *, stderr: bool = False) -> None:
    stream = sys.stderr if stderr else sys.stdout
    con = Console(file=stream, width=None if stream.isatty() else 180)
    con.print(report_table(report))
    for note in report.notes:
        con.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    for name, path in report.plots.items():
        con.print(f"{name}: {path}", highlight=False, soft_wrap=True)
