"""`download(REPO_ID, into=DIR)`: fetch a checkpoint from the Hugging Face Hub, verify it, adopt it.

`huggingface_hub.snapshot_download` does the transfer into the Hub cache (`--cache-dir`, else
HF_HOME): only files matching `include` (allow-patterns, e.g. `tokenizer/*` or one Ermine `.tar`),
several in parallel, resumed where an interrupted run stopped (finished files are kept, partial ones
continue). With `HF_HUB_OFFLINE=1` or `offline=True` nothing goes to the network and an already
populated cache is used.

Then what arrived is classified: one `.tar` archive → extracted into DIR/iter_N; a checkpoint
directory (flat snapshot, iter dir, save dir) → hard-linked into DIR/iter_N from the cache's blobs (no
copy, so DIR and the cache should share a filesystem; `allow_copy=True` otherwise). Both go through
`adopt`, which verifies the source first and the result after. Other downloaded files (a tokenizer,
a README) are hard-linked into DIR under their repository paths.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from longctx.checkpoint.adopt import AdoptResult, adopt
from longctx.checkpoint.save_layout import DISTCP_RE, MARKERS, TRACKER
from longctx.errors import CheckpointError
from longctx.util.progress import progress_disabled


@dataclass
class DownloadResult:
    repo_id: str
    revision: str | None
    snapshot_dir: Path
    files: list[str]
    adopted: AdoptResult | None
    checkpoint_source: str | None
    extra_files: list[str] = field(default_factory=list)


def _snapshot(
    repo_id: str,
    revision: str | None,
    include: list[str] | None,
    cache_dir: str | os.PathLike[str] | None,
    offline: bool,
    token: str | None,
) -> Path:
    # huggingface_hub (and httpx) are loaded only for a download, not by `import longctx.checkpoint`
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    net_errors: tuple[type[BaseException], ...] = ()
    try:  # huggingface_hub ≥ 1.0 talks httpx; older releases raise requests' OSError subclasses
        import httpx2

        net_errors = (httpx2.HTTPError,)
    except ImportError:
        pass
    if progress_disabled():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    where = f"{repo_id}@{revision or 'main'}"
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=include or None,
            cache_dir=cache_dir,
            local_files_only=offline,
            token=token,
        )
    except (RepositoryNotFoundError, GatedRepoError) as err:
        raise CheckpointError(
            f"the Hub repository cannot be read ({type(err).__name__})",
            where=where,
            fix="check the repo id, and log in (`hf auth login` or HF_TOKEN) for gated or private repos",
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(
            "no such revision in the repository",
            where=where,
            fix="pass an existing branch, tag or commit to --revision",
        ) from None
    except LocalEntryNotFoundError as err:
        raise CheckpointError(
            "the Hub cannot be reached (offline) and the cache holds no complete snapshot of this revision "
            f"for these patterns ({err.__class__.__name__})",
            where=where,
            fix="run once with network access (HF_HUB_OFFLINE unset), or point --cache-dir/HF_HOME at the "
            "populated cache",
        ) from None
    except (HfHubHTTPError, EntryNotFoundError, OSError, *net_errors) as err:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(
            f"download interrupted: {text}",
            where=where,
            fix="run the same command again: finished files stay in the cache and partial ones resume",
        ) from None
    return Path(path)


def _selected_files(snapshot: Path, include: list[str] | None) -> list[str]:
    from huggingface_hub.utils import filter_repo_objects  # heavy: only for a download

    rels: list[str] = []
    for root, _dirs, files in os.walk(snapshot, followlinks=False):
        for name in files:
            rels.append(Path(root, name).relative_to(snapshot).as_posix())
    return sorted(filter_repo_objects(rels, allow_patterns=include or None))


def _checkpoint_source(snapshot: Path, files: list[str]) -> tuple[str | None, set[str]]:
    """(relative path of the archive or directory to adopt, the files it covers)."""
    archives = [f for f in files if f.endswith(".tar")]
    if len(archives) > 1:
        shown = ", ".join(archives[:5])
        raise CheckpointError(
            f"{len(archives)} archives were downloaded ({shown})",
            where=str(snapshot),
            fix="pass --include with one archive's name to adopt it",
        )
    if archives:
        return archives[0], {archives[0]}
    dirs: set[str] = set()
    for f in files:
        name, parent = posixpath.basename(f), posixpath.dirname(f)
        if name in MARKERS or DISTCP_RE.match(name):
            dirs.add(parent)
    trackers = {posixpath.dirname(f) for f in files if posixpath.basename(f) == TRACKER}
    for t in trackers:  # a save dir: its iteration dirs are below the tracker
        dirs = {d for d in dirs if not _is_below(d, t)} | {t}
    if len(dirs) > 1:
        shown = ", ".join(sorted(d or "." for d in dirs)[:5])
        raise CheckpointError(
            f"{len(dirs)} checkpoint directories were downloaded ({shown})",
            where=str(snapshot),
            fix="pass --include to select one",
        )
    if not dirs:
        return None, set()
    d = dirs.pop()
    covered = {f for f in files if not d or f.startswith(d + "/")}
    return d, covered


def _is_below(d: str, top: str) -> bool:
    return top == "" or d == top or d.startswith(top + "/")


def _link_extra(snapshot: Path, into: Path, rels: list[str], allow_copy: bool) -> list[str]:
    linked: list[str] = []
    for rel in rels:
        src, dst = snapshot / rel, into / rel
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(src)
        try:
            os.link(real, dst)
        except OSError:
            if not allow_copy:
                raise CheckpointError(
                    "cannot hard-link from the Hub cache (another filesystem?)",
                    where=str(dst),
                    fix="pass --cache-dir on the target's filesystem, or --allow-copy",
                ) from None
            shutil.copy2(real, dst)
        linked.append(rel)
    return linked


def download(
    repo_id: str,
    into: str | os.PathLike[str],
    *,
    revision: str | None = None,
    include: list[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    iteration: int | None = None,
    allow_copy: bool = False,
    token: str | None = None,
) -> DownloadResult:
    """Download (or take from the cache), then verify + adopt into INTO (see module docstring)."""
    into = Path(into)
    snapshot = _snapshot(repo_id, revision, include, cache_dir, offline, token)
    files = _selected_files(snapshot, include)
    if not files:
        raise CheckpointError(
            f"no file of the snapshot matches {include!r}",
            where=f"{repo_id}@{revision or 'main'}",
            fix="check the --include patterns against the repository's file list",
        )
    source, covered = _checkpoint_source(snapshot, files)
    adopted = None
    if source is not None:
        adopted = adopt(
            snapshot / source if source else snapshot, into, iteration=iteration, allow_copy=allow_copy
        )
    extra = [f for f in files if f not in covered]
    into.mkdir(parents=True, exist_ok=True)
    linked = _link_extra(snapshot, into, extra, allow_copy)
    return DownloadResult(
        repo_id=repo_id,
        revision=revision,
        snapshot_dir=snapshot,
        files=files,
        adopted=adopted,
        checkpoint_source=source,
        extra_files=linked,
    )


__all__ = ["DownloadResult", "download"]
