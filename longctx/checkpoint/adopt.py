"""`adopt(SRC, into=DIR)`: arrange a flat snapshot or a tar archive into Megatron-LM's save layout.

    DIR/iter_NNNNNNN/…                       the checkpoint's files
    DIR/latest_checkpointed_iteration.txt    N (written last)

Directories are adopted without copying data: every file is hard-linked (default) or moved
(`mode="move"`); a copy happens only when asked (`allow_copy=True`, e.g. across filesystems).
Symlinks (a Hub cache snapshot links into `blobs/`) are resolved and their targets linked.

Archives are extracted, which writes the data once. Before anything is written every member is
checked: absolute paths, `..`, names a file system cannot hold, links and devices make the whole archive
refused, and so does a path the archive holds twice under any spelling (which copy is meant is unclear;
the archive index refuses it for every reader). Extraction copies each member's byte range into a new
regular file that longctx creates itself (the same on every Python; no reliance on tarfile's extraction
filters, which Python 3.11.0-3.11.3 lack).

The iteration comes from the common state (`iteration`, or `args.iteration`), else from the directory
name (`iter_NNNNNNN`), else from `iteration=`; an explicit one that disagrees with the saved one is an
error. Files appear under a temporary name and are renamed into place, then the tracker is written:
an interrupted adopt leaves no directory that the tracker names.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from longctx.checkpoint.archive import UnsafeName, member_path
from longctx.checkpoint.metadata import args_dict, read_common_state, read_dcp_index
from longctx.checkpoint.save_layout import (
    RELEASE,
    TRACKER,
    ResolvedCheckpoint,
    iter_dir_name,
    read_tracker,
    resolve_in_tree,
)
from longctx.checkpoint.tree import ByteRange, DirTree, TarTree, open_tree
from longctx.checkpoint.verify import VerifyReport, verify_checkpoint, verify_resolved
from longctx.errors import CheckpointError
from longctx.report import Findings
from longctx.util.fs import atomic_write_text, fsync_dir
from longctx.util.progress import progress_bar

Mode = Literal["link", "move"]


@dataclass
class AdoptResult:
    source: str
    save_dir: Path
    checkpoint_dir: Path
    iteration: int | None  # None for release
    iteration_source: str
    method: str  # "hardlink", "move", "copy", "extract", mixed as "hardlink+copy"
    files: int
    bytes: int
    tracker_written: bool
    verify: VerifyReport | None = field(default=None, repr=False)


def _saved_iteration(resolved: ResolvedCheckpoint) -> int | None:
    try:
        index = read_dcp_index(resolved.tree, resolved.checkpoint_rel)
        common = read_common_state(resolved.tree, resolved.checkpoint_rel, index).state or {}
    except CheckpointError:
        return None
    it = common.get("iteration")
    if isinstance(it, int):
        return it
    it = args_dict(common).get("iteration")
    return it if isinstance(it, int) else None


def choose_iteration(resolved: ResolvedCheckpoint, explicit: int | None) -> tuple[int | None, str]:
    """(iteration or None for release, where it came from)."""
    saved = _saved_iteration(resolved)
    if explicit is not None:
        if explicit <= 0:
            raise CheckpointError(
                f"--iteration {explicit}: Megatron-LM needs an iteration > 0", fix="pass N ≥ 1"
            )
        if saved is not None and saved != explicit:
            raise CheckpointError(
                f"--iteration {explicit} disagrees with the iteration saved in the checkpoint ({saved})",
                where=resolved.where,
                fix=f"drop --iteration (the saved {saved} is used), or pass --iteration {saved}",
            )
        return explicit, "--iteration"
    if resolved.kind == "release_dir" or (resolved.tracker is not None and resolved.tracker.release):
        return None, "release directory"
    if saved is not None and saved > 0:
        return saved, "common state"
    if resolved.iteration is not None and resolved.iteration > 0:
        return resolved.iteration, "directory name" if resolved.tracker is None else "tracker"
    raise CheckpointError(
        "cannot tell the iteration: no saved iteration in the common state and no iter_NNNNNNN name",
        where=resolved.where,
        fix="pass --iteration N",
    )


def _refuse_unsafe_archive(tree: TarTree) -> None:
    bad = tree.unsafe
    if bad:
        m = bad[0]
        more = f" (and {len(bad) - 1} more unsafe members)" if len(bad) > 1 else ""
        raise CheckpointError(
            f"refusing to extract the archive: member {m.name!r} is unsafe ({m.reason}){more}",
            where=str(tree.source),
            fix="do not use this archive; obtain a clean copy",
        )


def _prepare_target(into: Path, dir_name: str, write_tracker: bool, iteration: int | None) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    target = into / dir_name
    if target.exists():
        raise CheckpointError(
            f"{dir_name} already exists in the target directory; nothing is overwritten",
            where=str(target),
            fix="adopt into another directory, or remove the existing one first",
        )
    if write_tracker:
        existing = read_tracker(into)
        if existing is not None and existing.dir_name != dir_name:
            raise CheckpointError(
                f"the target's {TRACKER} already names {existing.dir_name}",
                where=str(into / TRACKER),
                fix="adopt into an empty directory (or pass --no-tracker and edit the tracker yourself)",
            )
    return target


def _link_or_copy(src: Path, dst: Path, mode: Mode, allow_copy: bool) -> str:
    real = Path(os.path.realpath(src))
    if mode == "move":
        if src.is_symlink():
            raise CheckpointError(
                "cannot move a symlinked file (a Hub cache snapshot links into blobs/)",
                where=str(src),
                fix="use the default hardlink mode",
            )
        try:
            os.rename(src, dst)
            return "move"
        except OSError as err:
            if err.errno != errno.EXDEV or not allow_copy:
                raise
    else:
        try:
            os.link(real, dst)
            return "hardlink"
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP) or not allow_copy:
                raise
    shutil.copy2(real, dst)
    if mode == "move":
        os.unlink(src)
    return "copy"


def _regular_size(tree: DirTree, rel: str) -> int:
    """The size of `rel`, which must resolve (inside the tree: `DirTree.path`) to a regular file."""
    p = tree.path(rel)
    try:
        st = os.stat(p)
    except OSError as err:
        what = "a symlink loop" if err.errno == errno.ELOOP else f"unreadable ({err.strerror})"
        raise CheckpointError(
            f"{rel} is {what}", where=str(p), fix="remove or repair the link, then adopt again"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(
            f"{rel} is not a regular file (mode {stat.filemode(st.st_mode)})",
            where=str(p),
            fix="a checkpoint holds regular files only: remove the device, socket or fifo",
        )
    return st.st_size


def _source_files(resolved: ResolvedCheckpoint) -> dict[str, int]:
    """{file: size} of a directory source; refuses links out of it and anything not a regular file."""
    tree = resolved.tree
    assert isinstance(tree, DirTree)
    return {r: _regular_size(tree, r) for r in tree.files(resolved.checkpoint_rel)}


def _adopt_dir(
    resolved: ResolvedCheckpoint, sizes: dict[str, int], staging: Path, mode: Mode, allow_copy: bool
) -> tuple[int, int, set[str]]:
    tree = resolved.tree
    assert isinstance(tree, DirTree)
    rels = sorted(sizes)
    base = resolved.checkpoint_rel
    done: list[tuple[Path, Path]] = []
    methods: set[str] = set()
    total = sum(sizes.values())
    try:
        with progress_bar(f"adopt ({mode})", total, unit="bytes") as advance:
            for r in rels:
                sub = r[len(base) + 1 :] if base else r
                src, dst = tree.path(r), staging / sub
                dst.parent.mkdir(parents=True, exist_ok=True)
                methods.add(_link_or_copy(src, dst, mode, allow_copy))
                done.append((src, dst))
                advance(sizes[r])
    except OSError as err:
        if mode == "move":  # put back what was moved
            for src, dst in reversed(done):
                if dst.exists() and not src.exists():
                    os.rename(dst, src)
        shutil.rmtree(staging, ignore_errors=True)
        verb = "move" if mode == "move" else "hard-link"
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CheckpointError(
                f"no space left on the target's file system while adopting {err.filename} "
                f"({err.strerror}); the partial copy was removed",
                where=str(staging.parent),
                fix=f"free space on the target's file system (`df -h {staging.parent}`), or adopt onto a larger "
                "one (or onto the source's file system, where files are hard-linked, not copied)",
            ) from None
        if err.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise CheckpointError(
                f"cannot {verb} {err.filename}: {err.strerror} (source and target on different filesystems?)",
                where=str(err.filename),
                fix="put the target on the same filesystem as the source, or pass --allow-copy to copy the data",
            ) from None
        raise CheckpointError(
            f"cannot {verb} {err.filename}: {err.strerror}",
            where=str(err.filename),
            fix="check that the source is readable and the target writable",
        ) from None
    return len(rels), total, methods


_COPY_CHUNK = 1 << 20


def _confined(staging: Path, sub: str, where: str) -> Path:
    """staging/sub for a member path the archive index already normalised and checked; checked again by
    the same rule (`member_path`), because this is where a byte is written."""
    try:
        clean = sub != "" and member_path(sub) == sub
    except UnsafeName:
        clean = False
    if not clean:
        raise CheckpointError(
            f"refusing to extract the member {sub!r}: its path leaves the target directory or is not a "
            "file name a file system holds",
            where=where,
            fix="do not use this archive; obtain a clean copy",
        )
    return staging.joinpath(*sub.split("/"))


def _write_range(src: ByteRange, dst: Path, advance: Callable[[int], None]) -> None:
    """Copy a member's bytes to a new regular file: O_EXCL and O_NOFOLLOW, so nothing already there (a file,
    a link) is written through."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(dst, flags, 0o644)
    with os.fdopen(fd, "wb") as out, open(src.path, "rb") as fh:
        fh.seek(src.offset)
        left = src.length
        while left > 0:
            chunk = fh.read(min(_COPY_CHUNK, left))
            if not chunk:
                raise CheckpointError(
                    "the archive ends inside a member (truncated)",
                    where=str(src.path),
                    fix="re-download or re-copy the archive",
                )
            out.write(chunk)
            left -= len(chunk)
            advance(len(chunk))
        out.flush()
        os.fsync(out.fileno())


