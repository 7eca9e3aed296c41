"""Outputs never land on inputs: a write target inside what a command reads is refused."""

from __future__ import annotations

import os
from pathlib import Path

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
            fix=f"write it beside the input, e.g. {option} {Path(os.path.abspath(source)).parent / (Path(source).name + suffix)}",
        )
