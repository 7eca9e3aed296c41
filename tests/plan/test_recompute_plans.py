"""Plans whose recompute or attention settings Megatron would refuse, or ignore, are refused naming the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from longctx.errors import PlanError
from longctx.plan.derive import resolve_plan, validate_plan
from longctx.plan.load import load_plan
from longctx.plan.schema import Plan
from tests.fixtures.plan_toml import cluster_plan, write_plan_toml


@pytest.fixture
def plan(oellm_like_manifest: Path, tmp_path: Path) -> dict[str, Any]:
    """One 16K stage of an 8-layer model at TP 2 · PP 2."""
    data = cluster_plan(tmp_path, oellm_like_manifest)
    data["model"]["num_layers"] = 8
    data["defaults"]["pipeline_parallel"] = 2
    del data["stages"][1]
    return data


def _load(tmp_path: Path, data: dict[str, Any]) -> Plan:
    return load_plan(write_plan_toml(tmp_path, data))


def _refused(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(PlanError) as info:
        resolve_plan(_load(tmp_path, data))
    return f"{info.value.what} {info.value.where or ''}"


def test_unset_recompute_is_none(tmp_path: Path, plan: dict[str, Any]) -> None:
    st = resolve_plan(_load(tmp_path, plan)).stages[0]
    assert (st.recompute, st.recompute_method, st.recompute_num_layers, st.recompute_modules) == (
        "none",
        None,
        None,
        (),
    )
    assert st.attention_backend == "flash"


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, stage settings, pattern in the message, pattern naming the field)
    (
        "unknown-module",
        {"recompute": "selective", "recompute_modules": ["attention"]},
        r"Input should be 'core_attn'",
        r"stages\[0\] \('16k'\)\.recompute_modules",
    ),
    (
        "num-layers-zero",
        {"recompute": "full", "recompute_num_layers": 0},
        r"greater than 0",
        r"recompute_num_layers",
    ),
    (
        "num-layers-negative",
        {"recompute": "full", "recompute_num_layers": -2},
        r"greater than 0",
        r"recompute_num_layers",
    ),
    (
        "unknown-method",
        {"recompute": "full", "recompute_method": "every"},
        r"'uniform' or 'block'",
        r"recompute_method",
    ),
    # PP 2: 4 layers per pipeline stage — Megatron's recompute_num_layers counts per stage
    (
        "uniform-not-dividing",
        {"recompute": "full", "recompute_num_layers": 3},
        r"does not divide the 4 layers",
        r"recompute_num_layers",
    ),
    (
        "uniform-too-many",
        {"recompute": "full", "recompute_num_layers": 8},
        r"more than the 4 layers per pipeline",
        r"recompute_num_layers",
    ),
    (
        "block-too-many",
        {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 5},
        r"more than the 4 layers",
        r"recompute_num_layers",
    ),
    (
        "selective-without-modules",
        {"recompute": "selective"},
        r"needs recompute_modules",
        r"recompute_modules",
    ),
    (
        "selective-empty",
        {"recompute": "selective", "recompute_modules": []},
        r"needs recompute_modules",
        r"recompute_modules",
    ),
    (
        "core-attn-alone",
        {"recompute": "selective", "recompute_modules": ["core_attn"]},
        r"core_attn with attention_backend 'flash' saves almost nothing",
        r"recompute_modules",
    ),
    (
        "repeated-module",
        {"recompute": "selective", "recompute_modules": ["mlp", "mlp"]},
        r"repeats mlp",
        r"recompute_modules",
    ),
    (
        "dense-layernorm",
        {"recompute": "selective", "recompute_modules": ["layernorm"]},
        r"layernorm recomputes nothing",
        r"recompute_modules",
    ),
    (
        "dense-moe-act",
        {"recompute": "selective", "recompute_modules": ["moe_act"]},
        r"this model is dense",
        r"recompute_modules",
    ),
]


@pytest.mark.parametrize(("stage", "message", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_recompute_is_refused_naming_the_field(
    tmp_path: Path, plan: dict[str, Any], stage: dict[str, Any], message: str, field: str
) -> None:
    plan["stages"][0].update(stage)
    text = _refused(tmp_path, plan)
    assert re.search(message, text), text
    assert re.search(field, text), text


def test_block_of_all_layers_of_a_pipeline_stage_is_fine(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["stages"][0].update(recompute="full", recompute_method="block", recompute_num_layers=4)
    st = resolve_plan(_load(tmp_path, plan)).stages[0]
    assert (st.recompute_method, st.recompute_num_layers) == ("block", 4)


def test_local_attention_backend_is_refused(tmp_path: Path, plan: dict[str, Any]) -> None:
    # Megatron-LM allows `local` only with --spec local, which longctx's argv never has
    plan["megatron"] = {"attention_backend": "local"}
    text = _refused(tmp_path, plan)
    assert re.search(
        r"megatron\.attention_backend: Input should be 'flash', 'fused', 'unfused' or 'auto'", text
    )


def test_moe_modules_are_accepted_for_moe_models(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["model"].update(num_experts=4, moe_shared_expert_intermediate_size=256)
    plan["megatron"] = {"performance_args": ["--moe-grouped-gemm"]}
    plan["stages"][0].update(
        recompute="selective", recompute_modules=["moe_act", "layernorm", "shared_experts"]
    )
    st = resolve_plan(_load(tmp_path, plan)).stages[0]
    assert st.recompute_modules == ("moe_act", "layernorm", "shared_experts")
    plan["megatron"] = {}
    assert re.search(r"moe_act needs --moe-grouped-gemm", _refused(tmp_path, plan))
    plan["stages"][0].update(recompute_modules=["mlp"])
    assert re.search(r"mlp recomputes dense MLP layers only", _refused(tmp_path, plan))


def test_fields_of_another_policy_warn(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["defaults"].update(recompute_method="block", recompute_num_layers=2)
    plan["stages"][0].update(recompute="selective", recompute_modules=["mlp"])
    rp = validate_plan(_load(tmp_path, plan))
    assert rp.findings.ok
    warned = [f for f in rp.findings if f.code == "recompute-unused"]
    assert {f.where.rsplit(".", 1)[-1] for f in warned} == {"recompute_method", "recompute_num_layers"}
