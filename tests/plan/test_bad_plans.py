"""Bad plans: each is refused with a message naming the field, and `plan check` exits 2."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from tests.fixtures.plan_toml import cluster_plan, write_plan_toml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def good(oellm_like_manifest: Path, tmp_path: Path) -> dict[str, Any]:
    return cluster_plan(tmp_path, oellm_like_manifest)


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    p = write_plan_toml(tmp_path, data)
    tomllib.loads(p.read_text())  # the helper writes valid TOML
    return p


def refused(tmp_path: Path, data: dict[str, Any]) -> PlanError:
    with pytest.raises(PlanError) as info:
        resolve_plan(load_plan(write(tmp_path, data)))
    return info.value


def test_good_plan_resolves(tmp_path: Path, good: dict[str, Any]) -> None:
    rp = resolve_plan(load_plan(write(tmp_path, good)))
    assert [s.name for s in rp.stages] == ["16k", "64k"]
    s64 = rp.stage("64k")
    assert (s64.tp, s64.cp, s64.dp) == (2, 2, 1)
    assert s64.train_iters == -(-10_000_000 // (4 * 65536))


def test_a_warmup_fraction_stops_short_of_a_one_iteration_stage(tmp_path: Path, good: dict[str, Any]) -> None:
    """Megatron asserts warm-up < decay: 10 % of one iteration rounds up to the whole stage, so the
    fraction's warm-up stops one short (0), where an explicit warm-up that long is refused."""
    good["defaults"]["lr"] = {"warmup_fraction": 0.1}
    _stage(good, 0).update(tokens=8 * 16384)
    rp = resolve_plan(load_plan(write(tmp_path, good)))
    assert (rp.stage("16k").train_iters, rp.stage("16k").warmup_iters) == (1, 0)
    good["defaults"]["lr"] = {"warmup_iters": 1}
    err = refused(tmp_path, good)
    assert "warmup 1 iterations is not shorter than the stage (1)" in err.what, err.what


def _stage(d: dict[str, Any], i: int) -> dict[str, Any]:
    return d["stages"][i]


CASES: list[tuple[str, Any, str, str]] = [
    # (id, mutation, pattern in message, pattern in where+message naming the field)
    (
        "unknown-stage-key",
        lambda d: _stage(d, 0).update(seq_lenght=1),
        r"unknown key",
        r"stages\[0\] \('16k'\)\.seq_lenght",
    ),
    (
        "float-base",
        lambda d: _stage(d, 0).update(rope={"base": 1e6}),
        r"rotary base must be an integer",
        r"stages\[0\].*rope\.base",
    ),
    (
        "decreasing-base",
        lambda d: _stage(d, 1).update(rope={"base": 500_000}),
        r"lower than the previous stage",
        r"stages\[1\] \('64k'\)\.rope",
    ),
    ("missing-tokenizer", lambda d: d.pop("tokenizer"), r"tokenizer: required but missing", r"tokenizer"),
    (
        "tokens-below-batch",
        lambda d: _stage(d, 0).update(tokens=1000),
        r"less than one global batch",
        r"stages\[0\].*tokens",
    ),
    (
        "cp-not-dividing",
        lambda d: _stage(d, 0).update(seq_length=16400, context_parallel=16, nodes=8, global_batch_size=1),
        r"not divisible by 2·CP",
        r"context_parallel",
    ),
    (
        "batch-not-divisible",
        lambda d: _stage(d, 0).update(global_batch_size=3),
        r"not divisible by micro_batch_size × DP",
        r"global_batch_size",
    ),
    (
        "tp-heads",
        lambda d: d["defaults"].update(tensor_parallel=3),
        r"num_attention_heads 8 is not divisible by TP 3",
        r"tensor_parallel",
    ),
    (
        "max-position",
        lambda d: _stage(d, 0).update(max_position_embeddings=8192),
        r"max_position_embeddings 8192 is below seq_length",
        r"max_position_embeddings",
    ),
    (
        "world-not-divisible",
        lambda d: _stage(d, 1).update(context_parallel=8, nodes=1, global_batch_size=4),
        r"not a multiple of TP·PP·CP",
        r"nodes",
    ),
    (
        "unknown-rope-method",
        lambda d: _stage(d, 0).update(rope={"method": "magic"}),
        r"RoPE method cannot be applied",
        r"rope",
    ),
    (
        "base-and-method",
        lambda d: _stage(d, 0).update(rope={"base": 10, "method": "abf"}),
        r"exactly one of `base`",
        r"rope",
    ),
    (
        "use-checkpoint-args",
        lambda d: _stage(d, 0).update(extra_args=["--use-checkpoint-args"]),
        r"--use-checkpoint-args",
        r"extra_args",
    ),
    (
        "owned-flag",
        lambda d: _stage(d, 0).update(extra_args=["--seq-length", "8"]),
        r"sets --seq-length, which the planner derives",
        r"extra_args",
    ),
    (
        "memory",
        lambda d: (
            d["defaults"].pop("nodes"),
            d["model"].update(
                num_layers=32,
                hidden_size=4096,
                ffn_hidden_size=11008,
                num_attention_heads=32,
                num_query_groups=8,
                kv_channels=128,
            ),
            _stage(d, 1).update(context_parallel=1, global_batch_size=2),
        ),
        r"needs .* GiB per GPU.*smallest CP that fits",
        r"context_parallel",
    ),
    ("duplicate-stage", lambda d: _stage(d, 1).update(name="16k"), r"stage names must be unique", r"plan"),
    ("no-data", lambda d: d["defaults"].pop("data"), r"no data for this stage", r"data"),
    ("negative-tokens", lambda d: _stage(d, 0).update(tokens=-5), r"greater than 0", r"tokens"),
    (
        "tokens-past-any-run",
        lambda d: _stage(d, 0).update(tokens=10**23),
        r"less than or equal to 1000000000000000",
        r"tokens",
    ),
    (
        "infinite-lr",
        lambda d: d["defaults"].setdefault("lr", {}).update(lr=float("inf")),
        r"finite number",
        r"lr\.lr",
    ),
    (
        "beta-of-one",
        lambda d: d["defaults"].setdefault("lr", {}).update(adam_beta2=1.0),
        r"less than 1",
        r"adam_beta2",
    ),
    (
        "negative-init-std",
        lambda d: d["model"].update(init_method_std=-0.02),
        r"greater than 0",
        r"init_method_std",
    ),
    ("negative-seed", lambda d: d["defaults"].update(seed=-1), r"greater than or equal to 0", r"seed"),
]


