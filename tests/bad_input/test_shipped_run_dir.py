"""A shipped plan (by name, or by a path into the installed package) keeps its run in the current
directory, as its copy there would; no run directory lies inside the installed package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.plan.derive import open_plan
from longctx.util.shipped import package_dir, resource_dir
from tests.bad_input.harness import refused


@pytest.mark.parametrize("given", ["tiny", "path-into-the-package"])
def test_a_shipped_plan_runs_in_the_current_directory(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LONGCTX_RUN_DIR", raising=False)
    plan = "tiny" if given == "tiny" else str(resource_dir("stages") / "tiny.toml")
    res = CliRunner().invoke(app, ["plan", "show", plan, "--json"])
    assert res.exit_code == 0, res.output
    run_dir = Path(json.loads(res.stdout)["run_dir"])
    assert run_dir == tmp_path / "runs" / "tiny"
    assert not run_dir.resolve().is_relative_to(package_dir())
    for st in open_plan(plan).stages:
        assert st.save_dir.is_relative_to(tmp_path), st.save_dir


@pytest.mark.parametrize("how", ["--run-dir", "LONGCTX_RUN_DIR", "cwd-inside-the-package"])
def test_a_run_dir_inside_the_package_is_refused(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside = resource_dir("stages") / "runs-here"
    monkeypatch.delenv("LONGCTX_RUN_DIR", raising=False)
    args: list[object] = ["plan", "show", "tiny"]
    if how == "--run-dir":
        args += ["--run-dir", inside]
    elif how == "LONGCTX_RUN_DIR":
        monkeypatch.setenv("LONGCTX_RUN_DIR", str(inside))
    else:
        monkeypatch.chdir(resource_dir("stages"))  # ./runs/tiny from here is ../runs/tiny: in the package
    msg = " ".join(
        refused(args, [package_dir(), tmp_path], needle="inside the installed longctx package").split()
    )
    assert "--run-dir" in msg and not inside.exists()
