"""`data fetch`: download a tokenized artifact (or adopt one already here), verify it, point its mix here.

Online, in two transfers into DIR (huggingface_hub's `local_dir` mode: a plain tree, resumable — a
second run keeps finished files and continues partial ones):

1. the manifests (mix/, manifests/, the run's chunk manifests), at one commit resolved up front;
2. the chunks of the chosen languages and tiers (all files, or `.idx` only, or none).

Then every selected file is checked against the manifests (size first, then sha256 in parallel with
a progress bar); sha256 results are remembered per (size, mtime) in DIR/.longctx/verified.json so a
resumed fetch hashes only new files. Files that fail are deleted and fetched once more; what still
fails is listed. Finally mix/data_path.args, data_mix.json and data_mix.txt are rewritten to this
machine's paths (originals kept under DIR/.longctx/original/).

Offline (`offline=True` or HF_HUB_OFFLINE=1) nothing goes to the network: DIR must already hold the
download, which is verified and adopted the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from longctx.data.artifact.chunk_layout import (
    DEFAULT_REPO_ID,
    MIX_FILES,
    STATE_DIR,
    SUFFIX,
    Artifact,
    Chunk,
    Expected,
    RewriteResult,
    open_artifact,
    parse_prefix_name,
    refresh_originals,
    rewrite_mix_paths,
)
from longctx.errors import DatasetError
from longctx.report import Findings
from longctx.util.fs import atomic_write_json
from longctx.util.hashing import sha256_file
from longctx.util.hub import hub_offline, local_dir_commit, local_dir_metadata, resolve_commit, snapshot
from longctx.util.progress import progress_bar

Content = Literal["all", "idx", "manifests"]
VERIFIED_CACHE = "verified.json"
FETCH_RECORD = "fetch.json"


@dataclasses.dataclass
class FileCheck:
    rel: str
    status: Literal["ok", "missing", "size", "sha256", "unverified"]
    expected_bytes: int | None = None
    found_bytes: int | None = None
    expected_sha256: str | None = None
    found_sha256: str | None = None
    source: str = ""


@dataclasses.dataclass
class VerifyReport:
    files: int
    bytes_total: int
    bytes_hashed: int
    cached: int  # files whose sha256 came from the verified cache
    seconds: float
    bad: list[FileCheck]  # missing, wrong size, wrong sha256
    unverified: list[str]  # present, but no manifest gives a checksum
    findings: Findings

    @property
    def ok(self) -> bool:
        return not self.bad


@dataclasses.dataclass
class FetchResult:
    repo_id: str | None
    revision: str | None
    commit: str | None
    root: Path
    run: str | None
    offline: bool
    content: Content
    languages: list[str]
    tiers: list[str]
    chunks: int
    bin_bytes: int
    verify: VerifyReport | None
    refetched: list[str]
    rewrite: RewriteResult | None
    data_path_args: Path | None
    findings: Findings

    @property
    def ok(self) -> bool:
        return self.findings.ok


# -- verification ----------------------------------------------------------------------------------------
def _cache_path(root: Path) -> Path:
    return root / STATE_DIR / VERIFIED_CACHE


def _load_cache(root: Path) -> dict[str, list[Any]]:
    try:
        data = json.loads(_cache_path(root).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def verify_files(
    root: str | os.PathLike[str],
    expected: dict[str, Expected],
    *,
    workers: int | None = None,
    progress: bool = True,
    use_cache: bool = True,
    rewritten: Iterable[str] = (),
) -> VerifyReport:
    """Check files under `root` against their records: missing, size, then sha256 (parallel).

    `rewritten` names files longctx rewrote (the mix files): their downloaded originals, kept under
    `.longctx/original/`, are what is checked."""
    root = Path(root)
    started = time.perf_counter()
    cache = _load_cache(root) if use_cache else {}
    new_cache = dict(_load_cache(root))
    todo = _triage(root, expected, set(rewritten), cache)
    hashed = sum(x[3] for x in todo.to_hash)
    _hash_files(todo, new_cache, hashed, workers, progress)
    if todo.to_hash:  # a read-only artifact loses only the shortcut, not the verification
        with contextlib.suppress(OSError):
            atomic_write_json(_cache_path(root), dict(sorted(new_cache.items())))
    bad = todo.bad
    bad.sort(key=lambda b: b.rel)
    return VerifyReport(
        files=len(expected),
        bytes_total=todo.total,
        bytes_hashed=hashed,
        cached=todo.cached,
        seconds=time.perf_counter() - started,
        bad=bad,
        unverified=todo.unverified,
        findings=_verify_findings(root, bad, todo.unverified),
    )


@dataclasses.dataclass
class _Triage:
    """What stat() and the verified cache decide before any hashing."""

    bad: list[FileCheck] = dataclasses.field(default_factory=list)
    unverified: list[str] = dataclasses.field(default_factory=list)
    to_hash: list[tuple[str, Path, Expected, int]] = dataclasses.field(default_factory=list)
    total: int = 0  # bytes of the files present
    cached: int = 0


def _triage(
    root: Path, expected: dict[str, Expected], rewritten: set[str], cache: dict[str, list[Any]]
) -> _Triage:
    t = _Triage()
    for rel in sorted(expected):
        exp = expected[rel]
        path = root / STATE_DIR / "original" / rel if rel in rewritten else root / rel
        if rel in rewritten and not path.is_file():
            path = root / rel
        try:
            st = path.stat()
        except FileNotFoundError:
            t.bad.append(FileCheck(rel, "missing", exp.bytes, None, exp.sha256, None, exp.source))
            continue
        t.total += st.st_size
        if exp.bytes is not None and st.st_size != exp.bytes:
            t.bad.append(FileCheck(rel, "size", exp.bytes, st.st_size, exp.sha256, None, exp.source))
            continue
        if exp.sha256 is None:
            if exp.bytes is None and exp.source != "present":
                t.unverified.append(rel)
            continue
        hit = cache.get(rel)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            t.cached += 1
            if hit[2] != exp.sha256:
                t.bad.append(FileCheck(rel, "sha256", exp.bytes, st.st_size, exp.sha256, hit[2], exp.source))
            continue
        t.to_hash.append((rel, path, exp, st.st_size))
    return t


def _hash_files(
    todo: _Triage, new_cache: dict[str, list[Any]], hashed: int, workers: int | None, progress: bool
) -> None:
    """sha256 of `todo.to_hash` in parallel: results go to `new_cache`, mismatches to `todo.bad`."""
    to_hash = todo.to_hash
    lock = threading.Lock()
    n_workers = max(1, min(workers or min(os.cpu_count() or 1, 8), len(to_hash) or 1))
    with (
        progress_bar(f"sha256 {len(to_hash)} files", hashed, unit="bytes") if progress else _null() as advance
    ):

        def one(item: tuple[str, Path, Expected, int]) -> None:
            rel, path, exp, size = item
            mtime = path.stat().st_mtime_ns
            digest = sha256_file(path, on_bytes=advance)
            with lock:
                new_cache[rel] = [size, mtime, digest]
                if digest != exp.sha256:
                    todo.bad.append(FileCheck(rel, "sha256", exp.bytes, size, exp.sha256, digest, exp.source))

        if n_workers == 1:
            for item in to_hash:
                one(item)
        else:
            with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="longctx-sha") as pool:
                for fut in [pool.submit(one, item) for item in to_hash]:
                    fut.result()


def _verify_findings(root: Path, bad: list[FileCheck], unverified: list[str]) -> Findings:
    f = Findings()
    for b in bad:
        if b.status == "missing":
            f.error("missing", f"missing file {b.rel} (listed in {b.source})", where=str(root / b.rel))
        elif b.status == "size":
            f.error(
                "size",
                f"{b.rel}: {b.found_bytes:,} bytes, {b.source} says {b.expected_bytes:,}",
                where=str(root / b.rel),
                expected=b.expected_bytes,
                found=b.found_bytes,
            )
        else:
            f.error(
                "sha256",
                f"{b.rel}: sha256 differs from {b.source} (corrupt or changed)",
                where=str(root / b.rel),
                expected=b.expected_sha256,
                found=b.found_sha256,
            )
    if unverified:
        f.warning(
            "unverified",
            f"{len(unverified)} file(s) have no checksum in any manifest (first: {unverified[0]})",
            where=str(root),
        )
    return f


class _null:
    def __enter__(self) -> Callable[..., None]:
        return lambda n=1: None

    def __exit__(self, *exc: object) -> None:
        return None


def rewritten_files(root: Path) -> list[str]:
    orig = root / STATE_DIR / "original"
    if not orig.is_dir():
        return []
    return sorted(Path(os.path.relpath(p, orig)).as_posix() for p in orig.rglob("*") if p.is_file())


def expected_for(art: Artifact, chunks: Sequence[Chunk], content: Content) -> dict[str, Expected]:
    files = dict(art.manifest_expected())
    if content != "manifests":
        files.update(art.chunk_files(chunks, bins=content == "all", idx=True))
    return files


def verify_artifact(
    art: Artifact,
    chunks: Sequence[Chunk] | None = None,
    *,
    content: Content = "all",
    workers: int | None = None,
    progress: bool = True,
    use_cache: bool = True,
) -> VerifyReport:
    """Verify the manifests and the given chunks' files (default: all chunks)."""
    chunks = art.chunks if chunks is None else chunks
    return verify_files(
        art.root,
        expected_for(art, chunks, content),
        workers=workers,
        progress=progress,
        use_cache=use_cache,
        rewritten=rewritten_files(art.root),
    )


