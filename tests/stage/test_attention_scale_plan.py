"""`attention_scale` on the planner's side: "yarn" resolves from the stage's length over the previous one's,
a number stands as given, the ledger binds it, `plan check` says which backend applies it, and Megatron-LM's
argv builder refuses the stage with what/where/fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError, StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage import ledger
from longctx.stage.ledger_events import RecordedBinding
from longctx.stage.megatron_args import stage_flags
from tests.fixtures.plan_toml import cluster_plan, write_plan_toml

runner = CliRunner()


@pytest.fixture
def plan(oellm_like_manifest: Path, tmp_path: Path) -> dict[str, Any]:
    """4K base → 16K ("yarn") → 64K (× 1.5)."""
    data = cluster_plan(tmp_path, oellm_like_manifest)
    data["stages"][0]["attention_scale"] = "yarn"
    data["stages"][1]["attention_scale"] = 1.5
    return data


def test_yarn_and_a_number_resolve_and_plan_check_says_who_applies_them(
    tmp_path: Path, plan: dict[str, Any]
) -> None:
    rp = resolve_plan(load_plan(write_plan_toml(tmp_path, plan)))
    s16, s64 = rp.stages
    assert s16.attention_scale == pytest.approx(1.2965, abs=1e-4)  # (0.1·ln 4 + 1)²
    assert s64.attention_scale == 1.5 and s64.summary()["attention_scale"] == 1.5
    shown = runner.invoke(app, ["plan", "show", str(write_plan_toml(tmp_path, plan))])
    assert (
        "64k: rotary base 8,000,000" in shown.stdout and "attention logits × 1.5 at its start" in shown.stdout
    )
    infos = [f for f in rp.findings if f.code == "attention-scale-local"]
    assert [f.level for f in infos] == ["info", "info"] and "× 1.296" in infos[0].message

    plan["megatron"] = {"version": "0.16.1"}  # a plan for the cluster: the same finding is a warning
    res = runner.invoke(app, ["plan", "check", str(write_plan_toml(tmp_path, plan)), "--json"])
    doc = json.loads(res.stdout)
    warned = [f for f in doc["findings"] if f["code"] == "attention-scale-local"]
    assert [f["level"] for f in warned] == ["warning", "warning"]
    assert "--backend megatron-lm` refuses this stage" in warned[0]["message"] and warned[0]["fix"]


def test_megatron_lm_refuses_a_scaled_stage(tmp_path: Path, plan: dict[str, Any]) -> None:
    rp = resolve_plan(load_plan(write_plan_toml(tmp_path, plan)))
    with pytest.raises(StageError) as info:
        stage_flags(rp, rp.stage("64k"))
    err = info.value
    assert (
        "scales its attention logits by 1.5" in err.what and "pretrain_gpt.py loads them unscaled" in err.what
    )
    assert "64k attention_scale" in (err.where or "") and "--backend local" in (err.fix or "")


@pytest.mark.parametrize(("value", "said"), [(0.5, "greater than or equal to 1"), ("sharp", "yarn")])
def test_a_bad_scale_is_refused_naming_the_field(
    tmp_path: Path, plan: dict[str, Any], value: Any, said: str
) -> None:
    plan["stages"][1]["attention_scale"] = value
    with pytest.raises(PlanError) as info:
        resolve_plan(load_plan(write_plan_toml(tmp_path, plan)))
    assert said in info.value.what and "attention_scale" in f"{info.value.where} {info.value.what}"


def test_the_ledger_binds_the_scale() -> None:
    now = ledger.Binding("md5", "data", "base", 1_000_000, 16384, attention_scale=1.2965)
    plain = ledger.Binding("md5", "data", "base", 1_000_000, 16384).to_json()
    assert ledger.binding_conflicts(RecordedBinding.model_validate(plain), now) == {
        "attention_scale": (1.0, 1.2965)
    }
    older = RecordedBinding.model_validate({k: v for k, v in plain.items() if k != "attention_scale"})
    assert ledger.binding_conflicts(older, now) == {}
