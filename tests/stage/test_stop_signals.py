"""`longctx stage run` stopped by a signal, for real: the trainer saves and exits, the command stops at
once (no next launch, nothing reported done), nothing it started outlives it, and a rerun resumes from
the save. The same for a second signal (everything killed) and for a launcher killed outright (its
workers save and exit on their own)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint.save_layout import TRACKER, read_tracker
from longctx.cli.main import app
from longctx.stage import ledger
from tests.fixtures.run import write_plan
from tests.fixtures.stopping import STOP_S, Command, longctx_argv

S1_ITERS = 40  # long enough that no signal lands after its end, short enough to resume in seconds
# the signals wait for the first save; a save every 8 iterations (not every 2) spares the launches, the
# resume above all, some 15 saves they do not need
S1_SAVE = 8


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.toml", fresh_run, s1_tokens=S1_ITERS * 4 * 128, s1_save=S1_SAVE)


def _saved(run: Path) -> Callable[[], bool]:
    return lambda: (run / "stages" / "s1" / "checkpoints" / TRACKER).exists()


def _stage_run(long_command: Callable[..., Command], plan: Path, run: Path, *extra: str) -> Command:
    return long_command(
        longctx_argv("stage", "run", plan, "--run-dir", run, "--no-eval", *extra), "stage-run"
    )


def _launches(run: Path) -> list[tuple[str, str, int]]:
    return [(r.stage, r.action, r.start_iteration) for r in ledger.read(run) if r.event == "launch"]


def _status(plan: Path, run: Path) -> dict[str, dict]:
    res = CliRunner().invoke(app, ["stage", "status", str(plan), "--run-dir", str(run), "--json"])
    assert res.exit_code == 0, res.output
    return {s["stage"]: s for s in json.loads(res.stdout)["stages"]}


def _planned(plan: Path, run: Path) -> tuple[str, str, int]:
    """What the next `stage run` would launch (a dry run: nothing trained)."""
    res = CliRunner().invoke(app, ["stage", "run", str(plan), "--run-dir", str(run), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    launch = json.loads(res.stdout)["launches"][0]
    return launch["stage"], launch["action"], launch["start_iteration"]


def _stopped_by_signal(cmd: Command, run: Path, sig: int) -> int:
    """The command stopped by `sig` with the trainer's save, said so, and left nothing running."""
    assert cmd.ended_within(STOP_S) == 128 + sig
    out = cmd.output
    stopped = read_tracker(run / "stages" / "s1" / "checkpoints").iteration
    assert (
        f"stopped by {signal.Signals(sig).name}: stage s1 at iteration {stopped} of {S1_ITERS} (not done"
        in out
    )
    assert "Traceback" not in out and "exiting after iteration" in out, out
    assert cmd.left_behind(marks=[str(run)]) == []
    return stopped


@pytest.mark.timeout(600)
def test_sigterm_stops_until_done_at_once_and_the_rerun_resumes(
    long_command: Callable[..., Command], plan: Path, fresh_run: Path
) -> None:
    cmd = _stage_run(long_command, plan, fresh_run, "--until-done")
    cmd.wait_for(_saved(fresh_run), "a save of stage s1")
    workers = [p for p in cmd.snapshot() if "longctx.train" in p.cmdline() and p.ppid() == cmd.proc.pid]
    assert len(workers) == 2, cmd.output  # the stage's DP 2, each with its save manager below it
    cmd.send(signal.SIGTERM)
    stopped = _stopped_by_signal(cmd, fresh_run, signal.SIGTERM)
    # nothing went on from the stopped launch: no relaunch, no next stage, s1 not reported done
    assert _launches(fresh_run) == [("s1", "first-launch", 0)]
    ends = [r for r in ledger.read(fresh_run) if r.event == "end"]
    assert [(e.status, e.end_iteration) for e in ends] == [("in-progress", stopped)]
    status = _status(plan, fresh_run)
    assert (status["s1"]["status"], status["s1"]["iteration"], status["s2"]["status"]) == (
        "in-progress",
        stopped,
        "pending",
    )

    again = _stage_run(long_command, plan, fresh_run)  # one step: the resume of s1
    assert again.ended_within(300) == 0, again.output
    assert _launches(fresh_run)[1] == ("s1", "resume", stopped)
    assert _status(plan, fresh_run)["s1"]["status"] == "done"


@pytest.mark.timeout(600)
def test_ctrl_c_saves_and_stops_as_sigterm_does(
    long_command: Callable[..., Command], plan: Path, fresh_run: Path
) -> None:
    cmd = _stage_run(long_command, plan, fresh_run, "--until-done")
    cmd.wait_for(_saved(fresh_run), "a save of stage s1")
    cmd.send(signal.SIGINT)
    stopped = _stopped_by_signal(cmd, fresh_run, signal.SIGINT)
    assert "KeyboardInterrupt" not in cmd.output
    assert _launches(fresh_run) == [("s1", "first-launch", 0)]
    assert _planned(plan, fresh_run) == ("s1", "resume", stopped)


@pytest.mark.timeout(600)
def test_a_second_signal_kills_everything_and_the_run_stays_resumable(
    long_command: Callable[..., Command], plan: Path, fresh_run: Path
) -> None:
    cmd = _stage_run(long_command, plan, fresh_run, "--until-done")
    cmd.wait_for(_saved(fresh_run), "a save of stage s1")
    cmd.send(signal.SIGTERM)
    cmd.send(signal.SIGTERM)  # at once: the workers are still training or saving
    assert cmd.ended_within(STOP_S) == 143
    assert "Traceback" not in cmd.output and "stopped by SIGTERM" in cmd.output, cmd.output
    assert cmd.left_behind(marks=[str(fresh_run)]) == []
    assert _launches(fresh_run) == [("s1", "first-launch", 0)]
    kept = read_tracker(fresh_run / "stages" / "s1" / "checkpoints").iteration
    assert _planned(plan, fresh_run) == ("s1", "resume", kept)


@pytest.mark.timeout(600)
def test_workers_of_a_killed_launcher_save_and_exit(
    long_command: Callable[..., Command], plan: Path, fresh_run: Path
) -> None:
    """A SIGKILL the launcher cannot pass on (`timeout -k`, the OOM killer): its workers, in sessions of
    their own, notice that it is gone and stop as if signalled, saving first."""
    cmd = _stage_run(long_command, plan, fresh_run, "--until-done")
    cmd.wait_for(_saved(fresh_run), "a save of stage s1")
    save_dir = fresh_run / "stages" / "s1" / "checkpoints"
    before = read_tracker(save_dir).iteration
    cmd.send(signal.SIGKILL)
    assert cmd.ended_within(10) == -signal.SIGKILL
    assert cmd.left_behind(grace=30, marks=[str(fresh_run)]) == []
    # the launch log died with the launcher: the save dir and the trainer's metrics tell what happened
    after = read_tracker(save_dir).iteration
    assert before < after < S1_ITERS, "the orphaned workers neither saved on their way out nor stopped"
    metrics = (fresh_run / "stages" / "s1" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["iteration"] == after
