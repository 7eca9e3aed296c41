"""Megatron-LM's torch_dist save layout: tracker, iteration directories, release, flat snapshots.

    SAVE/latest_checkpointed_iteration.txt   "76800" or "release" (written after every rank saved)
    SAVE/iter_0076800/                       one torch_dist checkpoint
    SAVE/release/                            a checkpoint loaded as iteration 0

A torch_dist checkpoint directory holds `.metadata` (the DCP index), `__R_T.distcp` shards,
`common.pt` (megatron-core ≤ 0.18) and `metadata.json`, which rank 0 writes last: a directory without
it is an unfinished save. A *flat snapshot* is such a directory downloaded on its own, without tracker
or iter_ name.

This module reads names and small files only; no torch import.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from longctx.checkpoint.tree import DirTree, TarTree, Tree, join, open_tree
from longctx.errors import CheckpointError

TRACKER = "latest_checkpointed_iteration.txt"
METADATA_JSON = "metadata.json"
DCP_METADATA = ".metadata"
COMMON_PT = "common.pt"
RELEASE = "release"
ITER_RE = re.compile(r"^iter_(\d{7,})$")
DISTCP_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
MARKERS = (DCP_METADATA, METADATA_JSON, COMMON_PT)

Kind = Literal["save_dir", "iteration_dir", "release_dir", "flat_dir"]


class TrackerError(CheckpointError):
    """The tracker is unreadable, missing, or names an iteration that is absent or unfinished."""


def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def parse_iter_dir_name(name: str) -> int | None:
    m = ITER_RE.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Tracker:
    """The content of latest_checkpointed_iteration.txt: an iteration, or `release` (loaded as 0)."""

    iteration: int
    release: bool
    path: str

    @property
    def dir_name(self) -> str:
        return RELEASE if self.release else iter_dir_name(self.iteration)


def parse_tracker_text(text: str, where: str) -> Tracker:
    """Parse tracker text as Megatron-LM does: an integer > 0, or the word `release`."""
    value = text.strip()
    if value == RELEASE:
        return Tracker(0, True, where)
    try:
        iteration = int(value)
    except ValueError:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise TrackerError(
            f"the tracker holds {shown!r}, not an iteration number or 'release'",
            where=where,
            fix="write the iteration to load (e.g. `echo 76800 > latest_checkpointed_iteration.txt`)",
        ) from None
    if iteration <= 0:
        raise TrackerError(
            f"the tracker holds {iteration}; Megatron-LM accepts only iterations > 0 or 'release'",
            where=where,
            fix="write the iteration of a complete iter_NNNNNNN directory into the tracker",
        )
    return Tracker(iteration, False, where)


def read_tracker_in(tree: Tree, rel: str = "") -> Tracker | None:
    p = join(rel, TRACKER)
    if not tree.is_file(p):
        return None
    raw = tree.read_bytes(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return parse_tracker_text(text, tree.where(p))


def read_tracker(save_dir: str | os.PathLike[str]) -> Tracker | None:
    """The tracker of a save dir; None when there is none. Garbage raises CheckpointError."""
    return read_tracker_in(DirTree(save_dir))


@dataclass(frozen=True)
class DirStatus:
    """Whether a checkpoint directory holds a finished save (cheap: names and metadata.json only)."""

    complete: bool
    reason: str | None = None  # why not
    sharded_backend: str | None = None


def checkpoint_dir_status(tree: Tree, rel: str) -> DirStatus:
    mj = join(rel, METADATA_JSON)
    if not tree.is_file(mj):
        return DirStatus(False, "no metadata.json (rank 0 writes it last: the save did not finish)")
    try:
        meta = json.loads(tree.read_bytes(mj).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return DirStatus(False, "metadata.json is not valid JSON")
    if not isinstance(meta, dict) or "sharded_backend" not in meta:
        return DirStatus(False, "metadata.json has no sharded_backend")
    backend = str(meta["sharded_backend"])
    if not tree.is_file(join(rel, DCP_METADATA)):
        return DirStatus(False, "no .metadata (the DCP index)", backend)
    return DirStatus(True, None, backend)


def iteration_dirs_in(tree: Tree, rel: str = "") -> dict[int, str]:
    """{iteration: relative dir} for every iter_NNNNNNN directory (complete or not)."""
    out: dict[int, str] = {}
    for name in tree.listdir(rel):
        it = parse_iter_dir_name(name)
        if it is not None and tree.is_dir(join(rel, name)):
            out[it] = join(rel, name)
    return out


def complete_iterations_in(tree: Tree, rel: str = "") -> list[int]:
    return sorted(
        it for it, d in iteration_dirs_in(tree, rel).items() if checkpoint_dir_status(tree, d).complete
    )


def complete_iterations(save_dir: str | os.PathLike[str]) -> list[int]:
    """Iterations with a finished iter_NNNNNNN directory in `save_dir`, ascending ([] when none)."""
    p = Path(save_dir)
    if not p.is_dir():
        return []
    return complete_iterations_in(DirTree(p))


def partial_saves(save_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """{iteration: directory} of the iter_NNNNNNN directories in `save_dir` that hold no finished save."""
    p = Path(save_dir)
    if not p.is_dir():
        return {}
    tree = DirTree(p)
    return {
        it: p / d for it, d in iteration_dirs_in(tree).items() if not checkpoint_dir_status(tree, d).complete
    }


def looks_like_checkpoint_dir(tree: Tree, rel: str) -> bool:
    names = tree.listdir(rel)
    return any(n in MARKERS for n in names) or any(DISTCP_RE.match(n) for n in names)


def looks_like_save_dir(tree: Tree, rel: str) -> bool:
    return (
        tree.is_file(join(rel, TRACKER))
        or bool(iteration_dirs_in(tree, rel))
        or tree.is_dir(join(rel, RELEASE))
    )


@dataclass
class ResolvedCheckpoint:
    """Where the checkpoint to read is, and how it was found.

    `checkpoint_dir` is relative to `tree` (a directory or an archive); `path` is the real directory
    for directory inputs (None inside archives).
    """

    source: Path
    kind: Kind
    tree: Tree = field(repr=False)
    checkpoint_rel: str
    save_rel: str | None = None
    tracker: Tracker | None = None
    iteration: int | None = None  # from the tracker or the directory name; None for flat dirs
    complete_iterations: list[int] = field(default_factory=list)

    @property
    def archive(self) -> Path | None:
        return self.tree.source if isinstance(self.tree, TarTree) else None

    @property
    def path(self) -> Path | None:
        if isinstance(self.tree, DirTree):
            return self.tree.path(self.checkpoint_rel)
        return None

    @property
    def save_dir(self) -> Path | None:
        if isinstance(self.tree, DirTree) and self.save_rel is not None:
            return self.tree.path(self.save_rel)
        return None

    @property
    def where(self) -> str:
        return self.tree.where(self.checkpoint_rel)

    def status(self) -> DirStatus:
        return checkpoint_dir_status(self.tree, self.checkpoint_rel)


def _newest_complete_hint(tree: Tree, save_rel: str) -> tuple[list[int], str]:
    """(complete iterations, a fix naming the newest one)."""
    done = complete_iterations_in(tree, save_rel)
    if done:
        newest = done[-1]
        return done, (
            f"the newest complete iteration is {newest}: write {newest} into {TRACKER}, "
            f"or pass {tree.where(join(save_rel, iter_dir_name(newest)))} directly"
        )
    return done, "no complete iteration exists in this save dir; start from another checkpoint"


def _resolve_save_dir(tree: Tree, rel: str) -> ResolvedCheckpoint:
    tracker = read_tracker_in(tree, rel)
    if tracker is None:
        _, hint = _newest_complete_hint(tree, rel)
        raise TrackerError(
            f"the save dir has no {TRACKER}; Megatron-LM would ignore its checkpoints and start from "
            "random weights",
            where=tree.where(rel),
            fix=hint,
        )
    target = join(rel, tracker.dir_name)
    if not tree.is_dir(target):
        _, hint = _newest_complete_hint(tree, rel)
        raise TrackerError(
            f"the tracker names {tracker.dir_name}, which does not exist",
            where=tree.where(join(rel, TRACKER)),
            fix=hint,
        )
    status = checkpoint_dir_status(tree, target)
    if not status.complete:
        _, hint = _newest_complete_hint(tree, rel)
        raise TrackerError(
            f"the tracker names {tracker.dir_name}, which is incomplete: {status.reason}",
            where=tree.where(target),
            fix=hint,
        )
    return ResolvedCheckpoint(
        source=tree.source,
        kind="save_dir",
        tree=tree,
        checkpoint_rel=target,
        save_rel=rel,
        tracker=tracker,
        iteration=tracker.iteration,
        complete_iterations=complete_iterations_in(tree, rel),
    )


def _resolve_checkpoint_dir(tree: Tree, rel: str) -> ResolvedCheckpoint:
    name = Path(rel).name if rel else tree.source.name
    it = parse_iter_dir_name(name)
    if it is not None:
        kind: Kind = "iteration_dir"
    elif name == RELEASE:
        kind, it = "release_dir", 0
    else:
        kind = "flat_dir"
    return ResolvedCheckpoint(source=tree.source, kind=kind, tree=tree, checkpoint_rel=rel, iteration=it)


def resolve_in_tree(tree: Tree, rel: str = "", *, max_depth: int = 3) -> ResolvedCheckpoint:
    """Find the checkpoint at `rel`: a save dir (via its tracker), a checkpoint dir, or — inside an
    archive or a download — the one directory below that holds either."""
    if looks_like_checkpoint_dir(tree, rel):
        return _resolve_checkpoint_dir(tree, rel)
    if looks_like_save_dir(tree, rel):
        return _resolve_save_dir(tree, rel)
    if max_depth > 0:
        subdirs = [join(rel, n) for n in tree.listdir(rel) if tree.is_dir(join(rel, n))]
        candidates = [d for d in subdirs if _contains_checkpoint(tree, d, max_depth - 1)]
        if len(candidates) == 1:
            return resolve_in_tree(tree, candidates[0], max_depth=max_depth - 1)
        if len(candidates) > 1:
            shown = ", ".join(tree.where(c) for c in candidates[:5])
            raise CheckpointError(
                f"{len(candidates)} checkpoints found below this path ({shown})",
                where=tree.where(rel),
                fix="pass the one you mean",
            )
    raise CheckpointError(
        "no torch_dist checkpoint here (no tracker, iter_NNNNNNN directory, .metadata or metadata.json)",
        where=tree.where(rel),
        fix="pass a save dir, an iter_NNNNNNN/release dir, a flat snapshot dir or a .tar archive",
    )


def _contains_checkpoint(tree: Tree, rel: str, depth: int) -> bool:
    if looks_like_checkpoint_dir(tree, rel) or looks_like_save_dir(tree, rel):
        return True
    if depth <= 0:
        return False
    return any(
        _contains_checkpoint(tree, join(rel, n), depth - 1)
        for n in tree.listdir(rel)
        if tree.is_dir(join(rel, n))
    )


def resolve_checkpoint(path: str | os.PathLike[str]) -> ResolvedCheckpoint:
    """Resolve PATH (save dir with tracker → its iteration dir; iter_N or release dir; flat snapshot
    dir; `.tar`/`.tar.tar` archive) to one checkpoint directory.

    Raises CheckpointError when the tracker is garbage or names a missing or unfinished iteration
    (the message names the newest complete one), or when nothing checkpoint-like is found.
    """
    return resolve_in_tree(open_tree(path))


__all__ = [
    "COMMON_PT",
    "DCP_METADATA",
    "METADATA_JSON",
    "RELEASE",
    "TRACKER",
    "DirStatus",
    "ResolvedCheckpoint",
    "Tracker",
    "TrackerError",
    "checkpoint_dir_status",
    "complete_iterations",
    "iter_dir_name",
    "parse_iter_dir_name",
    "parse_tracker_text",
    "read_tracker",
    "resolve_checkpoint",
    "resolve_in_tree",
]
