"""One launcher at a time per run directory: the holder is named, a second launcher is refused and changes
nothing, a stale lock is named and replaced, `stage status` shows the holder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm import chain, commands
from longctx.stage import ledger
from longctx.stage.ledger_events import Submit
from longctx.stage.lock import lock_path, read_holder, run_lock
from longctx.stage.run import LaunchPlan, execute, prepare_launch
from tests.bad_input.harness import refused
from tests.fixtures.run import write_plan

runner = CliRunner()


def _holder(run: Path, pid: int, host: str | None = None, job: str | None = None) -> Path:
    rec = {
        "host": host or socket.gethostname(),
        "pid": pid,
        "job_id": job,
        "since": "2026-01-01T00:00:00+00:00",
        "stage": "s1",
    }
    lock_path(run).write_text(json.dumps(rec))
    return lock_path(run)


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class LockChecking:
    """Runs nothing; records the lock's holder at launch time."""

    def __init__(self, run: Path) -> None:
        self.run_dir, self.holders = run, []

    def run(self, argv, *, nproc, env, log) -> int:
        self.holders.append(read_holder(self.run_dir))
        return 0


def test_a_second_launcher_is_refused_and_changes_nothing(
    fresh_run: Path, tmp_path: Path, live_pid: int
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    _holder(fresh_run, live_pid, job="4242")
    msg = " ".join(
        refused(["stage", "run", plan], [fresh_run, tmp_path], needle="locked by another launch").split()
    )
    assert f"pid {live_pid}" in msg and "Slurm job 4242" in msg and socket.gethostname() in msg
    status = runner.invoke(app, ["stage", "status", str(plan), "--json"])
    assert status.exit_code == 0, status.output
    lock = json.loads(status.stdout)["lock"]
    assert (lock["pid"], lock["job_id"], lock["stale"]) == (live_pid, "4242", None)
    text = runner.invoke(app, ["stage", "status", str(plan)]).output
    assert f"locked by pid {live_pid}" in " ".join(text.split())


def test_a_chain_job_refused_by_the_lock_cancels_nothing(
    fresh_run: Path, tmp_path: Path, live_pid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second chain's job meets the first chain's live job holding the run: its `stage run` is refused,
    and its job end must not cancel the chains' jobs (the holder among them) as a plain refusal would."""
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    _holder(fresh_run, live_pid, job="101")
    for jid in ("101", "102", "201", "202"):
        ledger.append(fresh_run, Submit(kind="chain", slurm_job_id=jid))
    monkeypatch.setenv("SLURM_JOB_ID", "201")
    r = runner.invoke(app, ["stage", "run", str(plan)])
    assert r.exit_code == 2 and "locked by another launch" in r.output
    cancelled: list[list[str]] = []
    monkeypatch.setattr(commands, "active_jobs", lambda ids: set(ids))
    monkeypatch.setattr(commands, "cancel_jobs", lambda ids: cancelled.append(list(ids)))
    out = chain.job_end(resolve_plan(load_plan(plan)), r.exit_code)
    assert out.cancelled == [] and cancelled == []
    # the same refusal without a live holder is a check that every next job would meet: the chain stops
    lock_path(fresh_run).unlink()
    out = chain.job_end(resolve_plan(load_plan(plan)), 2)
    assert out.cancelled
    assert (
        "refused before it started"
        in [x for x in ledger.read(fresh_run) if x.event == "chain-cancel"][-1].reason
    )


def test_a_holder_on_another_host_is_named_not_guessed(fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    _holder(fresh_run, 1, host="node-that-is-not-here", job="77")
    msg = " ".join(
        refused(["stage", "run", plan], [fresh_run, tmp_path], needle="node-that-is-not-here").split()
    )
    assert "squeue -j 77" in msg


def test_the_launch_holds_the_lock_and_a_stale_one_is_named_and_replaced(
    fresh_run: Path, tmp_path: Path
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    dead = _dead_pid()
    _holder(fresh_run, dead)
    status = runner.invoke(app, ["stage", "status", str(plan), "--json"])
    assert f"no process {dead} runs" in json.loads(status.stdout)["lock"]["stale"]
    rp = resolve_plan(load_plan(plan))
    lp = prepare_launch(rp, "local")
    assert isinstance(lp, LaunchPlan)
    launcher = LockChecking(fresh_run)
    outcome = execute(rp, lp, launcher)
    [held] = launcher.holders
    assert held is not None and (held.pid, held.host, held.stage) == (os.getpid(), socket.gethostname(), "s1")
    assert outcome.stale_lock is not None and outcome.stale_lock["pid"] == dead
    [launch] = [r for r in ledger.read(fresh_run) if r.event == "launch"]
    assert launch.stale_lock["pid"] == dead and "no process" in launch.stale_lock["stale"]
    assert not lock_path(fresh_run).exists()  # released after the launch


def test_a_requeued_job_replaces_its_own_earlier_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "991")
    _holder(tmp_path, 1, host="the-node-it-ran-on-before", job="991")
    with run_lock(tmp_path, "s2") as stale:
        assert stale is not None and "restarted" in str(stale["stale"])
        assert read_holder(tmp_path).job_id == "991"


@pytest.mark.parametrize("content", [b"", b"garbage", b'{"pid": "x"}', b"[" * 100_000])
def test_a_lock_that_is_not_a_holder_record_is_refused(tmp_path: Path, content: bytes) -> None:
    lock_path(tmp_path).write_bytes(content)
    # 100 000 bytes is refused by its size before it is parsed
    with (
        pytest.raises(StageError, match=r"not a holder record|more than the 64\.0 KiB"),
        run_lock(tmp_path, "s1"),
    ):
        pass
    assert lock_path(tmp_path).read_bytes() == content
