"""`longctx demo` stopped by SIGTERM, for real: in base pretraining (the stopped base is neither reported
as trained nor extended by the stages), then in a stage (the signal reaches the `stage run` step and its
workers once; the demo stops with them) — each time at once, with nothing left running; the rerun
resumes the base from its save, and the stage's next launch is its resume. Also the check behind it, on
its own: a launch that saved short of its target is never taken as done."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint.save_layout import TRACKER, read_tracker
from longctx.cli.main import app
from longctx.demo.train_launch import train_to_target
from longctx.errors import Interrupted, StageError
from longctx.launch.stop import stop_on_signals
from longctx.stage import ledger
from tests.fixtures.run import write_plan
from tests.fixtures.stopping import STOP_S, Command

BASE_ITERS = 60  # the small demo's base, longer: a signal after its first save (20) lands mid-training
S1_ITERS = 40

# `longctx demo --small --plan PLAN --dir DIR`, its small base made longer
DEMO = textwrap.dedent(f"""
    import dataclasses, sys
    from longctx.demo import run

    small = run.DemoConfig.small
    run.DemoConfig.small = classmethod(
        lambda cls, plan, interrupt_stage=None: dataclasses.replace(
            small(plan, interrupt_stage=interrupt_stage), base_iters={BASE_ITERS}
        )
    )
    from longctx.cli.main import app

    app(["demo", "--small", "--plan", sys.argv[1], "--dir", sys.argv[2]])
""")


def _iteration(save_dir: Path) -> int:
    t = read_tracker(save_dir) if save_dir.exists() else None
    return 0 if t is None else t.iteration


def _stopped(cmd: Command, run: Path, said: Callable[[], str]) -> None:
    """Ended by the SIGTERM within seconds, saying where it stopped (`said()`, read from disk after the
    end), with nothing left running."""
    assert cmd.ended_within(STOP_S) == 143, cmd.output
    assert f"stopped by SIGTERM: {said()}" in cmd.output, cmd.output[-3000:]
    assert "Traceback" not in cmd.output
    assert cmd.left_behind(marks=[str(run)]) == []


@pytest.mark.timeout(1500)  # two demo runs up to a stage: minutes, more on shared cores
def test_sigterm_stops_the_demo_in_the_base_and_in_a_stage_and_the_rerun_resumes(
    long_command: Callable[..., Command], tmp_path: Path
) -> None:
    run = tmp_path / "demo"
    plan = write_plan(tmp_path / "plan.toml", run, s1_tokens=S1_ITERS * 4 * 128, s1_save=2)
    base, s1 = run / "base" / "checkpoints", run / "stages" / "s1" / "checkpoints"
    demo = [sys.executable, "-c", DEMO, str(plan), str(run)]

    first = long_command(demo, "demo")
    first.wait_for(lambda: (base / TRACKER).exists(), "a save of the base")
    first.send(signal.SIGTERM)
    _stopped(first, run, lambda: f"base pretraining at iteration {_iteration(base)} of {BASE_ITERS}")
    assert _iteration(base) < BASE_ITERS
    # the stopped base was neither reported as trained nor extended
    assert f"{BASE_ITERS} iterations at" not in first.output
    assert not (run / "stages").exists() and ledger.read(run) == []

    second = long_command(demo, "demo")  # resumes the base, finishes it, then stage s1 …
    second.wait_for(lambda: (s1 / TRACKER).exists(), "a save of stage s1")
    assert "resumed from" in (run / "base" / "train.log").read_text() and _iteration(base) == BASE_ITERS
    second.send(signal.SIGTERM)  # … through the `stage run` step to its workers
    _stopped(second, run, lambda: f"stage s1 at iteration {_iteration(s1)} of {S1_ITERS} (not done")
    launches = [(r.stage, r.action) for r in ledger.read(run) if r.event == "launch"]
    assert launches == [("s1", "first-launch")], "the stopped stage was relaunched, or the next one started"
    assert not (run / "eval").exists()

    # the next run resumes stage s1 from the save the stop left (what `stage run` would launch next)
    res = CliRunner().invoke(app, ["stage", "run", str(plan), "--run-dir", str(run), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    nxt = json.loads(res.stdout)["launches"][0]
    assert (nxt["stage"], nxt["action"], nxt["start_iteration"]) == ("s1", "resume", _iteration(s1))


class _SavesAt:
    """A launcher whose trainer saved at `iteration` and exited 0 (as it does when asked to stop)."""

    def __init__(self, save_dir: Path, iteration: int) -> None:
        self.save_dir, self.iteration = save_dir, iteration

    def __call__(self, echo: bool = True) -> _SavesAt:
        return self

    def run(self, argv: list[str], *, nproc: int, env: dict[str, str], log: Path) -> int:
        self.save_dir.mkdir(parents=True, exist_ok=True)
        (self.save_dir / TRACKER).write_text(str(self.iteration))
        return 0


def test_a_launch_that_saved_short_of_its_target_is_not_taken_as_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save = tmp_path / "base" / "checkpoints"
    monkeypatch.setattr("longctx.demo.train_launch.LocalLauncher", _SavesAt(save, 4))
    kw = dict(nproc=2, env={}, log=tmp_path / "train.log", save_dir=save, target=150, what="base pretraining")
    with (
        stop_on_signals(),
        pytest.raises(StageError, match="base pretraining stopped at iteration 4 of 150") as err,
    ):
        train_to_target(tmp_path / "spec.json", **kw)  # type: ignore[arg-type]
    assert "resumes" in (err.value.fix or "")
    # the same launch in a process that was asked to stop: the command stops, saying where
    with (
        stop_on_signals(),
        pytest.raises(Interrupted, match="stopped by SIGTERM: base pretraining at iteration 4 of 150"),
    ):
        signal.raise_signal(signal.SIGTERM)
        train_to_target(tmp_path / "spec.json", **kw)  # type: ignore[arg-type]
    monkeypatch.setattr("longctx.demo.train_launch.LocalLauncher", _SavesAt(save, 150))
    with stop_on_signals():  # a new command: the last one's signal is behind it
        assert train_to_target(tmp_path / "spec.json", **kw) == 150  # type: ignore[arg-type]
