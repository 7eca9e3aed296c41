"""A plan edit that changes a started stage's LR schedule (lr, min lr, warmup, decay iterations, decay
style — what Megatron-LM's OptimizerParamScheduler asserts on resume) is refused before launching, with
the recorded and the new values; `--force` resumes with `--override-opt_param-scheduler` and the ledger
records the override. Launches are recorded, not run (no engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage import ledger
from longctx.stage.megatron_args import OVERRIDE_SCHEDULER_FLAG, argv
from longctx.stage.run import LaunchPlan, execute, prepare_launch, schedule_for
from tests.fixtures.run import BASE_ITERS, stamp_schedule, write_plan


@pytest.fixture(autouse=True)
def _any_python_may_plan_megatron(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests plan Megatron-LM launches; whether this Python may run Megatron-LM at all is
    tests/stage/test_megatron_python.py's question."""
    monkeypatch.setattr("longctx.stage.run.enums_pickled_by_name", lambda: False)


MLM = ["--backend", "megatron-lm", "--no-preflight"]


class Trainer:
    """Records each launch and leaves a complete save of the stage at the next iteration(s)."""

    def __init__(self, save_dir: Path, run_dir: Path) -> None:
        self.save_dir, self.run_dir = save_dir, run_dir
        self.calls: list[list[str]] = []

    def run(self, words, *, nproc, env, log) -> int:
        self.calls.append(list(words))
        done = sorted(int(p.name[5:]) for p in self.save_dir.glob("iter_*")) if self.save_dir.is_dir() else []
        it = (done[-1] if done else 0) + 2
        base = self.run_dir / "base" / "checkpoints" / f"iter_{BASE_ITERS:07d}"
        self.save_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(base, self.save_dir / f"iter_{it:07d}")
        _stamp_schedule(self.save_dir / f"iter_{it:07d}" / "common.pt", words)
        (self.save_dir / "latest_checkpointed_iteration.txt").write_text(str(it))
        return 0


def _stamp_schedule(common_pt: Path, words: list[str]) -> None:
    """The launch's schedule, read back from its argv, stamped on the copied save."""
    flag = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    stamp_schedule(
        common_pt,
        {
            "lr": flag["--lr"],
            "min_lr": flag["--min-lr"],
            "lr_decay_style": flag["--lr-decay-style"],
            "lr_warmup_iters": flag["--lr-warmup-iters"],
            "lr_decay_iters": flag["--lr-decay-iters"],
            "weight_decay": flag["--weight-decay"],
            "global_batch_size": flag["--global-batch-size"],
        },
    )


@pytest.fixture
def mlm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "Megatron-LM"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text("raise SystemExit('not run in these tests')\n")
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(root))
    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", "0")
    return root


def _edited(path: Path, run_dir: Path, *, lr: bool = True) -> Path:
    """The plan with more s1 tokens (→ more decay and warmup iterations) and, with `lr`, another peak LR."""
    p = write_plan(path, run_dir, s1_tokens=8 * 4 * 128)
    if lr:
        p.write_text(p.read_text().replace("lr = 2e-3\n", "lr = 3e-3\n", 1))
    return p


