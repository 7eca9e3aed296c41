"""A YaRN stage end to end on the planner's side: a plan on Megatron-LM 0.19 resolves with the scaling on its
stage, `stage args` emits `--position-embedding-type yarn` and the YaRN flags (each in 0.19's parser source,
each once, none contradicted), `plan show` carries it; the same plan on 0.16, on the local backend, with a
partial rotary dimension, a bidirectional objective or another scaling is refused with what/where/fix."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError, StageError
from longctx.plan.derive import ResolvedPlan, resolve_plan, validate_plan
from longctx.plan.load import load_plan
from longctx.rope.scaling import RopeScaling
from longctx.stage import ledger
from longctx.stage.ledger_events import RecordedBinding
from longctx.stage.megatron_source import parser_flags
from longctx.stage.run import local_spec
from tests.fixtures.plan_toml import cluster_plan, write_plan_toml

CHECKOUT_019 = Path(__file__).resolve().parents[3] / "shared" / "megatron-lm-0.19"
YARN = {"method": "yarn", "params": {"base": 1_000_000, "original_length": 16384}}
# what 16K → 64K with YaRN means on Megatron-LM 0.19's command line
YARN_WORDS = {
    "--position-embedding-type": "yarn", "--rotary-base": "1000000", "--rotary-scaling-factor": "4",
    "--yarn-original-max-position-embeddings": "16384", "--yarn-beta-fast": "32", "--yarn-beta-slow": "1",
    "--mscale": "1", "--mscale-all-dim": "0",
}  # fmt: skip
runner = CliRunner()


@pytest.fixture
def plan(oellm_like_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """4K base → 16K (base 1M) → 64K with YaRN factor 4 over the 16K stage, on Megatron-LM 0.19."""
    monkeypatch.delenv("LONGCTX_MEGATRON_LM", raising=False)
    data = cluster_plan(tmp_path, oellm_like_manifest)
    data["megatron"] = {"version": "0.19.0"}
    data["stages"][1]["rope"] = YARN
    return data


def _resolve(tmp_path: Path, data: dict[str, Any]) -> ResolvedPlan:
    return resolve_plan(load_plan(write_plan_toml(tmp_path, data)))


def _refused(tmp_path: Path, data: dict[str, Any]) -> PlanError:
    with pytest.raises(PlanError) as info:
        _resolve(tmp_path, data)
    err = info.value
    assert err.what and err.where and err.fix, err
    return err


def test_yarn_stage_resolves_and_plan_show_carries_it(tmp_path: Path, plan: dict[str, Any]) -> None:
    rp = _resolve(tmp_path, plan)
    first, st = rp.stages
    assert first.rope_scaling is None and first.summary()["rope_scaling"] is None
    assert st.rope_method == "yarn" and st.rotary_base == 1_000_000
    assert st.rope_scaling == RopeScaling("yarn", 4.0, 16384, 32.0, 1.0, 1.0, 0.0)
    assert rp.findings.ok and not [f for f in rp.findings if f.code.startswith("scaling")], rp.findings
    res = runner.invoke(app, ["plan", "show", str(write_plan_toml(tmp_path, plan)), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)["stages"][1]
    assert shown["rope_method"] == "yarn" and shown["rotary_base"] == 1_000_000
    assert shown["rope_scaling"] == {
        "type": "yarn",
        "factor": 4.0,
        "original_length": 16384,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.0,
    }
    text = runner.invoke(app, ["plan", "show", str(write_plan_toml(tmp_path, plan))])
    assert text.exit_code == 0 and "64k: rotary base 1,000,000 — yarn (Peng et al. 2023)" in text.stdout


def _flag_values(words: list[str]) -> dict[str, list[str]]:
    """Each flag of an argv with its values (a repeated flag keeps every occurrence's, joined)."""
    out: dict[str, list[str]] = {}
    last = None
    for w in words:
        if w.startswith("--"):
            out.setdefault(w, [])
            last = w
            out[w].append("")
        elif last is not None:
            out[last][-1] = f"{out[last][-1]} {w}".strip()
    return out


def test_stage_args_emit_yarn_flags_that_0_19_parses(tmp_path: Path, plan: dict[str, Any]) -> None:
    if not (CHECKOUT_019 / "megatron" / "training" / "arguments.py").is_file():
        pytest.skip(f"0.19's checkout is not beside this clone ({CHECKOUT_019})")
    plan["megatron"]["path"] = str(CHECKOUT_019)  # the launch checks the checkout is 0.19.0
    res = runner.invoke(app, ["stage", "args", str(write_plan_toml(tmp_path, plan)), "64k", "--json"])
    assert res.exit_code == 0, res.output
    words = json.loads(res.stdout)[1:]
    flags = _flag_values(words)
    for flag, value in YARN_WORDS.items():
        assert flags[flag] == [value], (flag, flags.get(flag))  # there, once, with the stage's value
    assert "--use-rotary-position-embeddings" not in flags and "--use-rope-scaling" not in flags
    known = parser_flags(CHECKOUT_019)
    for flag, values in flags.items():
        assert flag in known, f"{flag} is not in 0.19's parser"
        assert known[flag].takes_value == bool(values[0]), flag
        kind = {"int": int, "float": float}.get(known[flag].value_type or "")
        for v in values if kind else ():
            kind(v)  # Megatron's parser takes the word
    # the base-only stage keeps plain RoPE
    plain = _flag_values(
        json.loads(
            runner.invoke(
                app, ["stage", "args", str(write_plan_toml(tmp_path, plan)), "16k", "--json"]
            ).stdout
        )[1:]
    )
    assert plain["--position-embedding-type"] == ["rope"] and "--rotary-scaling-factor" not in plain


def test_yarn_on_0_16_is_refused_naming_the_version(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["megatron"]["version"] = "0.16.1"
    err = _refused(tmp_path, plan)
    assert "RoPE method 'yarn' cannot run on Megatron-LM 0.16.1 ([megatron].version)" in err.what
    assert "exist for GPT only from megatron-core 0.19.0" in err.what
    assert err.where.endswith("stages[1] ('64k').rope.method") and "≥ 0.19" in (err.fix or "")
    res = runner.invoke(app, ["plan", "check", str(write_plan_toml(tmp_path, plan)), "--json"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] is False
    [bad] = [f for f in doc["findings"] if f["level"] == "error"]
    assert bad["code"] == "rope-scaling" and bad["fix"] and "64k" in bad["where"]


def test_local_backend_refuses_a_yarn_stage(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["defaults"]["tensor_parallel"] = 1
    plan["cluster"]["gpus_per_node"] = 2
    rp = _resolve(tmp_path, plan)
    with pytest.raises(StageError) as info:
        local_spec(rp, rp.stage("64k"))
    err = info.value
    assert "local backend trains plain RoPE only" in err.what and "yarn (factor 4)" in err.what
    assert "stage 64k" in (err.where or "") and "--backend megatron-lm" in (err.fix or "")


@pytest.mark.parametrize(
    ("rope", "version", "said"),
    [
        (
            {"method": "yarn"},
            "0.16.1",
            r"cannot run on Megatron-LM 0\.16\.1 .* only from megatron-core 0\.19",
        ),
        (
            {"method": "llama3"},
            "0.19.0",
            r"'llama3' cannot run on Megatron-LM 0\.19\.0 .* original length 8192",
        ),
        (
            {"method": "linear", "params": {"factor": 4.0}},
            "0.16.1",
            r"'linear' cannot run on Megatron-LM 0\.16\.1 .* before megatron-core 0\.19",
        ),
        (
            {"method": "linear", "params": {"factor": 4.0}},
            "0.19.0",
            r"'linear': Megatron-LM 0\.19\.0 runs it, but longctx carries no scaling but yarn",
        ),
    ],
)
def test_other_scalings_are_refused(
    tmp_path: Path, plan: dict[str, Any], rope: dict[str, Any], version: str, said: str
) -> None:
    plan["megatron"]["version"] = version
    plan["stages"] = plan["stages"][:1]
    plan["stages"][0]["rope"] = rope
    err = _refused(tmp_path, plan)
    assert re.search(said, err.what), err.what


def test_partial_rotary_and_bidirectional_yarn_are_refused(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["stages"] = plan["stages"][:1]
    plan["stages"][0]["rope"] = {"method": "yarn"}
    partial = {**plan, "model": {**plan["model"], "rotary_percent": 0.5}}
    assert "YarnRotaryEmbedding computes its frequencies over kv_channels" in _refused(tmp_path, partial).what
    mdm = {**plan, "objective": {"kind": "mdm"}}
    found = [
        f
        for f in validate_plan(load_plan(write_plan_toml(tmp_path, mdm))).findings
        if f.code == "rope-scaling"
    ]
    assert len(found) == 1 and "bidirectional objective" in found[0].message


def test_original_length_other_than_the_previous_stage_warns(tmp_path: Path, plan: dict[str, Any]) -> None:
    plan["stages"][1]["rope"] = {"method": "yarn", "params": {"base": 1_000_000}}  # from the 4K base
    rp = _resolve(tmp_path, plan)
    assert rp.stages[1].rope_scaling == RopeScaling("yarn", 16.0, 4096, 32.0, 1.0, 1.0, 0.0)
    [warn] = [f for f in rp.findings if f.code == "scaling-original-length"]
    assert warn.level == "warning" and "last trained at 16,384" in warn.message
    assert "original_length = 16384" in (warn.fix or "")


@pytest.mark.parametrize(
    "words",
    [
        ["--use-rotary-position-embeddings"],
        ["--no-yarn-correction-range-round-to-int"],
        ["--rope-scaling-factor", "4"],
        ["--yarn-beta-fast=16"],
    ],
)
def test_rope_flags_in_extra_args_are_the_planners(
    tmp_path: Path, plan: dict[str, Any], words: list[str]
) -> None:
    plan["stages"][1]["extra_args"] = words
    err = _refused(tmp_path, plan)
    assert "which the planner derives" in err.what and "the stage's rope (method/base) field" in (
        err.fix or ""
    )


def test_the_ledger_binds_the_scaling() -> None:
    """A started stage whose plan now adds (or drops) YaRN is a binding conflict; a record written before the
    scaling was bound is not compared on it."""
    yarn = {"type": "yarn", "factor": 4.0, "original_length": 16384}
    now = ledger.Binding("md5", "data", "base", 1_000_000, 65536, rope_scaling=yarn)
    plain = ledger.Binding("md5", "data", "base", 1_000_000, 65536).to_json()
    assert ledger.binding_conflicts(RecordedBinding.model_validate(plain), now) == {
        "rope_scaling": (None, yarn)
    }
    older = RecordedBinding.model_validate({k: v for k, v in plain.items() if k != "rope_scaling"})
    assert ledger.binding_conflicts(older, now) == {}
    assert (
        ledger.binding_conflicts(RecordedBinding.model_validate(json.loads(json.dumps(now.to_json()))), now)
        == {}
    )
