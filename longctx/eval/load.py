"""A torch_dist checkpoint → a megatron-core GPTModel ready for evaluation.

`checkpoint_info(path)` reads what the model needs (architecture, RoPE base, trained length, padded
vocabulary) from the checkpoint's metadata and saved args, without tensors. `load_model(info, …)`,
inside `longctx.mcore.parallel.eval_parallel(cp)`, builds the GPTModel with longctx's attention (so
long inputs never materialise an S×S mask, and CP > 1 runs the ring) and loads the weights (TP = 1;
dist_checkpointing reshards checkpoints saved at any TP).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from longctx.arch import ModelArch
from longctx.checkpoint.inspect import CheckpointReport, inspect_checkpoint
from longctx.errors import CheckpointError, EvalError
from longctx.mcore.checkpoint import load_model_weights
from longctx.mcore.model import GPTModel, ModelSettings, build_gpt_model
from longctx.mcore.parallel import EvalParallel
from longctx.mcore.stored_layout import read_layout
from longctx.objective import ObjectiveKind

MEGATRON_DEFAULT_ROTARY_BASE = 10000


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What evaluation needs to know about a checkpoint, from its metadata and saved args."""

    requested: str
    path: str  # the iteration (or release / flat) directory actually read
    iteration: int | None
    arch: ModelArch
    rotary_base: int
    rotary_base_source: str  # "args" | "given" | "megatron default"
    seq_length: int | None
    max_position: int | None  # max_position_embeddings (else seq_length): the trained window
    padded_vocab_size: int
    vocab_size: int | None
    tokenizer_md5: str | None
    stage: str | None
    bf16: bool  # trained in bf16 (args.bf16)
    identity: str  # changes when the checkpoint's contents do (for result caches)
    # what it was trained as: "ar" (causal, next token) or a diffusion objective (bidirectional)
    objective: ObjectiveKind = "ar"
    output_vocab_size: int | None = None  # output-layer rows when not padded_vocab_size
    mask_id: int | None = None  # a masked-diffusion model's [MASK] id

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["arch"] = self.arch.model_dump()
        return out