def _tar_sources(resolved: ResolvedCheckpoint) -> dict[str, ByteRange]:
    """{member: its bytes in the archive} of the checkpoint's files, checked before anything is written:
    regular files only (no links, no sparse members). The index behind the tree already refused a path
    held twice (also as a file and a directory) and every name that leaves the archive."""
    tree = resolved.tree
    assert isinstance(tree, TarTree)
    out: dict[str, ByteRange] = {}
    for r in tree.files(resolved.checkpoint_rel):
        kind = tree.member_kind(r)
        if kind != "file":
            raise CheckpointError(
                f"the archive member {r!r} is a {kind}: a checkpoint archive holds regular files only",
                where=tree.where(r),
                fix="extract the archive yourself, replace links by the files they name, and adopt the directory",
            )
        out[r] = tree.byte_range(r)  # a sparse member is refused here
    return out


def _adopt_tar(resolved: ResolvedCheckpoint, ranges: dict[str, ByteRange], staging: Path) -> tuple[int, int]:
    """Extract the checkpoint's members from the archive index, each a byte range copied into a new file.

    tarfile's own extraction is not used: its `data` filter exists only from Python 3.11.4, and the
    index already refused every unsafe member; what is written here are regular files and the
    directories above them, all created by this function inside `staging`, so no write can leave it.
    """
    tree = resolved.tree
    prefix = resolved.checkpoint_rel
    total = sum(b.length for b in ranges.values())
    staging.mkdir(parents=True)
    try:
        with progress_bar("extract", total, unit="bytes") as advance:
            for r, byte_range in ranges.items():
                dst = _confined(staging, r[len(prefix) + 1 :] if prefix else r, tree.where(r))
                dst.parent.mkdir(parents=True, exist_ok=True)
                _write_range(byte_range, dst, advance)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(
            f"cannot extract the archive: {err.strerror}",
            where=str(err.filename or staging),
            fix="check that the target is writable and has room for the checkpoint",
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return len(ranges), total


def adopt(
    src: str | os.PathLike[str],
    into: str | os.PathLike[str],
    *,
    iteration: int | None = None,
    mode: Mode = "link",
    allow_copy: bool = False,
    write_tracker: bool = True,
) -> AdoptResult:
    """Arrange SRC (flat snapshot dir, iter/release dir, save dir, or .tar/.tar.tar) as INTO/iter_N.

    The source is verified first (shallow) and the result after; an incomplete or unsafe source is
    refused with CheckpointError before anything is written.
    """
    into = Path(into)
    tree = open_tree(Path(src))
    if isinstance(tree, TarTree):
        _refuse_unsafe_archive(tree)
    resolved = resolve_in_tree(tree)
    findings = Findings()
    verify_resolved(resolved, findings)
    if not findings.ok:
        first = findings.errors[0]
        raise CheckpointError(
            f"the source checkpoint is not whole: {first.message}",
            where=first.where or resolved.where,
            fix=first.fix or "run `longctx ckpt check` on the source for every problem",
        )
    it, it_src = choose_iteration(resolved, iteration)
    dir_name = RELEASE if it is None else iter_dir_name(it)
    if (
        isinstance(tree, DirTree)
        and resolved.save_dir is not None
        and into.resolve() == resolved.save_dir.resolve()
    ):
        raise CheckpointError("the source is already in this save dir", where=str(into), fix="nothing to do")
    # every file of the source checked (inside it, regular) before anything is created
    sizes = _source_files(resolved) if isinstance(tree, DirTree) else {}
    ranges = _tar_sources(resolved) if isinstance(tree, TarTree) else {}
    made = _missing_dirs(into)
    try:
        return _adopt_into(
            src, tree, resolved, into, dir_name, it, it_src, sizes, ranges, mode, allow_copy, write_tracker
        )
    except BaseException:
        for d in reversed(made):  # the target directories this adopt created, where it left them empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _publish(staging: Path, target: Path, into: Path, tracker: str | None, method: str) -> None:
    """Rename the staged checkpoint into place, then write the tracker. If either fails (a full file
    system), what this adopt wrote is removed, so the target is as it was; files moved out of a source
    directory (`move`) are the user's only copy and stay where they are."""
    where = staging
    try:
        fsync_dir(staging)
        os.rename(staging, target)
        where = target
        fsync_dir(into)
        if tracker is not None:
            atomic_write_text(into / TRACKER, tracker)
    except BaseException:
        if "move" not in method:
            shutil.rmtree(where, ignore_errors=True)
        raise


def _missing_dirs(path: Path) -> list[Path]:
    """The directories `path.mkdir(parents=True)` would create, outermost first."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out[::-1]


def _adopt_into(
    src: str | os.PathLike[str],
    tree: DirTree | TarTree,
    resolved: ResolvedCheckpoint,
    into: Path,
    dir_name: str,
    it: int | None,
    it_src: str,
    sizes: dict[str, int],
    ranges: dict[str, ByteRange],
    mode: Mode,
    allow_copy: bool,
    write_tracker: bool,
) -> AdoptResult:
    target = _prepare_target(into, dir_name, write_tracker, it)
    staging = into / f".adopt-{dir_name}.{os.getpid()}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    if isinstance(tree, TarTree):
        files, nbytes = _adopt_tar(resolved, ranges, staging)
        method = "extract"
    else:
        staging.mkdir()
        files, nbytes, methods = _adopt_dir(resolved, sizes, staging, mode, allow_copy)
        method = "+".join(sorted(methods)) or ("move" if mode == "move" else "hardlink")
    _publish(staging, target, into, f"{RELEASE if it is None else it}\n" if write_tracker else None, method)
    report = verify_checkpoint(into if write_tracker else target)
    return AdoptResult(
        source=str(src),
        save_dir=into,
        checkpoint_dir=target,
        iteration=it,
        iteration_source=it_src,
        method=method,
        files=files,
        bytes=nbytes,
        tracker_written=write_tracker,
        verify=report,
    )


__all__ = ["AdoptResult", "adopt", "choose_iteration"]
