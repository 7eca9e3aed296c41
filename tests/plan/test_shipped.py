"""Shipped plans travel inside the package: listed, loaded by name from any directory, copied to edit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError
from longctx.plan.derive import validate_plan
from longctx.plan.load import load_plan
from longctx.util.shipped import copy_plan, list_plans, plans_dir, resource_dir, shipped_plan, shipped_plans

runner = CliRunner()


def test_the_checkout_links_to_the_packaged_plans_and_manifests(repo_root: Path) -> None:
    for name, parts in (("stages", ("stages",)), ("tokenization", ("tokenization",))):
        link = repo_root / name
        assert link.is_symlink() and link.resolve() == resource_dir(*parts).resolve()
    assert plans_dir().resolve().is_relative_to(Path(__import__("longctx").__file__).parent.resolve())


def test_every_shipped_plan_names_files_that_ship() -> None:
    """A manifest named by a relative path must be inside the package, or an installed wheel lacks it."""
    root = resource_dir().resolve()
    assert {"baby_9b_dense", "ermine_arm", "tiny", "tiny_smoke"} <= set(shipped_plans())
    for name, path in shipped_plans().items():
        plan = load_plan(path, run_dir="/tmp/unused")
        manifest = plan.tokenizer.manifest
        if manifest and "$" not in manifest:
            target = (path.parent / manifest).resolve()
            assert target.is_file() and target.is_relative_to(root), (name, manifest)


def test_a_plan_by_name_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for given in ("baby_9b_dense", "baby_9b_dense.toml"):
        plan = load_plan(given)
        assert plan.plan_path == shipped_plans()["baby_9b_dense"].resolve()
    assert validate_plan(load_plan("ermine_arm", run_dir=tmp_path / "run")).findings.ok
    # a file of that name in the working directory is a path, and wins over the shipped plan
    (tmp_path / "tiny").write_text('name = "mine"\n')
    with pytest.raises(PlanError, match="invalid plan"):
        load_plan("tiny")
    with pytest.raises(PlanError, match="shipped plan"):
        load_plan("no_such_plan")
    assert shipped_plan("stages/tiny") is None and shipped_plan("") is None


def test_copy_plan_brings_its_manifest_and_overwrites_nothing(tmp_path: Path) -> None:
    written = copy_plan("baby_9b_dense", tmp_path)
    assert written == [tmp_path / "stages/baby_9b_dense.toml", tmp_path / "tokenization/oellm-256k.toml"]
    copied = load_plan(tmp_path / "stages/baby_9b_dense.toml")
    assert copied.tokenizer.manifest == "../tokenization/oellm-256k.toml"
    assert validate_plan(copied).findings.ok
    before = {p: p.read_bytes() for p in written}
    (tmp_path / "stages/baby_9b_dense.toml").write_text("# edited\n")
    with pytest.raises(PlanError, match="already exists; nothing was copied"):
        copy_plan("baby_9b_dense", tmp_path)
    assert (tmp_path / "stages/baby_9b_dense.toml").read_text() == "# edited\n"
    assert (tmp_path / "tokenization/oellm-256k.toml").read_bytes() == before[written[1]]
    with pytest.raises(PlanError, match="no shipped plan called"):
        copy_plan("nope", tmp_path / "other")
    assert not (tmp_path / "other").exists()
    # a demo plan brings the published base's manifest it names
    demo = copy_plan("tiny", tmp_path / "demo")
    assert tmp_path / "demo/demo/ar/tokenizer.toml" in demo


def test_plan_list_and_copy_cli(tmp_path: Path) -> None:
    out = runner.invoke(app, ["plan", "list", "--json"])
    assert out.exit_code == 0
    listed = json.loads(out.stdout)["plans"]
    assert [p["name"] for p in listed] == [p.name for p in list_plans()]
    assert all(p["summary"] for p in listed)
    ok = runner.invoke(app, ["plan", "copy", "ermine_arm", str(tmp_path), "--json"])
    assert ok.exit_code == 0 and len(json.loads(ok.stdout)["written"]) == 2
    again = runner.invoke(app, ["plan", "copy", "ermine_arm", str(tmp_path), "--json"])
    assert again.exit_code == 2 and json.loads(again.stdout)["ok"] is False
    shown = runner.invoke(app, ["plan", "show", "ermine_arm", "--run-dir", str(tmp_path / "r"), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["plan"]
    assert os.path.exists(tmp_path / "stages/ermine_arm.toml")
