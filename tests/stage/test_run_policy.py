"""`stage run`'s per-step policy, called without the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage.run_policy import RunOptions, run_steps
from tests.fixtures.run import write_plan


class _Heard:
    def __init__(self) -> None:
        self.events: list[str] = []

    def launching(self, lp) -> None:
        self.events.append(f"launching {lp.stage.name}")

    def planned(self, lp) -> None:
        self.events.append(f"planned {lp.stage.name}")

    def preflight_passed(self, lp, report) -> None:
        self.events.append("preflight")

    def finished(self, outcome) -> None:
        self.events.append("finished")

    def warning(self, text: str) -> None:
        self.events.append(text)

    def chose(self, stage: str, choice) -> None:
        self.events.append(f"chose {stage}")

    def sweep_starts(self, lines: list[str]) -> None:
        self.events.append(lines[0])


def _never(*_args):
    raise AssertionError("a dry run neither launches nor asks for device facts")


def test_a_dry_run_plans_the_next_step_and_runs_nothing(fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    heard = _Heard()
    steps = run_steps(
        lambda: resolve_plan(load_plan(plan)),
        RunOptions(dry_run=True, until_done=True),
        launcher=_never,
        facts=_never,
        report=heard,
    )
    assert steps.result.stop == "dry-run" and not steps.result.outcomes
    assert [lp.stage.name for lp in steps.planned] == ["s1"]
    assert heard.events == ["launching s1", "planned s1"]


def test_an_unknown_backend_is_refused_before_anything(fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    with pytest.raises(StageError, match="unknown backend 'tpu'"):
        run_steps(
            lambda: resolve_plan(load_plan(plan)),
            RunOptions(backend="tpu"),
            launcher=_never,
            facts=_never,
            report=_Heard(),
        )
