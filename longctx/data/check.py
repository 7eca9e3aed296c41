"""`data check`: is this data fit for a long-context stage of this model?

For every prefix of a blend: index structure, dtype vs vocabulary, a full token scan (ids in range,
documents end in EOD), document lengths against the stage lengths, tokens against the stage budgets,
and the sidecar's tokenizer against the model's: the md5 of its model file(s) and its encoding
fingerprint (the ids the Megatron tokenizer type, options and HF config give for fixed probe texts).
Library entry: `check_datasets`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, overload

import numpy as np

from longctx.data.blend import Blend, BlendEntry, blend_from_prefixes, parse_blend
from longctx.data.doc_lengths import LengthStats, checked_lengths, label, length_stats
from longctx.data.indexed import (
    IndexInfo,
    dtype_holds_vocab,
    optimal_dtype,
    read_index,
    validate_index,
)
from longctx.data.scan import BLOCK_BYTES, ScanParams, ScanResult, scan_datasets
from longctx.data.sidecar import DatasetSidecar, read_sidecar, sidecar_path
from longctx.errors import DatasetError, TokenizerError
from longctx.report import Findings
from longctx.tokenizer import EncodingFingerprint, LoadedTokenizer, encoding_differences, load_tokenizer

Datasets = Blend | str | Sequence[str | os.PathLike[str]]
TokenizerArg = LoadedTokenizer | str | os.PathLike[str]  # a loaded tokenizer, or the path to load


@dataclasses.dataclass
class PrefixReport:
    prefix: str
    weight: float | None
    share: float | None  # normalised weight in the blend (by size for plain prefix lists)
    index: dict[str, Any] | None
    scan: ScanResult | None
    lengths: LengthStats | None
    sidecar: dict[str, Any] | None
    epochs: dict[str, float]  # stage -> epochs of this dataset that the stage's budget needs
    findings: Findings

    @property
    def ok(self) -> bool:
        return self.findings.ok


@dataclasses.dataclass
class DataReport:
    blend: dict[str, Any]
    tokenizer: dict[str, Any] | None
    vocab_size: int | None
    eod_id: int | None
    lengths: list[int]
    budgets: dict[str, int]
    prefixes: list[PrefixReport]
    findings: Findings  # blend-level
    total_tokens: int
    strict: bool

    @property
    def ok(self) -> bool:
        return self.findings.ok and all(p.ok for p in self.prefixes)

    def all_findings(self) -> Findings:
        out = Findings(self.findings)
        for p in self.prefixes:
            out.extend(p.findings)
        return out


def _as_blend(datasets: Datasets) -> Blend:
    if isinstance(datasets, Blend):
        return datasets
    if isinstance(datasets, str):
        return parse_blend(datasets, source="--data-path", check_exists=False)
    return blend_from_prefixes(list(datasets), check_exists=False)


@overload
def resolve_tokenizer(tokenizer: TokenizerArg) -> LoadedTokenizer: ...
@overload
def resolve_tokenizer(tokenizer: None) -> None: ...
def resolve_tokenizer(tokenizer: TokenizerArg | None) -> LoadedTokenizer | None:
    """The tokenizer a check compares against: a `LoadedTokenizer` as given, a path loaded, None kept."""
    if tokenizer is None:
        return None
    return tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(tokenizer)


@dataclasses.dataclass
class _Prepared:
    entry: BlendEntry
    info: IndexInfo | None
    sidecar: DatasetSidecar | None
    params: ScanParams
    findings: Findings
    scannable: bool


def check_datasets(
    datasets: Datasets,
    *,
    tokenizer: TokenizerArg | None = None,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    lengths: Sequence[int] = (),
    budgets: Mapping[str, int] | None = None,
    strict: bool = False,
    workers: int | None = None,
    progress: bool = True,
    scan: bool = True,
    block_bytes: int = BLOCK_BYTES,
) -> DataReport:
    """Check a blend (or prefixes) for a stage; `lengths` are stage sequence lengths, `budgets` maps
    stage names to token budgets. `tokenizer` is a path or `LoadedTokenizer`; without one, the
    vocabulary and EOD come from `vocab_size`/`eod_id` or else from each dataset's sidecar.
    Raises only for unusable arguments; every problem of the data is a finding.
    """
    blend = _as_blend(datasets)
    tok = resolve_tokenizer(tokenizer)
    vocab = vocab_size if vocab_size is not None else (tok.vocab_size if tok is not None else None)
    eod = eod_id if eod_id is not None else (tok.eod_id if tok is not None else None)
    bos = tok.bos_id if tok is not None else None
    budgets = _checked_budgets(budgets)
    wanted = checked_lengths(lengths)

    findings = Findings(blend.findings)
    if tok is None and vocab is None:
        findings.warning(
            "tokenizer",
            "no tokenizer given: token ids are checked against each dataset's sidecar, if any, and "
            "tokenizer identity is not verified",
            fix="pass --tokenizer PATH (the model's tokenizer)",
        )

    encoding = _encoding_of(tok, findings)
    entries = blend.entries
    n_workers = workers or min(os.cpu_count() or 1, 8)
    with ThreadPoolExecutor(max_workers=max(1, min(n_workers, len(entries) or 1))) as pool:
        prepared = list(pool.map(lambda e: _prepare(e, tok, encoding, vocab, eod, bos), entries))
    scanned = _scan_prepared(prepared, scan, workers, progress, block_bytes)
    reports = [_prefix_report(p, scanned.get(id(p)), wanted) for p in prepared]

    total = _budget_findings(blend, reports, budgets, findings)
    if strict:
        findings.escalate_warnings()
        for r in reports:
            r.findings.escalate_warnings()
    return DataReport(
        blend={
            "source": blend.source,
            "weighted": blend.weighted,
            "entries": [dataclasses.asdict(e) for e in blend.entries],
        },
        tokenizer=_tokenizer_facts(tok),
        vocab_size=vocab,
        eod_id=eod,
        lengths=wanted,
        budgets=budgets,
        prefixes=reports,
        findings=findings,
        total_tokens=total,
        strict=strict,
    )


def _encoding_of(tok: LoadedTokenizer | None, findings: Findings) -> EncodingFingerprint | None:
    """The tokenizer's encoding fingerprint, computed once for every prefix (None without one)."""
    if tok is None:
        return None
    try:
        return tok.encoding_fingerprint()
    except TokenizerError as err:
        findings.error(
            "tokenizer-encoding",
            f"{tok.spec.tokenizer_type} cannot encode with the given tokenizer: {err.what}",
            where=err.where or str(tok.path),
            fix=err.fix,
        )
        return None


