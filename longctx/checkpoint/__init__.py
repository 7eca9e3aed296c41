"""torch_dist checkpoints: layout, safe metadata reading, architecture inference, verify, adopt, download.

Public API::

    resolve_checkpoint(path) -> ResolvedCheckpoint      # save dir (tracker) → iter dir; iter/release/flat dir; .tar
    read_tracker(save_dir) -> Tracker | None            # .iteration, .release; garbage raises TrackerError
    complete_iterations(save_dir) -> list[int]          # iter dirs whose save finished (metadata.json present)
    inspect_checkpoint(path, head_dim=None) -> CheckpointReport   # .args .iteration .arch .padded_vocab_size
    verify_checkpoint(path, deep=False, manifest=None, write_manifest=None) -> VerifyReport  # .ok .findings
    adopt(src, into, iteration=None, mode="link", allow_copy=False) -> AdoptResult
    download(repo_id, into, revision=None, include=None, cache_dir=None, offline=False) -> DownloadResult
    compare(a, b=None, vocab_size=None) -> CompareReport
    infer_arch(shapes, args=None, head_dim=None) -> InferredArch  # .to_model_arch()

Nothing here imports torch at import time; reading `.metadata` and the common state does.
"""

from longctx.checkpoint.adopt import AdoptResult, adopt
from longctx.checkpoint.compare import CompareReport, compare
from longctx.checkpoint.download import DownloadResult, download
from longctx.checkpoint.infer_arch import InferredArch, infer_arch
from longctx.checkpoint.inspect import CheckpointReport, inspect_checkpoint
from longctx.checkpoint.save_layout import (
    TRACKER,
    ResolvedCheckpoint,
    Tracker,
    TrackerError,
    complete_iterations,
    iter_dir_name,
    read_tracker,
    resolve_checkpoint,
)
from longctx.checkpoint.verify import VerifyReport, verify_checkpoint

__all__ = [
    "TRACKER",
    "AdoptResult",
    "CheckpointReport",
    "CompareReport",
    "DownloadResult",
    "InferredArch",
    "ResolvedCheckpoint",
    "Tracker",
    "TrackerError",
    "VerifyReport",
    "adopt",
    "compare",
    "complete_iterations",
    "download",
    "infer_arch",
    "inspect_checkpoint",
    "iter_dir_name",
    "read_tracker",
    "resolve_checkpoint",
    "verify_checkpoint",
]
