"""Tokenized long-context artifacts: Megatron chunks named by language and length tier, plus manifests.

Layout (format "openeuro-longctx-megatron-v1", and its streamed variant):

    ROOT/
      bin/<name>_text_document.{bin,idx}              packed artifact
      runs/<run>/bin/<name>_text_document.{bin,idx}   streamed run (one prefix per chunk)
      runs/<run>/manifests/chunks/<name>.json         per chunk: language, tier, docs, bin/idx bytes + sha256
      mix/data_mix.json   {bin_dir, suffix, alpha, floor, total_bin_bytes, tiers: {tier: {min, max, weight}},
                           languages: {name: {prefix, weight, bin_bytes, natural_p, tier?, language?, …}}}
      mix/data_path.args  "W1 PREFIX1 W2 PREFIX2 …" with the paths of the machine that built it
      mix/data_mix.txt    the same as a table
      manifests/checksums.json  {relative path: {bytes, sha256}} (+ checksums.sha256, "SHA  PATH" lines)
      manifests/build_info.json or stream_manifest.json   tokenizer_type, tokenizer_model, vocab_size, …

Streamed chunk names are `<run>_<lang>_s<shard>_c<chunk>_<tier>`; packed ones `<lang>` or
`<group>_<tier>`. Per-chunk manifests are the authority for language and tier; names are the fallback.
Everything here reads; `rewrite_mix_paths` is the one writer (the mix files of a download point at
another machine, and Megatron needs local paths).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from longctx.data.artifact.fields import (
    BuildInfoFields,
    ChecksumFields,
    ChunkFields,
    TierFields,
    is_sha256,
    read_fields,
)
from longctx.data.blend import parse_blend
from longctx.errors import DatasetError
from longctx.report import Findings
from longctx.tokenizer import MEGATRON_TOKENIZER_TYPE, LoadedTokenizer, TokenizerManifest
from longctx.util.fs import atomic_write_json, atomic_write_text

SUFFIX = "_text_document"
FORMATS = ("openeuro-longctx-megatron-v1", "openeuro-longctx-megatron-stream-v1")
DEFAULT_REPO_ID = "birgermoell/oellm-longctx-tokenized-streamed-all-v2"
STATE_DIR = ".longctx"  # what longctx keeps inside an artifact: original mix files, verified hashes
MIX_FILES = ("data_path.args", "data_mix.json", "data_mix.txt")
BUILD_INFO_FILES = ("build_info.json", "stream_manifest.json")


@dataclasses.dataclass(frozen=True)
class TierBounds:
    """Source-document length bounds of a tier, in the producer's source tokens: min ≤ n < max."""

    min: int
    max: int | None
    weight: float | None = None  # the producer's default tier weight, when it has one


def _tiers(spec: dict[str, tuple[int, int | None, float]]) -> dict[str, TierBounds]:
    return {k: TierBounds(lo, hi, w) for k, (lo, hi, w) in spec.items()}


