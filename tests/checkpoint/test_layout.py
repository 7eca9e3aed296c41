"""Tracker, iteration directories and resolution of every kind of checkpoint path."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.checkpoint import TrackerError, complete_iterations, read_tracker, resolve_checkpoint
from longctx.checkpoint.save_layout import parse_tracker_text
from tests.fixtures.checkpoint import CheckpointFixtures, copy_checkpoint


def test_tracker_values() -> None:
    t = parse_tracker_text("76800\n", "t")
    assert (t.iteration, t.release, t.dir_name) == (76800, False, "iter_0076800")
    r = parse_tracker_text(" release \n", "t")
    assert (r.iteration, r.release, r.dir_name) == (0, True, "release")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc\n", "the tracker holds 'abc', not an iteration number or 'release'"),
        ("", "the tracker holds '', not an iteration number or 'release'"),
        ("12.5", "the tracker holds '12.5', not an iteration number or 'release'"),
        ("0", "the tracker holds 0; Megatron-LM accepts only iterations > 0 or 'release'"),
    ],
)
def test_tracker_garbage(text: str, message: str) -> None:
    with pytest.raises(TrackerError) as ei:
        parse_tracker_text(text, "x/latest_checkpointed_iteration.txt")
    assert ei.value.what == message
    assert ei.value.where == "x/latest_checkpointed_iteration.txt"


def test_read_tracker_and_complete_iterations(
    megatron_checkpoints: CheckpointFixtures, tmp_path: Path
) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    assert read_tracker(save).iteration == 5
    assert complete_iterations(save) == [5]
    # an unfinished save (no metadata.json) is not complete
    (save / "iter_0000009").mkdir()
    (save / "iter_0000009" / ".metadata").write_bytes(b"")
    assert complete_iterations(save) == [5]
    assert read_tracker(tmp_path) is None
    assert complete_iterations(tmp_path / "nowhere") == []


def test_resolve_kinds(megatron_checkpoints: CheckpointFixtures, flat_snapshot: Path, tmp_path: Path) -> None:
    r = resolve_checkpoint(megatron_checkpoints.save_dir("gqa"))
    assert (r.kind, r.iteration, r.path) == ("save_dir", 5, megatron_checkpoints.iter_dir("gqa"))
    assert r.save_dir == megatron_checkpoints.save_dir("gqa") and r.tracker.iteration == 5
    r = resolve_checkpoint(megatron_checkpoints.iter_dir("gqa"))
    assert (r.kind, r.iteration, r.save_dir) == ("iteration_dir", 5, None)
    r = resolve_checkpoint(flat_snapshot)
    assert (r.kind, r.iteration) == ("flat_dir", None)
    release = copy_checkpoint(megatron_checkpoints.iter_dir("gqa"), tmp_path / "save" / "release")
    r = resolve_checkpoint(release)
    assert (r.kind, r.iteration) == ("release_dir", 0)
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("release\n")
    r = resolve_checkpoint(tmp_path / "save")
    assert (r.kind, r.iteration, r.tracker.release, r.path) == ("save_dir", 0, True, release)


def test_tracker_to_missing_iteration(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    (save / "latest_checkpointed_iteration.txt").write_text("10\n")
    with pytest.raises(TrackerError) as ei:
        resolve_checkpoint(save)
    assert ei.value.what == "the tracker names iter_0000010, which does not exist"
    assert ei.value.fix.startswith(
        "the newest complete iteration is 5: write 5 into latest_checkpointed_iteration.txt"
    )


def test_tracker_to_incomplete_iteration(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    partial = copy_checkpoint(save / "iter_0000005", save / "iter_0000010")
    (partial / "metadata.json").unlink()
    (save / "latest_checkpointed_iteration.txt").write_text("10\n")
    with pytest.raises(TrackerError) as ei:
        resolve_checkpoint(save)
    assert ei.value.what == (
        "the tracker names iter_0000010, which is incomplete: no metadata.json "
        "(rank 0 writes it last: the save did not finish)"
    )
    assert "the newest complete iteration is 5" in ei.value.fix


def test_save_dir_without_tracker(megatron_checkpoints: CheckpointFixtures, tmp_path: Path) -> None:
    save = copy_checkpoint(megatron_checkpoints.save_dir("gqa"), tmp_path / "save")
    (save / "latest_checkpointed_iteration.txt").unlink()
    with pytest.raises(TrackerError) as ei:
        resolve_checkpoint(save)
    assert (
        "has no latest_checkpointed_iteration.txt; Megatron-LM would ignore its checkpoints" in ei.value.what
    )
    assert "the newest complete iteration is 5" in ei.value.fix


def test_nothing_checkpoint_like(tmp_path: Path) -> None:
    from longctx.errors import CheckpointError

    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match="no torch_dist checkpoint here"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not a checkpoint directory or tar archive"):
        resolve_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(CheckpointError, match="the path does not exist"):
        resolve_checkpoint(tmp_path / "missing")
