"""`data check ARTIFACT`: a tokenized artifact against the model's tokenizer, per language × tier.

Two modes over the selected chunks:

- index-only: every `.idx` (dtype, documents, tokens, all document lengths, structure, `.bin` size)
  plus a spot check of a few tokens per prefix (EOD, id range) — seconds for thousands of prefixes;
- full: `check_datasets` on every prefix — the full token scan (every id < vocab, every document
  ends in EOD) — hours for hundreds of GiB.

Both check the recorded tokenizer (build_info.json) against the given one and report, per language ×
tier, documents, tokens and the share of tokens in documents at least as long as each stage length.
Findings repeated over many prefixes are shown a few times and counted.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from longctx.data.artifact.chunk_layout import (
    Artifact,
    BuildInfo,
    Chunk,
    open_artifact,
    tier_order,
    tokenizer_findings,
)
from longctx.data.blend import blend_from_prefixes
from longctx.data.check import TokenizerArg, check_datasets, resolve_tokenizer
from longctx.data.doc_lengths import LengthStats, checked_lengths, label
from longctx.data.index_scan import scan_indexes
from longctx.data.indexed import dtype_holds_vocab, optimal_dtype
from longctx.data.scan import ScanParams
from longctx.report import Finding, Findings
from longctx.tokenizer import LoadedTokenizer, TokenizerManifest, load_manifest
from longctx.util.units import fmt_bytes

SHOWN_PER_CODE = 3
# per-prefix findings that the per language × tier table or the build info replace
REPLACED_CODES = {"sidecar", "long-docs", "epochs", "tokenizer"}


@dataclasses.dataclass
class Coverage:
    length: int
    documents_at_least: int = 0
    tokens_in_documents_at_least: int = 0
    single_document_samples: int = 0
    packed_samples: int = 0
    token_share: float = 0.0


@dataclasses.dataclass
class GroupStats:
    language: str  # "*" for a tier total
    tier: str  # "*" for the grand total
    chunks: int = 0
    checked: int = 0  # chunks whose index (or data) was read
    documents: int = 0
    tokens: int = 0
    bin_bytes: int = 0
    max_length: int | None = None
    coverage: list[Coverage] = dataclasses.field(default_factory=list)

    def add(
        self, chunk: Chunk, stats: LengthStats | None, tokens: int | None, lengths: Sequence[int]
    ) -> None:
        if not self.coverage:
            self.coverage = [Coverage(n) for n in lengths]
        self.chunks += 1
        self.bin_bytes += chunk.bin_bytes or 0
        if stats is None:
            return
        self.checked += 1
        self.documents += stats.documents
        self.tokens += tokens if tokens is not None else stats.tokens
        if stats.max_length is not None:
            self.max_length = max(self.max_length or 0, stats.max_length)
        for acc, cov in zip(self.coverage, stats.coverage, strict=True):
            acc.documents_at_least += cov.documents_at_least
            acc.tokens_in_documents_at_least += cov.tokens_in_documents_at_least
            acc.single_document_samples += cov.single_document_samples
            acc.packed_samples += cov.packed_samples

    def finish(self) -> None:
        for c in self.coverage:
            c.token_share = c.tokens_in_documents_at_least / self.tokens if self.tokens else 0.0


@dataclasses.dataclass
class ArtifactReport:
    root: str
    run: str | None
    mode: str  # "index-only" or "full"
    lengths: list[int]
    build_info: dict[str, Any] | None
    tokenizer: dict[str, Any] | None
    vocab_size: int | None
    eod_id: int | None
    chunks: int
    checked: int
    dtypes: dict[str, int]
    groups: list[GroupStats]
    tiers: list[GroupStats]
    total: GroupStats
    findings: Findings
    seconds: float
    bytes_scanned: int

    @property
    def ok(self) -> bool:
        return self.findings.ok

    @property
    def prefixes_per_second(self) -> float:
        return self.checked / self.seconds if self.seconds > 0 else 0.0


def _condense(findings: Sequence[Finding], out: Findings) -> None:
    """Keep the first few findings of each (level, code), then one that counts the rest."""
    seen: dict[tuple[str, str], int] = {}
    for f in findings:
        key = (f.level, f.code)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= SHOWN_PER_CODE:
            out.append(f)
    for (level, code), n in seen.items():
        if n > SHOWN_PER_CODE:
            out.append(
                Finding(
                    level, code, f"… and {n - SHOWN_PER_CODE} more prefixes with the same finding ({code})"
                )
            )  # type: ignore[arg-type]


def _missing(art: Artifact, chunks: list[Chunk], index_only: bool, f: Findings) -> list[Chunk]:
    present, absent = [], []
    for c in chunks:
        (present if c.has_idx and (index_only or c.has_bin) else absent).append(c)
    if absent:
        what = ".idx" if index_only else ".bin/.idx"
        f.error(
            "not-downloaded",
            f"{len(absent)} of {len(chunks)} selected prefixes have no {what} here (first: {absent[0].name})",
            where=str(art.bin_dir),
            fix=f"fetch them: longctx data fetch REPO --into {art.root}"
            + (f" --run {art.run}" if art.run else "")
            + (" --idx-only" if index_only else "")
            + ", or narrow the check with --languages/--tiers",
        )
    if index_only:
        no_bin = sum(1 for c in present if not c.has_bin)
        if no_bin:
            f.info(
                "index-only-download",
                f"{no_bin} prefixes have their .idx but no .bin: token checks skip them",
            )
    return present


def check_artifact(
    path: str | os.PathLike[str],
    *,
    run: str | None = None,
    languages: Sequence[str] | None = None,
    tiers: Sequence[str] | None = None,
    tokenizer: TokenizerArg | None = None,
    manifest: TokenizerManifest | str | os.PathLike[str] | None = None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    lengths: Sequence[int] = (),
    index_only: bool = False,
    workers: int | None = None,
    progress: bool = True,
    strict: bool = False,
) -> ArtifactReport:
    """Check an artifact (see the module docstring). `tokenizer` is a path or LoadedTokenizer,
    `manifest` a tokenization/*.toml path or TokenizerManifest (names the tokenizer goes by)."""
    started = time.perf_counter()
    wanted = checked_lengths(lengths)
    art = open_artifact(path, run=run)
    chunks = art.select(languages, tiers)
    tok = resolve_tokenizer(tokenizer)
    man = load_manifest(manifest) if isinstance(manifest, (str, os.PathLike)) else manifest
    findings = Findings(art.findings)
    findings.extend(tokenizer_findings(art.build_info, tok, man))
    vocab = vocab_size if vocab_size is not None else (tok.vocab_size if tok is not None else None)
    eod = eod_id if eod_id is not None else (tok.eod_id if tok is not None else None)
    bos = tok.bos_id if tok is not None else None
    if vocab is None and art.build_info is not None and art.build_info.vocab_size:
        vocab = art.build_info.vocab_size
        findings.info("vocab", f"token ids are checked against the recorded vocab size {vocab:,}")
    present = _missing(art, chunks, index_only, findings)

    if index_only:
        seen = _index_pass(present, wanted, ScanParams(vocab, eod, bos), workers, progress, findings)
    elif present:
        seen = _full_pass(present, tok, vocab, eod, wanted, workers, progress, findings)
    else:
        seen = _Seen()
    if vocab is not None:
        _dtype_findings(seen.dtypes, vocab, art, findings)
    # per-prefix context (info) is summed up above and in the tables; problems are kept, condensed
    _condense([x for x in seen.findings if x.level != "info" and x.code not in REPLACED_CODES], findings)

    groups, tier_totals, total = _group_stats(art, chunks, seen.per_chunk, wanted)
    if strict:
        findings.escalate_warnings()
    return ArtifactReport(
        root=str(art.root),
        run=art.run,
        mode="index-only" if index_only else "full",
        lengths=wanted,
        build_info=_build_info_facts(art.build_info),
        tokenizer=None
        if tok is None
        else {"path": str(tok.path), "md5": tok.md5, "vocab_size": tok.vocab_size, "eod_id": tok.eod_id},
        vocab_size=vocab,
        eod_id=eod,
        chunks=len(chunks),
        checked=len(present),
        dtypes=seen.dtypes,
        groups=groups,
        tiers=tier_totals,
        total=total,
        findings=findings,
        seconds=time.perf_counter() - started,
        bytes_scanned=seen.scanned,
    )


@dataclasses.dataclass
class _Seen:
    """What one pass over the present prefixes found, per chunk and in sum."""

    per_chunk: dict[str, tuple[LengthStats | None, int | None]] = dataclasses.field(default_factory=dict)
    dtypes: dict[str, int] = dataclasses.field(default_factory=dict)  # dtype name -> prefixes
    findings: list[Finding] = dataclasses.field(default_factory=list)  # per prefix, condensed later
    scanned: int = 0  # bytes of the full scan


def _index_pass(
    present: list[Chunk],
    wanted: list[int],
    params: ScanParams,
    workers: int | None,
    progress: bool,
    findings: Findings,
) -> _Seen:
    """Index-only: every `.idx` plus a spot check of a few tokens per prefix."""
    seen = _Seen()
    summaries, _ = scan_indexes(
        [c.prefix for c in present], wanted, params=params, workers=workers, progress=progress
    )
    sampled = ending = max_id = 0
    for c, s in zip(present, summaries, strict=True):
        seen.per_chunk[c.prefix] = (s.lengths, s.tokens)
        if s.dtype:
            seen.dtypes[s.dtype] = seen.dtypes.get(s.dtype, 0) + 1
        seen.findings += s.findings
        if s.spot is not None:
            sampled += s.spot.documents
            ending += s.spot.ending_in_eod
            max_id = max(max_id, s.spot.max_id or 0)
    if sampled:
        eod, vocab = params.eod_id, params.vocab_size
        findings.info(
            "spot",
            f"spot check of {sampled:,} documents: "
            + (f"{ending:,} end with EOD {eod}; " if eod is not None else "")
            + f"max sampled id {max_id:,}"
            + (f" (vocab {vocab:,})" if vocab is not None else "")
            + " — run without --index-only for the full token scan",
        )
    return seen


def _full_pass(
    present: list[Chunk],
    tok: LoadedTokenizer | None,
    vocab: int | None,
    eod: int | None,
    wanted: list[int],
    workers: int | None,
    progress: bool,
    findings: Findings,
) -> _Seen:
    """Full: `check_datasets` on every present prefix (every token read)."""
    seen = _Seen()
    rep = check_datasets(
        blend_from_prefixes([c.prefix for c in present], check_exists=False),
        tokenizer=tok,
        vocab_size=vocab,
        eod_id=eod,
        lengths=wanted,
        workers=workers,
        progress=progress,
    )
    docs = without_eod = max_id = 0
    for c, p in zip(present, rep.prefixes, strict=True):
        seen.per_chunk[c.prefix] = (p.lengths, p.index["tokens"] if p.index else None)
        if p.index:
            seen.dtypes[p.index["dtype"]] = seen.dtypes.get(p.index["dtype"], 0) + 1
        if p.scan is not None:
            seen.scanned += p.scan.bytes_scanned
            docs += p.scan.documents_checked
            without_eod += p.scan.documents_without_eod
            max_id = max(max_id, p.scan.max_id or 0)
        seen.findings += p.findings
    seen.findings += rep.findings
    if seen.scanned:
        findings.info(
            "scan",
            f"full scan of {fmt_bytes(seen.scanned)}: max token id {max_id:,}"
            + (f" (vocab {vocab:,})" if vocab is not None else "")
            + (
                f"; {docs - without_eod:,} of {docs:,} documents end with EOD {eod}"
                if eod is not None
                else ""
            ),
        )
    return seen


def _dtype_findings(dtypes: dict[str, int], vocab: int, art: Artifact, findings: Findings) -> None:
    for name in dtypes:
        dt = np.dtype(name)
        if dt.kind in "iu" and not dtype_holds_vocab(dt, vocab):
            findings.error(
                "dtype-vocab",
                f"{dtypes[name]} prefixes store tokens as {name}, which cannot hold a vocabulary of {vocab:,}",
                where=str(art.bin_dir),
                fix="re-tokenize the data with the model's tokenizer",
            )
        elif dt != optimal_dtype(vocab):
            findings.info(
                "dtype-vocab",
                f"{dtypes[name]} prefixes are {name} (Megatron's tools would use "
                f"{optimal_dtype(vocab).name} for {vocab:,})",
            )
        else:
            findings.info(
                "dtype-vocab", f"{dtypes[name]} prefixes are {name}, as Megatron stores {vocab:,} ids"
            )


def _group_stats(
    art: Artifact,
    chunks: list[Chunk],
    per_chunk: dict[str, tuple[LengthStats | None, int | None]],
    wanted: list[int],
) -> tuple[list[GroupStats], list[GroupStats], GroupStats]:
    """Per language × tier, per tier and grand totals; longest tier first."""
    groups: dict[tuple[str, str], GroupStats] = {}
    tier_tot: dict[str, GroupStats] = {}
    total = GroupStats("*", "*")
    for c in chunks:
        stats, tokens = per_chunk.get(c.prefix, (None, None))
        lang, tier = c.language or "?", c.tier or "?"
        for g in (
            groups.setdefault((lang, tier), GroupStats(lang, tier)),
            tier_tot.setdefault(tier, GroupStats("*", tier)),
            total,
        ):
            g.add(c, stats, tokens, wanted)
    order = {t: i for i, t in enumerate(tier_order(art, tier_tot))}
    for g in [*groups.values(), *tier_tot.values(), total]:
        g.finish()
    return (
        sorted(groups.values(), key=lambda g: (order.get(g.tier, 99), g.language)),
        sorted(tier_tot.values(), key=lambda g: order.get(g.tier, 99)),
        total,
    )


def _build_info_facts(bi: BuildInfo | None) -> dict[str, Any] | None:
    if bi is None:
        return None
    return {
        "path": str(bi.path),
        "artifact_format": bi.artifact_format,
        "tokenizer_type": bi.tokenizer_type,
        "tokenizer_model": bi.tokenizer_model,
        "tokenizer_revision": bi.tokenizer_revision,
        "vocab_size": bi.vocab_size,
        "megatron_git_commit": bi.megatron_git_commit,
    }


def coverage_text(c: Coverage) -> str:
    return f"{c.token_share:.1%} ({c.documents_at_least:,} docs)"


__all__ = ["ArtifactReport", "Coverage", "GroupStats", "check_artifact", "coverage_text", "label"]
