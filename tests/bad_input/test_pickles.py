"""Checkpoints whose pickles write onto shared objects, stand for exponentially large structures or nest
without end: every reader refuses them at once, and the same process reads the next checkpoint as before.
The pickles are written opcode by opcode (tests/fixtures/hostile_pickles.py)."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from tests.bad_input.harness import refused
from tests.fixtures import hostile_pickles as hp
from tests.fixtures.export import ExportModels

_GETATTR = hp.glob("builtins", "getattr")
HOSTILE_COMMON = {
    # setattr(Namespace, "__getattribute__", getattr): every later read in the process would recurse
    "build-onto-Namespace": (
        hp.build_onto(hp.glob("argparse", "Namespace"), "__getattribute__", _GETATTR, slots=True),
        "BUILD",
    ),
    # args.seq_length = 40 levels of [x, x] through the memo: 2**40 objects to whatever walks it
    "memo-bomb": (hp.memo_bomb(40), "memo reference"),
    "nested-100k": (hp.nested_lists(100_000), "nested more than"),
}


@pytest.fixture
def ck(tmp_path: Path, flat_snapshot: Path) -> Path:
    d = tmp_path / "ck"
    shutil.copytree(flat_snapshot, d)
    return d


def _reads_as_before(snapshot: Path) -> None:
    """The next (legitimate) checkpoint reads in the same process: no class was changed."""
    assert argparse.Namespace.__getattribute__ is object.__getattribute__
    res = CliRunner().invoke(app, ["ckpt", "inspect", str(snapshot), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["iteration"] == 10


def _timed_refusal(args: list[object], watch: list[Path], needle: str) -> str:
    started = time.perf_counter()
    msg = refused(args, watch, needle=needle)
    elapsed = time.perf_counter() - started
    print(f"{args[:2]}: refused (plain and --json) in {elapsed:.2f} s")
    assert elapsed < 60, elapsed  # the plain and the --json run, each far under a second of unpickling
    return " ".join(msg.split())


@pytest.mark.parametrize("command", ["inspect", "check", "adopt"])
@pytest.mark.parametrize("case", sorted(HOSTILE_COMMON))
def test_a_hostile_common_pt_is_refused(
    case: str, command: str, ck: Path, flat_snapshot: Path, tmp_path: Path
) -> None:
    data, needle = HOSTILE_COMMON[case]
    (ck / "common.pt").write_bytes(hp.torch_file(data))
    args: list[object] = ["ckpt", command, ck]
    if command == "adopt":
        args += ["--into", tmp_path / "into"]
    msg = _timed_refusal(args, [tmp_path], needle)
    assert "refusing to unpickle" in msg and "common.pt" in msg
    assert not (tmp_path / "into").exists()
    _reads_as_before(flat_snapshot)


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_a_metadata_building_onto_the_dcp_class_is_refused(
    command: str, ck: Path, flat_snapshot: Path, tmp_path: Path
) -> None:
    dcp = hp.glob("torch.distributed.checkpoint.metadata", "Metadata")
    (ck / ".metadata").write_bytes(hp.build_onto(dcp, "__setstate__", _GETATTR, slots=True))
    msg = _timed_refusal(["ckpt", command, ck], [tmp_path], "BUILD")
    assert "onto the class torch.distributed.checkpoint.metadata.Metadata" in msg and ".metadata" in msg
    _reads_as_before(flat_snapshot)


def test_export_refuses_a_hostile_common_pt(
    export_models: ExportModels, export_plan_files: dict[str, Path], flat_snapshot: Path, tmp_path: Path
) -> None:
    save = tmp_path / "save"
    shutil.copytree(export_models.save_dir("qwen3_tp1"), save)
    common = next(save.rglob("common.pt"))
    common.write_bytes(hp.torch_file(hp.memo_bomb(40)))
    out = tmp_path / "out"
    args = ["export", "hf", save, "--plan", export_plan_files["qwen3"], "--out", out]
    msg = _timed_refusal(args, [save], "memo reference")
    assert "cannot read the checkpoint: refusing to unpickle" in msg
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))
    _reads_as_before(flat_snapshot)
