"""Megatron indexed datasets: read and validate, scan, blends, sidecars, tokenize, check.

Public API::

    read_index(prefix) -> IndexInfo                      # header facts + memory-mapped arrays, no .bin read
    validate_index(info) -> Findings
    parse_blend(words, source=) -> Blend                 # "W1 P1 W2 P2 …" or "P1 P2 …"
    read_data_args(path) -> Blend
    read_sidecar(prefix) / write_sidecar(prefix, sidecar)
    tokenize_jsonl(inputs, tokenizer, output_prefix, workers=, force=) -> DatasetSidecar
    check_datasets(prefixes_or_blend, tokenizer=, lengths=, budgets=, strict=) -> DataReport
    fingerprint_dataset(prefix, tokenizer, force=) -> DatasetSidecar
"""

from longctx.data.blend import Blend, BlendEntry, blend_from_prefixes, parse_blend, read_data_args
from longctx.data.check import DataReport, PrefixReport, check_datasets
from longctx.data.doc_lengths import LengthCoverage, LengthStats, length_stats
from longctx.data.fingerprint import fingerprint_dataset
from longctx.data.indexed import (
    DTYPE_CODES,
    IndexInfo,
    bin_path,
    dtype_holds_vocab,
    idx_path,
    optimal_dtype,
    read_index,
    validate_index,
)
from longctx.data.scan import ScanParams, ScanResult, scan_datasets
from longctx.data.sidecar import DatasetSidecar, read_sidecar, sidecar_path, write_sidecar
from longctx.data.tokenize import tokenize_jsonl

__all__ = [
    "DTYPE_CODES",
    "Blend",
    "BlendEntry",
    "DataReport",
    "DatasetSidecar",
    "IndexInfo",
    "LengthCoverage",
    "LengthStats",
    "PrefixReport",
    "ScanParams",
    "ScanResult",
    "bin_path",
    "blend_from_prefixes",
    "check_datasets",
    "dtype_holds_vocab",
    "fingerprint_dataset",
    "idx_path",
    "length_stats",
    "optimal_dtype",
    "parse_blend",
    "read_data_args",
    "read_index",
    "read_sidecar",
    "scan_datasets",
    "sidecar_path",
    "tokenize_jsonl",
    "validate_index",
    "write_sidecar",
]
