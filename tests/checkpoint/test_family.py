"""The model family (ARM / MDM / UDM, dense / MoE) from real megatron-core saves of each layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint import inspect_checkpoint, verify_checkpoint
from longctx.checkpoint.adopt import adopt
from longctx.checkpoint.family import detect_family
from longctx.cli.main import app
from longctx.errors import PlanError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from tests.fixtures.checkpoint import CheckpointFixtures
from tests.fixtures.diffusion import DIFFUSION_VARIANTS, VOCAB
from tests.fixtures.run import write_plan


def cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("name", sorted(DIFFUSION_VARIANTS))
def test_every_layout_reports_its_family_and_shapes(diffusion_checkpoints: Path, name: str) -> None:
    spec = DIFFUSION_VARIANTS[name]
    report = inspect_checkpoint(diffusion_checkpoints / name)
    fam, arch = report.family, report.arch
    assert fam.label == spec["family"]
    assert fam.block == spec["block"]
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_query_groups) == (
        2,
        64,
        4,
        2,
    )
    assert arch.kv_channels == 16 and arch.qk_layernorm and arch.swiglu
    assert fam.tied is spec["tied"]
    assert fam.input_vocab_rows == VOCAB + int(spec["mask_row"])
    assert fam.output_vocab_rows == (None if spec["tied"] else VOCAB)
    assert fam.vocab_padded is False
    assert fam.mask_id == (VOCAB if spec["mask_row"] else None)
    if spec["arch"].get("num_experts"):
        assert fam.moe and arch.num_experts == 4 and arch.moe_ffn_hidden_size == 32
        assert fam.expert_layout == ("per-expert" if spec.get("per_expert") else "stacked")
    else:
        assert not fam.moe and arch.num_experts is None
    assert fam.attention == ("causal" if fam.family == "ARM" else "bidirectional")
    assert fam.evidence


def test_undecided_objective_is_an_explicit_unknown(diffusion_checkpoints: Path) -> None:
    fam = inspect_checkpoint(diffusion_checkpoints / "udm_moe").family
    assert fam.family == "UDM" and fam.objective is None
    assert any('objective = "udm"' in u for u in fam.unknown)
    mdm = inspect_checkpoint(diffusion_checkpoints / "mdm").family
    assert mdm.objective == "mdm" and not mdm.unknown
    assert "target_length" in mdm.diffusion_args


def test_time_conditioning_and_unknown_keys_are_listed(diffusion_checkpoints: Path) -> None:
    timed = inspect_checkpoint(diffusion_checkpoints / "udm_time")
    assert timed.family.time_conditioning_keys == [
        "encoder.layers.0.adaLN_modulation.1.weight",
        "time_embed.linear_1.weight",
    ]
    assert [f.code for f in timed.findings.warnings] == ["time-conditioning"]
    odd = verify_checkpoint(diffusion_checkpoints / "odd_keys")
    assert odd.ok and odd.family is not None and odd.family.family == "MDM"
    (warning,) = odd.findings.warnings
    assert (
        warning.code == "unknown-keys"
        and "encoder.layers.0.self_attention.relative_bias.weight" in warning.message
    )


@pytest.mark.parametrize("name", ["mdm", "mdm_tied", "udm_moe", "mdm_moe"])
def test_archives_tar_and_tar_tar(diffusion_archives: dict[str, Path], name: str) -> None:
    want = DIFFUSION_VARIANTS[name]["family"]
    for key in (name, f"{name}.tar.tar"):
        report = inspect_checkpoint(diffusion_archives[key])
        assert report.family.label == want, key
        verified = verify_checkpoint(diffusion_archives[key])
        assert verified.ok and verified.family is not None and verified.family.label == want


def test_adopted_encoder_checkpoint_keeps_its_layout(
    diffusion_archives: dict[str, Path], tmp_path: Path
) -> None:
    src = inspect_checkpoint(diffusion_archives["mdm_moe.tar.tar"])
    result = adopt(diffusion_archives["mdm_moe.tar.tar"], tmp_path / "adopted")
    assert result.verify is not None and result.verify.ok
    after = inspect_checkpoint(tmp_path / "adopted")
    assert after.family.label == "MDM-MoE"
    assert src.index is not None and after.index is not None
    assert {k: t.shape for k, t in after.index.tensors.items()} == {
        k: t.shape for k, t in src.index.tensors.items()
    }


def test_gpt_fixtures_are_autoregressive(megatron_checkpoints: CheckpointFixtures) -> None:
    for name, label in (("gqa", "ARM"), ("tied", "ARM"), ("moe", "ARM-MoE")):
        fam = inspect_checkpoint(megatron_checkpoints.save_dir(name)).family
        assert fam.label == label and fam.vocab_padded and not fam.unrecognised_keys


def test_cli_json_carries_the_family(diffusion_checkpoints: Path) -> None:
    res = cli("ckpt", "inspect", diffusion_checkpoints / "mdm_tied", "--json")
    assert res.exit_code == 0, res.output
    fam = json.loads(res.output)["family"]
    assert (fam["family"], fam["mask_id"], fam["mask_id_source"]) == (
        "MDM",
        VOCAB,
        "saved vocab_size (the first id past it)",
    )
    shown = cli("ckpt", "inspect", diffusion_checkpoints / "udm_moe")
    assert shown.exit_code == 0 and "UDM-MoE (objective unknown)" in shown.output


def test_shapes_alone() -> None:
    layer = {"decoder.layers.self_attention.linear_qkv.weight": (2, 96, 64)}
    arm = detect_family({**layer, "embedding.word_embeddings.weight": (256, 64)})
    assert (arm.family, arm.vocab_padded, arm.tied) == ("ARM", True, True)
    # the mask buffer without a mask row or saved vocab: MDM, mask id undecided
    buf = detect_family({**layer, "embedding.word_embeddings.weight": (256, 64), "subtokenizer.mask": (1,)})
    assert buf.family == "MDM" and buf.mask_id is None and any("subtokenizer.mask" in u for u in buf.unknown)
    # a padded input (`--padded-input 3`) still reveals the mask row
    padded = detect_family(
        {**layer, "embedding.word_embeddings.weight": (204, 64), "output_layer.weight": (200, 64)},
        {"padded_input": 3},
    )
    assert padded.family == "MDM" and padded.mask_id == 200
    empty = detect_family({"embedding.word_embeddings.weight": (256, 64)})
    assert empty.family is None and any("no transformer layers" in u for u in empty.unknown)


def _on_base(good: Path, out: Path, base: Path, *, from_checkpoint: bool = False) -> Path:
    text = good.read_text().replace('"${RUN_DIR}/base/checkpoints"', f'"{base}"')
    if from_checkpoint:  # no [model]: the architecture comes from the checkpoint
        text = re.sub(r"\[model\]\n(?:\w+ = \d+\n)+", "", text)
        text = text.replace('name = "test-tiny"\n', 'name = "test-tiny"\nmodel_from_checkpoint = true\n')
    out.write_text(text)
    return out


def test_a_diffusion_base_is_refused_before_anything_runs(
    tiny_run: Path, diffusion_checkpoints: Path, tmp_path: Path
) -> None:
    good = write_plan(tmp_path / "arm.toml", tiny_run)
    for name, label, why in (
        ("mdm", "MDM", "autoregressive"),
        ("udm_time", "UDM (objective unknown)", "time-conditioning"),
    ):
        # the architecture read from the checkpoint: the plan itself is refused
        derived = _on_base(
            good, tmp_path / f"{name}-derived.toml", diffusion_checkpoints / name, from_checkpoint=True
        )
        with pytest.raises(PlanError) as err:
            resolve_plan(load_plan(derived))
        assert f"the base checkpoint is a {label} model" in err.value.what and err.value.where.endswith(
            "base.path"
        )
        res = cli("plan", "check", derived)
        assert res.exit_code == 2 and why in res.output
        # an explicit [model]: the first launch refuses, and writes nothing
        plan = _on_base(good, tmp_path / f"{name}.toml", diffusion_checkpoints / name)
        rp = resolve_plan(load_plan(plan))
        before = sorted(p.relative_to(tiny_run) for p in tiny_run.rglob("*"))
        res = cli("stage", "run", plan, "--backend", "local")
        assert res.exit_code == 2, res.output
        assert f"the base checkpoint is a {label} model" in res.output
        assert sorted(p.relative_to(tiny_run) for p in tiny_run.rglob("*")) == before
        assert rp.stages[0].load_from == diffusion_checkpoints / name


def test_longctx_saves_carry_their_objective() -> None:
    """A uniform-state model longctx trained in the GPT layout has no mask row: its saved objective decides."""
    layer = {"decoder.layers.0.self_attention.linear_qkv.weight": (192, 64)}
    shapes = {**layer, "embedding.word_embeddings.weight": (513, 64), "output_layer.weight": (513, 64)}
    udm = detect_family(shapes, {"longctx_objective": "udm"})
    assert (udm.family, udm.objective, udm.attention) == ("UDM", "udm", "bidirectional")
    assert udm.label == "UDM" and any("objective 'udm'" in e for e in udm.evidence)
    assert detect_family(shapes, {"longctx_objective": "ar"}).family == "ARM"
    assert detect_family(shapes).family == "ARM"
