"""A data check's report as rich tables: one per dataset, a blend summary, the status line."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from longctx.data.check import DataReport, PrefixReport
from longctx.data.doc_lengths import LengthStats, label


def size_text(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def prefix_table(report: DataReport, p: PrefixReport) -> Table:
    """One dataset's facts: weight, format, scan, document lengths, epochs per stage, sidecar."""
    table = Table(title=escape(p.prefix), show_header=False, title_justify="left")
    table.add_column("fact", style="bold")
    table.add_column("value", overflow="fold")
    for fact, value in [
        *_index_rows(p),
        *_scan_rows(report, p),
        *_length_rows(p.lengths),
        *_epoch_rows(p),
        *_sidecar_rows(p),
    ]:
        table.add_row(fact, value)
    return table


def _index_rows(p: PrefixReport) -> list[tuple[str, str]]:
    rows = []
    if p.weight is not None or p.share is not None:
        w = f"{p.weight:g}" if p.weight is not None else "by size"
        rows.append(("weight", f"{w} (share {p.share:.3f})" if p.share is not None else w))
    if p.index:
        ix = p.index
        rows.append(
            ("format", f"{ix['dtype']}, {ix['documents']:,} documents, {ix['sequences']:,} sequences")
        )
        rows.append(("tokens", f"{ix['tokens']:,} ({size_text(ix['bin_bytes'])} .bin)"))
    return rows


def _scan_rows(report: DataReport, p: PrefixReport) -> list[tuple[str, str]]:
    s = p.scan
    if s is None:
        return []
    vocab = f" (vocab {report.vocab_size})" if report.vocab_size is not None else ""
    rows = [("max token id", f"{s.max_id}{vocab}")]
    if report.eod_id is not None and p.index:
        ended = p.index["documents"] - s.documents_without_eod
        rows.append(
            ("EOD", f"{s.eod_count:,} EOD tokens; {ended:,}/{p.index['documents']:,} documents end with it")
        )
    rate = s.bytes_scanned / s.seconds / 1e9 if s.seconds else 0.0
    rows.append(
        ("scan", f"{size_text(s.bytes_scanned)} in {s.seconds:.2f} s ({rate:.2f} GB/s over all datasets)")
    )
    return rows


def _length_rows(ls: LengthStats | None) -> list[tuple[str, str]]:
    if ls is None or not ls.documents:
        return []
    pct = ", ".join(f"p{k} {v:,}" for k, v in (ls.percentiles or {}).items())
    rows = [
        (
            "doc length",
            f"min {ls.min_length:,}, {pct + ', ' if pct else ''}max {ls.max_length:,}, mean {ls.mean_length:,.0f}",
        )
    ]
    bins = [
        f"{'<' + label(b.hi) if b.lo == 0 else label(b.lo) + ('–' + label(b.hi) if b.hi else '+')}: "
        f"{b.tokens / ls.tokens:.0%}"
        for b in ls.histogram
        if b.documents and ls.tokens  # zero-length documents only: no token to share out
    ]
    rows.append(("tokens by doc length", ", ".join(bins) or "no token"))
    for cov in ls.coverage:
        rows.append(
            (
                f"≥ {label(cov.length)}",
                f"{cov.token_share:.1%} of tokens in {cov.documents_at_least:,} docs; "
                f"{cov.single_document_samples:,} single-doc / {cov.packed_samples:,} packed samples",
            )
        )
    return rows


def _epoch_rows(p: PrefixReport) -> list[tuple[str, str]]:
    return [
        (f"epochs {stage}", f"[yellow]{epochs:.2f}[/]" if epochs > 1 else f"{epochs:.2f}")
        for stage, epochs in p.epochs.items()
    ]


def _sidecar_rows(p: PrefixReport) -> list[tuple[str, str]]:
    if not p.sidecar:
        return []
    enc = p.sidecar["tokenizer"].get("encoding")
    how = f", encoded as {enc['tokenizer_type']}" if enc else ""
    return [
        ("sidecar", f"tokenizer md5 {p.sidecar['tokenizer']['md5']}{escape(how)} ({p.sidecar['origin']})")
    ]


def blend_table(report: DataReport) -> Table | None:
    """The datasets side by side (None for one dataset without blend-level findings)."""
    if len(report.prefixes) <= 1 and not report.findings:
        return None
    summary = Table(title="blend", title_justify="left")
    for col in ("prefix", "weight", "share", "tokens", *[f"epochs {s}" for s in report.budgets], "status"):
        summary.add_column(col)
    for p in report.prefixes:
        n_err = len(p.findings.errors)
        summary.add_row(
            escape(p.prefix),
            f"{p.weight:g}" if p.weight is not None else "size",
            f"{p.share:.3f}" if p.share is not None else "-",
            f"{p.index['tokens']:,}" if p.index else "-",
            *[f"{p.epochs[s]:.2f}" if s in p.epochs else "-" for s in report.budgets],
            "[green]ok[/]" if n_err == 0 else f"[red]{n_err} error(s)[/]",
        )
    return summary


def status_line(errors: int, what: str = "data check") -> str:
    return f"{what}: {'[green]OK[/]' if errors == 0 else f'[bold red]{errors} error(s)[/]'}"
