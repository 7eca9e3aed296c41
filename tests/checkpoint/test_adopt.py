"""adopt: flat snapshots and archives into Megatron's layout, without copying, refusing unsafe archives."""

from __future__ import annotations

import errno
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from longctx.checkpoint import adopt, inspect_checkpoint, read_tracker, verify_checkpoint
from longctx.cli.main import app
from longctx.errors import CheckpointError
from tests.fixtures.checkpoint import MODELOPT_YAML, CheckpointFixtures, copy_checkpoint

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def test_flat_snapshot_is_hardlinked(flat_snapshot: Path, tmp_path: Path) -> None:
    r = adopt(flat_snapshot, tmp_path / "base")
    assert r.checkpoint_dir == tmp_path / "base" / "iter_0000010"
    assert (r.iteration, r.iteration_source, r.method) == (10, "common state", "hardlink")
    assert read_tracker(tmp_path / "base").iteration == 10
    for src in flat_snapshot.iterdir():
        dst = r.checkpoint_dir / src.name
        assert os.path.samefile(src, dst), src.name  # same inode: no data copied
    assert (r.checkpoint_dir / "modelopt_run_config.yaml").read_text() == MODELOPT_YAML
    assert r.verify.ok and verify_checkpoint(tmp_path / "base").ok
    assert inspect_checkpoint(tmp_path / "base").arch.num_layers == 2
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == [
        "iter_0000010",
        "latest_checkpointed_iteration.txt",
    ]


def test_move_mode(flat_snapshot: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(flat_snapshot, tmp_path / "snap")
    names = sorted(p.name for p in src.iterdir())
    res = cli("ckpt", "adopt", src, "--into", tmp_path / "base", "--move", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["method"] == "move" and data["iteration"] == 10 and data["ok"]
    assert list(src.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "base" / "iter_0000010").iterdir()) == names


def test_iteration_from_name_or_option(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    # without a saved iteration (none in common.pt): the iter_ name, else --iteration
    named = copy_checkpoint(megatron_checkpoints.iter_dir("gqa"), tmp_path / "iter_0000005")
    common = torch.load(named / "common.pt", weights_only=False)  # the test's own fixture: trusted
    del common["iteration"]
    del common["args"].iteration
    torch.save(common, named / "common.pt")
    r = adopt(named, tmp_path / "a")
    assert (r.iteration, r.iteration_source) == (5, "directory name")
    flat = copy_checkpoint(named, tmp_path / "flat")
    with pytest.raises(CheckpointError) as ei:
        adopt(flat, tmp_path / "b")
    assert (
        ei.value.what
        == "cannot tell the iteration: no saved iteration in the common state and no iter_NNNNNNN name"
    )
    assert ei.value.fix == "pass --iteration N"
    r = adopt(flat, tmp_path / "b", iteration=123)
    assert (r.iteration, r.checkpoint_dir.name) == (123, "iter_0000123")


def test_iteration_conflict(flat_snapshot: Path, tmp_path: Path) -> None:
    res = cli("ckpt", "adopt", flat_snapshot, "--into", tmp_path / "base", "--iteration", 7)
    assert res.exit_code == 2
    assert "--iteration 7 disagrees with the iteration saved in the checkpoint (10)" in " ".join(
        res.output.split()
    )
    assert not (tmp_path / "base").exists() or not any((tmp_path / "base").iterdir())


def test_archives_are_extracted(ermine_archives: dict[str, Path], tmp_path: Path) -> None:
    for key in ("plain", "nested"):
        r = adopt(ermine_archives[key], tmp_path / key)
        assert (r.iteration, r.method, r.files) == (5, "extract", 5)
        assert sorted(p.name for p in r.checkpoint_dir.iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__0_1.distcp",
            "common.pt",
            "metadata.json",
        ]
        assert read_tracker(tmp_path / key).iteration == 5
        assert r.verify.ok
    res = cli("ckpt", "adopt", ermine_archives["moe"], "--into", tmp_path / "moe")
    assert res.exit_code == 0, res.output
    assert inspect_checkpoint(tmp_path / "moe").arch.num_experts == 4


def _tar_with(path: Path, src: Path, extra: tarfile.TarInfo, data: bytes | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        tar.add(src, arcname="x_model_only")
        tar.addfile(extra, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, data: bytes = b"evil") -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            "dotdot",
            "refusing to extract the archive: member 'x_model_only/../../evil.sh' is unsafe "
            "(path with '..' leaving the target directory)",
        ),
        ("absolute", "refusing to extract the archive: member '/etc/cron.d/evil' is unsafe (absolute path)"),
        (
            "symlink",
            "refusing to extract the archive: member 'x_model_only/iter_0000005/link' is unsafe "
            "(link to '../../../../home' leaving the target directory)",
        ),
        (
            "abs-symlink",
            "refusing to extract the archive: member 'x_model_only/ssh' is unsafe (link to absolute path '/root/.ssh')",
        ),
        ("device", "refusing to extract the archive: member 'x_model_only/dev' is unsafe (device or FIFO)"),
    ],
)
def test_unsafe_archives_are_refused(
    megatron_checkpoints: CheckpointFixtures, tmp_path: Path, kind: str, message: str
) -> None:
    if kind == "dotdot":
        ti, data = _member("x_model_only/../../evil.sh")
    elif kind == "absolute":
        ti, data = _member("/etc/cron.d/evil")
    else:
        data = None
        ti = tarfile.TarInfo(
            {
                "symlink": "x_model_only/iter_0000005/link",
                "abs-symlink": "x_model_only/ssh",
                "device": "x_model_only/dev",
            }[kind]
        )
        if kind == "device":
            ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
        else:
            ti.type = tarfile.SYMTYPE
            ti.linkname = "../../../../home" if kind == "symlink" else "/root/.ssh"
    tar = _tar_with(tmp_path / f"{kind}.tar", megatron_checkpoints.save_dir("gqa"), ti, data)
    target = tmp_path / "into"
    with pytest.raises(CheckpointError) as ei:
        adopt(tar, target)
    assert ei.value.what == message
    assert not target.exists()  # nothing written
    res = cli("ckpt", "adopt", tar, "--into", target)
    assert res.exit_code == 2 and message in " ".join(res.output.split())
    assert not (tmp_path.parent / "evil.sh").exists()