def _checked_budgets(budgets: Mapping[str, int] | None) -> dict[str, int]:
    out = dict(budgets or {})
    for stage, tokens in out.items():
        if tokens <= 0:
            raise DatasetError(f"token budget of stage {stage!r} must be positive, got {tokens}")
    return out


def _scan_prepared(
    prepared: list[_Prepared], scan: bool, workers: int | None, progress: bool, block_bytes: int
) -> dict[int, ScanResult]:
    """Full token scans of the prefixes that can be scanned, keyed by `id()` of their `_Prepared`."""
    to_scan = [p for p in prepared if scan and p.scannable and p.info is not None]
    if not to_scan:
        return {}
    results = scan_datasets(
        [p.info for p in to_scan],  # type: ignore[misc]
        [p.params for p in to_scan],
        workers=workers,
        progress=progress,
        block_bytes=block_bytes,
    )
    return {id(p): r for p, r in zip(to_scan, results, strict=True)}


def _prefix_report(p: _Prepared, res: ScanResult | None, wanted: list[int]) -> PrefixReport:
    if res is not None and p.info is not None:
        _scan_findings(p.info, p.params, res, p.findings)
    stats = None
    if p.info is not None and p.scannable:
        stats = length_stats(p.info, wanted)
        _length_findings(stats, p.findings, p.entry.prefix)
    return PrefixReport(
        prefix=p.entry.prefix,
        weight=p.entry.weight,
        share=None,
        index=_index_facts(p.info) if p.info is not None else None,
        scan=res,
        lengths=stats,
        sidecar=p.sidecar.model_dump(mode="json") if p.sidecar is not None else None,
        epochs={},
        findings=p.findings,
    )


