"""Read-only and full file systems, for real: a tmpfs mounted read-only or too small for the output.

Every command ends in the file-system error with what/where/fix and exit 2, leaves no partial output,
and a stage whose save filled the disk can be continued once there is space (its unfinished save is
removed, the ledger stays whole). Mounting needs root; CI runs as root, so there the tests always run."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.stage.ledger import ledger_path
from longctx.util import fs
from longctx.util.disk import storage_problem
from tests.bad_input.harness import refused, tree_state
from tests.fixtures.run import write_plan

runner = CliRunner()


class Mount:
    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(self.path)], check=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Mount]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], check=True)
    try:
        yield Mount(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _size_of(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_stage_run_on_a_read_only_run_dir(tmpfs: Mount, fresh_run: Path, tmp_path: Path) -> None:
    run = tmpfs.path / "run"
    shutil.copytree(fresh_run, run)
    plan = write_plan(tmp_path / "plan.toml", run)
    tmpfs.set("ro")
    msg = refused(
        ["stage", "run", plan], [tmpfs.path, tmp_path / "plan.toml"], needle="Read-only file system"
    )
    assert str(run) in " ".join(msg.split()) and "longctx stage run:" in msg, msg


def test_stage_run_that_fills_the_disk(tmpfs: Mount, fresh_run: Path, tmp_path: Path) -> None:
    run = tmpfs.path / "run"
    shutil.copytree(fresh_run, run)
    plan = write_plan(tmp_path / "plan.toml", run)
    # room for the logs, the ledger and the data cache, not for the first save
    tmpfs.set(f"size={_size_of(run) + (600 << 10)}")
    r = runner.invoke(app, ["stage", "run", str(plan), "--json"])
    assert r.exit_code == 2, r.stderr[-6000:]
    assert "Traceback" not in r.stdout
    outcomes = json.loads(r.stdout)
    assert len(outcomes) == 1 and outcomes[0]["exit_code"] == 2, outcomes
    assert "No space left on device" in outcomes[0]["storage"] and "fix:" in outcomes[0]["storage"]
    assert outcomes[0]["discarded"], "the unfinished save was not removed"
    assert not list((run / "stages" / "s1" / "checkpoints").glob("iter_*")), "an unfinished save was left"
    records = [json.loads(line) for line in ledger_path(run).read_text().splitlines()]
    assert [x["event"] for x in records] == ["launch", "end"] and records[1]["storage"]
    # with space again the stage starts over from its base (nothing half-written is in the way)
    tmpfs.set("size=64m")
    nxt = runner.invoke(app, ["stage", "next", str(plan), "--json"])
    assert nxt.exit_code == 0, nxt.output
    assert json.loads(nxt.stdout)["action"] == "first-launch", nxt.stdout


@pytest.fixture
def tok(oellm_like_hf_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "tok"
    shutil.copytree(oellm_like_hf_dir, d)
    return d


def test_tokenize_onto_a_full_disk(tmpfs: Mount, tok: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 400}) + "\n" for i in range(200)))
    tmpfs.set("size=64k")
    refused(
        ["data", "tokenize", corpus, "-t", tok, "-o", tmpfs.path / "ds"],
        [tmpfs.path, tmp_path],
        needle="No space left on device",
    )
    assert not any(tmpfs.path.iterdir()), "partial output left on the full disk"


def test_fingerprint_write_onto_a_read_only_disk(tmpfs: Mount, tok: Path, tmp_path: Path) -> None:
    tmpfs.set("ro")
    refused(
        ["tokenizer", "fingerprint", tok, "--write", tmpfs.path / "manifest.toml"],
        [tmpfs.path, tmp_path],
        needle="Read-only file system",
    )


def test_slurm_render_onto_a_read_only_disk(tmpfs: Mount, fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    tmpfs.set("ro")
    refused(
        ["slurm", "render", plan, "--out", tmpfs.path / "jobs"],
        [tmpfs.path, fresh_run, tmp_path],
        needle="Read-only file system",
    )


def test_storage_problem_names_read_only_and_full(tmpfs: Mount) -> None:
    assert storage_problem(tmpfs.path / "not" / "yet") is None  # asks the nearest existing directory
    tmpfs.set("ro")
    ro = storage_problem(tmpfs.path)
    assert ro is not None and ro.errno == errno.EROFS
    tmpfs.set("rw,size=16k")
    full = storage_problem(tmpfs.path)
    assert full is not None and full.errno == errno.ENOSPC and "MiB free" in full.strerror


def test_a_ledger_append_that_fails_takes_its_torn_line_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    fs.append_line_durably(ledger, '{"event": "launch"}')
    before = tree_state(tmp_path)
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:  # what a disk filling up mid-line does
        if len(data) > 8:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fs.os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        fs.append_line_durably(ledger, '{"event": "end", "exit_code": 0}')
    monkeypatch.undo()
    assert tree_state(tmp_path) == before
    fs.append_line_durably(ledger, '{"event": "end"}')
    assert [json.loads(x)["event"] for x in ledger.read_text().splitlines()] == ["launch", "end"]