def _identity(directory: Path, iteration: int | None) -> str:
    h = hashlib.sha256(f"{directory.resolve()}|{iteration}|".encode())
    meta = directory / ".metadata"
    if meta.is_file():
        h.update(meta.read_bytes())
    common = directory / "common.pt"
    if common.is_file():
        st = common.stat()
        h.update(f"common:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _unsupported_rope(args: dict[str, Any], where: str) -> None:
    kind = args.get("position_embedding_type", "rope")
    if kind not in (None, "rope"):
        raise EvalError(
            f"position_embedding_type is {kind!r}; evaluation builds RoPE models only",
            where=where,
            fix="evaluate a RoPE checkpoint (the long-context ladder extends RoPE models)",
        )
    if args.get("use_rope_scaling") or args.get("rotary_seq_len_interpolation_factor") not in (None, 1, 1.0):
        raise EvalError(
            "the checkpoint was trained with RoPE scaling (use_rope_scaling / "
            "rotary_seq_len_interpolation_factor), which the evaluation model does not apply",
            where=where,
            fix="evaluate checkpoints trained with a plain rotary base (what longctx stages produce)",
        )
    if args.get("rotary_interleaved"):
        raise EvalError(
            "interleaved RoPE is not supported", where=where, fix="evaluate a non-interleaved checkpoint"
        )


def checkpoint_info(path: str | os.PathLike[str], *, rotary_base: int | None = None) -> CheckpointInfo:
    """Describe the checkpoint at PATH (a save dir with a tracker, or an iter_N / release dir).

    `rotary_base` overrides the saved base (to evaluate a model with another base than it was trained
    with); otherwise the saved `args.rotary_base` is used, or Megatron's default 10000 when absent.
    """
    if rotary_base is not None and rotary_base <= 1:
        # a base of 1 or less gives every pair the same (or a NaN) frequency: losses would be NaN
        raise EvalError(
            f"--rotary-base must be above 1, got {rotary_base}",
            where="--rotary-base",
            fix="give a RoPE base such as 10000, or leave it out to use the checkpoint's",
        )
    p = Path(path)
    if not p.exists():
        raise EvalError(
            "checkpoint not found",
            where=str(p),
            fix="pass a save dir (with latest_checkpointed_iteration.txt) or an iter_NNNNNNN directory",
        )
    try:
        report = inspect_checkpoint(p)
    except CheckpointError as err:
        raise EvalError(
            f"cannot read the checkpoint: {err.what}", where=err.where or str(p), fix=err.fix
        ) from err
    resolved = report.resolved
    directory = resolved.path if resolved is not None else None
    if directory is None:
        raise EvalError(
            "the checkpoint is inside an archive; evaluation loads tensors from a directory",
            where=str(p),
            fix="extract the archive first (longctx ckpt adopt) and pass the extracted directory",
        )
    args = report.args or {}
    where = str(directory)
    _unsupported_rope(args, where)
    try:
        arch = report.to_model_arch()
    except CheckpointError as err:
        raise EvalError(f"cannot build the model: {err.what}", where=where, fix=err.fix) from err
    padded = report.padded_vocab_size or args.get("padded_vocab_size")
    if not padded:
        raise EvalError("the checkpoint does not give its (padded) vocabulary size", where=where)
    if rotary_base is not None:
        base, source = int(rotary_base), "given"
    elif args.get("rotary_base") is not None:
        base, source = int(args["rotary_base"]), "args"
    else:
        base, source = MEGATRON_DEFAULT_ROTARY_BASE, "megatron default"
    seq = args.get("seq_length")
    max_pos = args.get("max_position_embeddings") or seq
    objective, out_rows = _objective(report, int(padded))
    return CheckpointInfo(
        requested=str(p),
        path=str(directory),
        iteration=report.iteration,
        arch=arch,
        rotary_base=base,
        rotary_base_source=source,
        seq_length=int(seq) if seq else None,
        max_position=int(max_pos) if max_pos else None,
        padded_vocab_size=int(padded),
        vocab_size=int(args["vocab_size"]) if args.get("vocab_size") else None,
        tokenizer_md5=args.get("longctx_tokenizer_md5"),
        stage=args.get("longctx_stage"),
        bf16=bool(args.get("bf16")),
        identity=_identity(directory, report.iteration),
        objective=objective,
        output_vocab_size=out_rows,
        mask_id=report.family.mask_id,
    )


def _objective(report: CheckpointReport, padded: int) -> tuple[ObjectiveKind, int | None]:
    """What the checkpoint was trained as (its family, which reads longctx's saved objective; a
    uniform-state model's objective is not in its weights, and UDLM-style corruption is the one
    longctx knows), and its output rows when they differ from the input's."""
    fam = report.family
    kind: ObjectiveKind = fam.objective or ("udm" if fam.family == "UDM" else "ar")
    out = fam.output_vocab_rows
    return kind, (out if out is not None and out != padded else None)


# -- the model -------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoadedModel:
    model: GPTModel  # in eval mode
    info: CheckpointInfo
    parallel: EvalParallel
    max_length: int  # the longest sequence it was built for (RoPE itself has no limit)


def load_model(
    info: CheckpointInfo, parallel: EvalParallel, *, max_length: int, dtype: torch.dtype | None = None
) -> LoadedModel:
    """Build the GPTModel for `info` (its arch, RoPE base, padded vocab; TP 1, CP of `parallel`)
    and load its weights. Must run inside `eval_parallel`.

    `dtype` defaults to float32 on CPU and to the training precision (bf16 when args.bf16) on GPU;
    log-softmax and the scores are computed in float32 either way."""
    if dtype is None:
        dtype = torch.bfloat16 if parallel.device.type == "cuda" and info.bf16 else torch.float32
    settings = ModelSettings(
        seq_length=max_length,
        rotary_base=info.rotary_base,
        padded_vocab_size=info.padded_vocab_size,
        context_parallel_size=parallel.cp,
        params_dtype=dtype,
        causal=info.objective == "ar",
        output_vocab_size=info.output_vocab_size,
    )
    # building initialises weights from torch's generator; keep the caller's random stream intact
    with torch.random.fork_rng(devices=[]):
        model = build_gpt_model(info.arch, settings)
    model.to(parallel.device)
    try:
        with warnings.catch_warnings():
            # torch.distributed.checkpoint warns about its own deprecated internals on every load
            warnings.simplefilter("ignore")
            load_model_weights(model, info.path, model_state=read_layout(info.path).model_state(model))
    except (RuntimeError, KeyError, ValueError) as err:
        raise EvalError(
            f"the weights do not fit the model built from the checkpoint's args: {err}",
            where=info.path,
            fix="check that the checkpoint is complete and its saved args describe it (longctx ckpt inspect)",
        ) from err
    model.eval()
    return LoadedModel(model=model, info=info, parallel=parallel, max_length=max_length)