def _tokenizer_facts(tok: LoadedTokenizer | None) -> dict[str, Any] | None:
    if tok is None:
        return None
    return {
        "path": str(tok.path),
        "kind": tok.kind,
        "md5": tok.md5,
        "vocab_size": tok.vocab_size,
        "eod_id": tok.eod_id,
    }


def _prepare(
    entry: BlendEntry,
    tok: LoadedTokenizer | None,
    encoding: EncodingFingerprint | None,
    vocab: int | None,
    eod: int | None,
    bos: int | None,
) -> _Prepared:
    f = Findings()
    prefix = entry.prefix
    try:
        info = read_index(prefix)
    except DatasetError as err:
        f.error(getattr(err, "code", "index"), err.what, where=err.where, fix=err.fix)
        return _Prepared(entry, None, None, ScanParams(), f, False)
    structural = validate_index(info)
    f.extend(structural)
    scannable = not any(
        x.level == "error" and x.code in ("bin-size", "pointers", "lengths", "doc-indices", "dtype")
        for x in structural
    )

    try:
        sidecar = read_sidecar(prefix)
    except DatasetError as err:
        f.error("sidecar", err.what, where=err.where, fix=err.fix)
        sidecar = None
    else:
        _sidecar_findings(info, sidecar, tok, encoding, vocab, eod, f)
    if sidecar is not None:  # fall back on what the sidecar recorded when nothing else is known
        vocab = vocab if vocab is not None else sidecar.tokenizer.vocab_size
        eod = eod if eod is not None else sidecar.tokenizer.eod_id
        bos = bos if bos is not None else sidecar.tokenizer.bos_id

    if vocab is not None and info.dtype.kind in "iu":
        if not dtype_holds_vocab(info.dtype, vocab):
            f.error(
                "dtype-vocab",
                f"token dtype {info.dtype.name} cannot hold a vocabulary of {vocab} (largest id {vocab - 1}; "
                f"{info.dtype.name} holds up to {np.iinfo(info.dtype).max})",
                where=prefix,
                fix=f"re-tokenize: Megatron stores vocabularies of {vocab} as {optimal_dtype(vocab).name}",
            )
        elif info.dtype != optimal_dtype(vocab):
            f.info(
                "dtype-vocab",
                f"token dtype {info.dtype.name} for a vocabulary of {vocab} (Megatron's tools "
                f"would use {optimal_dtype(vocab).name})",
                where=prefix,
            )
    elif vocab is None:
        f.warning(
            "vocab",
            "no vocabulary size known: token ids are not range-checked",
            where=prefix,
            fix="pass --tokenizer PATH",
        )
    return _Prepared(entry, info, sidecar, ScanParams(vocab, eod, bos), f, scannable)


