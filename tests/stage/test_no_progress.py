"""A launch that exits 0 without training (Megatron-LM's "Unable to load rng state",
--exit-on-missing-checkpoint) is a failure: quoted from its log, recorded in the ledger, and it stops a
Slurm chain at once (job_end's decision, tested without a cluster). A stand-in pretrain_gpt.py prints
Megatron-LM's message and exits 0 without saving; no real engine."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm import chain, commands
from longctx.stage import ledger
from longctx.stage.ledger_events import End, Launch, LedgerEvent, Submit
from longctx.stage.lock import Holder
from longctx.stage.run import LaunchOutcome, no_progress_message, relevant_log_lines, schedule_for
from longctx.stage.until_done import UntilDone, after_step
from tests.fixtures.run import BASE_ITERS, stamp_schedule, write_plan


@pytest.fixture(autouse=True)
def _any_python_may_plan_megatron(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests plan Megatron-LM launches; whether this Python may run Megatron-LM at all is
    tests/stage/test_megatron_python.py's question."""
    monkeypatch.setattr("longctx.stage.run.enums_pickled_by_name", lambda: False)


RNG = (
    "Unable to load rng state from checkpoint {ckpt}. Specify --no-load-rng or --finetune to prevent "
    "attempting to load the rng state, exiting ..."
)


def _outcome(code: int, start: int, end: int, status: str = "in-progress", **kw) -> LaunchOutcome:
    return LaunchOutcome("s1", "resume", code, start, end, status, 0.0, **kw)