def test_incomplete_source_is_refused(flat_snapshot: Path, tmp_path: Path) -> None:
    src = copy_checkpoint(flat_snapshot, tmp_path / "snap")
    (src / "__1_1.distcp").unlink()
    with pytest.raises(CheckpointError) as ei:
        adopt(src, tmp_path / "base")
    assert ei.value.what.startswith("the source checkpoint is not whole: shard __1_1.distcp is missing")
    assert not (tmp_path / "base").exists()


def test_nothing_is_overwritten(flat_snapshot: Path, tmp_path: Path) -> None:
    adopt(flat_snapshot, tmp_path / "base")
    with pytest.raises(CheckpointError, match="iter_0000010 already exists in the target directory"):
        adopt(flat_snapshot, tmp_path / "base")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "latest_checkpointed_iteration.txt").write_text("3\n")
    with pytest.raises(CheckpointError, match="already names iter_0000003"):
        adopt(flat_snapshot, tmp_path / "other")


def test_cross_filesystem_needs_allow_copy(
    flat_snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hard links cannot cross filesystems; simulate the kernel's EXDEV
    def no_link(src: object, dst: object, *a: object, **k: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))

    monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(CheckpointError) as ei:
        adopt(flat_snapshot, tmp_path / "base")
    assert "Invalid cross-device link" in ei.value.what or "cross-device" in ei.value.what
    assert (
        ei.value.fix
        == "put the target on the same filesystem as the source, or pass --allow-copy to copy the data"
    )
    assert not (tmp_path / "base" / "iter_0000010").exists()
    r = adopt(flat_snapshot, tmp_path / "base", allow_copy=True)
    assert r.method == "copy" and r.verify.ok
    assert not os.path.samefile(flat_snapshot / ".metadata", r.checkpoint_dir / ".metadata")
