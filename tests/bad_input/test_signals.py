"""A command stopped by a signal keeps the contract of a refusal in all but its exit code: a message that
says it was stopped and how to go on, no traceback, exactly one JSON document with --json, nothing
changed on disk; the exit code is the shell's for the signal (128 + its number), so a script, `timeout`
or a scheduler sees a stop, not a failure. (Stopping a real launch: tests/stage/test_stop_signals.py.)"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from longctx.cli.main import app
from tests.bad_input.harness import runner, tree_state
from tests.fixtures.run import write_plan


def _signal(sig: int) -> Callable[..., None]:
    def stop(*args: object, **kwargs: object) -> None:
        signal.raise_signal(sig)
        raise AssertionError("the command went on after the signal")

    return stop


def _keyboard_interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt("signal 15")  # what code that cleans up on SIGTERM raises (data tokenize)


@pytest.mark.parametrize(
    ("stop", "code", "name"),
    [
        (_signal(signal.SIGTERM), 143, "SIGTERM"),
        (_signal(signal.SIGINT), 130, "SIGINT"),
        (_keyboard_interrupt, 143, "SIGTERM"),
    ],
    ids=["sigterm", "sigint", "keyboard-interrupt"],
)
def test_a_command_stopped_with_nothing_running_says_so_cleanly(
    fresh_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stop: Callable[..., None],
    code: int,
    name: str,
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    # the signal comes as `stage run` is about to launch: nothing started yet, so it stops on the spot
    monkeypatch.setattr("longctx.stage.run_policy.execute", stop)
    before, handler = tree_state(fresh_run, tmp_path), signal.getsignal(signal.SIGTERM)
    args = ["stage", "run", str(plan), "--run-dir", str(fresh_run)]
    plain = runner.invoke(app, args)
    assert plain.exit_code == code, plain.output
    assert f"stopped by {name}" in plain.output and "fix:" in plain.output, plain.output
    assert "Traceback" not in plain.output and "went on" not in plain.output
    as_json = runner.invoke(app, [*args, "--json"])
    assert as_json.exit_code == code
    doc = json.loads(as_json.stdout)  # exactly one document on stdout
    assert doc["ok"] is False and doc["error"]["type"] == "Interrupted", doc
    assert doc["error"]["what"] == f"stopped by {name}" and doc["error"]["fix"]
    assert tree_state(fresh_run, tmp_path) == before
    assert signal.getsignal(signal.SIGTERM) is handler, "the command did not give its handler back"
