"""Golden argv of the baby_9b_dense stages, and why each flag is there.

The plan's artifact is replaced by a small one with the producer's layout (run lc16k_full_20260507,
tiers 16k_plus / 4_16k / under4k) of which only the manifests are present — enough for the blend.
Regenerate the golden files with LONGCTX_REGEN_GOLDEN=1 after an intended change, and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from longctx.errors import PlanError, StageError
from longctx.megatron_versions import first_version
from longctx.plan.derive import resolve_plan, validate_plan
from longctx.stage.megatron_args import render_lines, stage_flags

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
RUN = "lc16k_full_20260507"


def _normalised(lines: list[str], tmp: Path) -> str:
    return "\n".join(lines).replace(str(tmp), "<TMP>") + "\n"


@pytest.mark.parametrize("stage", ["16k", "64k", "128k"])
def test_golden_argv(baby, stage: str) -> None:
    rp, tmp = baby
    text = _normalised(render_lines(rp, rp.stage(stage)), tmp)
    golden = GOLDEN / f"baby_9b_dense_{stage}.txt"
    if os.environ.get("LONGCTX_REGEN_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


def _flags(rp, stage: str) -> dict[str, tuple[str, ...]]:
    return {f.name: f.values for f in stage_flags(rp, rp.stage(stage))}


def test_flags_that_matter(baby) -> None:
    rp, _ = baby
    f16, f64, f128 = (_flags(rp, s) for s in ("16k", "64k", "128k"))
    # integers where Megatron wants integers; the base each stage planned
    assert (f16["--rotary-base"], f64["--rotary-base"], f128["--rotary-base"]) == (
        ("1200000",),
        ("8400000",),
        ("31000000",),
    )
    for f, s, cp in ((f16, "16384", "1"), (f64, "65536", "4"), (f128, "131072", "8")):
        assert f["--seq-length"] == f["--max-position-embeddings"] == (s,)
        assert f["--context-parallel-size"] == (cp,)
        assert "--no-create-attention-mask-in-dataloader" in f  # an S×S float mask per sample at 128K
        assert f["--ckpt-format"] == ("torch_dist",)
        assert f["--save"] == f["--load"]  # relaunches resume the stage itself
        assert "--exit-on-missing-checkpoint" in f  # never a silent random initialisation
        assert "--use-checkpoint-args" not in f  # it would restore the pretraining base
        assert f["--exit-duration-in-mins"] == ("1410",) and "--exit-signal-handler" in f
        assert f["--tokenizer-type"] == ("HuggingFaceTokenizer",)
        assert f["--data-args-path"][0].endswith("data_args.txt")
    # each stage starts from the previous one (the first from the base checkpoint)
    assert f16["--pretrained-checkpoint"] == (
        "/leonardo_scratch/fast/OELLM_prod2026/production_training/baby_9b_dense/checkpoints",
    )
    assert (
        f64["--pretrained-checkpoint"] == f16["--save"] and f128["--pretrained-checkpoint"] == f64["--save"]
    )
    assert "--cp-comm-type" not in f16 and f64["--cp-comm-type"] == ("p2p",)
    # 8,388,608 tokens per iteration at every length
    assert (f16["--global-batch-size"], f64["--global-batch-size"], f128["--global-batch-size"]) == (
        ("512",),
        ("128",),
        ("64",),
    )


def test_data_args_file_is_the_tier_blend(baby) -> None:
    rp, tmp = baby
    path = Path(_flags(rp, "64k")["--data-args-path"][0])
    words = path.read_text().split()
    weights = [float(w) for w in words[::2]]
    assert sum(weights) == pytest.approx(1.0) and all(w > 0 for w in weights)
    assert all(p.startswith(str(tmp / "artifact")) for p in words[1::2])
    assert any("_16k_plus_" in p for p in words[1::2])


def test_flags_a_version_does_not_honour_are_refused(baby) -> None:
    rp, _ = baby
    st = rp.stage("16k")
    old = rp.plan.model_copy(update={"megatron": rp.plan.megatron.model_copy(update={"version": "0.15.0"})})
    rp_old = validate_plan(old)
    assert "--exit-signal" not in {f.name for f in stage_flags(rp_old, st)}  # omitted below 0.16
    assert first_version("--exit-signal") == (0, 16, 0)
    st_bad = type(st)(**{**st.__dict__, "extra_args": ["--dataloader-inter-document-masking"]})
    with pytest.raises(
        StageError,
        match=r"--dataloader-inter-document-masking does not exist in Megatron-LM 0.16.0 \(added in 0.19.0\)",
    ):
        stage_flags(rp, st_bad)


def test_missing_artifact_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(tmp_path / "nowhere"))
    monkeypatch.setenv("LONGCTX_BABY_RUN_DIR", str(tmp_path / "run"))
    from typer.testing import CliRunner

    from longctx.cli.main import app

    r = CliRunner().invoke(app, ["stage", "args", str(REPO / "stages" / "baby_9b_dense.toml"), "16k"])
    assert r.exit_code == 2 and "longctx data fetch" in r.output


# -- the attention kernel and the recompute policy, flag by flag ---------------------------------------------

_KERNEL_FLAGS = ("--attention-backend", "--use-flash-attn", "--recompute-activations", "--recompute-granularity",
                 "--recompute-method", "--recompute-num-layers", "--recompute-modules")  # fmt: skip


def _kernel(rp, stage: str) -> list[str]:
    """The attention and recompute lines of a stage's argv, in order."""
    return [f.line() for f in stage_flags(rp, rp.stage(stage)) if f.name in _KERNEL_FLAGS]


