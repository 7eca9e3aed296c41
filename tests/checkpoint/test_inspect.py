"""inspect_checkpoint on real megatron-core saves: the inferred architecture matches the build config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.arch import ModelArch
from longctx.checkpoint import infer_arch, inspect_checkpoint
from longctx.cli.main import app
from tests.fixtures.checkpoint import VARIANTS, CheckpointFixtures

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_inferred_arch_matches_build_config(megatron_checkpoints: CheckpointFixtures, name: str) -> None:
    spec = VARIANTS[name]
    cfg = spec["arch"]
    report = inspect_checkpoint(megatron_checkpoints.save_dir(name), stub_megatron=True)
    a = report.arch
    heads, groups = cfg["num_attention_heads"], cfg["num_query_groups"] or cfg["num_attention_heads"]
    assert (a.num_layers, a.hidden_size, a.num_attention_heads, a.num_query_groups, a.kv_channels) == (
        cfg["num_layers"],
        cfg["hidden_size"],
        heads,
        groups,
        cfg["kv_channels"],
    )
    assert a.group_query_attention == (groups != heads)
    assert a.ffn_hidden_size == cfg["ffn_hidden_size"]
    assert (a.swiglu, a.qk_layernorm, a.untie_embeddings_and_output_weights, a.normalization) == (
        cfg["swiglu"],
        cfg["qk_layernorm"],
        cfg["untie_embeddings_and_output_weights"],
        cfg["normalization"],
    )
    assert a.padded_vocab_size == report.padded_vocab_size == spec["padded"]
    assert a.num_experts == cfg.get("num_experts")
    assert a.moe_ffn_hidden_size == cfg.get("moe_ffn_hidden_size")
    assert a.moe_shared_expert_intermediate_size == cfg.get("moe_shared_expert_intermediate_size")
    assert report.iteration == spec["iteration"] and report.iteration_source == "common state"
    assert report.tensor_model_parallel_size_from_layout == spec["tp"]
    assert report.args["rotary_base"] == 10000 and report.saved_args["seq_length"] == 64
    assert not report.findings.errors and not report.findings.warnings, report.findings
    # the shapes alone (no args) give the same answer where they can
    shapes = {k: t.shape for k, t in report.index.tensors.items()}
    bare = infer_arch(shapes)
    for field in (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "padded_vocab_size",
        "swiglu",
        "num_experts",
    ):
        if field == "ffn_hidden_size" and cfg.get("num_experts"):
            assert bare.sources[field] == "assumed"  # all-MoE layers have no dense FFN to measure
            continue
        assert getattr(bare, field) == getattr(a, field), field
    if cfg["qk_layernorm"]:  # QK-norm weights carry the head dim
        assert (bare.kv_channels, bare.num_attention_heads, bare.num_query_groups) == (
            cfg["kv_channels"],
            heads,
            groups,
        )
    # convertible to the plan's ModelArch, identical to the config it was built from
    built = ModelArch(**cfg, norm_epsilon=1e-5)
    inferred = report.to_model_arch()
    # diff makes defaults explicit: an MHA config's None groups equal the shapes' groups = heads
    assert built.diff(inferred) == {}
    if cfg["num_query_groups"] is None:
        assert inferred.num_query_groups == heads


@pytest.mark.parametrize(
    ("name", "contents", "layout", "source", "groups"),
    [
        ("gqa", "model", None, None, None),
        ("gqa_opt", "model+optimizer", "dp_reshardable", "content_metadata", 1),
        ("tp2", "model+optimizer", "dp_reshardable", "keys", 2),
        ("gqa_fully", "model+optimizer", "fully_reshardable", "keys", None),
    ],
)
def test_optimizer_layouts(
    megatron_checkpoints: CheckpointFixtures,
    name: str,
    contents: str,
    layout: str | None,
    source: str | None,
    groups: int | None,
) -> None:
    r = inspect_checkpoint(megatron_checkpoints.save_dir(name))
    assert r.contents == contents
    if layout is None:
        assert r.optimizer is None
        return
    assert (r.optimizer.layout, r.optimizer.layout_source, r.optimizer.dp_groups) == (layout, source, groups)
    assert r.optimizer.state_names == ["exp_avg", "exp_avg_sq", "param"]
    assert r.model_tensor_count < r.tensor_count
    assert r.has_rng_state == (layout == "dp_reshardable")


def test_eras_and_dtypes(megatron_checkpoints: CheckpointFixtures) -> None:
    old = inspect_checkpoint(megatron_checkpoints.save_dir("gqa"))
    assert (old.megatron_core_era, old.common_state_format) == ("<=0.18", "common.pt")
    assert old.backend.common_backend == "torch"
    new = inspect_checkpoint(megatron_checkpoints.save_dir("era019"))
    assert (new.megatron_core_era, new.common_state_format) == (">=0.19", "common_state")
    assert new.backend.common_backend is None and new.iteration == 6
    assert new.args["num_layers"] == 2
    tp2 = inspect_checkpoint(megatron_checkpoints.iter_dir("tp2"))
    assert tp2.kind == "iteration_dir" and tp2.dtypes.get("bfloat16")


def test_archives_read_in_place(ermine_archives: dict[str, Path], tmp_path: Path) -> None:
    before = sorted(p.name for p in ermine_archives["plain"].parent.iterdir())
    plain = inspect_checkpoint(ermine_archives["plain"])
    assert plain.kind == "save_dir" and plain.iteration == 5
    assert plain.location.endswith("x_model_only.tar:x_model_only/iter_0000005")
    nested = inspect_checkpoint(ermine_archives["nested"])
    assert nested.kind == "flat_dir" and nested.iteration == 5
    assert nested.location.endswith("x_model_only_ermine.tar.tar:x_model_only_ermine.tar:x_model_only_ermine")
    moe = inspect_checkpoint(ermine_archives["moe"])
    assert moe.arch.num_experts == 4
    assert sorted(p.name for p in ermine_archives["plain"].parent.iterdir()) == before  # nothing extracted


def test_head_dim_without_qk_norm_or_args(megatron_checkpoints: CheckpointFixtures) -> None:
    report = inspect_checkpoint(megatron_checkpoints.save_dir("tied"))
    shapes = {k: t.shape for k, t in report.index.tensors.items()}
    assumed = infer_arch(shapes)  # tied has no QK-norm: 128 is assumed and does not divide 128 rows
    assert assumed.sources.get("kv_channels") != "shape"
    given = infer_arch(shapes, head_dim=32)
    assert (given.kv_channels, given.num_attention_heads, given.num_query_groups) == (32, 4, 4)
    assert given.sources["kv_channels"] == "given"


def test_args_disagreeing_with_shapes_warn(megatron_checkpoints: CheckpointFixtures) -> None:
    report = inspect_checkpoint(megatron_checkpoints.save_dir("gqa"))
    shapes = {k: t.shape for k, t in report.index.tensors.items()}
    args = dict(report.args, hidden_size=128)
    from longctx.report import Findings

    f = Findings()
    a = infer_arch(shapes, args, findings=f)
    assert a.hidden_size == 64
    assert [x.message for x in f.warnings] == [
        "saved args say hidden_size=128 but the tensor shapes say 64 (shapes are what loads)"
    ]


def test_cli_inspect_json_uses_megatron_names(megatron_checkpoints: CheckpointFixtures) -> None:
    res = cli("ckpt", "inspect", megatron_checkpoints.save_dir("gqa_opt"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["iteration"] == 10 and data["padded_vocab_size"] == 640
    arch = data["arch"]
    for key in (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
        "untie_embeddings_and_output_weights",
        "qk_layernorm",
        "num_experts",
    ):
        assert key in arch
    assert data["saved_args"]["rotary_base"] == 10000 and data["args"]["seq_length"] == 64
    assert data["optimizer"]["layout"] == "dp_reshardable"
    res = cli("ckpt", "inspect", megatron_checkpoints.save_dir("moe"))
    assert res.exit_code == 0, res.output
    assert "moe_shared_expert_intermediate_size" in res.output