def test_the_log_lines_that_say_why(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(
        "using world size: 2\n"
        + "[rank0] "
        + RNG.format(ckpt="/s/iter_0000002")
        + "\n"
        + RNG.format(ckpt="/s/iter_0000002")
        + "\n"  # the same line from another rank: shown once
        + "iteration        1/      10 | loss 3.2\n"
        + ">> '--exit-on-missing-checkpoint' set ... exiting. <<\n"
    )
    lines = relevant_log_lines(log)
    assert lines == [
        "[rank0] " + RNG.format(ckpt="/s/iter_0000002"),
        RNG.format(ckpt="/s/iter_0000002"),
        ">> '--exit-on-missing-checkpoint' set ... exiting. <<",
    ]
    msg = no_progress_message("s1", 0, 2, tmp_path / "save", log, lines)
    assert "stage s1 made no progress: the launch exited 0 at iteration 2" in msg
    assert "Unable to load rng state" in msg and "fix: " in msg and "--no-load-rng" in msg
    traceback = tmp_path / "t.log"
    traceback.write_text("ok\nTraceback (most recent call last):\n  File x\nRuntimeError: boom\n")
    assert relevant_log_lines(traceback) == ["Traceback (most recent call last):", "RuntimeError: boom"]
    assert relevant_log_lines(tmp_path / "missing.log") == []
    assert "the log does not say why" in no_progress_message("s1", 0, 2, tmp_path, log, [])


def test_verdict_and_after_step() -> None:
    said = _outcome(
        0, 2, 2, no_progress="stage s1 made no progress: … Unable to load rng state", log_lines=["x"]
    )
    assert said.verdict == "failed"
    # failed even for one step (what a chain job runs), with the message as the reason; exit 1, not 0
    stop = after_step(said, until_done=False)
    assert stop is not None and stop[0] == "failed" and "Unable to load rng state" in stop[1]
    assert UntilDone("failed", stop[1], [said]).exit_code == 1
    # no progress and nothing in the log: still a failure (the next launch would repeat it)
    silent = _outcome(0, 2, 2)
    assert silent.verdict == "failed" and after_step(silent, until_done=True)[0] == "failed"
    assert after_step(silent, until_done=False)[0] == "failed"
    assert UntilDone("failed", "x", [silent]).exit_code == 1
    # stopped by a signal before its next save: an interruption the next job resumes from, exit 0
    stopped = _outcome(0, 2, 2, interrupted=True)
    assert stopped.verdict == "interrupted" and after_step(stopped, until_done=True)[0] == "interrupted"
    assert UntilDone("interrupted", "x", [stopped]).exit_code == 0
    assert _outcome(0, 2, 2, new_saves=[2]).verdict == "ok"  # a new save is progress
    assert _outcome(0, 2, 4).verdict == "ok" and _outcome(3, 2, 4).verdict == "failed"


def _save(save_dir: Path, run_dir: Path, iteration: int, schedule: dict) -> None:
    base = run_dir / "base" / "checkpoints" / f"iter_{BASE_ITERS:07d}"
    save_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base, save_dir / f"iter_{iteration:07d}")
    stamp_schedule(save_dir / f"iter_{iteration:07d}" / "common.pt", schedule)
    (save_dir / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def test_rng_exit_0_fails_is_recorded_and_cancels_the_chain(
    fresh_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    rp = resolve_plan(load_plan(plan))
    save = rp.stage("s1").save_dir
    _save(
        save, fresh_run, 2, schedule_for(rp.stage("s1"))
    )  # s1 started: the launch is a resume, as in a chain's second job
    mlm = tmp_path / "Megatron-LM"
    mlm.mkdir()
    (mlm / "pretrain_gpt.py").write_text(
        textwrap.dedent(f"""\
        import os, sys
        if os.environ["RANK"] == "0":
            print({RNG.format(ckpt=save / "iter_0000002")!r}, flush=True)
        sys.exit()
        """)
    )
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(mlm))
    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    ledger.append(fresh_run, Submit(kind="chain", slurm_job_id="101", position=1))
    ledger.append(fresh_run, Submit(kind="chain", slurm_job_id="102", position=2))
    ledger.append(fresh_run, Submit(kind="chain", slurm_job_id="103", position=3))

    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--backend", "megatron-lm", "--no-preflight"])
    assert r.exit_code == 1, r.output  # Megatron-LM exited 0, the launch failed
    assert "s1 made no progress" in r.output and "Unable to load rng state from checkpoint" in r.output
    end = [x for x in ledger.read(fresh_run) if x.event == "end"][-1]
    assert (end.exit_code, end.outcome, end.status, end.new_saves) == (
        0,
        "failed",
        "in-progress",
        [],
    )
    assert end.start_iteration == end.end_iteration == 2 and end.job_id == "101"
    assert "Unable to load rng state" in end.no_progress and "--no-load-rng" in end.no_progress
    assert any("Unable to load rng state" in x for x in end.log_lines)

    # job_end of that job: the next job would relaunch the same resume, so the queued ones are cancelled
    cancelled: list[list[str]] = []
    monkeypatch.setattr(commands, "active_jobs", lambda ids: {j for j in ids if j in ("101", "102", "103")})
    monkeypatch.setattr(commands, "cancel_jobs", lambda ids: cancelled.append(list(ids)))
    out = chain.job_end(rp, r.exit_code)
    assert out.cancelled == ["103", "102"] and cancelled == [["103", "102"]]
    event = [x for x in ledger.read(fresh_run) if x.event == "chain-cancel"][-1]
    assert event.slurm_job_ids == ["103", "102"]
    assert "made no progress and the next job would repeat it" in event.reason
    assert "Unable to load rng state" in event.reason


def test_chain_stop_reason() -> None:
    def end(job: str, code: int, start: int, stop: int, no_progress: str | None = None) -> End:
        return End(
            job_id=job,
            stage="s1",
            exit_code=code,
            start_iteration=start,
            end_iteration=stop,
            no_progress=no_progress,
        )

    def why(
        records: list[LedgerEvent], job: str | None = "7", action: str = "resume", code: int = 0
    ) -> str | None:
        return chain.chain_stop_reason(action, "x", records, job=job, exit_code=code)

    assert why([end("7", 0, 0, 4)]) is None  # progress: the chain goes on
    assert why([end("7", 0, 2, 2, "stage s1 made no progress: … missing checkpoint")]).startswith(
        "stage s1's launch"
    )
    assert why([end("6", 0, 2, 2, "no progress"), end("7", 0, 2, 4)]) is None  # another job's, then progress
    assert why([end("7", 0, 2, 2, "no progress")], job=None) is None  # not in a Slurm job: nothing to cancel
    # a crash without progress may be transient: retried until FAILURE_STREAK jobs in a row failed
    assert why([end("7", 1, 2, 2, "stage s1 made no progress")]) is None
    assert why([], action="all-done") == "the plan is complete"
    assert why([], action="blocked").startswith("the plan cannot go on")
    # refused before launching (exit 2, no launch of this job: an edited schedule, a preflight): stop now
    assert "refused before it started" in (why([], code=2) or "")
    assert why([Launch(job_id="7"), end("7", 2, 2, 2, None)], code=2) is None  # it launched
    assert why([], job=None, code=2) is None
    # refused because another launch holds the run (a second chain, a manual run): that one trains, so
    # nothing is cancelled, its own job included
    holder = Holder("node1", 4242, "5", "2026-12-04T10:00:00+00:00", "s1")
    assert chain.chain_stop_reason("resume", "x", [], job="7", exit_code=2, lock_holder=holder) is None