# the producer's tier presets (name: (min, max, weight))
TIER_PRESETS: dict[str, dict[str, TierBounds]] = {
    "lc16k": _tiers({"16k_plus": (16384, None, 0.5), "4_16k": (4096, 16384, 0.3), "under4k": (0, 4096, 0.2)}),
    "lc128k": _tiers(
        {
            "128k_plus": (131072, None, 0.25),
            "64_128k": (65536, 131072, 0.25),
            "32_64k": (32768, 65536, 0.20),
            "16_32k": (16384, 32768, 0.15),
            "4_16k": (4096, 16384, 0.10),
            "under4k": (0, 4096, 0.05),
        }
    ),
    "lc256k": _tiers(
        {
            "256k_plus": (262144, None, 0.20),
            "128_256k": (131072, 262144, 0.25),
            "64_128k": (65536, 131072, 0.20),
            "32_64k": (32768, 65536, 0.15),
            "16_32k": (16384, 32768, 0.10),
            "4_16k": (4096, 16384, 0.07),
            "under4k": (0, 4096, 0.03),
        }
    ),
}
KNOWN_TIERS: dict[str, TierBounds] = {
    name: dataclasses.replace(b, weight=None)
    for preset in TIER_PRESETS.values()
    for name, b in preset.items()
}
_SHARD_CHUNK = re.compile(r"_s\d+_c\d+$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclasses.dataclass
class Chunk:
    """One Megatron prefix of the artifact."""

    name: str  # the chunk's name: its prefix's file name without the `_text_document` suffix
    language: str | None
    tier: str | None
    prefix: str  # absolute local prefix (…/<name>_text_document), whether or not the files are here
    bin_bytes: int | None = None
    idx_bytes: int | None = None
    bin_sha256: str | None = None
    idx_sha256: str | None = None
    documents: int | None = None
    source_tokens: int | None = None
    described_by: str = ""  # which manifest described it (chunk manifest, data_mix.json, files)

    @property
    def bin_path(self) -> Path:
        return Path(self.prefix + ".bin")

    @property
    def idx_path(self) -> Path:
        return Path(self.prefix + ".idx")

    @property
    def has_bin(self) -> bool:
        return self.bin_path.is_file()

    @property
    def has_idx(self) -> bool:
        return self.idx_path.is_file()


@dataclasses.dataclass
class BuildInfo:
    """What the producer recorded about how the data was made (by name: it pins no hash)."""

    path: Path
    artifact_format: str | None
    tokenizer_type: str | None
    tokenizer_model: str | None
    tokenizer_revision: str | None
    vocab_size: int | None
    megatron_git_commit: str | None
    raw: dict[str, Any] = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class Expected:
    """An integrity record of one file: size and/or sha256, and the manifest that says so."""

    bytes: int | None
    sha256: str | None
    source: str


@dataclasses.dataclass
class Artifact:
    root: Path
    run: str | None
    run_root: Path
    bin_dir: Path
    chunks: list[Chunk]
    tiers: dict[str, TierBounds]  # bounds of the tiers present: the artifact's own spec, else the presets
    build_info: BuildInfo | None
    checksums: dict[str, Expected]  # relative to root
    mix_dir: Path | None
    manifest_files: list[str]  # relative to root: every manifest/mix file found
    findings: Findings

    @property
    def languages(self) -> list[str]:
        return sorted({c.language for c in self.chunks if c.language})

    @property
    def tier_names(self) -> list[str]:
        present = {c.tier for c in self.chunks if c.tier}
        return sorted(present, key=lambda t: (-(self.tiers[t].min if t in self.tiers else -1), t))

    def rel(self, path: str | os.PathLike[str]) -> str:
        return _rel(path, self.root)

    def select(
        self, languages: Iterable[str] | None = None, tiers: Iterable[str] | None = None
    ) -> list[Chunk]:
        """Chunks of these languages and tiers (None: all); unknown names are errors that list the known."""
        langs = list(dict.fromkeys(languages)) if languages else None
        wanted_tiers = list(dict.fromkeys(tiers)) if tiers else None
        if langs is not None:
            unknown = [x for x in langs if x not in self.languages]
            if unknown:
                raise DatasetError(
                    f"language(s) {', '.join(unknown)} not in the artifact",
                    where=str(self.run_root),
                    fix=f"use some of: {', '.join(self.languages) or '(none found)'}",
                )
        if wanted_tiers is not None:
            unknown = [x for x in wanted_tiers if x not in self.tier_names]
            if unknown:
                raise DatasetError(
                    f"tier(s) {', '.join(unknown)} not in the artifact",
                    where=str(self.run_root),
                    fix=f"use some of: {', '.join(self.tier_names) or '(none found)'}",
                )
        return [
            c
            for c in self.chunks
            if (langs is None or c.language in langs) and (wanted_tiers is None or c.tier in wanted_tiers)
        ]

    def chunk_files(
        self, chunks: Iterable[Chunk], *, bins: bool = True, idx: bool = True
    ) -> dict[str, Expected]:
        """Integrity records of the chunks' files (relative path → Expected), from chunk manifests and
        checksums.json; a file nothing describes gets an empty record (existence only)."""
        out: dict[str, Expected] = {}
        for c in chunks:
            pairs = []
            if bins:
                pairs.append((c.bin_path, c.bin_bytes, c.bin_sha256))
            if idx:
                pairs.append((c.idx_path, c.idx_bytes, c.idx_sha256))
            for path, size, sha in pairs:
                rel = self.rel(path)
                out[rel] = _merge_expected(rel, Expected(size, sha, c.described_by), self.checksums.get(rel))
        return out

    def manifest_expected(self) -> dict[str, Expected]:
        """Integrity records of the manifest and mix files (not chunk data). Other files a checksum list
        names (another run's, extras of the repository) count only when they are here."""
        data = {self.rel(c.bin_path) for c in self.chunks} | {self.rel(c.idx_path) for c in self.chunks}
        tops = dict.fromkeys([self.run_root, self.root])
        areas = tuple(f"{self.rel(top / sub)}/" for top in tops for sub in ("manifests", "mix"))
        out = {
            rel: e
            for rel, e in self.checksums.items()
            if rel not in data
            and (rel.startswith(areas) or rel == "README.md" or (self.root / rel).is_file())
        }
        for rel in self.manifest_files:
            out.setdefault(rel, Expected(None, None, "present"))
        return out


def _rel(path: str | os.PathLike[str], root: Path) -> str:
    """`path` relative to `root`, with '/' separators (cheap for the common case of a path below root)."""
    p, r = os.fspath(path), os.fspath(root)
    if p.startswith(r + os.sep) and ".." not in p:
        return p[len(r) + 1 :].replace(os.sep, "/")
    return Path(os.path.relpath(p, r)).as_posix()


def _merge_expected(rel: str, a: Expected, b: Expected | None) -> Expected:
    if b is None:
        return a
    for field in ("bytes", "sha256"):
        x, y = getattr(a, field), getattr(b, field)
        if x is not None and y is not None and x != y:
            raise DatasetError(
                f"the artifact's manifests disagree about {rel}: {a.source} says {field} {x}, {b.source} says {y}",
                where=rel,
                fix="the manifests come from different builds; fetch the artifact again at one revision",
            )
    return Expected(
        a.bytes if a.bytes is not None else b.bytes,
        a.sha256 if a.sha256 is not None else b.sha256,
        a.source if a.sha256 is not None else b.source,
    )


# -- names ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def _tier_names(extra: tuple[str, ...]) -> list[str]:
    return sorted(set(extra) | set(KNOWN_TIERS), key=len, reverse=True)


def parse_prefix_name(
    name: str, *, run: str | None = None, tiers: Iterable[str] | None = None
) -> tuple[str | None, str | None]:
    """(language, tier) of a prefix or chunk name: `[<run>_]<lang>[_sNNNN_cNNNNN][_<tier>][_text_document]`.

    The tier is the longest known tier name the name ends with; the language is what precedes it
    (without shard/chunk numbers and run id). Unrecognised parts give None.
    """
    stem = os.path.basename(name)
    stem = stem.removesuffix(SUFFIX)
    if run and stem.startswith(run + "_"):
        stem = stem[len(run) + 1 :]
    known = _tier_names(tuple(tiers or ()))
    tier = None
    for t in known:
        if stem == t:
            return None, t
        if stem.endswith("_" + t):
            tier, stem = t, stem[: -len(t) - 1]
            break
    stem = _SHARD_CHUNK.sub("", stem)
    if not stem:
        return None, tier
    # without the run id the language is the last word (`lc16k_full_20260507_en` → `en`)
    language = stem if run or "_" not in stem else stem.rsplit("_", 1)[1]
    return language, tier


# -- reading -------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(
            f"unreadable manifest {path.name}: {err}",
            where=str(path),
            fix="fetch the artifact's manifests again (longctx data fetch … --manifests-only)",
        ) from None


