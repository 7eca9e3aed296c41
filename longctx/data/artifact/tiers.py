"""Stage data from length tiers: a plan's tier mix → the exact weighted blend, its data-args file, its supply.

A tier mix says: take these tiers of an artifact with these weights, over these languages (or all),
languages tempered by size. Within each tier, language i with bin bytes b_i gets

    p_i = b_i / Σ b          w_i ∝ p_i^α (α None: w_i = p_i)          w_i = max(w_i, floor)          renormalise

(the producer's mix rule), and a language's chunks share its weight by their bin bytes. A prefix's
blend weight is tier weight × language weight × chunk share; the weights sum to 1. Sizes come from
the manifests, so a blend can be computed from an artifact holding only its manifests; the data
files are needed to train and to check, not to plan.

`stage_supply` answers whether the blend can fill the stage: sequences of the stage length it holds
before any dataset repeats vs the sequences the stage's token budget needs, the share of sampled
tokens that sit in documents at least as long as the stage, and the tiers that hold no such document.
Exact with the `.idx` files (index-only reads), estimated from manifests and tier bounds without.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longctx.data.artifact.chunk_layout import DEFAULT_REPO_ID, Artifact, Chunk, TierBounds
from longctx.data.blend import Blend, BlendEntry
from longctx.data.doc_lengths import label
from longctx.data.index_scan import scan_indexes
from longctx.errors import DatasetError
from longctx.report import Findings

DATA_ARGS_FILE = "data_args.txt"
DATA_ARGS_INFO = "data_args.json"
# a tier holding no document as long as the stage is expected for short-context replay; above this
# share of the blend it is probably a mistake
SHORT_TIER_WARN_SHARE = 0.25


def tempered_weights(sizes: Mapping[str, float], alpha: float | None, floor: float = 0.0) -> dict[str, float]:
    """Size-tempered weights summing to 1: p = s/Σs, w ∝ p^α (None: p), w = max(w, floor), renormalised."""
    total = float(sum(sizes.values()))
    if total <= 0:
        raise ValueError("tempered_weights needs at least one positive size")
    probs = {k: v / total for k, v in sizes.items() if v > 0}
    raw = dict(probs) if alpha is None else {k: p**alpha for k, p in probs.items()}
    s = sum(raw.values())
    w = {k: v / s for k, v in raw.items()}
    if floor > 0:
        w = {k: max(v, floor) for k, v in w.items()}
        s = sum(w.values())
        w = {k: v / s for k, v in w.items()}
    return w


@dataclasses.dataclass
class TierShare:
    tier: str
    weight: float  # of the whole blend
    bounds: TierBounds | None
    languages: dict[str, float]  # language → weight within the tier (sums to 1)
    language_bytes: dict[str, int]
    chunks: int
    bin_bytes: int


@dataclasses.dataclass
class TierBlend:
    artifact: Artifact
    entries: list[tuple[Chunk, float]]  # weights sum to 1
    tiers: list[TierShare]
    alpha: float | None
    floor: float
    missing_bin: int  # chunks of the blend whose .bin is not here
    missing_idx: int
    findings: Findings

    @property
    def manifest_only(self) -> bool:
        return self.missing_bin > 0

    def to_blend(self, source: str) -> Blend:
        entries = [BlendEntry(c.prefix, w) for c, w in self.entries]
        return Blend(entries, True, source, Findings(self.findings))

    def data_args_text(self) -> str:
        """Megatron --data-args-path content: one 'WEIGHT PREFIX' pair per line, plain decimals."""
        return "".join(f"{weight_text(w)} {c.prefix}\n" for c, w in self.entries)

    def summary(self) -> dict[str, Any]:
        art = self.artifact
        return {
            "artifact": str(art.root),
            "run": art.run,
            "alpha": self.alpha,
            "floor": self.floor,
            "prefixes": len(self.entries),
            "missing_bin": self.missing_bin,
            "missing_idx": self.missing_idx,
            "build_info": None
            if art.build_info is None
            else {
                "path": str(art.build_info.path),
                "tokenizer_model": art.build_info.tokenizer_model,
                "tokenizer_type": art.build_info.tokenizer_type,
                "vocab_size": art.build_info.vocab_size,
            },
            "tiers": [
                {
                    "tier": t.tier,
                    "weight": t.weight,
                    "bounds": None if t.bounds is None else [t.bounds.min, t.bounds.max],
                    "chunks": t.chunks,
                    "bin_bytes": t.bin_bytes,
                    "languages": {k: round(v, 8) for k, v in t.languages.items()},
                }
                for t in self.tiers
            ],
        }


def weight_text(w: float) -> str:
    """A weight as Megatron reads it, positional (never exponent notation), shortest exact form."""
    return np.format_float_positional(w, trim="-")


def _chunk_size(c: Chunk) -> int:
    if c.bin_bytes is not None:
        return c.bin_bytes
    if c.has_bin:
        return c.bin_path.stat().st_size
    raise DatasetError(
        f"no size known for chunk {c.name}: its manifests record no bin_bytes and its .bin is not here",
        where=c.prefix,
        fix="fetch the artifact's manifests (longctx data fetch … --manifests-only) or its data",
    )


def tier_blend(
    art: Artifact,
    tiers: Mapping[str, float],
    *,
    languages: Sequence[str] | None = None,
    alpha: float | None = None,
    floor: float = 0.0,
) -> TierBlend:
    """The weighted blend of a tier mix over an artifact (see the module docstring)."""
    used = _used_tier_weights(art, tiers)
    chunks = art.select(languages, list(tiers))
    findings = Findings()
    total_w = sum(used.values())
    shares: list[TierShare] = []
    entries: list[tuple[Chunk, float]] = []
    for tier in tiers:
        if tier not in used:
            findings.info("tier-zero", f"tier {tier} has weight 0 and is left out")
            continue
        share = _tier_share(
            art, tier, used[tier] / total_w, chunks, languages, alpha, floor, entries, findings
        )
        shares.append(share)
    missing_bin = sum(1 for c, _ in entries if not c.has_bin)
    missing_idx = sum(1 for c, _ in entries if not c.has_idx)
    if missing_bin:
        findings.warning(
            "manifest-only",
            f"{missing_bin} of {len(entries)} prefixes of the blend are not downloaded (the blend comes from the "
            "manifests): the stage cannot train until they are",
            where=str(art.run_root),
            fix=fetch_hint(art, list(tiers), languages),
        )
    return TierBlend(art, entries, shares, alpha, floor, missing_bin, missing_idx, findings)


def _used_tier_weights(art: Artifact, tiers: Mapping[str, float]) -> dict[str, float]:
    """The positive tier weights; refuses an empty mix, bad weights and a mix of zeros."""
    if not tiers:
        raise DatasetError("the tier mix names no tiers", fix="give tiers = { NAME = WEIGHT, … }")
    bad = {
        t: w for t, w in tiers.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0)
    }
    if bad:
        raise DatasetError(
            f"tier weights must be non-negative numbers: {bad}",
            where=str(art.root),
            fix="fix the tier weights",
        )
    used = {t: float(w) for t, w in tiers.items() if w > 0}
    if not used:
        raise DatasetError(
            "every tier weight is zero", where=str(art.root), fix="give at least one tier a weight"
        )
    return used


def _tier_share(
    art: Artifact,
    tier: str,
    tw: float,
    chunks: list[Chunk],
    languages: Sequence[str] | None,
    alpha: float | None,
    floor: float,
    entries: list[tuple[Chunk, float]],
    findings: Findings,
) -> TierShare:
    """One tier of weight `tw`: its languages tempered by size, its chunks' weights appended to `entries`."""
    in_tier = [c for c in chunks if c.tier == tier and c.language]
    by_lang: dict[str, list[Chunk]] = {}
    for c in in_tier:
        by_lang.setdefault(c.language, []).append(c)  # type: ignore[arg-type]
    if not by_lang:
        raise DatasetError(
            f"tier {tier} has no chunks for the chosen languages ({', '.join(languages or [])})",
            where=str(art.run_root),
            fix="drop the tier or choose other languages",
        )
    lang_bytes = {lang: sum(_chunk_size(c) for c in cs) for lang, cs in by_lang.items()}
    if sum(lang_bytes.values()) <= 0:
        raise DatasetError(f"tier {tier} is empty (0 bytes)", where=str(art.run_root), fix="drop the tier")
    lw = tempered_weights(lang_bytes, alpha, floor)
    if languages:
        absent = [x for x in languages if x not in by_lang]
        if absent:
            findings.info(
                "tier-languages",
                f"tier {tier} has no chunks for {', '.join(absent)}",
                where=str(art.run_root),
            )
    for lang in sorted(lw, key=lambda k: (-lw[k], k)):
        cs = sorted(by_lang[lang], key=lambda c: c.name)
        lb = lang_bytes[lang]
        for c in cs:
            share = _chunk_size(c) / lb if lb else 1.0 / len(cs)
            if share > 0:
                entries.append((c, tw * lw[lang] * share))
    return TierShare(
        tier=tier,
        weight=tw,
        bounds=art.tiers.get(tier),
        languages=dict(sorted(lw.items(), key=lambda kv: (-kv[1], kv[0]))),
        language_bytes=dict(sorted(lang_bytes.items())),
        chunks=len(in_tier),
        bin_bytes=sum(lang_bytes.values()),
    )