# -- download ---------------------------------------------------------------------------------------------
def manifest_patterns(run: str | None) -> list[str]:
    pats = ["mix/*", "manifests/*", "README.md"]
    pats += (
        [f"runs/{run}/mix/*", f"runs/{run}/manifests/*"] if run else ["runs/*/mix/*", "runs/*/manifests/*"]
    )
    return pats


def data_patterns(art: Artifact, chunks: Sequence[Chunk], content: Content) -> list[str]:
    """Allow-patterns for the chunks' files: one glob per (language, tier) when every chunk of the
    group is named by the producer's convention, else exact paths (huggingface_hub matches every
    pattern against every file, so thousands of exact paths are slow)."""
    if content == "manifests" or not chunks:
        return []
    exts = ["idx"] if content == "idx" else ["bin", "idx"]
    bin_rel = art.rel(art.bin_dir)
    if len(chunks) == len(art.chunks):
        return [f"{bin_rel}/*{SUFFIX}.{e}" for e in exts]
    groups: dict[tuple[str | None, str | None], list[Chunk]] = {}
    for c in chunks:
        groups.setdefault((c.language, c.tier), []).append(c)
    everyone: dict[tuple[str | None, str | None], int] = {}
    for c in art.chunks:
        everyone[(c.language, c.tier)] = everyone.get((c.language, c.tier), 0) + 1
    pats: list[str] = []
    run = f"{art.run}_" if art.run else ""
    for (lang, tier), members in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        conventional = (
            lang is not None
            and tier is not None
            and len(members) == everyone[(lang, tier)]
            and all(
                c.name.startswith(f"{run}{lang}_") and parse_prefix_name(c.name, run=art.run) == (lang, tier)
                for c in members
            )
        )
        if conventional:
            pats += [f"{bin_rel}/{run}{lang}_*_{tier}{SUFFIX}.{e}" for e in exts]
            if any(c.name == f"{run}{lang}_{tier}" for c in members):
                pats += [f"{bin_rel}/{run}{lang}_{tier}{SUFFIX}.{e}" for e in exts]
        else:
            pats += [f"{art.rel(c.prefix)}.{e}" for c in members for e in exts]
    return pats


