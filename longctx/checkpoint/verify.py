"""`verify_checkpoint(path, deep=False)`: is a torch_dist checkpoint whole?

Shallow (metadata and file sizes only, seconds for 119 GiB):
- the tracker (save dirs) names an iteration that exists and finished; else the newest complete one is named;
- `metadata.json` parses and says torch_dist (rank 0 writes it last: without it the save did not finish);
- `.metadata` unpickles (allow-list) and every shard file it references exists and is at least as long as
  the largest offset + length stored in it;
- the common state (args, iteration) unpickles through the allow-list;
- archives: no member that extraction would refuse (absolute, `..`, links leaving, devices).

Deep (`deep=True`) also reads every byte of every file of the checkpoint directory, in parallel, and
computes sha256. Where digests go is explicit; the checkpoint is never written to:
- `write_manifest=FILE` writes them as a `sha256sum`-compatible manifest (`<hex>  <relative path>`),
  so `cd CKPT && sha256sum -c FILE` checks it without longctx;
- `manifest=FILE` compares against such a manifest; without it, a `SHA256SUMS` file inside the
  checkpoint directory (shipped with a download) is used when present.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint.family import FamilyReport, detect_family, family_findings
from longctx.checkpoint.metadata import DcpIndex, args_dict, read_backend, read_common_state, read_dcp_index
from longctx.checkpoint.save_layout import (
    DISTCP_RE,
    ResolvedCheckpoint,
    TrackerError,
    checkpoint_dir_status,
    complete_iterations_in,
    resolve_in_tree,
)
from longctx.checkpoint.shapes import check_shapes
from longctx.checkpoint.tree import TarTree, Tree, join, open_tree
from longctx.errors import CheckpointError
from longctx.report import Findings, to_jsonable
from longctx.util.confine import refuse_write_into
from longctx.util.fs import atomic_write_text
from longctx.util.progress import progress_bar

MANIFEST_NAME = "SHA256SUMS"
_MAX_LISTED = 20  # per-file findings beyond this are summarised


@dataclass
class DeepResult:
    files: int
    bytes: int
    digests: dict[str, str]  # relative path → sha256
    manifest_checked: str | None = None
    manifest_written: str | None = None
    seconds: float = 0.0


@dataclass
class VerifyReport:
    path: str
    location: str | None
    kind: str | None
    iteration: int | None
    complete_iterations: list[int]
    shard_files: int
    shard_bytes: int
    findings: Findings
    deep: DeepResult | None = None
    family: FamilyReport | None = None
    resolved: ResolvedCheckpoint | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.findings.ok

    def to_json(self) -> dict[str, Any]:
        d = {k: to_jsonable(getattr(self, k)) for k in self.__dataclass_fields__ if k != "resolved"}
        if self.deep is not None:
            d["deep"]["digests"] = dict(sorted(self.deep.digests.items()))
        d["ok"] = self.ok
        return d


def _error_from(findings: Findings, code: str, err: CheckpointError) -> None:
    findings.error(code, err.what, where=err.where, fix=err.fix)


def check_shards(tree: Tree, rel: str, index: DcpIndex, findings: Findings) -> tuple[int, int]:
    """Every shard file `.metadata` references exists and is long enough; returns (files, bytes)."""
    missing: list[str] = []
    truncated: list[tuple[str, int, int]] = []
    total = 0
    on_disk = tree.file_sizes(rel)
    for name, ext in sorted(index.files.items()):
        size = (
            on_disk.get(name)
            if "/" not in name
            else (tree.size(join(rel, name)) if tree.is_file(join(rel, name)) else None)
        )
        if size is None:
            missing.append(name)
            continue
        total += size
        if size < ext.min_size:
            truncated.append((name, size, ext.min_size))
    for name in missing[:_MAX_LISTED]:
        findings.error(
            "missing-shard",
            f"shard {name} is missing ({index.files[name].items} stored items reference it)",
            where=tree.where(join(rel, name)),
            fix="re-download or re-copy the missing file",
        )
    for name, size, need in truncated[:_MAX_LISTED]:
        findings.error(
            "truncated-shard",
            f"shard {name} is truncated: {size} bytes, .metadata needs at least {need}",
            where=tree.where(join(rel, name)),
            fix="re-download or re-copy the file (an interrupted copy or download)",
            expected=need,
            found=size,
        )
    for label, items in (("missing", missing), ("truncated", truncated)):
        if len(items) > _MAX_LISTED:
            findings.error(f"{label}-shard", f"... and {len(items) - _MAX_LISTED} more {label} shards")
    referenced = set(index.files)
    extra = sorted(n for n in on_disk if DISTCP_RE.match(n) and n not in referenced)
    if extra:
        findings.warning(
            "unreferenced-shard",
            f"{len(extra)} .distcp file(s) not referenced by .metadata (e.g. {extra[0]}); leftovers of another save?",
            where=tree.where(rel),
        )
    return len(index.files) - len(missing), total


def verify_resolved(
    resolved: ResolvedCheckpoint, findings: Findings, *, stub_megatron: bool | None = None
) -> tuple[int, int, DcpIndex | None, FamilyReport | None]:
    """Shard files and bytes, the DCP index and the model family (None where unreadable); problems go
    into `findings`."""
    tree, rel = resolved.tree, resolved.checkpoint_rel
    if resolved.tracker is not None and resolved.save_rel is not None:
        done = complete_iterations_in(tree, resolved.save_rel)
        newer = [i for i in done if i > resolved.tracker.iteration]
        if newer and not resolved.tracker.release:
            findings.info(
                "tracker-lags",
                f"iteration {newer[-1]} is complete but the tracker names {resolved.tracker.iteration} "
                "(an async save finished after the job ended?)",
            )
    status = checkpoint_dir_status(tree, rel)
    if not status.complete:
        findings.error(
            "incomplete",
            f"incomplete checkpoint: {status.reason}",
            where=tree.where(rel),
            fix="use another iteration, or re-copy/re-download the directory",
        )
    backend = None
    try:
        backend = read_backend(tree, rel)
        if backend is not None and backend.sharded_backend not in ("torch_dist",):
            findings.error(
                "backend",
                f"metadata.json names sharded backend {backend.sharded_backend!r}, not torch_dist",
                where=tree.where(join(rel, "metadata.json")),
            )
    except CheckpointError as err:
        _error_from(findings, "metadata-json", err)
    try:
        index = read_dcp_index(tree, rel, stub_megatron=stub_megatron)
        check_shapes(index, tree.where(join(rel, ".metadata")))
    except CheckpointError as err:
        _error_from(findings, "dcp-metadata", err)
        return 0, 0, None, None
    files, nbytes = check_shards(tree, rel, index, findings)
    args: dict[str, Any] = {}
    try:
        common = read_common_state(tree, rel, index, stub_megatron=stub_megatron)
        if common.state is None and backend is not None:
            # megatron-core's loader reads the common state before any shard: it refuses such a save
            findings.error(
                "no-common-state",
                "no common.pt and no common_state object: megatron-core cannot load this save",
                where=tree.where(join(rel, "common.pt")),
                fix="copy common.pt from the original save (it holds the args, iteration and schedule)",
            )
        elif common.state is None:
            findings.warning("no-common-state", "no common.pt and no common_state object (no saved args)")
        args = args_dict(common.state or {})
    except CheckpointError as err:
        _error_from(findings, "common-state", err)
    family = detect_family({k: t.shape for k, t in index.tensors.items()}, args)
    family_findings(family, tree.where(rel), findings)
    return files, nbytes, index, family


# ---- deep -----------------------------------------------------------------------------------------------


def _hash_range(tree: Tree, rel: str, advance: Callable[..., None], lock: threading.Lock) -> str:
    r = tree.byte_range(rel)
    h = hashlib.sha256()
    chunk = 8 * 1024 * 1024
    remaining = r.length
    with open(r.path, "rb", buffering=0) as fh:
        fh.seek(r.offset)
        buf = bytearray(min(chunk, max(remaining, 1)))
        view = memoryview(buf)
        while remaining > 0:
            n = fh.readinto(view[: min(len(buf), remaining)])
            if not n:
                raise CheckpointError(
                    f"read ended {remaining} bytes early",
                    where=tree.where(rel),
                    fix="the file is truncated or the disk failed: re-copy it",
                )
            h.update(view[:n])
            remaining -= n
            with lock:
                advance(n)
    return h.hexdigest()


def hash_files(tree: Tree, rels: list[str], base: str, *, workers: int | None = None) -> dict[str, str]:
    """sha256 of each file (keys relative to `base`), read in parallel with a progress bar."""
    total = sum(tree.size(r) for r in rels)
    workers = workers or min(8, (os.cpu_count() or 2))
    out: dict[str, str] = {}
    lock = threading.Lock()
    with (
        progress_bar("sha256", total, unit="bytes") as advance,
        ThreadPoolExecutor(max_workers=workers) as pool,
    ):
        # largest first so one huge file does not start last
        order = sorted(rels, key=lambda r: -tree.size(r))
        futures = {pool.submit(_hash_range, tree, r, advance, lock): r for r in order}
        for fut in as_completed(futures):
            r = futures[fut]
            out[_relative(r, base)] = fut.result()
    return out


def _relative(rel: str, base: str) -> str:
    return rel[len(base) + 1 :] if base and rel.startswith(base + "/") else rel


def format_manifest(digests: dict[str, str]) -> str:
    return "".join(f"{h}  {p}\n" for p, h in sorted(digests.items()))


def parse_manifest(raw: bytes, where: str) -> dict[str, str]:
    """Parse `sha256sum` output (`<hex>  <path>` or `<hex> *<path>`); refuse one that lists nothing."""
    fix = "use a manifest written by `longctx ckpt check --deep --write-manifest` or sha256sum"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError(
            f"the manifest is not UTF-8 text (byte {err.start})", where=where, fix=fix
        ) from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if (
            len(parts) != 2
            or len(parts[0]) != 64
            or any(c not in "0123456789abcdef" for c in parts[0].lower())
        ):
            raise CheckpointError(
                f"manifest line {n} is not '<sha256>  <path>': {line[:80]!r}",
                where=where,
                fix=fix,
            )
        path = parts[1].lstrip("*").removeprefix("./")
        out[path] = parts[0].lower()
    if not out:  # an empty list would pass every comparison: it vouches for nothing
        raise CheckpointError("the manifest lists no files", where=where, fix=fix)
    return out


def compare_manifest(
    digests: dict[str, str], expected: dict[str, str], findings: Findings, where: str
) -> None:
    bad = [p for p in sorted(expected) if p in digests and digests[p] != expected[p]]
    gone = [p for p in sorted(expected) if p not in digests]
    new = [p for p in sorted(digests) if p not in expected and p != MANIFEST_NAME]
    for p in bad[:_MAX_LISTED]:
        findings.error(
            "sha256-mismatch",
            f"{p}: sha256 differs from the manifest",
            where=where,
            expected=expected[p],
            found=digests[p],
            fix="the file changed or is corrupt: re-download or re-copy it",
        )
    for p in gone[:_MAX_LISTED]:
        findings.error(
            "manifest-missing-file", f"{p} is in the manifest but not in the checkpoint", where=where
        )
    if len(bad) > _MAX_LISTED:
        findings.error("sha256-mismatch", f"... and {len(bad) - _MAX_LISTED} more mismatching files")
    if len(gone) > _MAX_LISTED:
        findings.error("manifest-missing-file", f"... and {len(gone) - _MAX_LISTED} more missing files")
    if new:
        findings.warning(
            "manifest-extra-file", f"{len(new)} file(s) not in the manifest (e.g. {new[0]})", where=where
        )
    if not bad and not gone:
        findings.info("sha256-ok", f"{len(expected)} files match the manifest", where=where)


def _deep(
    resolved: ResolvedCheckpoint,
    findings: Findings,
    manifest: Path | None,
    write_manifest: Path | None,
    workers: int | None,
) -> DeepResult:
    tree, rel = resolved.tree, resolved.checkpoint_rel
    rels = [r for r in tree.files(rel)]
    t0 = time.perf_counter()
    try:
        digests = hash_files(tree, rels, rel, workers=workers)
    except CheckpointError as err:
        _error_from(findings, "read-error", err)
        digests = {}
    result = DeepResult(files=len(rels), bytes=sum(tree.size(r) for r in rels), digests=digests)
    result.seconds = time.perf_counter() - t0
    expected: dict[str, str] | None = None
    if manifest is not None:
        if not manifest.is_file():
            raise CheckpointError(
                "manifest file not found",
                where=str(manifest),
                fix="pass an existing file to --manifest, or --write-manifest FILE to create one",
            )
        expected = parse_manifest(manifest.read_bytes(), str(manifest))
        result.manifest_checked = str(manifest)
    elif tree.is_file(join(rel, MANIFEST_NAME)):
        inner = join(rel, MANIFEST_NAME)
        expected = parse_manifest(tree.read_bytes(inner), tree.where(inner))
        result.manifest_checked = tree.where(inner)
    if expected is not None and digests:
        compare_manifest(digests, expected, findings, result.manifest_checked or "")
    elif expected is None and write_manifest is None:
        findings.info(
            "no-manifest",
            f"read {result.files} files; no manifest to compare against (--write-manifest FILE records one)",
        )
    if write_manifest is not None and digests and findings.ok:
        atomic_write_text(write_manifest, format_manifest(digests))
        result.manifest_written = str(write_manifest)
    elif write_manifest is not None:
        findings.error(
            "manifest-not-written",
            "the manifest was not written because verification failed",
            where=str(write_manifest),
        )
    return result


def verify_checkpoint(
    path: str | os.PathLike[str],
    deep: bool = False,
    *,
    manifest: str | os.PathLike[str] | None = None,
    write_manifest: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    stub_megatron: bool | None = None,
) -> VerifyReport:
    """Check that the checkpoint at PATH is whole; problems are error findings (`report.ok` False).

    Raises CheckpointError only when PATH is not a checkpoint location at all.
    """
    findings = Findings()
    if write_manifest is not None:
        refuse_write_into(Path(write_manifest), Path(path), "--write-manifest", ".sha256")
    tree = open_tree(Path(path))
    if isinstance(tree, TarTree):
        for m in tree.unsafe:
            findings.error(
                "unsafe-member",
                f"archive member {m.name!r} is unsafe ({m.reason}); extraction would refuse it",
                where=str(tree.source),
                fix="do not extract this archive; obtain a clean copy",
            )
    try:
        resolved = resolve_in_tree(tree)
    except TrackerError as err:
        _error_from(findings, "tracker", err)
        return VerifyReport(str(path), None, None, None, [], 0, 0, findings)
    files, nbytes, _, family = verify_resolved(resolved, findings, stub_megatron=stub_megatron)
    report = VerifyReport(
        path=str(path),
        location=resolved.where,
        kind=resolved.kind,
        iteration=resolved.iteration,
        complete_iterations=resolved.complete_iterations,
        shard_files=files,
        shard_bytes=nbytes,
        findings=findings,
        family=family,
        resolved=resolved,
    )
    if deep:
        report.deep = _deep(
            resolved,
            findings,
            Path(manifest) if manifest is not None else None,
            Path(write_manifest) if write_manifest is not None else None,
            workers,
        )
    elif manifest is not None or write_manifest is not None:
        raise CheckpointError(
            "--manifest/--write-manifest need --deep (digests come from reading every byte)", fix="add --deep"
        )
    return report


__all__ = [
    "MANIFEST_NAME",
    "DeepResult",
    "VerifyReport",
    "check_shards",
    "compare_manifest",
    "format_manifest",
    "hash_files",
    "parse_manifest",
    "verify_checkpoint",
]
