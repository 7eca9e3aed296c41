"""`longctx data check`'s dispatch: one tokenized artifact directory, or datasets given one way (prefixes,
a Megatron blend, a blend file), checked against the stages' lengths and token budgets.

    request = DataCheckRequest(prefixes=("data/books_text_document",), tokenizer=Path("tok"), lengths=(65536,))
    report = run_data_check(request)    # DataReport, or ArtifactReport for an artifact directory
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from longctx.data.artifact.check import ArtifactReport, check_artifact
from longctx.data.artifact.chunk_layout import looks_like_artifact
from longctx.data.blend import read_data_args
from longctx.data.check import DataReport, check_datasets
from longctx.errors import DatasetError
from longctx.tokenizer import EncodingSpec, load_tokenizer


@dataclasses.dataclass(frozen=True)
class DataCheckRequest:
    """What to check and against what. Exactly one of `prefixes`, `data_path`, `data_args_path` names the
    datasets; one prefix that is an artifact directory (mix/, manifests/, runs/) is checked as one."""

    prefixes: Sequence[str] = ()
    data_path: str | None = None
    """A Megatron blend: "W1 P1 W2 P2 …" or "P1 P2 …"."""
    data_args_path: Path | None = None
    """A file holding a blend (Megatron's --data-args-path)."""
    tokenizer: Path | None = None
    spec: EncodingSpec | None = None
    """How the tokenizer encodes (Megatron's --tokenizer-type and switches); None: its layout's default."""
    lengths: Sequence[int] = ()
    """Stage sequence lengths."""
    budgets: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Stage name → tokens it trains on (datasets only)."""
    vocab_size: int | None = None
    eod_id: int | None = None
    strict: bool = False
    scan: bool = True
    workers: int | None = None
    run: str | None = None
    """Artifact: the streamed run (runs/RUN)."""
    languages: Sequence[str] | None = None
    tiers: Sequence[str] | None = None
    index_only: bool = False
    tokenizer_manifest: Path | None = None

    def is_artifact(self) -> bool:
        one = len(self.prefixes) == 1 and self.data_path is None and self.data_args_path is None
        return one and looks_like_artifact(self.prefixes[0])

    def with_needs(self, lengths: Sequence[int], budgets: Mapping[str, int]) -> DataCheckRequest:
        """Add a plan's stage lengths and budgets (budgets given here win)."""
        return dataclasses.replace(
            self, lengths=sorted(set(self.lengths) | set(lengths)), budgets={**budgets, **self.budgets}
        )


def run_data_check(request: DataCheckRequest) -> DataReport | ArtifactReport:
    """Check an artifact directory or the datasets (see `check_artifact`, `check_datasets`); refuses options
    that do not apply and datasets given more than one way (DatasetError)."""
    r = request
    if r.is_artifact():
        return check_artifact(
            r.prefixes[0],
            run=r.run,
            languages=r.languages,
            tiers=r.tiers,
            tokenizer=r.tokenizer,
            manifest=r.tokenizer_manifest,
            vocab_size=r.vocab_size,
            eod_id=r.eod_id,
            lengths=list(r.lengths),
            index_only=r.index_only,
            workers=r.workers,
            strict=r.strict,
        )
    if r.index_only or r.run or r.languages or r.tiers:
        raise DatasetError(
            "--index-only, --run, --languages and --tiers apply to an artifact directory",
            fix="pass one artifact directory (with mix/, manifests/ or runs/), or use --no-scan for prefixes",
        )
    datasets = _datasets(r)
    if r.spec is not None and r.tokenizer is None:
        raise DatasetError(
            "--tokenizer-type needs --tokenizer", fix="pass --tokenizer PATH (the model's tokenizer)"
        )
    tok: Any = r.tokenizer if r.spec is None else load_tokenizer(r.tokenizer, spec=r.spec)  # type: ignore[arg-type]
    return check_datasets(
        datasets,
        tokenizer=tok,
        vocab_size=r.vocab_size,
        eod_id=r.eod_id,
        lengths=list(r.lengths),
        budgets=dict(r.budgets),
        strict=r.strict,
        workers=r.workers,
        scan=r.scan,
    )


def _datasets(r: DataCheckRequest) -> Any:
    sources = sum(
        x is not None and x != [] for x in (list(r.prefixes) or None, r.data_path, r.data_args_path)
    )
    if sources != 1:
        raise DatasetError(
            "give the datasets one way",
            fix="pass PREFIX arguments, or --data-path 'W P …', or --data-args-path FILE (exactly one)",
        )
    if r.data_args_path is not None:
        return read_data_args(r.data_args_path, check_exists=False)
    if r.data_path is not None:
        return r.data_path
    return list(r.prefixes)
