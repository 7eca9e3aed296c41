"""The one index of an uncompressed tar archive: every reader of a tar (`TarTree`, and through it
inspect, check and adopt) sees the members `index_archive` lists, never tarfile's own view.

A tar may hold one path under several spellings (`a/b`, `./a//b`, `a\\b`) or several times; tarfile and
`tar -x` let the last copy win without a word. The index decides once what each member's path is
(`member_path`) and refuses an archive in which two members have one path, so no reader can pick a
different copy from the one a check looked at. A name no file system can hold (a NUL byte, an
over-long component) or one that leaves the archive (absolute, `..`) makes the member unsafe.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from longctx.errors import CheckpointError

# a 9B model's save with optimizer has a few thousand files; the index of a tar is held in memory
MAX_TAR_MEMBERS = 200_000
# bytes of one path component and of a whole member path that Linux file systems hold (NAME_MAX, PATH_MAX - 1)
NAME_MAX = 255
PATH_MAX = 4095
_LINKS = ("symlink", "hardlink")


class UnsafeName(ValueError):
    """A member name that cannot be extracted as written (the message says why)."""


@dataclass
class Member:
    name: str  # normalised path inside the archive
    raw_name: str
    kind: str  # "file" | "dir" | "symlink" | "hardlink" | "other"
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
class ArchiveIndex:
    """The members of one tar, each under its one normalised path; `dirs` maps every directory (named or
    implied by a member below it) to its entries; `unsafe` lists what was left out and why."""

    members: dict[str, Member] = field(default_factory=dict)
    dirs: dict[str, set[str]] = field(default_factory=lambda: {"": set()})
    unsafe: list[UnsafeMember] = field(default_factory=list)


class RangeFile(io.RawIOBase):
    """A seekable read-only view of `length` bytes of a file from `offset` (a member, or a tar inside a tar)."""

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


def member_path(raw: str) -> str:
    """The path a member name means, relative to the archive root ("" is the root itself): `\\` is a
    separator, `.` and empty components are dropped. Raises UnsafeName for a name that leaves the archive
    (absolute, `..`) or that a file system cannot hold (NUL, other control characters, bytes that are not
    UTF-8, an over-long component or path)."""
    if "\x00" in raw:
        raise UnsafeName("NUL byte in the name")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise UnsafeName("control character in the name")
    try:
        size = len(raw.encode("utf-8"))
    except UnicodeEncodeError:  # tarfile keeps undecodable bytes as lone surrogates
        raise UnsafeName("the name is not valid UTF-8") from None
    name = raw.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeName("absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeName("path with '..' leaving the target directory")
    if size > PATH_MAX:
        raise UnsafeName(f"name of {size:,} bytes, longer than the {PATH_MAX:,} a file system path holds")
    if any(len(p.encode("utf-8")) > NAME_MAX for p in parts):
        raise UnsafeName(f"a path component longer than the {NAME_MAX} bytes a file name holds")
    return "/".join(parts)


def _link_reason(ti: tarfile.TarInfo, name: str) -> str | None:
    """Why the member `ti` (at path `name`) could escape the target directory through a link, or create
    a device (None: safe). Mirrors what tarfile's "data" filter refuses, so check can report it before
    adopt tries."""
    if ti.ischr() or ti.isblk() or ti.isfifo():
        return "device or FIFO"
    if not (ti.issym() or ti.islnk()):
        return None
    link = ti.linkname.replace("\\", "/")
    if "\x00" in link:
        return "NUL byte in the link target"
    if link.startswith("/"):
        return f"link to absolute path {ti.linkname!r}"
    base = posixpath.dirname(name) if ti.issym() else ""
    target = posixpath.normpath(posixpath.join(base, link))
    if target == ".." or target.startswith("../"):
        return f"link to {ti.linkname!r} leaving the target directory"
    return None


def _kind(ti: tarfile.TarInfo) -> str:
    if ti.isdir():
        return "dir"
    if ti.issym():
        return "symlink"
    if ti.islnk():
        return "hardlink"
    if ti.isreg():
        return "file"
    return "other"


def _word(m: Member) -> str:
    return {"dir": "directory", "other": "special member"}.get(m.kind, m.kind)


def _both(first: Member, second: Member) -> str:
    """How one path is spelled by two members, for a message."""
    if first.kind != second.kind:
        return f"as the {_word(first)} {first.raw_name!r} and as the {_word(second)} {second.raw_name!r}"
    if first.raw_name == second.raw_name:
        return f"two {_word(second)} members of that name"
    return f"as {first.raw_name!r} and as {second.raw_name!r}"


def _below(file: Member, below: Member) -> str:
    return f"as the {_word(file)} {file.raw_name!r} and as a directory, with {below.raw_name!r} below it"


def _twice(where: str, path: str, how: str) -> CheckpointError:
    return CheckpointError(
        f"the archive holds {path!r} twice ({how}); tar keeps the last copy and hides the first, so which "
        "one is meant is unclear",
        where=where,
        fix="do not use this archive; obtain a clean copy (or rebuild it with each file once)",
    )


def _add(index: ArchiveIndex, m: Member, where: str) -> None:
    """Put `m` into the index, refusing a path the index already holds, under any spelling, and a file
    that is also a directory (a member below it)."""
    old = index.members.get(m.name)
    if old is not None:
        raise _twice(where, m.name, _both(old, m))
    parts = m.name.split("/")
    for i in range(1, len(parts)):
        above = index.members.get("/".join(parts[:i]))
        if above is not None and above.kind not in ("dir", *_LINKS):  # below a link: _refuse_link_chains
            raise _twice(where, above.name, _below(above, m))
    if m.kind not in ("dir", *_LINKS) and m.name in index.dirs:
        below = next(o for o in index.members.values() if o.name.startswith(m.name + "/"))
        raise _twice(where, m.name, _below(m, below))
    index.members[m.name] = m
    for i in range(len(parts)):
        index.dirs.setdefault("/".join(parts[:i]), set()).add(parts[i])
    if m.kind == "dir":
        index.dirs.setdefault(m.name, set())


def _member(ti: tarfile.TarInfo, name: str, offset: int) -> Member:
    return Member(
        name=name,
        raw_name=ti.name,
        kind=_kind(ti),
        size=ti.size if ti.isreg() else 0,
        offset=offset + ti.offset_data,
        linkname=ti.linkname,
        sparse=ti.issparse(),
    )


def _index_members(tf: tarfile.TarFile, offset: int, where: str) -> ArchiveIndex:
    index = ArchiveIndex()
    for count, ti in enumerate(tf, 1):
        if count > MAX_TAR_MEMBERS:
            raise CheckpointError(
                f"the archive has more than {MAX_TAR_MEMBERS:,} members; no checkpoint has that many",
                where=where,
                fix="extract it yourself and point longctx at the checkpoint directory inside",
            )
        try:
            name = member_path(ti.name)
            reason = _link_reason(ti, name) or (None if name or ti.isdir() else "empty name")
        except UnsafeName as err:
            reason = str(err)
        if reason:
            index.unsafe.append(UnsafeMember(ti.name, reason))
        elif name:  # "" is the archive's root directory (`tar -cf x.tar .` names it `./`)
            _add(index, _member(ti, name, offset), where)
    return index


def index_archive(path: Path, offset: int, length: int, where: str) -> ArchiveIndex:
    """Index the tar stored in `length` bytes of `path` from `offset` (a tar inside a tar has offset > 0),
    reading headers only. `where` names the archive in messages. A path held twice raises
    CheckpointError; unsafe members are left out of the index and listed in `unsafe`."""
    raw = RangeFile(path, offset, length)
    try:
        try:
            tf = tarfile.open(fileobj=io.BufferedReader(raw), mode="r:")  # type: ignore[arg-type]  # noqa: SIM115
        except tarfile.TarError as err:
            raise CheckpointError(
                f"not a readable uncompressed tar archive ({err})",
                where=where,
                fix="decompress it first (only plain .tar archives are read in place), or re-download it",
            ) from None
        try:
            index = _index_members(tf, offset, where)
        except tarfile.TarError as err:
            raise CheckpointError(
                f"the tar archive is damaged ({err})", where=where, fix="re-download or re-copy the archive"
            ) from None
        finally:
            tf.close()
    finally:
        raw.close()
    _refuse_link_chains(index)
    return index


def is_tar_range(path: Path, offset: int, length: int) -> bool:
    """Whether `length` bytes of `path` from `offset` begin like a tar archive (headers only)."""
    with io.BufferedReader(RangeFile(path, offset, length)) as fh:  # type: ignore[arg-type]
        try:
            return tarfile.is_tarfile(fh)
        except (OSError, tarfile.TarError):
            return False


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


def _refuse_link_chains(index: ArchiveIndex) -> None:
    """Move to `unsafe` what escapes only once earlier links are followed: a member below a symlink
    (`a -> .` then `a/b -> ..` is `b -> ..`) and a link whose target passes through a link. Each link's
    text alone looks contained; extraction follows them in order, so the chain is refused as a whole."""
    links = {n for n, m in index.members.items() if m.kind in _LINKS}
    if not links:
        return
    bad: dict[str, str] = {}
    for name, m in index.members.items():
        below = next((p for p in _prefixes(name)[:-1] if p in links), None)
        if below is not None:
            bad[name] = f"member below the link {below!r} (a link chain can leave the target directory)"
        elif m.kind in _LINKS:
            base = posixpath.dirname(name) if m.kind == "symlink" else ""
            through = _link_on_the_way(posixpath.join(base, m.linkname.replace("\\", "/")), links)
            if through is not None:
                bad[name] = f"link to {m.linkname!r} through the link {through!r} (link chains are refused)"
    for name, reason in sorted(bad.items()):
        index.unsafe.append(UnsafeMember(index.members.pop(name).raw_name, reason))


__all__ = [
    "MAX_TAR_MEMBERS",
    "ArchiveIndex",
    "Member",
    "RangeFile",
    "UnsafeMember",
    "UnsafeName",
    "index_archive",
    "is_tar_range",
    "member_path",
]
