"""Bad input is refused through the CLI with what / where / fix, exit 2, one JSON document, and nothing
written: no output directory, no partial files beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.tokenizer import load_manifest, write_manifest
from tests.fixtures.export import ExportModels, export_plans
from tests.fixtures.export_refusals import refused_export


def _args(models: ExportModels, name: str, plan: Path, *extra: str) -> list[str]:
    return [str(models.save_dir(name)), "--plan", str(plan), *extra]


def test_unmapped_architecture(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    err = refused_export(_args(export_models, "layernorm", export_plan_files["qwen3"]), tmp_path / "out")
    assert "does not map this architecture" in err["what"]
    assert "LayerNorm" in err["what"] and "non-gated MLP" in err["what"]
    assert err["where"].endswith("iter_0000003")


def test_diffusion_model_is_refused_with_the_reason(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    err = refused_export(_args(export_models, "mdm", export_plan_files["qwen3"]), tmp_path / "out")
    assert "diffusion language model" in err["what"] and "encoder." in err["what"]
    assert "no class" in err["what"] and "ARM" in err["fix"]


def test_vocabulary_smaller_than_the_tokenizer(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    err = refused_export(_args(export_models, "small_vocab", export_plan_files["qwen3"]), tmp_path / "out")
    assert "256 rows, fewer than the tokenizer's 513 tokens" in err["what"]


def test_output_directory_not_empty(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = CliRunner().invoke(
        app,
        [
            "export",
            "hf",
            *_args(export_models, "qwen3_tp1", export_plan_files["qwen3"]),
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 2
    err = json.loads(res.stdout)["error"]
    assert err["what"] == "the output directory is not empty" and err["where"] == str(out) and err["fix"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_stage_with_another_rope_base(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    err = refused_export(
        _args(export_models, "qwen3_tp2", export_plan_files["qwen3"], "--stage", "s1"), tmp_path / "o"
    )
    assert "trained with rotary base 500,000, but stage s1 has 100,000" in err["what"]
    err = refused_export(
        _args(export_models, "qwen3_tp2", export_plan_files["qwen3"], "--stage", "s9"), tmp_path / "o"
    )
    assert "no stage 's9'" in err["what"] and "base, s1, s2" in err["fix"]


def test_the_plan_of_another_architecture(
    export_models: ExportModels, export_plan_files: dict[str, Path], tmp_path: Path
) -> None:
    err = refused_export(_args(export_models, "llama_tp1", export_plan_files["qwen3"]), tmp_path / "out")
    assert "[model] is not this checkpoint's architecture" in err["what"] and "qk_layernorm" in err["what"]


def test_a_tokenizer_that_is_not_the_manifests(
    export_models: ExportModels, oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path: Path
) -> None:
    manifest = load_manifest(oellm_like_manifest)
    wrong = tmp_path / "wrong.toml"
    write_manifest(manifest.model_copy(update={"md5": "0" * 32}), wrong)
    plans = export_plans(tmp_path, oellm_like_hf_dir, wrong)
    err = refused_export(_args(export_models, "qwen3_tp1", plans["qwen3"]), tmp_path / "out" / "model")
    assert "md5" in err["what"] and "0" * 32 in err["what"]


def test_a_missing_checkpoint(export_plan_files: dict[str, Path], tmp_path: Path) -> None:
    err = refused_export(
        [str(tmp_path / "nothing"), "--plan", str(export_plan_files["qwen3"])], tmp_path / "out"
    )
    assert "cannot read the checkpoint" in err["what"]


@pytest.mark.parametrize("size", ["0", "5 parsecs"])
def test_a_bad_shard_size(size: str, tmp_path: Path) -> None:
    err = refused_export([str(tmp_path), "--plan", "p.toml", "--max-shard-size", size], tmp_path / "o")
    assert "--max-shard-size" in err["what"]


def test_nothing_is_left_when_a_check_fails_after_writing_began(
    export_models: ExportModels,
    export_plan_files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure after writing began (here: transformers reads the config differently) removes it all."""
    import longctx.export.run as run

    def wrong_reading(directory: Path, meant: dict[str, Any]) -> None:
        from longctx.export.config import check_config

        check_config(directory, {**meant, "rope_theta": 1.0})

    monkeypatch.setattr(run, "check_config", wrong_reading)
    out = tmp_path / "deep" / "out"
    err = refused_export(_args(export_models, "qwen3_tp1", export_plan_files["qwen3"]), out)
    assert "transformers reads the written config.json differently" in err["what"]
    assert not (tmp_path / "deep").exists()  # the parent it created is gone too
