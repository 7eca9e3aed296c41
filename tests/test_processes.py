"""The inner loop's rule (tests/fixtures/processes.py): what it marks, what it leaves, and its guard."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from longctx.demo.run import run_demo
from tests.fixtures import processes
from tests.fixtures.processes import InnerLoopProcessError, starts_processes


def _uses_subprocess() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _calls_a_helper_that_does() -> None:
    _uses_subprocess()


@starts_processes
def _declared() -> None:
    pass


def _calls_the_declared() -> None:
    _declared()


def _runs_a_stage(runner: Any, app: Any) -> None:
    runner.invoke(app, ["stage", "run", "plan.toml"])


def _runs_the_demo() -> None:
    run_demo  # noqa: B018


def _shows_a_plan(runner: Any, app: Any) -> None:
    runner.invoke(app, ["plan", "show", "plan.toml"])


@pytest.mark.parametrize(
    "fn", [_uses_subprocess, _calls_a_helper_that_does, _calls_the_declared, _runs_a_stage, _runs_the_demo]
)
def test_what_starts_processes_is_marked(fn: Any) -> None:
    assert processes._Rule().why(fn) is not None


def test_what_does_not_stays_in_the_inner_loop() -> None:
    assert processes._Rule().why(_shows_a_plan) is None


def test_the_guard_stops_an_unmarked_test_and_says_what_to_do() -> None:
    guard = processes._Guard()
    guard.item = SimpleNamespace(nodeid="tests/x.py::test_x")  # type: ignore[assignment]
    with pytest.raises(InnerLoopProcessError, match="did not mark it `processes`"):
        guard.check("subprocess", (None, ["true"]))
    assert "tests/x.py::test_x" in guard.violations
    guard.paused = 1  # a @builds_once fixture's setup
    guard.check("subprocess", (None, ["true"]))