def _with(rp, *, megatron: dict | None = None, stages: int = 3, **defaults):
    """The baby plan with [megatron] and [defaults] settings changed (and only its first `stages`)."""
    plan = rp.plan.model_copy(
        update={
            "defaults": rp.plan.defaults.model_copy(update=defaults),
            "megatron": rp.plan.megatron.model_copy(update=megatron or {}),
            "stages": rp.plan.stages[:stages],
        }
    )
    return resolve_plan(plan)


def test_baby_argv_chooses_flash_with_attention_backend_and_recomputes_nothing(baby) -> None:
    rp, _ = baby
    for stage in ("16k", "64k", "128k"):
        # --use-flash-attn selects nothing for megatron-core models; --recompute-activations (core_attn
        # only) saves nothing next to flash attention and repeats its forward
        assert _kernel(rp, stage) == ["--attention-backend flash"]


@pytest.mark.parametrize("backend", ["flash", "fused", "auto"])
def test_attention_backend_is_the_plans(baby, backend: str) -> None:
    rp = _with(baby[0], megatron={"attention_backend": backend})
    for stage in ("16k", "64k", "128k"):
        assert _flags(rp, stage)["--attention-backend"] == (backend,)
        assert "--use-flash-attn" not in _flags(rp, stage)


def test_unfused_attention_is_refused_with_context_parallelism(baby) -> None:
    with pytest.raises(PlanError, match=r"attention_backend 'unfused' has no context parallelism") as info:
        _with(baby[0], megatron={"attention_backend": "unfused"})
    assert "megatron.attention_backend" in (info.value.where or "")


def test_full_recompute_defaults_to_uniform_one_layer(baby) -> None:
    rp = _with(baby[0], recompute="full")
    assert _kernel(rp, "64k") == [
        "--attention-backend flash",
        "--recompute-granularity full",
        "--recompute-method uniform",
        "--recompute-num-layers 1",
    ]


@pytest.mark.parametrize(("method", "layers"), [("uniform", 4), ("uniform", 36), ("block", 6), ("block", 35)])
def test_full_recompute_method_and_layers(baby, method: str, layers: int) -> None:
    rp = _with(baby[0], recompute="full", recompute_method=method, recompute_num_layers=layers)
    f = _flags(rp, "128k")
    assert f["--recompute-granularity"] == ("full",)
    assert f["--recompute-method"] == (method,)
    assert f["--recompute-num-layers"] == (str(layers),)
    assert "--recompute-modules" not in f and "--recompute-activations" not in f


@pytest.mark.parametrize("modules", [["mlp"]])
def test_selective_recompute_lists_the_modules(baby, modules: list[str]) -> None:
    rp = _with(baby[0], recompute="selective", recompute_modules=modules)
    f = _flags(rp, "64k")
    assert f["--recompute-granularity"] == ("selective",)
    assert f["--recompute-modules"] == tuple(modules)
    # Megatron-LM asserts that selective recompute has no method; Megatron-Core that it has no layer count
    assert "--recompute-method" not in f and "--recompute-num-layers" not in f
    assert "--recompute-activations" not in f


def test_selective_core_attn_is_emitted_for_unfused_attention(baby) -> None:
    # with the s×s probabilities stored, core_attn recompute is what saves memory
    rp = _with(
        baby[0],
        megatron={"attention_backend": "unfused"},
        stages=1,
        recompute="selective",
        recompute_modules=["core_attn", "mlp"],
    )
    assert _kernel(rp, "16k") == [
        "--attention-backend unfused",
        "--recompute-granularity selective",
        "--recompute-modules core_attn mlp",
    ]


@pytest.mark.parametrize(
    ("defaults", "message", "field"),
    [
        ({"recompute": "selective"}, r"needs recompute_modules", r"recompute_modules"),
        (
            {"recompute": "selective", "recompute_modules": ["core_attn"]},
            r"core_attn .* saves almost nothing",
            r"recompute_modules",
        ),
        (
            {"recompute": "selective", "recompute_modules": ["mlp", "core_attn"]},
            r"core_attn",
            r"recompute_modules",
        ),
        (
            {"recompute": "selective", "recompute_modules": ["layernorm"]},
            r"layernorm recomputes nothing",
            r"recompute_modules",
        ),
        (
            {"recompute": "selective", "recompute_modules": ["moe"]},
            r"this model is dense",
            r"recompute_modules",
        ),
        (
            {"recompute": "selective", "recompute_modules": ["mla_up_proj"]},
            r"multi-latent",
            r"recompute_modules",
        ),
        (
            {"recompute": "full", "recompute_num_layers": 5},
            r"does not divide the 36 layers",
            r"recompute_num_layers",
        ),
        (
            {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 37},
            r"more than the 36 layers per pipeline stage",
            r"recompute_num_layers",
        ),
    ],
)
def test_recompute_megatron_would_refuse_or_ignore_is_refused(
    baby, defaults, message: str, field: str
) -> None:
    with pytest.raises(PlanError) as info:
        _with(baby[0], **defaults)
    text = f"{info.value.what} {info.value.where or ''}"
    assert re.search(message, text), text
    assert re.search(field, text), text


@pytest.mark.parametrize("flag", ["--use-flash-attn", "--recompute-activations", "--attention-backend"])
def test_kernel_flags_in_performance_args_are_refused(baby, flag: str) -> None:
    with pytest.raises(PlanError, match=rf"performance_args (has|sets) {flag}") as info:
        _with(baby[0], megatron={"performance_args": [flag]})
    assert "megatron.performance_args" in (info.value.where or "")


@pytest.mark.parametrize("flag", ["--use-flash-attn", "--recompute-activations", "--recompute-granularity"])
def test_kernel_flags_in_extra_args_are_refused(baby, flag: str) -> None:
    with pytest.raises(PlanError, match=rf"extra_args (has|sets) {flag}"):
        _with(baby[0], extra_args=[flag])
