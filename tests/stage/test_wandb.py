"""A plan's [wandb] table reaches both backends: Megatron-LM's --wandb-* flags in the stage argv and the
local trainer's spec; the trainer logs to TensorBoard alone (and says so) when `wandb` is not installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage.megatron_args import stage_flags
from longctx.util.wandb_settings import WandbSettings

REPO = Path(__file__).resolve().parents[2]


def test_wandb_table_becomes_megatron_lms_flags(baby) -> None:
    rp, tmp = baby
    assert not any(f.name.startswith("--wandb") for f in stage_flags(rp, rp.stage("64k")))  # none by default
    plan = rp.plan.model_copy(update={"wandb": WandbSettings(project="baby-longctx", exp_name="try1")})
    rp = resolve_plan(plan)
    flags = {f.name: f.values for f in stage_flags(rp, rp.stage("64k"))}
    save = str(tmp / "run" / "stages" / "64k" / "wandb")
    assert flags["--wandb-project"] == ("baby-longctx",)
    assert flags["--wandb-exp-name"] == ("try1-64k",)
    assert flags["--wandb-save-dir"] == (save,)
    # the local trainer's spec takes the stage's settings as they are: one type from the plan to both backends
    assert rp.stage("64k").wandb == WandbSettings(project="baby-longctx", exp_name="try1-64k", save_dir=save)


def test_wandb_save_dir_takes_the_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGCTX_BABY_RUN_DIR", str(tmp_path / "run"))
    plan = load_plan(REPO / "stages" / "baby_9b_dense.toml")
    plan = plan.model_copy(
        update={"wandb": WandbSettings(project="p", exp_name="e", save_dir="${RUN_DIR}/wb")}
    )
    rp = resolve_plan(plan)
    assert rp.stage("16k").wandb.save_dir == str(tmp_path / "run" / "wb" / "16k")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_local_trainer_without_wandb_logs_to_tensorboard_and_says_so(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from longctx.train.events import TrainingEvents

    ev = TrainingEvents(
        tmp_path / "tb", WandbSettings(project="p", exp_name="e", save_dir=str(tmp_path / "wb"))
    )
    assert "wandb" in ev.wandb_note and ev.wandb_run is None
    ev.iteration(1, 4, loss=5.0, lr=1e-3, grad_norm=1.0, batch_size=4, seconds=0.5, tokens_per_second=100.0)
    ev.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("lm loss")] == [(1, 5.0)]
