"""What the ledger says this plan submitted to Slurm: submit records and their job ids."""

from __future__ import annotations

from pathlib import Path

from longctx.stage import ledger
from longctx.stage.ledger_events import Submit


def submitted(run_dir: Path, kind: str | None = None) -> list[Submit]:
    """The ledger's submit records (oldest first), optionally of one kind ("chain" or "eval"); a record
    without a job id (damaged, or written by hand) names no job and is left out."""
    return [
        r
        for r in ledger.read(run_dir)
        if isinstance(r, Submit) and (kind is None or r.kind == kind) and job_id_of(r) is not None
    ]


def job_id_of(record: Submit) -> str | None:
    """A submit record's Slurm job id as text, None when it holds none (Slurm's ids are digits)."""
    text = "" if record.slurm_job_id is None else str(record.slurm_job_id)
    return text if text.isdigit() and len(text) <= 20 else None


def submitted_ids(run_dir: Path, kind: str | None = None) -> list[str]:
    return [str(r.slurm_job_id) for r in submitted(run_dir, kind)]


__all__ = ["job_id_of", "submitted", "submitted_ids"]
