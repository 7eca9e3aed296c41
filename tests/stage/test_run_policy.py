"""`stage run`'s per-step policy, called without the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage.run_policy import RunOptions, run_steps
from tests.fixtures.run import write_plan
from tests.fixtures.steps import Heard, never


def test_a_dry_run_plans_the_next_step_and_runs_nothing(fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    heard = Heard()
    steps = run_steps(
        lambda: resolve_plan(load_plan(plan)),
        RunOptions(dry_run=True, until_done=True),
        launcher=never,
        facts=never,
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
            launcher=never,
            facts=never,
            report=Heard(),
        )


def test_stage_run_starts_without_torch_or_megatron_core() -> None:
    """Every `stage run` and every chain job starts a process that only launches and records: importing
    the evaluator's torch and megatron-core there cost seconds per launch; they load when a step needs them."""
    probe = (
        "import sys, longctx.cli.main, longctx.stage.run_policy; "
        "print(sorted({'torch', 'megatron.core'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout
