"""Read-only file trees: a directory, or an uncompressed tar archive read in place.

Checkpoints arrive as directories or as `.tar` files (some named `.tar.tar`, some holding one inner
`.tar`). Every reader in this package goes through a `Tree`, so inspect and verify work on archives
without extracting them: a member of an uncompressed tar is a byte range of the archive file, found
from the headers alone (`TarInfo.offset_data`), also for a tar nested inside a tar.

Paths inside a tree are POSIX strings relative to its root ("" is the root).
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from longctx.errors import CheckpointError

TAR_SUFFIXES = (".tar",)
# a 9B model's save with optimizer has a few thousand files; the index of a tar is held in memory
MAX_TAR_MEMBERS = 200_000


def join(*parts: str) -> str:
    return posixpath.join(*[p for p in parts if p]) if any(parts) else ""


@dataclass(frozen=True)
class ByteRange:
    """Where a file's bytes live on disk: `length` bytes of `path` from `offset`."""

    path: Path
    offset: int
    length: int


class Tree(ABC):
    """A read-only tree of files (directory or archive)."""

    #: the path the user gave
    source: Path

    @abstractmethod
    def is_dir(self, rel: str) -> bool: ...

    @abstractmethod
    def is_file(self, rel: str) -> bool: ...

    @abstractmethod
    def listdir(self, rel: str) -> list[str]:
        """Names (not paths) of the entries of directory `rel`, sorted."""

    @abstractmethod
    def size(self, rel: str) -> int: ...

    @abstractmethod
    def byte_range(self, rel: str) -> ByteRange: ...

    @abstractmethod
    def where(self, rel: str) -> str:
        """How to name `rel` in a message (a path, or archive:member)."""

    def exists(self, rel: str) -> bool:
        return self.is_file(rel) or self.is_dir(rel)

    def file_sizes(self, rel: str) -> dict[str, int]:
        """{name: size} of the regular files directly in directory `rel` (one listing, no per-file lookups)."""
        return {n: self.size(join(rel, n)) for n in self.listdir(rel) if self.is_file(join(rel, n))}

    def read_bytes(self, rel: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes of file `rel` (all, or `length` from `offset`); short reads raise CheckpointError."""
        r = self.byte_range(rel)
        if length is None:
            length = r.length - offset
        if offset < 0 or offset + length > r.length:
            raise CheckpointError(
                f"{self.where(rel)} is {r.length} bytes; cannot read {length} bytes at offset {offset}",
                where=self.where(rel),
                fix="the file is truncated: re-download or re-copy it",
            )
        with open(r.path, "rb") as fh:
            fh.seek(r.offset + offset)
            data = fh.read(length)
        if len(data) != length:
            raise CheckpointError(
                f"short read: {len(data)} of {length} bytes at offset {offset}",
                where=self.where(rel),
                fix="the file is truncated: re-download or re-copy it",
            )
        return data

    def files(self, rel: str = "") -> list[str]:
        """Every file below `rel` (recursive), as paths relative to the tree root, sorted."""
        out: list[str] = []
        stack = [rel]
        while stack:
            d = stack.pop()
            for name in self.listdir(d):
                p = join(d, name)
                if self.is_dir(p):
                    stack.append(p)
                else:
                    out.append(p)
        return sorted(out)


class DirTree(Tree):
    """A directory on disk. Symlinks are followed, but only to files inside the directory (or, in a
    Hub cache snapshot `…/snapshots/REV[/…]`, inside its repository's `blobs/`, where the Hub links them):
    a link elsewhere (`notes.txt -> /etc/passwd`) is refused wherever a reader resolves it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.source = Path(root)
        self.root = Path(root)
        real = os.path.realpath(self.root)
        self._inside = [real]
        absolute = Path(os.path.abspath(self.root))
        for revision in (absolute, *absolute.parents):  # the tree may be a folder of a snapshot
            if revision.parent.name == "snapshots":
                self._inside.append(os.path.realpath(revision.parent.parent / "blobs"))
                break

    def path(self, rel: str) -> Path:
        if not rel:
            return self.root
        p = self.root / rel
        self._confine(rel, p)
        return p

    def _confine(self, rel: str, p: Path) -> None:
        real = os.path.realpath(p)
        if any(real == root or real.startswith(root + os.sep) for root in self._inside):
            return
        raise CheckpointError(
            f"{rel} resolves to {real}, outside the checkpoint directory {self.root}",
            where=str(p),
            fix="a checkpoint may link only to files inside it (a Hub snapshot: into its blobs/); "
            "copy the file into the directory or remove the link",
        )

    def is_dir(self, rel: str) -> bool:
        return self.path(rel).is_dir()

    def is_file(self, rel: str) -> bool:
        return self.path(rel).is_file()

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            return []

    def size(self, rel: str) -> int:
        return self.path(rel).stat().st_size

    def file_sizes(self, rel: str) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            with os.scandir(self.path(rel)) as it:
                for e in it:
                    if (
                        e.is_symlink()
                    ):  # followed, as the Hub cache needs, but only to files of the checkpoint
                        self._confine(f"{rel}/{e.name}" if rel else e.name, Path(e.path))
                    try:
                        if e.is_file():
                            out[e.name] = e.stat().st_size
                    except OSError:
                        continue
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def byte_range(self, rel: str) -> ByteRange:
        p = self.path(rel)
        return ByteRange(p, 0, p.stat().st_size)

    def where(self, rel: str) -> str:
        return str(self.path(rel))


@dataclass
class _Member:
    name: str  # normalised path inside the archive
    raw_name: str
    kind: str  # "file" | "dir" | "symlink" | "hardlink" | "device" | "fifo" | "other"
    size: int
    offset: int  # absolute offset of the data in the archive file
    linkname: str = ""
    sparse: bool = False


@dataclass
class UnsafeMember:
    """A member that extraction must refuse (reason says why)."""

    name: str
    reason: str


@dataclass
class _Index:
    members: dict[str, _Member] = field(default_factory=dict)
    dirs: dict[str, set[str]] = field(default_factory=lambda: {"": set()})
    unsafe: list[UnsafeMember] = field(default_factory=list)


class _RangeFile(io.RawIOBase):
    """A seekable read-only view of `length` bytes of a file from `offset` (for a tar inside a tar)."""

    def __init__(self, path: Path, offset: int, length: int) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._offset, self._length, self._pos = offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), self._length - self._pos)
        if n <= 0:
            return 0
        self._fh.seek(self._offset + self._pos)
        data = self._fh.read(n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        self._fh.close()
        super().close()


def _normalise(name: str) -> str:
    n = name.replace("\\", "/")
    while n.startswith("./"):
        n = n[2:]
    return posixpath.normpath(n) if n not in ("", ".") else ""


def _unsafe_reason(ti: tarfile.TarInfo) -> str | None:
    """Why extracting `ti` into a directory could escape it or create a device (None: safe).

    Mirrors what tarfile's "data" filter refuses, so verify can report it before adopt tries.
    """
    name = ti.name.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if ".." in name.split("/"):
        return "path with '..' leaving the target directory"
    if ti.ischr() or ti.isblk() or ti.isfifo():
        return "device or FIFO"
    if ti.issym() or ti.islnk():
        link = ti.linkname.replace("\\", "/")
        if link.startswith("/"):
            return f"link to absolute path {ti.linkname!r}"
        base = posixpath.dirname(_normalise(name)) if ti.issym() else ""
        target = posixpath.normpath(posixpath.join(base, link))
        if target == ".." or target.startswith("../"):
            return f"link to {ti.linkname!r} leaving the target directory"
    return None


def _prefixes(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _link_on_the_way(path: str, links: set[str]) -> str | None:
    """The first link that resolving `path` component by component passes through (`d/../..` passes
    through `d`, which a textual normalisation would drop), or None."""
    cur: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        here = "/".join(cur)
        if here in links:
            return here
        if comp == "..":
            if cur:
                cur.pop()
            continue
        cur.append(comp)
    here = "/".join(cur)
    return here if here in links else None


def _refuse_link_chains(index: _Index) -> None:
    """Move to `unsafe` what escapes only once earlier links are followed: a member below a symlink
    (`a -> .` then `a/b -> ..` is `b -> ..`) and a link whose target passes through a link. Each link's
    text alone looks contained; extraction follows them in order, so the chain is refused as a whole."""
    links = {n for n, m in index.members.items() if m.kind in ("symlink", "hardlink")}
    if not links:
        return
    bad: dict[str, str] = {}
    for name, m in index.members.items():
        below = next((p for p in _prefixes(name)[:-1] if p in links), None)
        if below is not None:
            bad[name] = f"member below the link {below!r} (a link chain can leave the target directory)"
        elif m.kind in ("symlink", "hardlink"):
            base = posixpath.dirname(name) if m.kind == "symlink" else ""
            through = _link_on_the_way(posixpath.join(base, m.linkname.replace("\\", "/")), links)
            if through is not None:
                bad[name] = f"link to {m.linkname!r} through the link {through!r} (link chains are refused)"
    for name, reason in sorted(bad.items()):
        index.unsafe.append(UnsafeMember(index.members.pop(name).raw_name, reason))


def _kind(ti: tarfile.TarInfo) -> str:
    if ti.isdir():
        return "dir"
    if ti.issym():
        return "symlink"
    if ti.islnk():
        return "hardlink"
    if ti.ischr() or ti.isblk():
        return "device"
    if ti.isfifo():
        return "fifo"
    if ti.isreg():
        return "file"
    return "other"


def is_tar(path: Path) -> bool:
    try:
        return path.is_file() and tarfile.is_tarfile(path)
    except OSError:
        return False


class TarTree(Tree):
    """An uncompressed tar read in place; a tar whose only file is another tar is entered.

    `layers` lists the archive names entered (outer first), for messages.
    """

    def __init__(self, archive: str | os.PathLike[str]) -> None:
        self.source = Path(archive)
        self.archive = Path(archive)
        self.layers: list[str] = [self.archive.name]
        self.inner_offset = 0
        index = self._scan(self.archive, 0, os.path.getsize(self.archive))
        # Ermine-style `.tar.tar`: one inner tar and nothing else (directories aside)
        files = [m for m in index.members.values() if m.kind != "dir"]
        if len(files) == 1 and files[0].kind == "file" and files[0].name.endswith(TAR_SUFFIXES):
            inner = files[0]
            try:
                inner_index = self._scan(self.archive, inner.offset, inner.size)
            except CheckpointError:
                inner_index = None
            if inner_index is not None:
                self.layers.append(inner.name)
                self.inner_offset = inner.offset
                index = inner_index
        self._index = index

    def _scan(self, path: Path, offset: int, length: int) -> _Index:
        raw = _RangeFile(path, offset, length)
        try:
            try:
                tf = tarfile.open(fileobj=io.BufferedReader(raw), mode="r:")  # type: ignore[arg-type]  # noqa: SIM115
            except tarfile.TarError as err:
                raise CheckpointError(
                    f"not a readable uncompressed tar archive ({err})",
                    where=str(path),
                    fix="decompress it first (only plain .tar archives are read in place), or re-download it",
                ) from None
            index = _Index()
            try:
                for count, ti in enumerate(tf, 1):
                    if count > MAX_TAR_MEMBERS:
                        raise CheckpointError(
                            f"the archive has more than {MAX_TAR_MEMBERS:,} members; no checkpoint has that many",
                            where=str(path),
                            fix="extract it yourself and point longctx at the checkpoint directory inside",
                        )
                    reason = _unsafe_reason(ti)
                    if reason:
                        index.unsafe.append(UnsafeMember(ti.name, reason))
                        continue
                    name = _normalise(ti.name)
                    if not name:
                        continue
                    m = _Member(
                        name=name,
                        raw_name=ti.name,
                        kind=_kind(ti),
                        size=ti.size if ti.isreg() else 0,
                        offset=offset + ti.offset_data,
                        linkname=ti.linkname,
                        sparse=ti.issparse(),
                    )
                    index.members[name] = m
                    parts = name.split("/")
                    for i in range(len(parts)):
                        parent = "/".join(parts[:i])
                        index.dirs.setdefault(parent, set()).add(parts[i])
                        if i < len(parts) - 1:
                            index.dirs.setdefault("/".join(parts[: i + 1]), set())
                    if m.kind == "dir":
                        index.dirs.setdefault(name, set())
            except tarfile.TarError as err:
                raise CheckpointError(
                    f"the tar archive is damaged ({err})",
                    where=str(path),
                    fix="re-download or re-copy the archive",
                ) from None
            finally:
                tf.close()
        finally:
            raw.close()
        _refuse_link_chains(index)
        return index

    @property
    def unsafe(self) -> list[UnsafeMember]:
        return list(self._index.unsafe)

    def member_kind(self, rel: str) -> str | None:
        m = self._index.members.get(rel)
        return m.kind if m else ("dir" if rel in self._index.dirs else None)

    def is_dir(self, rel: str) -> bool:
        return rel in self._index.dirs

    def is_file(self, rel: str) -> bool:
        m = self._index.members.get(rel)
        return m is not None and m.kind == "file"

    def listdir(self, rel: str) -> list[str]:
        return sorted(self._index.dirs.get(rel, ()))

    def size(self, rel: str) -> int:
        return self._member(rel).size

    def byte_range(self, rel: str) -> ByteRange:
        m = self._member(rel)
        if m.sparse:
            raise CheckpointError(
                "sparse tar members cannot be read in place",
                where=self.where(rel),
                fix="extract the archive with `tar -xf` and pass the directory",
            )
        return ByteRange(self.archive, m.offset, m.size)

    def _member(self, rel: str) -> _Member:
        m = self._index.members.get(rel)
        if m is None or m.kind != "file":
            raise CheckpointError(f"no file {rel!r} in the archive", where=self.where(rel))
        return m

    def where(self, rel: str) -> str:
        return ":".join(
            [str(self.archive), *self.layers[1:], rel] if rel else [str(self.archive), *self.layers[1:]]
        )

    def open_tarfile(self) -> tarfile.TarFile:
        """The innermost archive as a TarFile (caller closes), for extraction."""
        if self.inner_offset:
            length = os.path.getsize(self.archive) - self.inner_offset
            raw = _RangeFile(self.archive, self.inner_offset, length)
            return tarfile.open(fileobj=io.BufferedReader(raw), mode="r:")  # type: ignore[arg-type]
        return tarfile.open(self.archive, mode="r:")


def open_tree(path: str | os.PathLike[str]) -> Tree:
    """A DirTree for a directory, a TarTree for a tar file; anything else raises CheckpointError."""
    p = Path(path)
    if p.is_dir():
        return DirTree(p)
    if not p.exists():
        raise CheckpointError(
            "the path does not exist",
            where=str(p),
            fix="pass a save dir, an iter_NNNNNNN/release dir, a flat snapshot dir or a .tar archive",
        )
    if is_tar(p):
        return TarTree(p)
    mode = p.stat().st_mode
    kind = "file" if stat.S_ISREG(mode) else "special file"
    raise CheckpointError(
        f"not a checkpoint directory or tar archive (a {kind})",
        where=str(p),
        fix="pass a save dir, an iter_NNNNNNN/release dir, a flat snapshot dir or a .tar archive",
    )


def open_binary(tree: Tree, rel: str) -> BinaryIO:
    """A seekable binary file object over one file of the tree (caller closes)."""
    r = tree.byte_range(rel)
    return io.BufferedReader(_RangeFile(r.path, r.offset, r.length))  # type: ignore[arg-type]
