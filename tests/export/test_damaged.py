"""`export hf` on what it cannot export faithfully or cannot trust: a diffusion plan, a tokenizer that no
longer encodes as its manifest pins, an output inside the checkpoint, a shard that leads outside it, and
damaged shards (truncated, zero-filled, a pickle where a tensor is). Each is a message with what/where/fix,
exit 2, one JSON document, nothing written."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.tokenizer import load_manifest, write_manifest
from longctx.tokenizer.encoding import behaviour_digest
from tests.bad_input.harness import tree_state
from tests.fixtures.export import ExportModels, export_plans
from tests.fixtures.export_refusals import refused_export


def _copy(models: ExportModels, tmp_path: Path) -> Path:
    save = tmp_path / "ckpt"
    shutil.copytree(models.save_dir("qwen3_tp1"), save)
    return save


def _shards(save: Path) -> list[Path]:
    return sorted(save.glob("iter_*/*.distcp"))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _zero(p: Path) -> None:
    p.write_bytes(bytes(p.stat().st_size))


def _pickle(p: Path) -> None:
    payload = pickle.dumps({"not": "a tensor", "call": print})
    size = p.stat().st_size
    p.write_bytes((payload * (size // len(payload) + 1))[:size])


@pytest.mark.parametrize("damage", [_truncate, _zero, _pickle], ids=["truncated", "zero-filled", "pickle"])
def test_a_damaged_shard_is_a_message(
    damage, export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    save = _copy(export_models, tmp_path)
    for shard in _shards(save):
        damage(shard)
    before = tree_state(save)
    err = refused_export([str(save), "--plan", str(export_plan_files["qwen3"])], tmp_path / "out")
    assert "shard" in err["what"] and "weights_only" not in str(err), err
    assert tree_state(save) == before
    plain = CliRunner().invoke(
        app,
        [
            "export",
            "hf",
            str(save),
            "--plan",
            str(export_plan_files["qwen3"]),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert plain.exit_code == 2 and "Traceback" not in plain.output and "Aborted" not in plain.output


def test_a_shard_linked_from_outside_is_not_read(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    save = _copy(export_models, tmp_path)
    shard = _shards(save)[0]
    outside = tmp_path / "outside.distcp"
    shutil.move(shard, outside)
    shard.symlink_to(outside)
    err = refused_export([str(save), "--plan", str(export_plan_files["qwen3"])], tmp_path / "out")
    # refused where the checkpoint's files are listed, before any byte of the link's target is read
    assert (
        "outside the checkpoint" in err["what"] and shard.name in err["what"] and err["where"] == str(shard)
    )


def test_the_output_is_never_inside_the_checkpoint(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    save = _copy(export_models, tmp_path)
    before = tree_state(save)
    err = refused_export([str(save), "--plan", str(export_plan_files["qwen3"])], save / "hf")
    assert "inside the checkpoint" in err["what"]
    assert tree_state(save) == before


def test_a_diffusion_plan_is_not_exported_as_a_causal_lm(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    plan = tmp_path / "mdm.toml"
    text = export_plan_files["qwen3"].read_text()
    plan.write_text(text.replace("[cluster]", '[objective]\nkind = "mdm"\n\n[cluster]', 1))
    err = refused_export([str(export_models.save_dir("qwen3_tp1")), "--plan", str(plan)], tmp_path / "out")
    assert "a transformers causal LM" in err["what"] and "autoregressive" in err["fix"], err


def test_a_manifest_pinning_another_encoding(
    export_models: ExportModels, oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    from longctx.tokenizer import load_tokenizer

    manifest = load_manifest(oellm_like_manifest)
    enc = manifest.encoding or load_tokenizer(oellm_like_hf_dir).encoding_fingerprint()
    probes = [list(reversed(ids)) for ids in enc.probe_ids]  # another encoding, consistently digested
    digest = behaviour_digest(
        probes,
        enc.probe_ids_with_special_tokens,
        vocab_size=enc.vocab_size,
        eod_id=enc.eod_id,
        bos_id=enc.bos_id,
    )
    wrong = tmp_path / "wrong.toml"
    write_manifest(
        manifest.model_copy(
            update={"encoding": enc.model_copy(update={"probe_ids": probes, "digest": digest})}
        ),
        wrong,
    )
    plans = export_plans(tmp_path, oellm_like_hf_dir, wrong)
    err = refused_export(
        [str(export_models.save_dir("qwen3_tp1")), "--plan", str(plans["qwen3"])], tmp_path / "o" / "m"
    )
    assert "[encoding]" in err["what"] and "probe texts encode differently" in err["what"], err