def _drop(root: Path, rels: Iterable[str]) -> None:
    """Delete files that failed verification, and huggingface_hub's record of them, so they are fetched again."""
    for rel in rels:
        for p in (root / rel, local_dir_metadata(root, rel)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


@dataclasses.dataclass
class _Download:
    """One Hub dataset at one commit, downloaded into `root` (huggingface_hub's local_dir mode)."""

    repo_id: str
    commit: str | None
    root: Path
    token: str | None
    max_workers: int

    def get(self, patterns: list[str]) -> None:
        snapshot(
            self.repo_id,
            repo_type="dataset",
            revision=self.commit,
            allow_patterns=patterns,
            local_dir=self.root,
            offline=False,
            token=self.token,
            max_workers=self.max_workers,
            error=DatasetError,
        )


def fetch_artifact(
    repo_id: str | None,
    into: str | os.PathLike[str],
    *,
    run: str | None = None,
    languages: Sequence[str] | None = None,
    tiers: Sequence[str] | None = None,
    revision: str | None = None,
    content: Content = "all",
    offline: bool | None = None,
    token: str | None = None,
    workers: int | None = None,
    max_downloads: int = 8,
    verify: bool = True,
    recheck: bool = False,
    progress: bool = True,
) -> FetchResult:
    """Download (or, offline, adopt) an artifact into INTO; see the module docstring."""
    root = Path(into).absolute()
    offline = hub_offline() if offline is None else offline
    download = _fetch_manifests(repo_id, root, run, revision, offline, token, max_downloads)
    art = open_artifact(root, run=run)
    chunks = art.select(languages, tiers)
    if download is not None and content != "manifests":
        download.get(data_patterns(art, chunks, content))
        art = open_artifact(root, run=run)
        chunks = art.select(languages, tiers)
    commit = download.commit if download is not None else None
    if commit is None:
        commit = local_dir_commit(root)

    findings = Findings(art.findings)
    refresh_originals(art)  # a mix file downloaded again replaces its saved original
    report = None
    refetched: list[str] = []
    if verify:
        select = _Selection(run, languages, tiers, content)
        art, chunks, report, refetched = _verify_fetched(
            art, chunks, select, download, workers, progress, recheck
        )
        findings.extend(report.findings)
        if report.bad:
            names = ", ".join(b.rel for b in report.bad[:5]) + (" …" if len(report.bad) > 5 else "")
            findings.error(
                "verify",
                f"{len(report.bad)} file(s) failed verification: {names}",
                where=str(root),
                fix=_refetch_hint(repo_id, root, art, select),
            )
    rewrite = _rewrite_mix(art, report, findings)
    result = FetchResult(
        repo_id=repo_id,
        revision=revision,
        commit=commit,
        root=root,
        run=art.run,
        offline=offline,
        content=content,
        languages=sorted({c.language for c in chunks if c.language}),
        tiers=sorted({c.tier for c in chunks if c.tier}),
        chunks=len(chunks),
        bin_bytes=sum(c.bin_bytes or 0 for c in chunks),
        verify=report,
        refetched=refetched,
        rewrite=rewrite,
        data_path_args=(art.mix_dir / "data_path.args")
        if art.mix_dir and (art.mix_dir / "data_path.args").is_file()
        else None,
        findings=findings,
    )
    _record(root, result, languages, tiers)
    return result


@dataclasses.dataclass(frozen=True)
class _Selection:
    """What of the artifact a fetch takes."""

    run: str | None
    languages: Sequence[str] | None
    tiers: Sequence[str] | None
    content: Content


def _fetch_manifests(
    repo_id: str | None,
    root: Path,
    run: str | None,
    revision: str | None,
    offline: bool,
    token: str | None,
    max_downloads: int,
) -> _Download | None:
    """Online: resolve the commit and download the manifests at it. Offline: None, once INTO holds a download."""
    if repo_id is None and not offline:
        raise DatasetError(
            "no repository given",
            fix=f"pass the Hub dataset id (e.g. {DEFAULT_REPO_ID}) or --offline to adopt INTO",
        )
    if not offline:
        assert repo_id is not None
        commit = resolve_commit(
            repo_id, repo_type="dataset", revision=revision, token=token, error=DatasetError
        )
        root.mkdir(parents=True, exist_ok=True)
        download = _Download(repo_id, commit, root, token, max_downloads)
        download.get(manifest_patterns(run))
        return download
    if not root.is_dir():
        raise DatasetError(
            f"offline, and nothing was downloaded to {root}",
            where=str(root),
            fix=f"run `longctx data fetch {repo_id or DEFAULT_REPO_ID} --into {root}` with network access "
            "(HF_HUB_OFFLINE unset), or give --into the directory that holds the download",
        )
    return None


def _verify_fetched(
    art: Artifact,
    chunks: list[Chunk],
    select: _Selection,
    download: _Download | None,
    workers: int | None,
    progress: bool,
    recheck: bool,
) -> tuple[Artifact, list[Chunk], VerifyReport, list[str]]:
    """Verify the selected files; online, delete and download once more what fails, and verify again.
    Returns the artifact and chunks (read again after a re-download), the report and the re-fetched files."""
    root = art.root
    expected = expected_for(art, chunks, select.content)
    rewritten = rewritten_files(root)
    report = verify_files(
        root, expected, workers=workers, progress=progress, use_cache=not recheck, rewritten=rewritten
    )
    broken = [b.rel for b in report.bad]
    if not broken or download is None:
        return art, chunks, report, []
    _drop(root, broken)
    for rel in set(broken) & set(rewritten):  # the download is taken afresh, then rewritten again
        (root / STATE_DIR / "original" / rel).unlink(missing_ok=True)
    download.get(broken)
    art = open_artifact(root, run=select.run)
    chunks = art.select(select.languages, select.tiers)
    report = verify_files(
        root,
        expected_for(art, chunks, select.content),
        workers=workers,
        progress=progress,
        use_cache=True,
        rewritten=rewritten_files(root),
    )
    return art, chunks, report, broken


def _refetch_hint(repo_id: str | None, root: Path, art: Artifact, select: _Selection) -> str:
    return (
        f"run `longctx data fetch {repo_id or DEFAULT_REPO_ID} --into {root}"
        + (f" --run {art.run}" if art.run else "")
        + (f" --languages {','.join(select.languages)}" if select.languages else "")
        + (f" --tiers {','.join(select.tiers)}" if select.tiers else "")
        + {"all": "", "idx": " --idx-only", "manifests": " --manifests-only"}[select.content]
        + "` with network access: it deletes and re-downloads the failed files"
    )


def _rewrite_mix(art: Artifact, report: VerifyReport | None, findings: Findings) -> RewriteResult | None:
    """Point the mix at this machine's prefixes, unless a mix file failed verification."""
    if art.mix_dir is None or (report is not None and any(b.rel in _mix_rels(art) for b in report.bad)):
        return None
    rewrite = rewrite_mix_paths(art)
    if rewrite.prefixes and rewrite.local < rewrite.prefixes:
        findings.info(
            "mix-local",
            f"mix/data_path.args names {rewrite.prefixes} prefixes, {rewrite.local} of them are here "
            "(the others were not selected); stage plans build their own blends from the tiers",
            where=str(art.mix_dir / "data_path.args"),
        )
    return rewrite


def _mix_rels(art: Artifact) -> set[str]:
    return {art.rel(art.mix_dir / f) for f in MIX_FILES} if art.mix_dir else set()


def _record(root: Path, r: FetchResult, languages: Sequence[str] | None, tiers: Sequence[str] | None) -> None:
    record = {
        "repo_id": r.repo_id,
        "revision": r.revision,
        "commit": r.commit,
        "run": r.run,
        "content": r.content,
        "languages": list(languages) if languages else None,
        "tiers": list(tiers) if tiers else None,
        "chunks": r.chunks,
        "verified": None if r.verify is None else r.verify.ok,
    }
    with contextlib.suppress(OSError):
        atomic_write_json(root / STATE_DIR / FETCH_RECORD, record)


__all__ = [
    "FetchResult",
    "FileCheck",
    "VerifyReport",
    "data_patterns",
    "fetch_artifact",
    "manifest_patterns",
    "verify_artifact",
    "verify_files",
]
