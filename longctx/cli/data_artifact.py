"""`longctx data fetch` and `longctx data check ARTIFACT_DIR`: tokenized long-context artifacts.

Registered on the `data` app by `longctx/cli/data.py`; the logic lives in `longctx.data.artifact.fetch` and
`longctx.data.artifact.check`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from longctx.cli._common import cli_errors, console, exit_for, print_findings, print_json
from longctx.cli._params import Json
from longctx.errors import DatasetError

# The library is imported inside the commands: `longctx --help` need not load the artifact machinery.


def names(value: str | None) -> list[str] | None:
    return [x.strip() for x in value.split(",") if x.strip()] if value else None


def print_artifact_report(report: Any) -> None:
    from longctx.data.artifact.artifact_tables import artifact_status, artifact_table

    console.print(artifact_table(report))
    if report.findings:
        print_findings(report.findings)
    console.print(artifact_status(report), highlight=False)


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
        repo_id,
        into,
        run=run,
        languages=names(languages),
        tiers=names(tiers),
        revision=revision,
        content=content,
        offline=True if offline else None,
        workers=workers,
        max_downloads=downloads,
        verify=not no_verify,
        recheck=recheck,
    )
    if json_out:
        print_json({"ok": result.ok, **vars(result)})
        exit_for(result.findings)
        return
    from longctx.data.artifact.artifact_tables import fetch_table
    from longctx.data.check_tables import status_line

    console.print(fetch_table(result))
    if result.findings:
        print_findings(result.findings)
    console.print(status_line(len(result.findings.errors), "data fetch"), highlight=False)
    exit_for(result.findings)