def _sidecar_findings(
    info: IndexInfo,
    sc: DatasetSidecar | None,
    tok: LoadedTokenizer | None,
    encoding: EncodingFingerprint | None,
    vocab: int | None,
    eod: int | None,
    f: Findings,
) -> None:
    where = str(sidecar_path(info.prefix))
    if sc is None:
        f.warning(
            "sidecar",
            f"no sidecar {Path(where).name}: nothing records which tokenizer made this dataset",
            where=info.prefix,
            fix="if you know it was made with the model's tokenizer: longctx data fingerprint PREFIX --tokenizer PATH",
        )
        return
    if tok is not None and sc.tokenizer.md5 != tok.md5:
        f.error(
            "sidecar-md5",
            f"dataset was tokenized with another tokenizer: sidecar md5 of {sc.tokenizer.md5_of} differs "
            "from the given tokenizer's",
            where=where,
            expected=tok.md5,
            found=sc.tokenizer.md5,
            fix="re-tokenize the data with the model's tokenizer (longctx data tokenize)",
        )
    if encoding is not None:
        _encoding_findings(sc, encoding, where, f)
    if vocab is not None and sc.tokenizer.vocab_size != vocab:
        f.error(
            "sidecar-vocab",
            "sidecar vocab size differs from the tokenizer's",
            where=where,
            expected=vocab,
            found=sc.tokenizer.vocab_size,
        )
    if eod is not None and sc.tokenizer.eod_id is not None and sc.tokenizer.eod_id != eod:
        f.error(
            "sidecar-eod",
            "sidecar EOD id differs from the tokenizer's",
            where=where,
            expected=eod,
            found=sc.tokenizer.eod_id,
        )
    recorded = {"documents": sc.documents, "tokens": sc.tokens, "dtype": sc.dtype}
    actual = {"documents": info.documents, "tokens": info.tokens, "dtype": info.dtype.name}
    for key in recorded:
        if recorded[key] != actual[key]:
            f.error(
                "sidecar-counts",
                f"sidecar records {key} = {recorded[key]}, the .idx has {actual[key]}: "
                "the dataset changed after it was made",
                where=where,
                expected=recorded[key],
                found=actual[key],
                fix="re-create the dataset, or its sidecar with `longctx data fingerprint`",
            )
    if tok is not None and not any(x.code.startswith("sidecar-") for x in f):
        f.info("sidecar", f"sidecar md5 and encoding match the tokenizer ({tok.md5})", where=where)


def _encoding_findings(sc: DatasetSidecar, mine: EncodingFingerprint, where: str, f: Findings) -> None:
    theirs = sc.tokenizer.encoding
    if theirs is None:
        f.warning(
            "sidecar-encoding",
            "the sidecar records no encoding fingerprint: how the text became ids (Megatron tokenizer type, "
            "HF config, library) is not verified",
            where=where,
            fix="re-tokenize with `longctx data tokenize`; for data made elsewhere with this tokenizer: "
            "`longctx data fingerprint PREFIX --tokenizer PATH --force`",
        )
        return
    diffs = encoding_differences(mine, theirs)
    if diffs:
        f.error(
            "sidecar-encoding",
            "dataset was encoded differently from how the given tokenizer encodes: " + "; ".join(diffs),
            where=where,
            expected=f"{mine.describe()} digest {mine.digest[:16]}",
            found=f"{theirs.describe()} digest {theirs.digest[:16]}",
            fix="re-tokenize the data with the model's tokenizer directory and type (longctx data tokenize "
            f"-t TOKENIZER {' '.join(mine.spec().megatron_flags())}), or check with the type the data was "
            "made with (--tokenizer-type …)",
        )


def _token_to_document(info: IndexInfo, token: int) -> int:
    seq = int(np.searchsorted(info.sequence_pointers, token * info.itemsize, "right")) - 1
    return int(np.searchsorted(info.document_indices, seq, "right")) - 1