@pytest.mark.parametrize(("mutate", "message", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_plan_is_refused_naming_the_field(
    tmp_path: Path, good: dict[str, Any], mutate: Any, message: str, field: str
) -> None:
    mutate(good)
    err = refused(tmp_path, good)
    text = f"{err.what} {err.where or ''}"
    assert re.search(message, text), text
    assert re.search(field, text), text


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed\n")
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan(bad)
    with pytest.raises(PlanError, match="plan file not found"):
        load_plan(tmp_path / "nope.toml")


def test_unset_environment_variable_is_named(tmp_path: Path, good: dict[str, Any], monkeypatch) -> None:
    monkeypatch.delenv("LONGCTX_TEST_UNSET", raising=False)
    good["run_dir"] = "${LONGCTX_TEST_UNSET}/run"
    err = refused(tmp_path, good)
    assert "LONGCTX_TEST_UNSET" in err.what and "run_dir" in err.what
    good["run_dir"] = "${LONGCTX_TEST_UNSET:-" + str(tmp_path) + "}/run"
    assert resolve_plan(load_plan(write(tmp_path, good))).run_dir == tmp_path / "run"


def test_cli_validate_exits_2_with_the_field(tmp_path: Path, good: dict[str, Any]) -> None:
    _stage(good, 0)["global_batch_size"] = 3
    r = CliRunner().invoke(app, ["plan", "check", str(write(tmp_path, good))])
    assert r.exit_code == 2
    assert "batch-divisible" in r.output and "global_batch_size" in r.output


def test_cli_validate_ok_and_json(tmp_path: Path, good: dict[str, Any]) -> None:
    path = write(tmp_path, good)
    r = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["plan", "show", str(path), "--json"])
    assert r.exit_code == 0, r.output
    import json

    out = json.loads(r.output)
    assert out["ok"] is True and [s["stage"] for s in out["stages"]] == ["16k", "64k"]


def test_explicit_base_below_the_bound_warns(tmp_path: Path, good: dict[str, Any]) -> None:
    _stage(good, 1)["rope"] = {"base": 1_000_000}
    rp = resolve_plan(load_plan(write(tmp_path, good)))
    assert "below-men-bound" in rp.findings.codes("warning")