def fetch_hint(
    art: Artifact | None,
    tiers: Sequence[str],
    languages: Sequence[str] | None,
    *,
    root: Path | None = None,
    run: str | None = None,
    extra: str = "",
) -> str:
    root = art.root if art is not None else root
    run = art.run if art is not None else run
    cmd = f"longctx data fetch {DEFAULT_REPO_ID} --into {root}"
    if run:
        cmd += f" --run {run}"
    if tiers:
        cmd += f" --tiers {','.join(tiers)}"
    if languages:
        cmd += f" --languages {','.join(languages)}"
    return cmd + extra


# -- supply ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class TierSupply:
    tier: str
    weight: float
    chunks: int
    indexed: int  # chunks whose figures come from their .idx (the rest: manifest estimates)
    tokens: int
    packed_sequences: int  # sequences of the stage length per epoch, as Megatron packs documents
    documents_at_least: int | None  # documents ≥ stage length (None: unknown without the .idx)
    tokens_in_documents_at_least: int | None
    single_document_sequences: int | None  # Σ ⌊len/L⌋: windows that lie inside one document
    longest_document: int | None
    sequences_needed: float
    epochs: float  # sequences needed / packed sequences
    worst_epochs: float  # the most any of its (language) groups must repeat
    worst_language: str | None

    @property
    def can_supply(self) -> bool | None:
        return None if self.documents_at_least is None else self.documents_at_least > 0


