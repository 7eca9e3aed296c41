"""The ledger's typed records: a ledger written before records were typed is read, and the records written
now are the lines the code wrote then.

data/ledger-before-typed-events.jsonl was written by the code before typed records (a `stage run` and
the Slurm chain's submit, job end and cancels with Slurm stood in; the sweep and failed-submit records
through its `ledger.append`): one record of every event kind, verbatim."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.slurm.records import submitted_ids
from longctx.stage import ledger
from longctx.stage.ledger_events import (
    Cancel,
    ChainCancel,
    ChainWait,
    End,
    JobEnd,
    Launch,
    RopeSweep,
    Submit,
    SubmitFailed,
)
from tests.fixtures.run import write_plan

OLD_LEDGER = Path(__file__).parent / "data" / "ledger-before-typed-events.jsonl"
STAMPS = ("time", "host", "pid", "job_id")


def _old_run(run_dir: Path) -> Path:
    shutil.copyfile(OLD_LEDGER, ledger.ledger_path(run_dir))
    return run_dir


def test_a_ledger_written_before_typed_records_is_read(tmp_path: Path) -> None:
    records = ledger.read(_old_run(tmp_path))
    kinds = [
        Submit,
        Submit,
        Launch,
        End,
        JobEnd,
        ChainCancel,
        SubmitFailed,
        Submit,
        Submit,
        Submit,
        ChainWait,
    ]
    assert [type(r) for r in records] == [*kinds, RopeSweep, Cancel]
    launch, end, job_end = records[2], records[3], records[4]
    assert isinstance(launch, Launch) and isinstance(end, End) and isinstance(job_end, JobEnd)
    assert (launch.stage, launch.action, launch.start_iteration, launch.job_id) == (
        "s1",
        "first-launch",
        0,
        "101",
    )
    assert launch.binding is not None and launch.binding.identity == ledger.CONTENT_IDENTITY
    assert launch.binding.rotary_base == 11000 and launch.binding.rope_scaling is None
    assert (end.exit_code, end.outcome, end.new_saves, end.progressed) == (0, "failed", [], False)
    assert end.no_progress is not None and "made no progress" in end.no_progress
    assert (job_end.next_action, job_end.next_stage, job_end.progress) == ("first-launch", "s1", 0)
    assert submitted_ids(tmp_path, "chain") == ["101", "102"]
    assert ledger.recorded_schedule(tmp_path, "s1") == launch.binding.schedule
    assert ledger.recorded_binding(tmp_path, "s1") == launch.binding


def test_records_written_now_are_the_lines_written_before(tmp_path: Path) -> None:
    """Each old record, appended again by the current code, is the same JSON line but for the stamps."""
    old = [json.loads(line) for line in OLD_LEDGER.read_text().splitlines()]
    again = tmp_path / "again"
    again.mkdir()
    for rec in ledger.read(_old_run(tmp_path)):
        ledger.append(again, rec)
    new = [json.loads(line) for line in ledger.ledger_path(again).read_text().splitlines()]
    strip = [{k: v for k, v in r.items() if k not in STAMPS} for r in old]
    assert [{k: v for k, v in r.items() if k not in STAMPS} for r in new] == strip
    assert all(set(r) == set(o) for r, o in zip(new, old, strict=True))


@pytest.mark.timeout(120)
def test_commands_read_an_old_ledger(fresh_run: Path, tmp_path: Path) -> None:
    """`stage status` (the pace from its end record) and a dry run (its binding and schedule) read it."""
    plan = write_plan(tmp_path / "plan.toml", _old_run(fresh_run))
    for args in (["stage", "status", str(plan)], ["stage", "run", str(plan), "--dry-run"]):
        r = CliRunner().invoke(app, [*args, "--json"])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        json.loads(r.stdout)
