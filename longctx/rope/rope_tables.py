"""`rope suggest` and `rope check` results as rich tables and the lines under them."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table


def fmt_base(value: float | None) -> str:
    if value is None:
        return "–"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.1f}"


def fmt_pos(value: int | None, cap: int | None = None) -> str:
    if value is None:
        return f"none < {cap:,}" if cap else "none"
    return f"{value:,}"


def suggest_table(result: Any) -> Table:
    """Every method at every length: base, ×bound, first failing position, min cos-sum, Liu limit (★ recommended)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for col in ("length", "method", "base", "×bound", "first<0", "min B<L", "Liu limit"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=True)
    for row in result.lengths:
        for i, c in enumerate(row.choices):
            d = c.diagnostics
            assert d is not None
            star = c.scaling is None and c.base == row.recommended and c.method == row.recommended_by
            base_text = fmt_base(c.base) if d.passes_bound else f"[yellow]{fmt_base(c.base)}![/]"
            table.add_row(
                f"{row.length:,}" if i == 0 else "",
                c.method + (" ★" if star else ""),
                base_text,
                f"{c.base / row.men_bound:.2f}" if c.scaling is None else "–",
                fmt_pos(d.first_failing_position, d.search_cap) if d.first_failing_position else "none",
                f"{d.min_cos_sum:+.2f}",
                fmt_base(round(d.liu_limit_after_tuning)) if d.liu_limit_after_tuning else "–",
            )
        table.add_section()
    return table


def suggest_header(result: Any, dim: int, head_dim: int | None, length: int, base: int) -> str:
    dims = f"rotary dim {dim}" + (f" of head dim {head_dim}" if head_dim else "")
    return (
        f"[bold]RoPE base per stage[/] — {dims}, pretrained at {length:,} tokens with base {fmt_base(base)}"
    )


def suggest_lines(result: Any) -> list[str]:
    """Under the table: the recommendation per length, the legend, the rule."""
    lines = []
    for row in result.lengths:
        paper = f", paper {fmt_base(row.men_paper)}" if row.men_paper else ""
        fit = f", fit {fmt_base(round(row.men_fit))}" if row.men_fit else ""
        lines.append(
            f"{row.length:>9,}: recommended [bold green]--rotary-base {row.recommended}[/] "
            f"(by {row.recommended_by}; Men's bound: exact {row.men_bound:,}{paper}{fit})"
        )
    lines.append(
        "[dim]×bound: base / Men's exact bound; first<0: first m with Σcos(m·θ_i) < 0 (searched to 4 × length); "
        "min B<L: minimum of that sum below the length (of "
        f"{result.lengths[0].choices[0].diagnostics.cos_sum_at_zero:g} at m = 0); "
        "Liu limit: extrapolation limit after training at the length (2π·base^(d_extra/d) above Liu's critical "
        "base, else the length); [yellow]![/] below the bound.[/]"
    )
    lines.append(f"[dim]rule: {result.rule}[/]")
    return lines


def check_table(result: Any) -> Table:
    """One base at one length: position of the first failure, cos-sum minimum, Men's and Liu's bounds."""
    diag, dim, hd = result.diagnostics, result.rotary_dim, result.head_dim
    rows: list[tuple[str, str]] = [
        ("base", fmt_base(result.base)),
        ("rotary dim", f"{dim}" + (f" (head dim {hd})" if hd else "")),
        ("length", f"{result.length:,}"),
        ("first failing position", fmt_pos(diag.first_failing_position, diag.search_cap)),
        (
            "min cos-sum below length (at m)",
            f"{diag.min_cos_sum:+.4f} ({diag.min_cos_sum_position:,}) of {diag.cos_sum_at_zero:g}",
        ),
        ("Men's bound, exact search", f"{diag.men_bound:,}"),
        (
            "Men's bound, paper table / fit",
            f"{fmt_base(diag.men_paper)} / {fmt_base(round(diag.men_fit)) if diag.men_fit else '–'}",
        ),
        ("base / exact bound", f"{diag.margin:.2f}"),
    ]
    if diag.liu_d_extra is not None:
        rows += [
            ("Liu d_extra", str(diag.liu_d_extra)),
            ("Liu critical base β0 at this length", fmt_base(diag.liu_critical_base)),
            ("Liu extrapolation bound T_extra", fmt_base(round(diag.liu_extrapolation_bound or 0))),
            ("Liu limit after training at this length", fmt_base(round(diag.liu_limit_after_tuning or 0))),
        ]
    table = Table(show_header=False)
    table.add_column("item")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    return table
