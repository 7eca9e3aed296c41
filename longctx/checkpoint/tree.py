"""Read-only file trees: a directory, or an uncompressed tar archive read in place.

Checkpoints arrive as directories or as `.tar` files (some named `.tar.tar`, some holding one inner
`.tar`). Every reader in this package goes through a `Tree`, so inspect and verify work on archives
without extracting them: a member of an uncompressed tar is a byte range of the archive file, found
from the headers alone (`TarInfo.offset_data`), also for a tar nested inside a tar. What a tar holds
is decided by one index (`archive.index_archive`), which a `TarTree` is built on.

Paths inside a tree are POSIX strings relative to its root ("" is the root).
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from longctx.checkpoint.archive import (
    ArchiveIndex,
    Member,
    RangeFile,
    UnsafeMember,
    index_archive,
    is_tar_range,
)
from longctx.errors import CheckpointError

TAR_SUFFIXES = (".tar",)


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
        index = index_archive(self.archive, 0, os.path.getsize(self.archive), str(self.archive))
        inner = self._inner_tar(index)
        if inner is not None:  # indexed by the same rules: a name held twice in it is refused as well
            nested = index_archive(self.archive, inner.offset, inner.size, f"{self.archive}:{inner.name}")
            nested.unsafe[:0] = index.unsafe  # the outer archive's unsafe members stay reported
            index = nested
            self.layers.append(inner.name)
        self._index = index

    def _inner_tar(self, index: ArchiveIndex) -> Member | None:
        """The inner tar of an Ermine-style `.tar.tar`: one tar and nothing else (directories aside)."""
        files = [m for m in index.members.values() if m.kind != "dir"]
        if len(files) != 1 or files[0].kind != "file" or not files[0].name.endswith(TAR_SUFFIXES):
            return None
        return files[0] if is_tar_range(self.archive, files[0].offset, files[0].size) else None

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

    def _member(self, rel: str) -> Member:
        m = self._index.members.get(rel)
        if m is None or m.kind != "file":
            raise CheckpointError(f"no file {rel!r} in the archive", where=self.where(rel))
        return m

    def where(self, rel: str) -> str:
        return ":".join(
            [str(self.archive), *self.layers[1:], rel] if rel else [str(self.archive), *self.layers[1:]]
        )


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
    return io.BufferedReader(RangeFile(r.path, r.offset, r.length))  # type: ignore[arg-type]
