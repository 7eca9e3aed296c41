"""Archives that hold one path twice (under any spelling, also inside a nested `.tar.tar`) and member
names no file system can hold: check and adopt refuse them from the one archive index."""

from __future__ import annotations

import errno
import importlib
import io
import tarfile
from pathlib import Path

import pytest

from longctx.checkpoint.adopt import adopt
from longctx.checkpoint.verify import verify_checkpoint
from longctx.errors import CheckpointError
from tests.bad_input.harness import refused, tree_state

SHARD = "__0_0.distcp"


def _member(name: str, data: bytes, pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    if pax:
        ti.pax_headers = pax
    return ti, data


def _archive(path: Path, snapshot: Path, extra: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """The snapshot's files under `ckpt/`, then the extra members (each after the genuine copies, so it
    is the copy tar would keep)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(snapshot.iterdir()):
            tar.add(f, arcname=f"ckpt/{f.name}")
        for ti, data in extra:
            tar.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return path


def _zeros(snapshot: Path) -> bytes:
    """A shard's size of zeros: shallow checks (sizes) cannot tell it from the real shard."""
    return bytes((snapshot / SHARD).stat().st_size)


SPELLINGS = {
    "same-name": f"ckpt/{SHARD}",
    "dot-slash": f"./ckpt/{SHARD}",
    "double-slash": f"ckpt//{SHARD}",
    "dot-component": f"ckpt/./{SHARD}",
    "backslash": f"ckpt\\{SHARD}",
    "trailing-slash": f"ckpt/{SHARD}/",
}


@pytest.mark.parametrize("case", sorted(SPELLINGS))
def test_a_path_held_twice_is_refused_by_check_and_adopt(
    case: str, flat_snapshot: Path, tmp_path: Path
) -> None:
    raw = SPELLINGS[case]
    archive = _archive(tmp_path / f"{case}.tar", flat_snapshot, [_member(raw, _zeros(flat_snapshot))])
    into = tmp_path / "into"
    text = refused(["ckpt", "check", "--deep", archive], [tmp_path], needle="twice")
    assert f"ckpt/{SHARD}" in text and "obtain a clean copy" in text
    refused(["ckpt", "adopt", archive, "--into", into], [tmp_path], needle="twice")
    assert not into.exists()
    for call in (lambda: verify_checkpoint(archive, deep=True), lambda: adopt(archive, into)):
        with pytest.raises(CheckpointError) as err:
            call()
        assert err.value.what.startswith(f"the archive holds 'ckpt/{SHARD}' twice")
        assert repr(raw) in err.value.what and err.value.where == str(archive)
    assert not into.exists()


def test_a_file_that_is_also_a_directory_is_refused_by_check(flat_snapshot: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "clash.tar", flat_snapshot, [_member(f"ckpt/{SHARD}/x", b"x")])
    text = refused(["ckpt", "check", archive], [tmp_path], needle="twice")
    assert "as a directory" in text


def _nested(path: Path, inner_name: str, inner: bytes, copies: list[str]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name in copies:
            ti = tarfile.TarInfo(name)
            ti.size = len(inner)
            tar.addfile(ti, io.BytesIO(inner))
    return path


def test_a_path_held_twice_inside_a_nested_tar_is_refused(flat_snapshot: Path, tmp_path: Path) -> None:
    inner = _archive(
        tmp_path / "inner.tar", flat_snapshot, [_member(f"./ckpt/{SHARD}", _zeros(flat_snapshot))]
    )
    nested = _nested(tmp_path / "x.tar.tar", "x.tar", inner.read_bytes(), ["x.tar"])
    inner.unlink()
    refused(["ckpt", "check", "--deep", nested], [tmp_path], needle="twice")
    refused(["ckpt", "adopt", nested, "--into", tmp_path / "into"], [tmp_path], needle="twice")
    with pytest.raises(CheckpointError) as err:
        adopt(nested, tmp_path / "into")
    assert err.value.where == f"{nested}:x.tar"  # names the inner archive, not only the outer file
    assert not (tmp_path / "into").exists()


def test_a_nested_tar_held_twice_is_refused(flat_snapshot: Path, tmp_path: Path) -> None:
    good = _archive(tmp_path / "good.tar", flat_snapshot, []).read_bytes()
    nested = _nested(tmp_path / "x.tar.tar", "x.tar", good, ["x.tar", "./x.tar"])
    (tmp_path / "good.tar").unlink()
    text = refused(["ckpt", "adopt", nested, "--into", tmp_path / "into"], [tmp_path], needle="twice")
    assert "'./x.tar'" in text
    assert not (tmp_path / "into").exists()


UNSAFE_NAMES = {
    "nul-in-pax-path": (_member("ckpt/evil", b"x", {"path": "ckpt/ev\x00il"}), "NUL byte"),
    "nul-replacing-a-shard": (_member("ckpt/x", b"x", {"path": f"ckpt/{SHARD}\x00.evil"}), "NUL byte"),
    "control-character": (_member("ckpt/a\nb", b"x"), "control character"),
    "not-utf8": (_member("ckpt/\udcff", b"x"), "not valid UTF-8"),
    "long-component": (_member("ckpt/" + "a" * 256, b"x"), "longer than the 255 bytes"),
    "long-path": (_member("ckpt/" + "/".join(["d" * 200] * 21), b"x"), "longer than the 4,095"),
    "empty-name": (_member("", b"x"), "empty name"),
    "dot-as-file": (_member("./", b"x"), "empty name"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE_NAMES))
def test_a_name_no_file_system_holds_is_refused(case: str, flat_snapshot: Path, tmp_path: Path) -> None:
    member, reason = UNSAFE_NAMES[case]
    archive = _archive(tmp_path / f"{case}.tar", flat_snapshot, [member])
    into = tmp_path / "into"
    text = refused(["ckpt", "check", archive], [tmp_path], needle="unsafe")
    assert reason in text
    text = refused(["ckpt", "adopt", archive, "--into", into], [tmp_path], needle="refusing to extract")
    assert reason in text
    with pytest.raises(CheckpointError, match="refusing to extract"):
        adopt(archive, into)
    assert not into.exists()


def test_a_nul_in_a_link_target_is_unsafe(flat_snapshot: Path, tmp_path: Path) -> None:
    ti = tarfile.TarInfo("ckpt/alias")
    ti.type, ti.linkname = tarfile.SYMTYPE, "common.pt"
    ti.pax_headers = {"linkpath": "common.pt\x00/../../etc/passwd"}
    archive = _archive(tmp_path / "link.tar", flat_snapshot, [(ti, b"")])
    text = refused(["ckpt", "check", archive], [tmp_path], needle="unsafe")
    assert "NUL byte in the link target" in text


def test_a_truncated_archive_leaves_the_target_unchanged(flat_snapshot: Path, tmp_path: Path) -> None:
    """Extraction fails after the first files are written: what it wrote goes, the target is as it was."""
    archive = tmp_path / "cut.tar"
    with tarfile.open(archive, "w") as tar:  # the largest shard last, so the archive ends inside it
        for f in sorted(flat_snapshot.iterdir(), key=lambda f: (f.name == SHARD, f.name)):
            tar.add(f, arcname=f"ckpt/{f.name}")
    size = (flat_snapshot / SHARD).stat().st_size
    with tarfile.open(archive) as tar:
        end = tar.getmember(f"ckpt/{SHARD}").offset_data + size // 2
    with open(archive, "r+b") as fh:
        fh.truncate(end)
    into = tmp_path / "into"
    into.mkdir()
    (into / "keep.txt").write_text("the user's file\n")
    before = tree_state(into)
    refused(["ckpt", "adopt", archive, "--into", into], [tmp_path], needle="truncated")
    with pytest.raises(CheckpointError, match="truncated"):
        adopt(archive, into)
    assert tree_state(into) == before


def test_legitimate_spellings_still_adopt(flat_snapshot: Path, tmp_path: Path) -> None:
    """`tar -C DIR -cf x.tar .` names the root `./` and every member `./…`; each path is there once."""
    archive = tmp_path / "dotted.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(flat_snapshot, arcname=".", recursive=False)
        tar.add(flat_snapshot, arcname="./ckpt")
    result = adopt(archive, tmp_path / "into")
    assert result.verify is not None and result.verify.ok
    assert sorted(p.name for p in result.checkpoint_dir.iterdir()) == sorted(
        p.name for p in flat_snapshot.iterdir()
    )


@pytest.mark.parametrize("family", ["ar", "mdm"])
def test_the_published_demo_bases_adopt(family: str, tmp_path: Path) -> None:
    from longctx.demo.published import family_dir, read_card

    directory = family_dir(family)
    result = adopt(directory / read_card(directory).archive, tmp_path / "into")
    assert result.method == "extract" and result.verify is not None and result.verify.ok


def test_a_tracker_that_cannot_be_written_leaves_the_target_unchanged(
    flat_snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extracted checkpoint is already in place when the tracker fails (a full disk): it is removed."""
    adopt_module = importlib.import_module("longctx.checkpoint.adopt")  # the package exports `adopt`

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(adopt_module, "atomic_write_text", full)
    archive = _archive(tmp_path / "clean.tar", flat_snapshot, [])
    into = tmp_path / "into"
    into.mkdir()
    (into / "keep.txt").write_text("the user's file\n")
    refused(["ckpt", "adopt", archive, "--into", into], [tmp_path], needle="No space left")
    assert sorted(p.name for p in into.iterdir()) == ["keep.txt"]