@dataclasses.dataclass
class SupplyReport:
    stage: str
    seq_length: int
    tokens: int  # the stage's token budget (realized)
    sequences_needed: int
    sequences_without_repeat: float | None  # before the first dataset of the blend starts a second epoch
    long_token_share: float | None  # of sampled tokens, the share in documents ≥ the stage length
    single_document_share: float | None  # of sampled sequences, ~ the share lying inside one document
    tiers: list[TierSupply]
    basis: str  # "index", "manifests" or "mixed"
    findings: Findings


def _estimated_tokens(art: Artifact, c: Chunk) -> int:
    """Tokens of a chunk without its .idx: bin bytes / token size. The size follows from the
    producer's source token count when there is one (≈ tokens, another tokenizer), else from the
    recorded vocabulary (Megatron's uint16 below 65,500, int32 above)."""
    size = c.bin_bytes if c.bin_bytes is not None else _chunk_size(c)
    if c.source_tokens:
        itemsize = 4 if size / c.source_tokens > 2 * math.sqrt(2) else 2
    else:
        vocab = art.build_info.vocab_size if art.build_info else None
        itemsize = 2 if vocab is not None and vocab < 65500 else 4
    return size // itemsize


def blend_supply(
    tb: TierBlend,
    *,
    stage: str,
    seq_length: int,
    tokens: int,
    use_index: bool = True,
    workers: int | None = None,
    progress: bool = False,
) -> SupplyReport:
    """How far the blend goes at this stage length and budget (see the module docstring)."""
    L = int(seq_length)
    needed = int(tokens // L)
    per_chunk = _chunk_rows(tb, L, use_index, workers, progress)
    findings = Findings()
    tiers = [_tier_supply(share, per_chunk, needed) for share in tb.tiers]
    ratios = [r.packed / r.weight for r in per_chunk if r.weight > 0]
    without_repeat = min(ratios) if ratios else None
    long_share = _weighted(per_chunk, lambda r: None if r.tok_long is None else r.tok_long / max(r.tokens, 1))
    single_share = _weighted(
        per_chunk,
        lambda r: None if r.single is None else min(r.single / r.packed, 1.0) if r.packed else 0.0,
    )
    bases = {r.basis for r in per_chunk}
    basis = bases.pop() if len(bases) == 1 else "mixed"
    report = SupplyReport(
        stage, L, tokens, needed, without_repeat, long_share, single_share, tiers, basis, findings
    )
    _supply_findings(report, tb, per_chunk)
    return report


@dataclasses.dataclass
class _Row:
    """One chunk of the blend at the stage length L: exact from its .idx, else estimated."""

    chunk: Chunk
    weight: float
    tokens: int
    packed: int  # sequences of L per epoch
    docs: int | None  # documents ≥ L (None: unknown)
    tok_long: int | None  # tokens in those documents
    single: int | None  # sequences of L inside one document
    longest: int | None
    basis: str  # "index" or "manifests"


def _chunk_rows(tb: TierBlend, L: int, use_index: bool, workers: int | None, progress: bool) -> list[_Row]:
    art = tb.artifact
    indexed = [c for c, _ in tb.entries if use_index and c.has_idx]
    summaries = {}
    if indexed:
        got, _ = scan_indexes(
            [c.prefix for c in indexed], [L], workers=workers, progress=progress, validate=False
        )
        summaries = {s.prefix: s for s in got}
    rows: list[_Row] = []
    for c, w in tb.entries:
        s = summaries.get(c.prefix)
        bounds = art.tiers.get(c.tier or "")
        if s is not None and s.lengths is not None:
            cov = s.lengths.coverage[0]
            row = _Row(
                c,
                w,
                tokens=s.tokens,
                packed=cov.packed_samples,
                docs=cov.documents_at_least,
                tok_long=cov.tokens_in_documents_at_least,
                single=cov.single_document_samples,
                longest=s.lengths.max_length,
                basis="index",
            )
        else:
            t = _estimated_tokens(art, c)
            row = _Row(
                c,
                w,
                tokens=t,
                packed=max(t - 1, 0) // L,
                docs=None,
                tok_long=None,
                single=None,
                longest=None,
                basis="manifests",
            )
            if bounds is not None and bounds.max is not None and bounds.max <= L:
                row.docs, row.tok_long, row.single = 0, 0, 0  # by its bounds no document reaches L
            elif bounds is not None and bounds.min >= L:
                row.docs, row.tok_long = c.documents, t  # every document is at least L (source tokens)
        rows.append(row)
    return rows


def _tier_supply(share: TierShare, per_chunk: list[_Row], needed: int) -> TierSupply:
    rows = [r for r in per_chunk if r.chunk.tier == share.tier]
    groups: dict[str, list[_Row]] = {}
    for r in rows:
        groups.setdefault(r.chunk.language, []).append(r)  # type: ignore[arg-type]
    worst, worst_lang = 0.0, None
    for lang, rs in groups.items():
        packed = sum(r.packed for r in rs)
        e = sum(r.weight for r in rs) * needed / packed if packed else math.inf
        if e > worst:
            worst, worst_lang = e, lang
    packed = sum(r.packed for r in rows)

    def total(key: str) -> int | None:
        vals = [getattr(r, key) for r in rows]
        return None if any(v is None for v in vals) else int(sum(vals))

    longest = [r.longest for r in rows if r.longest is not None]
    return TierSupply(
        tier=share.tier,
        weight=share.weight,
        chunks=len(rows),
        indexed=sum(1 for r in rows if r.basis == "index"),
        tokens=int(sum(r.tokens for r in rows)),
        packed_sequences=packed,
        documents_at_least=total("docs"),
        tokens_in_documents_at_least=total("tok_long"),
        single_document_sequences=total("single"),
        longest_document=max(longest) if longest and len(longest) == len(rows) else None,
        sequences_needed=share.weight * needed,
        epochs=share.weight * needed / packed if packed else math.inf,
        worst_epochs=worst,
        worst_language=worst_lang,
    )


def _weighted(rows: Iterable[_Row], value: Callable[[_Row], float | None]) -> float | None:
    acc = 0.0
    for r in rows:
        v = value(r)
        if v is None:
            return None
        acc += r.weight * v
    return acc


def _supply_findings(rep: SupplyReport, tb: TierBlend, rows: list[_Row]) -> None:
    f, L, where = rep.findings, rep.seq_length, str(tb.artifact.run_root)
    lab = label(L)
    head = (
        f"stage {rep.stage}: needs {rep.sequences_needed:,} sequences of {lab} ({rep.tokens:,} tokens); the blend "
        + (
            f"holds {rep.sequences_without_repeat:,.0f} before any dataset repeats"
            if rep.sequences_without_repeat is not None
            else "size is unknown"
        )
    )
    if rep.long_token_share is not None:
        head += f"; {rep.long_token_share:.1%} of sampled tokens sit in documents ≥ {lab}"
    if rep.single_document_share is not None:
        head += f", ~{rep.single_document_share:.1%} of sequences lie inside one document"
    f.info("supply", head, where=where)
    if rep.basis != "index":
        n = sum(1 for r in rows if r.basis == "manifests")
        f.info(
            "supply-estimate",
            f"{n} of {len(rows)} prefixes have no .idx here: their figures are estimates from the manifests "
            "(sizes, tier bounds in source tokens)",
            where=where,
            fix=fetch_hint(tb.artifact, [t.tier for t in tb.tiers], None, extra=" --idx-only"),
        )
    if rep.sequences_without_repeat is not None and rep.sequences_without_repeat < rep.sequences_needed:
        worst = sorted(rep.tiers, key=lambda t: -t.worst_epochs)
        detail = ", ".join(
            f"{t.worst_language} in {t.tier}: "
            + (
                f"{t.worst_epochs:.2f} epochs"
                if math.isfinite(t.worst_epochs)
                else f"less than one {lab} sequence"
            )
            for t in worst[:3]
            if t.worst_epochs > 1
        )
        f.warning(
            "supply-epochs",
            f"stage {rep.stage} repeats data: {rep.sequences_needed:,} sequences needed, "
            f"{rep.sequences_without_repeat:,.0f} before the first repeat ({detail or 'small prefixes'})",
            where=where,
            fix="lower alpha/floor (less upsampling of small languages), shift weight to larger tiers, or accept "
            "repeated epochs of the small ones",
        )
    known = [t for t in rep.tiers if t.can_supply is not None]
    for t in rep.tiers:
        if t.can_supply is False:
            longest = (
                f" (longest {t.longest_document:,})" if t.longest_document is not None else " (by its bounds)"
            )
            level = f.warning if t.weight > SHORT_TIER_WARN_SHARE else f.info
            level(
                "tier-short",
                f"tier {t.tier} holds no document of {lab} tokens or more{longest}: its {t.weight:.0%} of the stage "
                "are sequences packed from shorter documents",
                where=where,
                fix=None
                if t.weight <= SHORT_TIER_WARN_SHARE
                else "give this tier less weight at this length",
            )
        elif t.can_supply is None:
            f.info(
                "tier-unknown",
                f"tier {t.tier}: how many documents reach {lab} is unknown without its .idx files",
                where=where,
                fix=fetch_hint(tb.artifact, [t.tier], None, extra=" --idx-only"),
            )
    if known and len(known) == len(rep.tiers) and not any(t.can_supply for t in known):
        f.error(
            "supply-none",
            f"no tier of the blend holds a document of {lab} tokens or more: every sequence of stage "
            f"{rep.stage} is stitched from shorter documents",
            where=where,
            fix="add a tier of long documents (e.g. 16k_plus, 64_128k) to this stage's tier mix",
        )


__all__ = [
    "SupplyReport",
    "TierBlend",
    "TierShare",
    "TierSupply",
    "blend_supply",
    "fetch_hint",
    "tempered_weights",
    "tier_blend",
    "weight_text",
]
