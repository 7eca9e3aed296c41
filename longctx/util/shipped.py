"""What ships inside the package, found through importlib.resources so that an installed wheel works from
any directory: the plans (`resources/stages`), the tokenizer manifests they name (`resources/tokenization`)
and the published demo bases (`resources/demo`). A checkout's `stages/` and `tokenization/` link to them.

A shipped plan names its manifest relative to itself (`../tokenization/gpt2.toml`), so `copy_plan` copies
the plan together with every shipped file it names, keeping the layout: the copy works where it lands.
"""

from __future__ import annotations

import functools
import os
import shutil
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from longctx.errors import PlanError

PLAN_SUFFIX = ".toml"


def resource_dir(*parts: str) -> Path:
    """A directory of `longctx/resources` as a path on disk."""
    return Path(str(resources.files("longctx").joinpath("resources", *parts)))


@functools.cache
def package_dir() -> Path:
    """The installed `longctx` package on disk (the checkout's `longctx/` in an editable install)."""
    return Path(str(resources.files("longctx"))).resolve()


def shipped_home(path: Path) -> Path | None:
    """For a file shipped inside the package (`…/resources/stages/tiny.toml`), the directory it sits in
    relative to the resources (`stages`); None for any other file."""
    root = resource_dir().resolve()
    where = path.resolve()
    return where.parent.relative_to(root) if where.is_relative_to(root) else None


def plans_dir() -> Path:
    return resource_dir("stages")


def shipped_plans() -> dict[str, Path]:
    """{name: path} of every shipped plan, by file stem (`baby_9b_dense`)."""
    return {p.stem: p for p in sorted(plans_dir().glob(f"*{PLAN_SUFFIX}"))}


def shipped_plan(name: str) -> Path | None:
    """The shipped plan called `name` (`baby_9b_dense` or `baby_9b_dense.toml`), None if there is none.
    Only a bare name is looked up: anything with a directory part is a path, not a name."""
    if not name or "/" in name or os.sep in name:
        return None
    return shipped_plans().get(name.removesuffix(PLAN_SUFFIX))


@dataclass(frozen=True)
class ShippedPlan:
    name: str
    path: Path
    summary: str  # the plan's first comment line


def _summary(path: Path) -> str:
    """The first sentence of the plan's opening comment."""
    words: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
        text = " ".join(words)
        end = text.find(". ")
        if end >= 0 or text.endswith("."):
            return text[: end + 1] if end >= 0 else text
    return " ".join(words)


def list_plans() -> list[ShippedPlan]:
    return [ShippedPlan(name, path, _summary(path)) for name, path in shipped_plans().items()]


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def _shipped_files_named(plan: Path) -> list[Path]:
    """The shipped files a plan names by a path relative to itself (its manifests)."""
    root = resource_dir().resolve()
    out: list[Path] = []
    for text in _strings(tomllib.loads(plan.read_text(encoding="utf-8"))):
        if "$" in text or text.startswith("/") or not text.endswith(PLAN_SUFFIX):
            continue
        target = (plan.parent / text).resolve()
        if target.is_file() and target.is_relative_to(root) and target not in out:
            out.append(target)
    return out


def copy_plan(name: str, dest: str | os.PathLike[str]) -> list[Path]:
    """Copy the shipped plan `name` into DEST/stages/, and the shipped files it names to the same places
    relative to it (DEST/tokenization/…); nothing is overwritten. Returns the files written."""
    src = shipped_plan(name)
    if src is None:
        raise PlanError(
            f"no shipped plan called {name!r}",
            where=str(plans_dir()),
            fix=f"one of: {', '.join(shipped_plans())} (`longctx plan list`)",
        )
    root, dest = resource_dir().resolve(), Path(dest)
    pairs = [(src, dest / src.relative_to(root))]
    pairs += [(f, dest / f.relative_to(root)) for f in _shipped_files_named(src)]
    clash = [d for _, d in pairs if d.exists() or d.is_symlink()]
    if clash:
        raise PlanError(
            f"{clash[0]} already exists; nothing was copied",
            where=str(clash[0]),
            fix="copy into another directory, or move the existing file away",
        )
    for s, d in pairs:
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(s, d)
    return [d for _, d in pairs]


__all__ = [
    "ShippedPlan",
    "copy_plan",
    "list_plans",
    "plans_dir",
    "resource_dir",
    "shipped_plan",
    "shipped_plans",
]
