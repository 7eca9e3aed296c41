"""A tokenized artifact's check and fetch as rich tables (`longctx data check ARTIFACT`, `data fetch`)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from longctx.data.artifact.check import ArtifactReport, coverage_text
from longctx.data.artifact.fetch import FetchResult
from longctx.data.doc_lengths import label
from longctx.util.units import fmt_bytes


def artifact_table(report: ArtifactReport) -> Table:
    """Per language × tier: chunks, documents, tokens, .bin bytes, the longest document, coverage per length."""
    bi = report.build_info or {}
    title = f"{report.root}" + (f" · run {report.run}" if report.run else "")
    if bi:
        title += f" · tokenizer {bi.get('tokenizer_model')} (vocab {bi.get('vocab_size')})"
    table = Table(title=escape(title), title_justify="left")
    for col in (
        "language",
        "tier",
        "chunks",
        "documents",
        "tokens",
        ".bin",
        "longest",
        *[f"≥ {label(n)}" for n in report.lengths],
    ):
        table.add_column(col, justify="left" if col in ("language", "tier") else "right")
    for g in report.groups:
        _group_row(table, g)
    if len(report.tiers) > 1 or len(report.groups) > len(report.tiers):
        table.add_section()
        for g in report.tiers:
            _group_row(table, g, "bold")
    table.add_section()
    _group_row(table, report.total, "bold")
    return table


def _group_row(table: Table, g: Any, style: str = "") -> None:
    cells = [
        g.language,
        g.tier,
        f"{g.checked}/{g.chunks}" if g.checked != g.chunks else f"{g.chunks}",
        f"{g.documents:,}",
        f"{g.tokens:,}",
        fmt_bytes(g.bin_bytes),
        f"{g.max_length:,}" if g.max_length is not None else "-",
        *[coverage_text(c) for c in g.coverage],
    ]
    table.add_row(*[f"[{style}]{escape(c)}[/]" if style else escape(c) for c in cells])


def artifact_status(report: ArtifactReport) -> str:
    errors = len(report.findings.errors)
    status = "[green]OK[/]" if errors == 0 else f"[bold red]{errors} error(s)[/]"
    return (
        f"data check ({report.mode}): {status} — {report.checked:,} of {report.chunks:,} prefixes in "
        f"{report.seconds:.2f} s ({report.prefixes_per_second:,.0f} prefixes/s)"
    )


def fetch_table(result: FetchResult) -> Table:
    """What a fetch selected, verified, fetched again and rewrote."""
    t = Table(
        show_header=False,
        title=escape(f"{result.repo_id}" + (f"@{result.commit[:12]}" if result.commit else "")),
    )
    t.add_column("fact", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("into", escape(str(result.root)) + (" (offline: adopted)" if result.offline else ""))
    t.add_row("run", escape(result.run or "-"))
    t.add_row(
        "selected",
        f"{result.chunks:,} prefixes ({result.content}), {fmt_bytes(result.bin_bytes)} of .bin; "
        f"languages {', '.join(result.languages)}; tiers {', '.join(result.tiers)}",
    )
    v = result.verify
    if v is not None:
        rate = v.bytes_hashed / v.seconds / 1e9 if v.seconds > 0 else 0.0
        t.add_row(
            "verified",
            f"{v.files:,} files, {fmt_bytes(v.bytes_total)}: {len(v.bad)} bad; hashed "
            f"{fmt_bytes(v.bytes_hashed)} in {v.seconds:.1f} s ({rate:.2f} GB/s), {v.cached:,} remembered",
        )
    if result.refetched:
        more = " …" if len(result.refetched) > 10 else ""
        t.add_row("fetched again", escape(", ".join(result.refetched[:10]) + more))
    if result.rewrite is not None and result.rewrite.files:
        t.add_row("rewritten", escape(", ".join(result.rewrite.files)))
    if result.data_path_args is not None:
        t.add_row("data-args", escape(str(result.data_path_args)))
    return t
