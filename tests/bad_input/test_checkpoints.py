"""Checkpoints and snapshots that must be refused: links out of the input, shard paths out of the
checkpoint, outputs written over the input, saves megatron-core cannot load."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from tests.bad_input.harness import refused
from tests.fixtures.checkpoint import CheckpointFixtures


@pytest.fixture
def snapshot(tmp_path: Path, flat_snapshot: Path) -> Path:
    d = tmp_path / "snapshot"
    shutil.copytree(flat_snapshot, d)
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    o = tmp_path / "outside"
    o.mkdir()
    (o / "secret.txt").write_text("not part of any checkpoint\n")
    return o


def test_adopt_refuses_a_file_link_out_of_the_snapshot(snapshot: Path, outside: Path, tmp_path: Path) -> None:
    (snapshot / "notes.txt").symlink_to(outside / "secret.txt")
    msg = refused(
        ["ckpt", "adopt", snapshot, "--into", tmp_path / "into"],
        [snapshot, outside, tmp_path],
        needle="outside",
    )
    assert "notes.txt" in msg and not (tmp_path / "into").exists()


def test_check_refuses_a_shard_linked_out_of_the_checkpoint(snapshot: Path, outside: Path) -> None:
    """Without --deep no shard is read, but its size is: a link out of the checkpoint is refused, not
    measured (a shard must be a file of the checkpoint, or of a Hub snapshot's blobs/)."""
    shard = sorted(snapshot.glob("*.distcp"))[0]
    shutil.move(shard, outside / shard.name)
    shard.symlink_to(outside / shard.name)
    msg = refused(["ckpt", "check", snapshot], [snapshot, outside], needle="outside the checkpoint")
    assert shard.name in msg


def test_adopt_refuses_a_directory_link_out_of_the_snapshot(
    snapshot: Path, outside: Path, tmp_path: Path
) -> None:
    (snapshot / "extra").symlink_to(outside, target_is_directory=True)
    refused(
        ["ckpt", "adopt", snapshot, "--into", tmp_path / "into"],
        [tmp_path],
        needle="extra resolves to",
    )


def test_adopt_refuses_a_symlink_loop(snapshot: Path, tmp_path: Path) -> None:
    (snapshot / "loop_a").symlink_to(snapshot / "loop_b")
    (snapshot / "loop_b").symlink_to(snapshot / "loop_a")
    refused(["ckpt", "adopt", snapshot, "--into", tmp_path / "into"], [tmp_path], needle="symlink loop")


def test_adopt_refuses_a_fifo(snapshot: Path, tmp_path: Path) -> None:
    os.mkfifo(snapshot / "pipe")
    refused(["ckpt", "adopt", snapshot, "--into", tmp_path / "into"], [tmp_path], needle="not a regular file")


def test_adopt_refuses_a_dangling_link(snapshot: Path, tmp_path: Path) -> None:
    (snapshot / "gone.txt").symlink_to(snapshot / "never-there.txt")
    refused(["ckpt", "adopt", snapshot, "--into", tmp_path / "into"], [tmp_path], needle="gone.txt")


def _rewrite_storage(metadata: Path, rel_path: str) -> None:
    md = pickle.loads(metadata.read_bytes())  # the test's own fixture: trusted
    first = next(iter(md.storage_data))
    info = md.storage_data[first]
    md.storage_data[first] = type(info)(relative_path=rel_path, offset=info.offset, length=info.length)
    metadata.write_bytes(pickle.dumps(md))


@pytest.mark.parametrize("rel_path", ["../../outside.bin", "/etc/passwd", "sub/__0_0.distcp", ".."])
def test_verify_refuses_shard_paths_out_of_the_checkpoint(
    snapshot: Path, tmp_path: Path, rel_path: str
) -> None:
    _rewrite_storage(snapshot / ".metadata", rel_path)
    (tmp_path / "outside.bin").write_bytes(b"\0" * (1 << 20))
    refused(
        ["ckpt", "check", snapshot, "--deep"], [tmp_path], needle="not a file of the checkpoint directory"
    )


def test_write_manifest_over_an_input_file_is_refused(snapshot: Path, tmp_path: Path) -> None:
    target = snapshot / "common.pt"
    msg = refused(
        ["ckpt", "check", snapshot, "--deep", "--write-manifest", target],
        [tmp_path],
        needle="inside the input",
    )
    assert "snapshot.sha256" in msg


def test_write_manifest_into_the_input_directory_is_refused(snapshot: Path, tmp_path: Path) -> None:
    refused(
        ["ckpt", "check", snapshot, "--deep", "--write-manifest", snapshot / "new.sha256"],
        [tmp_path],
        needle="inside the input",
    )


def test_a_save_without_common_state_fails_verify(
    megatron_checkpoints: CheckpointFixtures, tmp_path: Path
) -> None:
    ck = tmp_path / "gqa"
    shutil.copytree(megatron_checkpoints.iter_dir("gqa"), ck)
    (ck / "common.pt").unlink()
    assert (ck / "metadata.json").is_file()
    refused(["ckpt", "check", ck], [tmp_path], needle="megatron-core cannot load this save")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "lists no files"),
        (b"# only a comment\n", "lists no files"),
        (b"\xff" * 64 + b"  common.pt\n", "not UTF-8"),
    ],
)
def test_deep_check_against_an_unusable_manifest(
    snapshot: Path, tmp_path: Path, content: bytes, needle: str
) -> None:
    manifest = tmp_path / "given.sha256"
    manifest.write_bytes(content)
    refused(["ckpt", "check", snapshot, "--deep", "--manifest", manifest], [tmp_path], needle=needle)
