"""Archives whose links escape only once earlier links are followed, and other unsafe members."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tests.bad_input.harness import refused


def _archive(path: Path, snapshot: Path, extra: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w") as tar:
        for f in sorted(snapshot.iterdir()):
            tar.add(f, arcname=f"ckpt/{f.name}")
        for ti in extra:
            tar.addfile(ti, io.BytesIO(b"x" * ti.size) if ti.isreg() else None)
    return path


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, target
    return ti


def _file(name: str, size: int = 3) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    return ti


CASES = {
    "chain": [_link("ckpt/a", "."), _link("ckpt/a/b", "..")],  # a/b is ckpt/b -> .. : out of ckpt/
    "chain-deeper": [_link("ckpt/l1", "."), _link("ckpt/l1/l2", "."), _link("ckpt/l1/l2/up", "../..")],
    "through-link": [_link("ckpt/d", "."), _link("ckpt/e", "d/../..")],
    "file-below-link": [_link("ckpt/dir", "/tmp"), _file("ckpt/dir/planted.txt")],
    "absolute": [_file("/tmp/longctx-planted.txt")],
    "dotdot": [_file("ckpt/../../planted.txt")],
    "hardlink-out": [_link("ckpt/h", "../../etc/passwd", tarfile.LNKTYPE)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unsafe_archive_is_refused_by_check_and_adopt(case: str, flat_snapshot: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / f"{case}.tar", flat_snapshot, CASES[case])
    refused(["ckpt", "check", archive], [tmp_path], needle="unsafe")
    refused(["ckpt", "adopt", archive, "--into", tmp_path / "into"], [tmp_path], needle="refusing to extract")
    assert not (tmp_path / "into").exists()


def test_archive_with_too_many_members(
    flat_snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from longctx.checkpoint import archive

    monkeypatch.setattr(archive, "MAX_TAR_MEMBERS", 5)  # the real bound (200,000) holds the same way
    archive = _archive(tmp_path / "many.tar", flat_snapshot, [_file(f"ckpt/extra{i}.txt") for i in range(5)])
    refused(["ckpt", "check", archive], [tmp_path], needle="more than 5 members")


@pytest.fixture
def without_tar_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile as Python 3.11.0-3.11.3 have it: no extraction filters, no TarInfo.replace. Extraction
    through tarfile is made to fail too, so a test passes only if longctx never relies on it."""
    for name in ("data_filter", "tar_filter", "fully_trusted_filter", "FilterError"):
        monkeypatch.delattr(tarfile, name, raising=False)
    monkeypatch.delattr(tarfile.TarInfo, "replace", raising=False)

    def no_extract(*args: object, **kwargs: object) -> None:
        raise AssertionError("tarfile extraction used")

    monkeypatch.setattr(tarfile.TarFile, "extract", no_extract)
    monkeypatch.setattr(tarfile.TarFile, "extractall", no_extract)


@pytest.mark.parametrize("case", sorted(CASES))
def test_unsafe_archive_refused_without_tar_filters(
    case: str, flat_snapshot: Path, tmp_path: Path, without_tar_filters: None
) -> None:
    from longctx.checkpoint.adopt import adopt
    from longctx.errors import CheckpointError

    archive = _archive(tmp_path / f"{case}.tar", flat_snapshot, CASES[case])
    with pytest.raises(CheckpointError, match="refusing to extract"):
        adopt(archive, tmp_path / "into")
    assert not (tmp_path / "into").exists()


LINKS_INSIDE = {
    "symlink-to-file": [_link("ckpt/alias", "common.pt")],
    "hardlink-to-file": [_link("ckpt/alias", "ckpt/common.pt", tarfile.LNKTYPE)],
}


@pytest.mark.parametrize("case", sorted(LINKS_INSIDE))
def test_links_inside_the_archive_are_refused_at_adopt(
    case: str, flat_snapshot: Path, tmp_path: Path, without_tar_filters: None
) -> None:
    archive = _archive(tmp_path / f"{case}.tar", flat_snapshot, LINKS_INSIDE[case])
    refused(["ckpt", "adopt", archive, "--into", tmp_path / "into"], [tmp_path], needle="regular files only")
    assert not (tmp_path / "into").exists()


def test_a_name_both_file_and_directory_is_refused(flat_snapshot: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "clash.tar", flat_snapshot, [_file("ckpt/x"), _file("ckpt/x/y")])
    refused(["ckpt", "adopt", archive, "--into", tmp_path / "into"], [tmp_path], needle="twice")
    assert not any((tmp_path / "into").glob("iter_*"))


def test_adopt_extracts_without_tar_filters(
    flat_snapshot: Path, tmp_path: Path, without_tar_filters: None
) -> None:
    from longctx.checkpoint.adopt import adopt

    archive = _archive(tmp_path / "clean.tar", flat_snapshot, [])
    result = adopt(archive, tmp_path / "into")
    assert result.method == "extract" and result.verify is not None and result.verify.ok
    for f in flat_snapshot.iterdir():
        assert (result.checkpoint_dir / f.name).read_bytes() == f.read_bytes()