def test_a_schedule_edit_is_refused_then_forced(fresh_run: Path, tmp_path: Path, mlm: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    rp = resolve_plan(load_plan(plan))
    s1 = rp.stage("s1")
    trainer = Trainer(s1.save_dir, fresh_run)

    # the first launch records the schedule; no override flag: the argv is the stage's, unchanged
    lp = prepare_launch(rp, "megatron-lm")
    assert isinstance(lp, LaunchPlan) and lp.schedule_override is None
    assert lp.argv[1:] == argv(rp, s1, script=str(mlm / "pretrain_gpt.py"))
    execute(rp, lp, trainer)
    first = [r for r in ledger.read(fresh_run) if r.event == "launch"][-1]
    assert first.binding.schedule == schedule_for(s1) and first.schedule_override is None
    old = schedule_for(s1)

    # an unchanged plan resumes without the flag
    lp = prepare_launch(rp, "megatron-lm")
    assert lp.step.action == "resume" and OVERRIDE_SCHEDULER_FLAG not in lp.argv

    # the edit: refused before anything is launched or recorded, naming fields, old and new values, the fix
    edited = _edited(tmp_path / "edited.toml", fresh_run)
    rp2 = resolve_plan(load_plan(edited))
    new = schedule_for(rp2.stage("s1"))
    assert (new["lr"], new["lr_decay_iters"]) == (0.003, 8) and old["lr_decay_iters"] == 6
    before = ledger.read(fresh_run)
    with pytest.raises(StageError) as err:
        prepare_launch(rp2, "megatron-lm")
    what, fix = err.value.what, err.value.fix or ""
    assert "stage 's1' has started" in what and "Megatron-LM would stop on resume" in what
    assert "lr (--lr): 0.002 → 0.003" in what and "lr_decay_iters (--lr-decay-iters): 6 → 8" in what
    assert "min_lr" not in what  # unchanged fields are not named
    assert "revert" in fix and "lr = 0.002" in fix and "--force" in fix and OVERRIDE_SCHEDULER_FLAG in fix
    assert ledger.read(fresh_run) == before and len(trainer.calls) == 1

    # the CLI: a dry run refuses the same way (exit 2) …
    r = CliRunner().invoke(app, ["stage", "run", str(edited), *MLM, "--dry-run"])
    assert r.exit_code == 2 and "lr (--lr): 0.002 → 0.003" in r.output and "--force" in r.output, r.output
    # … and --force does not take a new peak LR: Megatron-LM would keep the checkpoint's (param groups)
    r = CliRunner().invoke(app, ["stage", "run", str(edited), *MLM, "--dry-run", "--force"])
    assert r.exit_code == 2 and "lr: 0.002 → 0.003" in r.output and "param groups" in r.output, r.output
    assert ledger.read(fresh_run) == before

    # the same edit without the LR (longer decay and warmup): --force shows the argv with the override
    edited = _edited(tmp_path / "edited-decay.toml", fresh_run, lr=False)
    rp2 = resolve_plan(load_plan(edited))
    new = schedule_for(rp2.stage("s1"))
    r = CliRunner().invoke(app, ["stage", "run", str(edited), *MLM, "--dry-run", "--force"])
    assert r.exit_code == 0, r.output
    assert OVERRIDE_SCHEDULER_FLAG in r.output and "resumes with another LR schedule" in r.output

    # --force: the launch's argv ends with the override, and the ledger records old → new
    lp = prepare_launch(rp2, "megatron-lm", force=True)
    assert lp.argv[-1] == OVERRIDE_SCHEDULER_FLAG and lp.argv[1:-1] == argv(
        rp2, rp2.stage("s1"), str(mlm / "pretrain_gpt.py")
    )
    execute(rp2, lp, trainer, force=True)
    assert trainer.calls[-1][-1] == OVERRIDE_SCHEDULER_FLAG
    forced = [r for r in ledger.read(fresh_run) if r.event == "launch"][-1]
    changed = {k: [old[k], new[k]] for k in old if old[k] != new[k]}
    assert forced.schedule_override == changed and "lr_decay_iters" in changed and "lr" not in changed
    assert OVERRIDE_SCHEDULER_FLAG in forced.argv
    assert json.loads(json.dumps(forced.binding.schedule)) == new

    # that launch saved: its checkpoints carry the new schedule, so the edited plan resumes plainly now,
    # and going back to the old schedule is the edit that is refused
    lp = prepare_launch(rp2, "megatron-lm")
    assert lp.schedule_override is None and OVERRIDE_SCHEDULER_FLAG not in lp.argv
    with pytest.raises(StageError, match=r"lr_decay_iters \(--lr-decay-iters\): 8 → 6"):
        prepare_launch(rp, "megatron-lm")


def test_a_stage_not_started_takes_the_edit(fresh_run: Path, tmp_path: Path, mlm: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    rp = resolve_plan(load_plan(plan))
    # a first launch that died before saving: the ledger has s1's schedule, the save dir no tracker
    lp = prepare_launch(rp, "megatron-lm")

    class Dies:
        def run(self, words, *, nproc, env, log) -> int:
            return 1

    execute(rp, lp, Dies())
    rp2 = resolve_plan(load_plan(_edited(tmp_path / "edited.toml", fresh_run)))
    lp = prepare_launch(rp2, "megatron-lm")  # Megatron-LM starts it from the base again: no check
    assert lp.step.action == "first-launch" and lp.schedule_override is None
    assert OVERRIDE_SCHEDULER_FLAG not in lp.argv
