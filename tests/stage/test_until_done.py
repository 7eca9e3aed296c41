"""`longctx.stage.until_done`: the loop behind `stage run --until-done` and `longctx demo`, called
directly with launches that lay out save dirs the way a trainer would (no training here)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from longctx.errors import StageError
from longctx.plan.derive import ResolvedPlan, resolve_plan
from longctx.plan.load import load_plan
from longctx.stage.run import LaunchOutcome
from longctx.stage.state import NextStep, plan_state
from longctx.stage.until_done import after_step, evaluate_finished, evaluates_after, run_until_done
from tests.fixtures.run import copy_base_save, write_plan


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.toml", fresh_run)


def _resolve(plan: Path):
    return lambda: resolve_plan(load_plan(plan))


class Trainer:
    """Launches that reach a stage's target (or `stop_at`), or fail with `fail_code`."""

    def __init__(self, *, stop_at: int | None = None, fail_code: int = 0) -> None:
        self.stop_at, self.fail_code = stop_at, fail_code
        self.launched: list[tuple[str, str, int]] = []

    def __call__(self, rp: ResolvedPlan, step: NextStep) -> LaunchOutcome:
        st = rp.stage(step.stage or "")
        self.launched.append((st.name, step.action, step.start_iteration))
        end = st.train_iters if self.stop_at is None else self.stop_at
        if end > step.start_iteration:
            copy_base_save(rp, st.name, end)
        after = plan_state(rp)[st.index]
        return LaunchOutcome(
            st.name, step.action, self.fail_code, step.start_iteration, after.iteration, after.status, 0.0
        )


def test_runs_every_stage_then_stops_all_done(plan: Path) -> None:
    trainer = Trainer()
    result = run_until_done(_resolve(plan), trainer)
    assert result.done and result.stop == "all-done" and result.exit_code == 0
    assert [(n, a) for n, a, _ in trainer.launched] == [("s1", "first-launch"), ("s2", "first-launch")]
    assert [o.status for o in result.outcomes] == ["done", "done"]
    again = run_until_done(_resolve(plan), trainer)  # decided from disk: nothing left
    assert again.done and again.outcomes == [] and len(trainer.launched) == 2


def test_one_step_without_until_done(plan: Path) -> None:
    result = run_until_done(_resolve(plan), Trainer(), until_done=False)
    assert (
        result.stop == "one-step" and [o.stage for o in result.outcomes] == ["s1"] and result.exit_code == 0
    )


def test_a_failed_launch_stops_with_its_exit_code(plan: Path) -> None:
    result = run_until_done(_resolve(plan), Trainer(fail_code=3))
    assert result.stop == "failed" and result.exit_code == 3 and len(result.outcomes) == 1
    killed = run_until_done(_resolve(plan), Trainer(fail_code=-15))
    assert killed.exit_code == 1  # a signal's negative code


def test_a_step_without_progress_stops(plan: Path) -> None:
    trainer = Trainer(stop_at=2)
    result = run_until_done(_resolve(plan), trainer)  # s1: 0 → 2, then 2 → 2 (no progress)
    assert result.stop == "failed" and "made no progress" in result.reason and result.exit_code == 1
    assert [(a, s) for _, a, s in trainer.launched] == [("first-launch", 0), ("resume", 2)]


def test_a_dry_run_launches_nothing(plan: Path) -> None:
    result = run_until_done(_resolve(plan), lambda rp, step: None)
    assert result.stop == "dry-run" and result.outcomes == [] and result.exit_code == 0


def test_a_blocked_step_raises(plan: Path, fresh_run: Path) -> None:
    (fresh_run / "base/checkpoints/latest_checkpointed_iteration.txt").unlink()
    with pytest.raises(StageError, match="cannot launch stage s1"):
        run_until_done(_resolve(plan), Trainer())


def test_after_step() -> None:
    def outcome(code: int, start: int, end: int, status: str) -> LaunchOutcome:
        return LaunchOutcome("s1", "resume", code, start, end, status, 0.0)

    assert after_step(outcome(0, 0, 2, "in-progress"), until_done=True) is None
    assert after_step(outcome(0, 2, 2, "done"), until_done=True) is None
    assert after_step(outcome(0, 2, 2, "in-progress"), until_done=True)[0] == "failed"
    assert after_step(outcome(0, 0, 2, "in-progress"), until_done=False)[0] == "one-step"
    assert after_step(outcome(1, 0, 2, "in-progress"), until_done=True)[0] == "failed"


def test_evaluation_after_a_stage(plan: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rp = resolve_plan(load_plan(plan))
    done = LaunchOutcome("s1", "first-launch", 0, 0, 6, "done", 0.0)
    assert rp.plan.local.eval_after_stage is False  # the test plan turns it off
    assert not evaluates_after(rp, done, backend="local", enabled=True)
    plan.write_text(plan.read_text().replace("eval_after_stage = false", "eval_after_stage = true"))
    rp = resolve_plan(load_plan(plan))
    assert evaluates_after(rp, done, backend="local", enabled=True)
    assert not evaluates_after(rp, done, backend="megatron-lm", enabled=True)
    assert not evaluates_after(rp, done, backend="local", enabled=False)
    assert not evaluates_after(
        rp, LaunchOutcome("s1", "resume", 0, 0, 2, "in-progress", 0.0), backend="local", enabled=True
    )

    import longctx.eval.runner as runner

    def broken(rp: ResolvedPlan, stage: str) -> None:
        raise RuntimeError("no memory")

    monkeypatch.setattr(runner, "evaluate_finished_stage", broken)
    warning = evaluate_finished(rp, "s1")
    assert warning is not None and "evaluation of stage s1 failed: no memory" in warning
    assert "longctx eval run <checkpoint> --plan PLAN --stage s1" in warning
    monkeypatch.setattr(runner, "evaluate_finished_stage", lambda rp, stage: time.sleep(0))
    assert evaluate_finished(rp, "s1") is None
