"""Outputs never land on inputs: a write target inside what a command reads is refused."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import longctx
from longctx.errors import OutputError


def is_within(path: Path, root: Path) -> bool:
    """Whether `path` (resolved, links followed) is `root` or lies inside it."""
    p, r = os.path.realpath(path), os.path.realpath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def refuse_write_into(target: Path, source: Path, option: str, suffix: str = ".out") -> None:
    """Refuse writing `target` when it is the input `source` (a file) or lies inside it (a directory)."""
    if is_within(target, source):
        raise OutputError(
            f"{option} {target} would be written inside the input {source}, which this command reads",
            where=str(target),
            fix=(
                f"write it beside the input, e.g. {option} "
                f"{Path(os.path.abspath(source)).parent / (Path(source).name + suffix)}"
            ),
        )


def _tracked_by_git(path: Path) -> bool:
    """Whether `path` is a file git tracks in the checkout around it (False without git or a checkout)."""
    top = next((d for d in path.parents if (d / ".git").exists()), None)
    if top is None:
        return False
    try:
        r = subprocess.run(
            ["git", "-C", str(top), "ls-files", "--error-unmatch", "--", str(path.relative_to(top))],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return False
    return r.returncode == 0


def _refuse(target: Path, option: str, why: str, fix: str) -> OutputError:
    return OutputError(f"{option} {target}: {why}; nothing was written", where=str(target), fix=fix)


def check_output_file(
    target: Path,
    *,
    option: str,
    kind: str,
    suffix: str,
    magic: bytes,
    inputs: Sequence[Path] = (),
    run_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """The file a command writes at a user's `option` (a figure, a report), checked before anything is
    computed or written; OutputError names the reason. Never written: a path without `suffix`; anything
    that is not a regular file (a directory, a link, a FIFO, a device); a file of the installed package, of
    a git checkout's tracked files or of a `.git` directory; an input (`inputs`: files, and directories
    whose every file is one); inside `run_dir`, anything but a file directly in it (its subdirectories hold
    checkpoints, logs, events and data). An existing file is replaced only when it already is a `kind`
    (its first bytes are `magic`: an earlier output); any other file needs `force`."""
    target = Path(os.path.abspath(target))
    name = f"a {kind}"
    if target.suffix.lower() != suffix:
        raise _refuse(
            target,
            option,
            f"the name does not end in {suffix}, and this command writes {name}",
            f"name the file …{suffix}, e.g. {option} {target.with_suffix(suffix)}",
        )
    try:
        st = target.lstat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise _refuse(target, option, f"cannot inspect it ({err.strerror})", "choose another path") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise _refuse(target, option, f"it is {what}", f"choose a new file name for the {kind}")
    real = _refuse_protected(target, option, f"the {kind}")
    for source in inputs:
        if is_within(real, source):
            raise _refuse(
                target,
                option,
                f"it would land on the input {source}, which this command reads",
                f"write the {kind} elsewhere, e.g. into the run directory",
            )
    if run_dir is not None and is_within(real, run_dir) and real.parent != Path(os.path.realpath(run_dir)):
        raise _refuse(
            target,
            option,
            f"it lies in a subdirectory of the run {run_dir}, which holds the "
            "run's checkpoints, logs, events and data",
            f"write it directly into the run directory, e.g. {option} {Path(run_dir) / target.name}",
        )
    if st is None:
        return target
    if _tracked_by_git(real):
        raise _refuse(
            target,
            option,
            "it is a file git tracks in this checkout",
            f"write the {kind} to a new file, or outside the checkout",
        )
    if not force and not _starts_with(real, magic):
        raise _refuse(
            target,
            option,
            f"the file exists and is not {name} (an earlier output would be)",
            f"choose a new file name, or pass --force to replace {target} with the {kind}",
        )
    return target


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(magic)) == magic
    except OSError:
        return False


def check_output_dir(target: Path, *, option: str, what: str) -> Path:
    """A directory a command writes its outputs into (`what`, e.g. "the evaluation's report and plots"):
    never inside the installed package or a `.git` directory, never a path that exists as something other
    than a directory. OutputError names the reason before anything is written."""
    target = Path(os.path.abspath(target))
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise _refuse(
            target, option, f"cannot write there ({err.strerror})", "choose another directory"
        ) from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise _refuse(target, option, "it exists and is not a directory", f"name a directory for {what}")
    _refuse_protected(target, option, what)
    return target


def _refuse_protected(target: Path, option: str, what: str) -> Path:
    """The target's real path, unless it lies inside the installed package or a `.git` directory."""
    real = Path(os.path.realpath(target))
    package = Path(os.path.realpath(Path(longctx.__file__).parent))
    if is_within(real, package):
        raise _refuse(
            target,
            option,
            f"it lies inside the installed longctx package ({package})",
            f"write {what} outside the package, e.g. into the run directory",
        )
    if ".git" in real.parts:
        raise _refuse(
            target, option, "it lies inside a git repository's .git directory", f"write {what} elsewhere"
        )
    return real
