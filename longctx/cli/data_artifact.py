"""`longctx data fetch` and `longctx data check ARTIFACT_DIR`: tokenized long-context artifacts.

Registered on the `data` app by `longctx/cli/data.py`; the logic lives in `longctx.data.artifact.fetch` and
`longctx.data.artifact.check`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from longctx.cli._common import cli_errors, console, exit_for, print_findings, print_json
from longctx.cli._params import Json
from longctx.errors import DatasetError
from longctx.report import Findings

# The library is imported inside the commands: `longctx --help` need not load the artifact machinery.


def _size(n: int) -> str:
    from longctx.util.units import fmt_bytes

    return fmt_bytes(n)


def _problems(findings: Findings) -> None:
    if findings:
        print_findings(findings)


def names(value: str | None) -> list[str] | None:
    return [x.strip() for x in value.split(",") if x.strip()] if value else None


def check_artifact_cmd(path: str, *, json_out: bool, **kw: Any) -> None:
    from longctx.data.artifact.check import check_artifact

    report = check_artifact(path, **kw)
    if json_out:
        print_json({"ok": report.ok, **vars(report), "prefixes_per_second": report.prefixes_per_second})
    else:
        render_artifact_report(report)
    exit_for(report.findings)


def render_artifact_report(report: Any) -> None:
    from longctx.data.artifact.check import coverage_text
    from longctx.data.stats import label

    bi = report.build_info or {}
    title = f"{report.root}" + (f" · run {report.run}" if report.run else "")
    if bi:
        title += f" · tokenizer {bi.get('tokenizer_model')} (vocab {bi.get('vocab_size')})"
    table = Table(title=escape(title), title_justify="left")
    for col in ("language", "tier", "chunks", "documents", "tokens", ".bin", "longest",
                *[f"≥ {label(n)}" for n in report.lengths]):  # fmt: skip
        table.add_column(col, justify="left" if col in ("language", "tier") else "right")

    def row(g: Any, style: str = "") -> None:
        cells = [
            g.language, g.tier, f"{g.checked}/{g.chunks}" if g.checked != g.chunks else f"{g.chunks}",
            f"{g.documents:,}", f"{g.tokens:,}", _size(g.bin_bytes),
            f"{g.max_length:,}" if g.max_length is not None else "-",
            *[coverage_text(c) for c in g.coverage],
        ]  # fmt: skip
        table.add_row(*[f"[{style}]{escape(c)}[/]" if style else escape(c) for c in cells])

    for g in report.groups:
        row(g)
    if len(report.tiers) > 1 or len(report.groups) > len(report.tiers):
        table.add_section()
        for g in report.tiers:
            row(g, "bold")
    table.add_section()
    row(report.total, "bold")
    console.print(table)
    _problems(report.findings)
    errors = len(report.findings.errors)
    status = "[green]OK[/]" if errors == 0 else f"[bold red]{errors} error(s)[/]"
    console.print(
        f"data check ({report.mode}): {status} — {report.checked:,} of {report.chunks:,} prefixes in "
        f"{report.seconds:.2f} s ({report.prefixes_per_second:,.0f} prefixes/s)",
        highlight=False,
    )


@cli_errors
def fetch_cmd(
    repo_id: str = typer.Argument(
        ..., help="Hub dataset id, e.g. birgermoell/oellm-longctx-tokenized-streamed-all-v2."
    ),
    into: Path = typer.Option(
        ..., "--into", help="Directory to download into (or, offline, the download to adopt)."
    ),
    run: str | None = typer.Option(
        None, "--run", help="Streamed run (runs/RUN); needed when the repo has several."
    ),
    languages: str | None = typer.Option(None, "--languages", help="Only these languages, e.g. en,de,fi."),
    tiers: str | None = typer.Option(None, "--tiers", help="Only these tiers, e.g. 16k_plus,4_16k."),
    revision: str | None = typer.Option(
        None, "--revision", help="Branch, tag or commit (default main, pinned once)."
    ),
    manifests_only: bool = typer.Option(
        False, "--manifests-only", help="Only mix/ and manifests (enough to plan and print stage args)."
    ),
    idx_only: bool = typer.Option(
        False, "--idx-only", help="Manifests and .idx files (index checks, supply)."
    ),
    offline: bool = typer.Option(
        False, "--offline", help="No network: verify and adopt what INTO holds (also HF_HUB_OFFLINE=1)."
    ),
    workers: int | None = typer.Option(
        None, "--workers", "-w", min=1, help="sha256 threads (default: CPUs, ≤ 8)."
    ),
    downloads: int = typer.Option(8, "--downloads", min=1, help="Parallel file downloads."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip checksum verification."),
    recheck: bool = typer.Option(
        False, "--recheck", help="Hash every file again (ignore remembered hashes)."
    ),
    json_out: Json = False,
) -> None:
    """Download a tokenized artifact (chosen languages/tiers), verify checksums, point its mix at INTO.

    Resumable: run it again after an interruption. Files that fail verification are deleted and
    fetched again; offline (--offline or HF_HUB_OFFLINE=1) the same command verifies and adopts a
    directory that already holds the download. mix/data_path.args and data_mix.json are rewritten to
    local paths (originals kept under INTO/.longctx/original/). Exit 2 if anything fails to verify.

    Example: longctx data fetch birgermoell/oellm-longctx-tokenized-streamed-all-v2 --into /data/oellm-longctx
    --run lc16k_full_20260507 --tiers 16k_plus,4_16k,under4k --languages en,de
    """
    from longctx.data.artifact.fetch import fetch_artifact

    if manifests_only and idx_only:
        raise DatasetError("give at most one of --manifests-only and --idx-only")
    content = "manifests" if manifests_only else ("idx" if idx_only else "all")
    result = fetch_artifact(
        repo_id, into, run=run, languages=names(languages), tiers=names(tiers), revision=revision,
        content=content, offline=True if offline else None, workers=workers, max_downloads=downloads,
        verify=not no_verify, recheck=recheck,
    )  # fmt: skip
    if json_out:
        print_json({"ok": result.ok, **vars(result)})
        exit_for(result.findings)
        return
    t = Table(
        show_header=False,
        title=escape(f"{result.repo_id}" + (f"@{result.commit[:12]}" if result.commit else "")),
    )
    t.add_column("fact", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("into", escape(str(result.root)) + (" (offline: adopted)" if result.offline else ""))
    t.add_row("run", escape(result.run or "-"))
    t.add_row("selected", f"{result.chunks:,} prefixes ({result.content}), {_size(result.bin_bytes)} of .bin; "
                          f"languages {', '.join(result.languages)}; tiers {', '.join(result.tiers)}")  # fmt: skip
    v = result.verify
    if v is not None:
        rate = v.bytes_hashed / v.seconds / 1e9 if v.seconds > 0 else 0.0
        t.add_row("verified", f"{v.files:,} files, {_size(v.bytes_total)}: {len(v.bad)} bad; hashed "
                              f"{_size(v.bytes_hashed)} in {v.seconds:.1f} s ({rate:.2f} GB/s), {v.cached:,} remembered")  # fmt: skip
    if result.refetched:
        t.add_row(
            "fetched again",
            escape(", ".join(result.refetched[:10]) + (" …" if len(result.refetched) > 10 else "")),
        )
    if result.rewrite is not None and result.rewrite.files:
        t.add_row("rewritten", escape(", ".join(result.rewrite.files)))
    if result.data_path_args is not None:
        t.add_row("data-args", escape(str(result.data_path_args)))
    console.print(t)
    _problems(result.findings)
    errors = len(result.findings.errors)
    console.print(
        f"data fetch: {'[green]OK[/]' if errors == 0 else f'[bold red]{errors} error(s)[/]'}", highlight=False
    )
    exit_for(result.findings)