def _tier_bounds(raw: Any, *, where: str, findings: Findings) -> dict[str, TierBounds]:
    out: dict[str, TierBounds] = {}
    if not isinstance(raw, dict):
        return out
    for name, spec in raw.items():
        if isinstance(spec, dict):
            t = read_fields(TierFields, spec, where=f"{where}: tiers.{name}", findings=findings)
            out[str(name)] = TierBounds(t.min or 0, t.max, t.weight)
    return out


def _find_run_root(root: Path, run: str | None) -> tuple[str | None, Path]:
    runs_dir = root / "runs"
    runs = sorted(p.name for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []
    if run is not None:
        if (runs_dir / run).is_dir():
            return run, runs_dir / run
        if runs:
            raise DatasetError(
                f"run {run!r} is not in the artifact",
                where=str(root),
                fix=f"use one of: {', '.join(runs)} (or fetch it: longctx data fetch REPO --into {root} --run {run})",
            )
        return run, root  # a local-only layout: the root is the run
    if len(runs) > 1:
        raise DatasetError(
            f"the artifact holds {len(runs)} runs",
            where=str(root),
            fix=f"choose one with --run (or `run = …` in the plan): {', '.join(runs)}",
        )
    if len(runs) == 1:
        return runs[0], runs_dir / runs[0]
    return None, root


def looks_like_artifact(path: str | os.PathLike[str]) -> bool:
    """True for a directory with the artifact layout (manifests/, mix/ or runs/)."""
    p = Path(path)
    return p.is_dir() and any((p / d).is_dir() for d in ("manifests", "mix", "runs"))


def open_artifact(path: str | os.PathLike[str], *, run: str | None = None) -> Artifact:
    """Read an artifact's manifests (no data files are opened). Raises DatasetError if there is none."""
    root = Path(path).absolute()
    if not root.is_dir():
        raise DatasetError(
            f"artifact directory not found: {root}",
            where=str(root),
            fix=f"fetch it: longctx data fetch {DEFAULT_REPO_ID} --into {root}"
            + (f" --run {run}" if run else "")
            + " (add --manifests-only to plan without the data)",
        )
    run, run_root = _find_run_root(root, run)
    bin_dir = run_root / "bin"
    findings = Findings()
    manifest_dirs = list(dict.fromkeys([run_root / "manifests", root / "manifests"]))
    mix_dirs = [d for d in dict.fromkeys([run_root / "mix", root / "mix"]) if d.is_dir()]
    mix_dir = mix_dirs[0] if mix_dirs else None

    table = _ChunkTable(run, bin_dir, findings)
    # tier bounds first (names are parsed against them): the artifact's own spec wins over presets
    mix_json = None
    if mix_dir is not None and (mix_dir / "data_mix.json").is_file():
        mix_json = _read_json(mix_dir / "data_mix.json")
        if isinstance(mix_json, dict):
            where = _rel(mix_dir / "data_mix.json", root)
            table.tiers.update(_tier_bounds(mix_json.get("tiers"), where=where, findings=findings))
    build_info = _find_build_info(manifest_dirs, table.tiers, root, findings)
    _describe_chunks(table, root, manifest_dirs, build_info, mix_dir, mix_json)

    checksums: dict[str, Expected] = {}
    manifest_files: list[str] = []
    for d in manifest_dirs:
        _read_checksums(d, root, checksums, findings)
        if d.is_dir():
            for top, _dirs, files in os.walk(d):
                manifest_files += [_rel(os.path.join(top, f), root) for f in files]
    for d in mix_dirs:
        manifest_files += [_rel(d / f, root) for f in MIX_FILES if (d / f).is_file()]
    # 5. checksums.json may list chunks that nothing else describes
    for rel in sorted(checksums):
        p = root / rel
        if p.suffix == ".bin" and p.stem.endswith(SUFFIX) and p.parent == bin_dir:
            table.add({"prefix": p.stem}, "checksums")

    _finish_chunks(table, root, run_root)
    return Artifact(
        root=root,
        run=run,
        run_root=run_root,
        bin_dir=bin_dir,
        chunks=sorted(table.chunks.values(), key=lambda c: c.name),
        tiers=table.tiers,
        build_info=build_info,
        checksums=checksums,
        mix_dir=mix_dir,
        manifest_files=sorted(set(manifest_files)),
        findings=findings,
    )


class _ChunkTable:
    """The chunks the manifests describe, merged: the first description of a field wins, later ones
    fill its gaps, and a disagreement is a warning."""

    def __init__(self, run: str | None, bin_dir: Path, findings: Findings) -> None:
        self.run = run
        self.bin_dir = bin_dir
        self.findings = findings
        self.chunks: dict[str, Chunk] = {}  # keyed by prefix file name (<name>_text_document)
        self.tiers: dict[str, TierBounds] = {}

    def add(self, entry: dict[str, Any], described_by: str) -> None:
        name = str(entry.get("name") or "")
        prefix_name = os.path.basename(str(entry.get("prefix") or "")) or (name + SUFFIX if name else "")
        if not prefix_name:
            return
        if described_by in ("files", "checksums") and prefix_name in self.chunks:
            return
        name = name or prefix_name.removesuffix(SUFFIX)
        if entry.get("language") and entry.get("tier"):
            lang, tier = entry["language"], entry["tier"]
        else:
            lang, tier = parse_prefix_name(prefix_name, run=self.run, tiers=tuple(self.tiers))
        new = Chunk(
            name=name,
            language=entry.get("language") or lang,
            tier=entry.get("tier") or tier,
            prefix=str(self.bin_dir / prefix_name),
            **read_fields(ChunkFields, entry, where=described_by, findings=self.findings).model_dump(),
            described_by=described_by,
        )
        old = self.chunks.get(prefix_name)
        if old is None:
            self.chunks[prefix_name] = new
            return
        for field in ("language", "tier", "bin_bytes", "bin_sha256", "idx_sha256"):
            a, b = getattr(old, field), getattr(new, field)
            if a is not None and b is not None and a != b:
                self.findings.warning(
                    "manifest-conflict",
                    f"{name}: {old.described_by} says {field} {a!r}, {described_by} says {b!r} (keeping the first)",
                    where=described_by,
                )
            elif a is None and b is not None:
                setattr(old, field, b)


def _find_build_info(
    manifest_dirs: list[Path], tiers: dict[str, TierBounds], root: Path, findings: Findings
) -> BuildInfo | None:
    """The first build info found; its tier bounds fill those the mix does not give."""
    build_info = None
    for d in manifest_dirs:
        for fname in BUILD_INFO_FILES:
            p = d / fname
            if p.is_file() and build_info is None:
                raw = _read_json(p)
                if isinstance(raw, dict):
                    where = _rel(p, root)
                    build_info = _build_info(
                        p, raw, read_fields(BuildInfoFields, raw, where=where, findings=findings)
                    )
                    for k, v in _tier_bounds(raw.get("tiers"), where=where, findings=findings).items():
                        tiers.setdefault(k, v)
    return build_info


def _describe_chunks(
    table: _ChunkTable,
    root: Path,
    manifest_dirs: list[Path],
    build_info: BuildInfo | None,
    mix_dir: Path | None,
    mix_json: Any,
) -> None:
    """Add the chunks every manifest describes, the authority first."""
    # 1. per-chunk manifests: the authority
    for d in manifest_dirs:
        chunk_dir = d / "chunks"
        if chunk_dir.is_dir():
            for p in sorted(chunk_dir.glob("*.json"), key=lambda x: x.name):
                raw = _read_json(p)
                if isinstance(raw, dict):
                    table.add(raw, _rel(p, root))
    # 2. the stream manifest's entries, 3. data_mix.json's entries
    if build_info is not None and isinstance(build_info.raw.get("entries"), list):
        for e in build_info.raw["entries"]:
            if isinstance(e, dict):
                table.add(e, _rel(build_info.path, root))
    if isinstance(mix_json, dict) and isinstance(mix_json.get("languages"), dict):
        for key, e in mix_json["languages"].items():
            if isinstance(e, dict):
                table.add({"name": key, **e}, _rel(mix_dir / "data_mix.json", root))  # type: ignore[operator]
    # 4. files nobody described
    if table.bin_dir.is_dir():
        for p in sorted(table.bin_dir.iterdir()):
            if p.suffix in (".bin", ".idx") and p.stem.endswith(SUFFIX):
                table.add({"prefix": p.stem}, "files")


def _finish_chunks(table: _ChunkTable, root: Path, run_root: Path) -> None:
    """Refuse an artifact without chunks; add the presets' bounds of the tiers present; warn of
    chunks without language or tier."""
    chunks = table.chunks
    if not chunks:
        raise DatasetError(
            "the artifact describes no Megatron prefixes (no chunk manifests, data_mix.json entries or "
            f"{SUFFIX}.bin/.idx files)",
            where=str(run_root),
            fix=f"fetch it: longctx data fetch {DEFAULT_REPO_ID} --into {root}"
            + (f" --run {table.run}" if table.run else ""),
        )
    for c in chunks.values():
        if c.tier is not None and c.tier not in table.tiers and c.tier in KNOWN_TIERS:
            table.tiers[c.tier] = KNOWN_TIERS[c.tier]
    unnamed = [c.name for c in chunks.values() if c.language is None or c.tier is None]
    if unnamed:
        table.findings.warning(
            "chunk-names",
            f"{len(unnamed)} prefix(es) have no language or tier (first: {unnamed[0]}); tier mixes skip them",
            where=str(table.bin_dir),
        )


def _build_info(path: Path, raw: dict[str, Any], fields: BuildInfoFields) -> BuildInfo:
    def s(key: str) -> str | None:
        v = raw.get(key)
        return str(v) if v not in (None, "") else None

    return BuildInfo(
        path=path,
        artifact_format=s("artifact_format"),
        tokenizer_type=s("tokenizer_type"),
        tokenizer_model=s("tokenizer_model"),
        tokenizer_revision=s("tokenizer_revision"),
        vocab_size=fields.vocab_size,
        megatron_git_commit=s("megatron_git_commit"),
        raw=raw,
    )


def _read_checksums(manifests: Path, root: Path, out: dict[str, Expected], findings: Findings) -> None:
    """checksums.json / checksums.sha256 paths are relative to the directory holding `manifests/`."""
    base = manifests.parent
    js, sha = manifests / "checksums.json", manifests / "checksums.sha256"

    def put(rel_to_base: str, e: Expected) -> None:
        rel = _rel(os.path.normpath(base / rel_to_base), root)
        if os.path.isabs(rel_to_base) or rel == ".." or rel.startswith("../"):
            # a hostile list would make a check hash (and report on) any file of the machine
            raise DatasetError(
                f"{e.source} names {rel_to_base!r}, a path outside the artifact",
                where=str(manifests / e.source),
                fix="the list is damaged or not this artifact's: fetch the artifact again (longctx reads only "
                "files inside the artifact's root)",
            )
        out[rel] = _merge_expected(rel, e, out.get(rel))

    if js.is_file():
        raw = _read_json(js)
        if not isinstance(raw, dict):
            raise DatasetError("checksums.json is not an object", where=str(js), fix="fetch it again")
        for rel, item in raw.items():
            if isinstance(item, dict):
                e = read_fields(ChecksumFields, item, where=f"{_rel(js, root)}: {rel}", findings=findings)
                put(rel, Expected(e.bytes, e.sha256, "checksums.json"))
    if sha.is_file():
        try:
            text = sha.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DatasetError(
                "checksums.sha256 is not UTF-8 text",
                where=str(sha),
                fix="fetch the artifact's checksum list again",
            ) from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            digest, _, rel = line.partition("  ")
            if not is_sha256(digest) or not rel:
                findings.warning(
                    "checksums", f"line {n} is not 'SHA256  PATH': {line[:80]!r}", where=str(sha)
                )
                continue
            put(rel.strip(), Expected(None, digest.lower(), "checksums.sha256"))


# -- tokenizer identity --------------------------------------------------------------------------------
def tokenizer_aliases(tok: LoadedTokenizer | None, manifest: TokenizerManifest | None = None) -> set[str]:
    """Names the given tokenizer goes by: manifest name, Hub ids in its source, directory names."""
    names: set[str] = set()
    if manifest is not None:
        names.add(manifest.name)
        names.update(
            m.group(1) for m in re.finditer(r"huggingface\.co/([\w.-]+/[\w.-]+)", manifest.source or "")
        )
    if tok is not None:
        p = Path(tok.path)
        names.add((p.parent if p.is_file() else p).name)
    names |= {n.rsplit("/", 1)[1] for n in list(names) if "/" in n}
    return {n.lower() for n in names if n}


def tokenizer_findings(
    info: BuildInfo | None, tok: LoadedTokenizer | None = None, manifest: TokenizerManifest | None = None
) -> Findings:
    """The recorded tokenizer (name, type, vocabulary) against the given one. The producer pins no
    hash, so names are weak evidence: a different vocabulary size is an error, and so is a Hub id that
    is none of the names the tokenizer's manifest gives; anything less certain is a warning."""
    f = Findings()
    if info is None:
        f.warning(
            "build-info",
            "no build_info.json or stream_manifest.json: nothing records which tokenizer made the data",
            fix="check the data with the model's tokenizer (the token-id scan decides)",
        )
        return f
    where = str(info.path)
    if tok is None:
        f.warning(
            "tokenizer",
            f"no tokenizer given: the recorded tokenizer {info.tokenizer_model!r} (vocab {info.vocab_size}) "
            "is not compared with the model's",
            where=where,
            fix="pass --tokenizer PATH",
        )
        return f
    _build_vocab_finding(info, tok, where, f)
    own_type = getattr(manifest, "megatron_tokenizer_type", None) or MEGATRON_TOKENIZER_TYPE.get(tok.kind)
    if info.tokenizer_type and own_type and info.tokenizer_type != own_type:
        f.warning(
            "build-tokenizer-type",
            f"the data was made with Megatron tokenizer type {info.tokenizer_type}, the model uses {own_type}",
            where=where,
            fix="the same vocabulary loaded by another class can give other ids for special tokens; the token-id "
            "checks (EOD, id range) decide",
        )
    _build_name_finding(info, tok, manifest, where, f)
    return f


def _build_vocab_finding(info: BuildInfo, tok: LoadedTokenizer, where: str, f: Findings) -> None:
    if info.vocab_size is None:
        f.warning("build-vocab", "build info records no vocab_size", where=where)
    elif info.vocab_size not in (tok.vocab_size, tok.model_vocab_size):
        f.error(
            "build-vocab",
            f"the data was tokenized with a vocabulary of {info.vocab_size:,}; the given tokenizer has "
            f"{tok.vocab_size:,} ({tok.model_vocab_size:,} in its model file)",
            where=where,
            expected=tok.vocab_size,
            found=info.vocab_size,
            fix="use the tokenizer the data was made with, or re-tokenize the data with the model's tokenizer",
        )


def _build_name_finding(
    info: BuildInfo, tok: LoadedTokenizer, manifest: TokenizerManifest | None, where: str, f: Findings
) -> None:
    """The recorded tokenizer_model against the names the given tokenizer goes by."""
    model = info.tokenizer_model
    aliases = tokenizer_aliases(tok, manifest)
    if not model:
        f.warning("build-tokenizer", "build info records no tokenizer_model", where=where)
        return
    hub_like = _HUB_ID.match(model) and not model.startswith((".", "~"))
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if model.lower() in aliases or base in aliases:
        f.info("build-tokenizer", f"recorded tokenizer {model!r} is the given tokenizer by name", where=where)
    elif hub_like and manifest is not None:
        f.error(
            "build-tokenizer",
            f"the data was tokenized with {model!r}; the given tokenizer is "
            f"{', '.join(sorted(aliases)) or str(tok.path)}",
            where=where,
            expected=sorted(aliases),
            found=model,
            fix="use the tokenizer the data was made with, or re-tokenize the data with the model's tokenizer",
        )
    elif hub_like:
        f.warning(
            "build-tokenizer",
            f"the data was tokenized with {model!r}; the given tokenizer's name is not known "
            f"(directory {', '.join(sorted(aliases))})",
            where=where,
            fix="pass its manifest (--tokenizer-manifest tokenization/….toml) to compare names; the token-id "
            "checks (dtype, id range, EOD) decide",
        )
    else:
        f.warning(
            "build-tokenizer",
            f"recorded tokenizer is the local path {model!r} of the machine that built the data; its name "
            f"does not identify it (given: {', '.join(sorted(aliases))})",
            where=where,
            fix="the token-id checks (dtype, id range, EOD) decide; run `longctx data check` without --index-only",
        )


# -- rewriting the mix to local paths --------------------------------------------------------------------
@dataclasses.dataclass
class RewriteResult:
    files: list[str]  # rewritten files, relative to the root
    prefixes: int  # prefixes in data_path.args
    local: int  # of those, how many have their .bin and .idx here
    unknown: list[str]  # prefix names the artifact's manifests do not describe


def _original(art: Artifact, path: Path) -> Path:
    return art.root / STATE_DIR / "original" / art.rel(path)


def original_text(art: Artifact, path: Path) -> str:
    """The file as downloaded: the saved original if longctx rewrote it, else the file itself."""
    orig = _original(art, path)
    return (orig if orig.is_file() else path).read_text(encoding="utf-8")


def _written_record(art: Artifact) -> Path:
    return art.root / STATE_DIR / "rewritten.json"


def refresh_originals(art: Artifact) -> list[str]:
    """Take a mix file that is not longctx's own output (a fresh download) as the new original.

    Returns the files whose saved original was replaced."""
    record_path = _written_record(art)
    try:
        written = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        written = {}
    replaced: list[str] = []
    if art.mix_dir is None:
        return replaced
    for fname in MIX_FILES:
        path = art.mix_dir / fname
        orig = _original(art, path)
        if not (path.is_file() and orig.is_file()):
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != written.get(art.rel(path)) and path.read_bytes() != orig.read_bytes():
            _save_original(path, orig)
            replaced.append(art.rel(path))
    return replaced


def _save_original(path: Path, orig: Path) -> None:
    orig.parent.mkdir(parents=True, exist_ok=True)
    tmp = orig.with_name(orig.name + ".tmp")
    shutil.copy2(path, tmp)
    os.replace(tmp, orig)


def _local_prefix(art: Artifact, old: str) -> str:
    return str(art.bin_dir / os.path.basename(old.rstrip("/")))


def rewrite_mix_paths(art: Artifact) -> RewriteResult:
    """Point mix/data_path.args, data_mix.json and data_mix.txt at this machine's prefixes.

    The downloaded originals are kept under `.longctx/original/` (so checksums still verify and a
    second rewrite starts from them). Weights are kept word for word. Files change only if their
    text does."""
    result = RewriteResult([], 0, 0, [])
    if art.mix_dir is None:
        return result
    refresh_originals(art)
    known = {os.path.basename(c.prefix) for c in art.chunks}
    mapping: dict[str, str] = {}
    args_path = art.mix_dir / "data_path.args"

    def remember(old: str) -> str:
        new = _local_prefix(art, old)
        mapping[old] = new
        if os.path.basename(old) not in known and os.path.basename(old) not in result.unknown:
            result.unknown.append(os.path.basename(old))
        return new

    texts: dict[Path, str] = {}
    if args_path.is_file():
        words = original_text(art, args_path).split()
        blend = parse_blend(words, source=str(args_path), check_exists=False)
        blend.raise_for_errors()
        out = [w if (blend.weighted and i % 2 == 0) else remember(w) for i, w in enumerate(words)]
        result.prefixes = len(blend.entries)
        result.local = sum(
            1
            for e in blend.entries
            if os.path.isfile(mapping[e.prefix] + ".bin") and os.path.isfile(mapping[e.prefix] + ".idx")
        )
        texts[args_path] = " ".join(out) + "\n"
    json_path = art.mix_dir / "data_mix.json"
    if json_path.is_file():
        data = json.loads(original_text(art, json_path))
        if isinstance(data, dict):
            for e in (data.get("languages") or {}).values():
                if isinstance(e, dict) and isinstance(e.get("prefix"), str):
                    e["prefix"] = remember(e["prefix"])
            if "bin_dir" in data:
                data["bin_dir"] = str(art.bin_dir)
            if isinstance(data.get("data_path_args"), str):
                w = data["data_path_args"].split()
                blend = parse_blend(w, source=f"{json_path}: data_path_args", check_exists=False)
                data["data_path_args"] = " ".join(
                    x if (blend.weighted and i % 2 == 0) else remember(x) for i, x in enumerate(w)
                )
            texts[json_path] = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    txt_path = art.mix_dir / "data_mix.txt"
    if txt_path.is_file() and mapping:
        text = original_text(art, txt_path)
        olds = sorted(mapping, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(o) for o in olds))
        text = pattern.sub(lambda m: mapping[m.group(0)], text)
        text = re.sub(r"(?m)^(# bin_dir\s*=\s*).*$", lambda m: m.group(1) + str(art.bin_dir), text)
        texts[txt_path] = text
    written: dict[str, str] = {}
    for path, text in texts.items():
        written[art.rel(path)] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if path.read_text(encoding="utf-8") == text:
            continue
        orig = _original(art, path)
        if not orig.is_file():  # keep the download's bytes once, before the first rewrite
            _save_original(path, orig)
        atomic_write_text(path, text)
        result.files.append(art.rel(path))
    if written:
        atomic_write_json(_written_record(art), dict(sorted(written.items())))
    return result


def tier_order(art: Artifact, tiers: Iterable[str]) -> list[str]:
    """Longest tier first (by lower bound), unknown tiers last by name."""
    return sorted(set(tiers), key=lambda t: (-(art.tiers[t].min if t in art.tiers else -1), t))
