"""Hugging Face Hub transfers shared by checkpoint and dataset downloads.

`snapshot(...)` wraps `huggingface_hub.snapshot_download`: allow-patterns, resumable transfers (a
second run keeps finished files and continues partial ones), offline use of what is already there,
and Hub errors turned into the caller's domain error (what / where / fix). `resolve_commit` pins a
branch or tag to a commit so several transfers of one fetch see the same revision.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import disable_progress_bars

from longctx.errors import LongctxError
from longctx.util.progress import progress_disabled


def _network_errors() -> tuple[type[BaseException], ...]:
    try:  # huggingface_hub ≥ 1.0 talks httpx; older releases raise requests' OSError subclasses
        import httpx2

        return (httpx2.HTTPError,)
    except ImportError:
        return ()


def hub_offline() -> bool:
    """True when huggingface_hub is told to stay off the network (HF_HUB_OFFLINE)."""
    return bool(constants.HF_HUB_OFFLINE)


def resolve_commit(
    repo_id: str,
    *,
    repo_type: str = "model",
    revision: str | None = None,
    token: str | None = None,
    error: type[LongctxError] = LongctxError,
) -> str:
    """The commit a branch/tag points at now (a 40-hex revision is returned as it is)."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    where = f"{repo_id}@{revision or 'main'}"
    with _mapped_errors(where, error):
        info = HfApi(token=token).repo_info(repo_id, repo_type=repo_type, revision=revision or "main")
    if not info.sha:
        raise error("the Hub returned no commit for this revision", where=where, fix="pass --revision COMMIT")
    return info.sha


class _mapped_errors:
    def __init__(self, where: str, error: type[LongctxError]) -> None:
        self.where, self.error = where, error

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, err: BaseException | None, tb: object) -> bool:
        if err is None:
            return False
        where, error = self.where, self.error
        if isinstance(err, (RepositoryNotFoundError, GatedRepoError)):
            raise error(
                f"the Hub repository cannot be read ({type(err).__name__})",
                where=where,
                fix="check the repo id, and log in (`hf auth login` or HF_TOKEN) for gated or private repos",
            ) from None
        if isinstance(err, RevisionNotFoundError):
            raise error(
                "no such revision in the repository",
                where=where,
                fix="pass an existing branch, tag or commit to --revision",
            ) from None
        if isinstance(err, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
            raise error(
                f"the Hub cannot be reached (offline) and nothing local holds these files ({type(err).__name__})",
                where=where,
                fix="run once with network access (HF_HUB_OFFLINE unset), or point at a directory that holds "
                "the download",
            ) from None
        if isinstance(err, (HfHubHTTPError, EntryNotFoundError, OSError, *_network_errors())):
            text = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise error(
                f"download interrupted: {text}",
                where=where,
                fix="run the same command again: finished files are kept and partial ones resume",
            ) from None
        return False


def snapshot(
    repo_id: str,
    *,
    repo_type: str = "model",
    revision: str | None = None,
    allow_patterns: list[str] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    token: str | None = None,
    max_workers: int = 8,
    error: type[LongctxError] = LongctxError,
) -> Path:
    """Download the files matching `allow_patterns` (None: all) into `local_dir` (a plain tree, with
    huggingface_hub's resume metadata under `.cache/huggingface/`) or into the Hub cache; returns the
    directory holding them."""
    if progress_disabled():
        disable_progress_bars()
    with _mapped_errors(f"{repo_id}@{revision or 'main'}", error):
        path = snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision,
            allow_patterns=allow_patterns or None,
            local_dir=local_dir,
            cache_dir=cache_dir,
            local_files_only=offline,
            token=token,
            max_workers=max_workers,
        )
    return Path(path)


def local_dir_metadata(local_dir: str | os.PathLike[str], rel: str) -> Path:
    """huggingface_hub's record of a file downloaded into `local_dir` (commit, etag, timestamp)."""
    return Path(local_dir) / ".cache" / "huggingface" / "download" / f"{rel}.metadata"


def local_dir_commit(local_dir: str | os.PathLike[str]) -> str | None:
    """The commit of files downloaded into `local_dir`, read from huggingface_hub's metadata."""
    meta = Path(local_dir) / ".cache" / "huggingface" / "download"
    if not meta.is_dir():
        return None
    for p in sorted(meta.rglob("*.metadata")):
        try:
            first = p.read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError, UnicodeDecodeError):
            continue
        if len(first) == 40:
            return first
    return None


__all__ = ["hub_offline", "local_dir_commit", "local_dir_metadata", "resolve_commit", "snapshot"]