def _scan_findings(info: IndexInfo, params: ScanParams, res: ScanResult, f: Findings) -> None:
    where = str(info.bin_path)
    if res.out_of_range:
        pos, value = res.first_out_of_range or (0, 0)
        f.error(
            "token-range",
            f"{res.out_of_range} token ids outside 0..{params.vocab_size - 1} "  # type: ignore[operator]
            f"(vocab size {params.vocab_size}); "
            f"first: id {value} at token {pos} (document {_token_to_document(info, pos)})",
            where=where,
            expected=f"< {params.vocab_size}",
            found=res.max_id if value >= 0 else res.min_id,
            fix="the data was tokenized with a larger vocabulary (another tokenizer); re-tokenize it",
        )
    elif params.vocab_size is not None:
        f.info("token-range", f"max token id {res.max_id} < vocab size {params.vocab_size}", where=where)
    if params.eod_id is not None:
        docs = info.documents
        if res.documents_without_eod:
            f.error(
                "eod",
                f"{res.documents_without_eod} of {docs} documents do not end with EOD id {params.eod_id} "
                f"(first: document {res.first_document_without_eod}); EOD tokens in the data: {res.eod_count}",
                where=where,
                expected=docs,
                found=docs - res.documents_without_eod,
                fix="re-tokenize with EOD appended (Megatron: --append-eod; longctx data tokenize always does)",
            )
        elif res.eod_count > docs:
            f.warning(
                "eod",
                f"{res.eod_count} EOD tokens for {docs} documents: some documents hold several (concatenated "
                "documents attend to each other within a sample)",
                where=where,
            )
        else:
            f.info("eod", f"all {docs} documents end with EOD id {params.eod_id}", where=where)
    if params.bos_id is not None and info.documents:
        share = res.documents_starting_with_bos / info.documents
        f.info("bos", f"{share:.1%} of documents start with BOS id {params.bos_id}", where=where)


def _length_findings(stats: LengthStats, f: Findings, prefix: str) -> None:
    for cov in stats.coverage:
        if cov.documents_at_least == 0:
            f.warning(
                "long-docs",
                f"no document has {label(cov.length)} tokens or more (longest: {stats.max_length}): every "
                f"{label(cov.length)} sample is stitched from shorter documents",
                where=prefix,
                fix="add long documents for this stage (books, code repositories, long web pages)",
            )
        else:
            f.info(
                "long-docs",
                f"{cov.token_share:.1%} of tokens sit in documents ≥ {label(cov.length)}; "
                f"{cov.single_document_samples} single-document samples, {cov.packed_samples} packed samples",
                where=prefix,
            )


def _budget_findings(
    blend: Blend, reports: list[PrefixReport], budgets: dict[str, int], findings: Findings
) -> int:
    usable = [r for r in reports if r.index is not None and r.index["tokens"] > 0]
    total = sum(r.index["tokens"] for r in usable)  # type: ignore[index]
    if not usable:
        return total
    if blend.weighted:
        wsum = sum(r.weight or 0.0 for r in usable if (r.weight or 0) > 0)
        for r in usable:
            r.share = (r.weight / wsum) if wsum > 0 and r.weight and r.weight > 0 else 0.0
    else:
        for r in usable:
            r.share = r.index["tokens"] / total  # type: ignore[index]
    for stage, budget in budgets.items():
        worst = 0.0
        for r in usable:
            need = budget * (r.share or 0.0)
            epochs = need / r.index["tokens"]  # type: ignore[index]
            r.epochs[stage] = epochs
            worst = max(worst, epochs)
            if epochs > 1:
                r.findings.warning(
                    "epochs",
                    f"stage {stage} needs {epochs:.2f} epochs of this dataset ({need:,.0f} tokens of its "
                    f"{r.index['tokens']:,}: budget {budget:,} × share {r.share:.3f})",  # type: ignore[index]
                    where=r.prefix,
                    fix="add data, lower this dataset's weight, or accept repeated data",
                )
        level = findings.warning if worst > 1 else findings.info
        level(
            "epochs",
            f"stage {stage}: budget {budget:,} tokens over {total:,} available; up to {worst:.2f} "
            "epochs of a dataset",
        )
    return total


def _index_facts(info: IndexInfo) -> dict[str, Any]:
    return {
        "dtype": info.dtype.name,
        "dtype_code": info.dtype_code,
        "documents": info.documents,
        "sequences": info.sequence_count,
        "tokens": info.tokens,
        "bin_bytes": info.bin_size,
        "idx_bytes": info.idx_size,
        "multimodal": info.multimodal,
    }
