"""`export_hf`: a torch_dist save of a plan's stage (or its base) → a Hugging Face model directory.

    config.json  generation_config.json  model.safetensors (or model-0000k-of-0000n + index)
    tokenizer files  longctx_export.json (where it came from: checkpoint, iteration, plan, stage, md5s)

Every check runs before anything is written: the output directory (absent or empty), the plan, the
checkpoint (complete, a directory, not a diffusion LM, an architecture that maps), the plan's
[model] against the checkpoint, the stage and its RoPE base and scaling (YaRN) against the saved
ones, the tokenizer against the manifest and the saved md5, the vocabulary against the embedding rows,
and the tensor plan (every model tensor mapped, every shape right). The files are then written into a
hidden sibling directory that becomes the output directory only when everything, including
transformers' reading of the config and the tokenizer, succeeded; on failure it is removed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from longctx import __version__
from longctx.arch import ModelArch
from longctx.checkpoint.inspect import CheckpointReport, inspect_checkpoint
from longctx.errors import CheckpointError, ExportError
from longctx.export.config import check_config, generation_config, hf_config
from longctx.export.family import HF_ARCHITECTURE, Family, choose_family, refuse_diffusion
from longctx.export.guards import check_encoding, read_region, refuse_out_inside, refuse_outside_files
from longctx.export.mapping import TensorPlan, build_plan
from longctx.export.reader import DcpReader
from longctx.export.stage import StageChoice, choose_stage
from longctx.export.tokenizer import TokenizerExport, check_identity, export_tokenizer
from longctx.export.writer import SafetensorsWriter
from longctx.plan.derive import ResolvedPlan, open_plan
from longctx.plan.stage_data import plan_tokenizer
from longctx.tokenizer import LoadedTokenizer, TokenizerManifest
from longctx.util.confine import check_output_dir
from longctx.util.fs import atomic_write_json
from longctx.util.progress import progress_bar

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' "5GB"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# architecture fields the plan's [model] must agree on with the checkpoint (shapes and saved args)
_ARCH_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "normalization", "swiglu", "qk_layernorm", "untie_embeddings_and_output_weights", "add_bias_linear",
    "add_qkv_bias",
)  # fmt: skip


@dataclasses.dataclass
class ExportReport:
    out: str
    architecture: str
    family: str
    checkpoint: str
    iteration: int | None
    plan: str
    stage: str
    stage_source: str
    rotary_base: int
    max_position_embeddings: int
    rope_parameters: dict[str, Any]  # as config.json has them (rope_type "default" or "yarn")
    vocab_size: int
    padded_vocab_size: int
    dtype: str
    tensors: int
    parameters: int
    weight_bytes: int
    files: list[str]
    shards: int
    largest_read_bytes: int
    tokenizer: TokenizerExport
    notes: list[str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, **dataclasses.asdict(self)}


@dataclasses.dataclass
class _Inputs:
    """Everything the export is checked to need, before anything is written."""

    rp: ResolvedPlan
    report: CheckpointReport
    directory: Path
    arch: ModelArch
    family: Family
    stage: StageChoice
    tokenizer: LoadedTokenizer
    manifest: TokenizerManifest
    reader: DcpReader
    plan: TensorPlan
    dtype: torch.dtype
    notes: list[str]


def _transformers_version() -> str:
    try:
        import transformers  # lazy: transformers loads slowly; only export needs it
    except ImportError:
        raise ExportError(
            "exporting to Hugging Face needs the transformers package, which is not installed",
            fix="reinstall longctx (transformers is one of its dependencies): pip install longctx",
        ) from None
    return str(transformers.__version__)


def _check_out(out: Path) -> None:
    check_output_dir(out, option="--out", what="the exported model")
    if out.exists() and not out.is_dir():
        raise ExportError(
            "the output path is a file", where=str(out), fix="give a new or empty directory as --out"
        )
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(
            "the output directory is not empty",
            where=str(out),
            fix="give a new or empty directory as --out (nothing is overwritten)",
        )


def _checkpoint(path: Path) -> tuple[CheckpointReport, Path]:
    try:
        report = inspect_checkpoint(path)
    except CheckpointError as err:
        raise ExportError(
            f"cannot read the checkpoint: {err.what}", where=err.where or str(path), fix=err.fix
        ) from err
    if not report.complete:
        raise ExportError(
            f"the checkpoint is incomplete: {report.incomplete_reason}",
            where=report.location,
            fix="export a complete save (longctx ckpt check PATH)",
        )
    directory = report.resolved.path if report.resolved is not None else None
    if directory is None:
        raise ExportError(
            "the checkpoint is inside an archive; the exporter reads tensors from a directory",
            where=str(path),
            fix="extract it first (longctx ckpt adopt ARCHIVE --into DIR) and export DIR",
        )
    return report, directory


def _arch(
    report: CheckpointReport, rp: ResolvedPlan, args: dict[str, Any], where: str, notes: list[str]
) -> tuple[ModelArch, Family]:
    """The checkpoint's architecture (shapes, saved args) and its transformers family; the plan's
    [model] must agree with it. What neither shapes nor args say (norm epsilon, rotary percent) comes
    from the plan."""
    try:
        arch = report.to_model_arch()
    except CheckpointError as err:
        raise ExportError(f"cannot tell the architecture: {err.what}", where=where, fix=err.fix) from err
    fill = {
        k: getattr(rp.arch, k) for k in ("norm_epsilon", "rotary_percent") if k not in report.arch.sources
    }
    if fill:
        arch = arch.model_copy(update=fill)
        notes.append(f"from the plan's [model] (the checkpoint's args do not say): {fill}")
    # what no transformers class computes is refused first: no plan could make it exportable
    family = choose_family(arch, report.arch, args, where)
    mine, plan = arch.normalized(), rp.arch.normalized()
    wrong = {
        k: (getattr(plan, k), getattr(mine, k))
        for k in (*_ARCH_FIELDS, "norm_epsilon", "rotary_percent")
        if getattr(plan, k) != getattr(mine, k)
    }
    if wrong:
        shown = "; ".join(f"{k}: plan {a!r}, checkpoint {b!r}" for k, (a, b) in wrong.items())
        raise ExportError(
            f"the plan's [model] is not this checkpoint's architecture: {shown}",
            where=where,
            fix="export with the plan this checkpoint was trained under",
        )
    return arch, family


def _dtype(name: str, report: CheckpointReport) -> torch.dtype:
    if name == "auto":
        weights = {k: v for k, v in report.dtypes.items() if k in DTYPES}
        return DTYPES[max(weights, key=lambda k: weights[k])] if weights else torch.float32
    if name not in DTYPES:
        raise ExportError(f"unknown dtype {name!r}", fix=f"use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def _inputs(
    checkpoint: Path, plan_path: Path, stage: str | None, dtype: str, run_dir: Path | None
) -> _Inputs:
    notes: list[str] = []
    rp = open_plan(plan_path, run_dir)
    if rp.objective.kind != "ar":
        raise ExportError(
            f"the plan trains {rp.objective.describe()}; a transformers causal LM (Qwen3/Llama) would compute "
            "another model (causal attention, next-token logits) from these weights",
            where=rp.where,
            fix="export only autoregressive plans; evaluate diffusion models with `longctx eval run`",
        )
    report, directory = _checkpoint(checkpoint)
    where = str(directory)
    refuse_outside_files(directory, Path(checkpoint))
    args = report.args or {}
    refuse_diffusion(report.index.tensors if report.index else (), args, where)
    arch, family = _arch(report, rp, args, where, notes)
    choice = choose_stage(rp, directory, args, stage)
    manifest = rp.tokenizer.manifest
    tok = plan_tokenizer(rp)  # encoding as the plan's Megatron tokenizer type does
    check_identity(tok, manifest, saved_md5=args.get("longctx_tokenizer_md5"), where=where)
    check_encoding(tok, manifest)
    rows = report.padded_vocab_size or 0
    if rows < tok.vocab_size:
        raise ExportError(
            f"the checkpoint's vocabulary has {rows} rows, fewer than the tokenizer's {tok.vocab_size} tokens",
            where=where,
            fix="export with the plan whose tokenizer trained this checkpoint",
        )
    reader = DcpReader(directory)
    tensor_plan = build_plan(reader, arch, family, tok.vocab_size, where=where)
    if args.get("rotary_base") is None:
        notes.append(f"the checkpoint's args do not record a rotary base; the {choice.name} base is used")
    return _Inputs(
        rp,
        report,
        directory,
        arch,
        family,
        choice,
        tok,
        manifest,
        reader,
        tensor_plan,
        _dtype(dtype, report),
        notes,
    )


def _write_weights(inp: _Inputs, staging: Path, max_shard_bytes: int) -> SafetensorsWriter:
    writer = SafetensorsWriter(staging, inp.plan.tensors, inp.dtype, max_shard_bytes)
    try:
        with progress_bar("export weights", writer.total_bytes, unit="bytes") as advance:
            for step in inp.plan.steps:
                region = read_region(inp.reader, step.read.key, step.read.offsets, step.read.sizes)
                for name, piece in step.split(region):
                    advance(writer.write(name, piece))
                del region
    except BaseException:
        writer.abort()
        raise
    return writer


def _provenance(inp: _Inputs, tok: TokenizerExport, checkpoint: Path) -> dict[str, Any]:
    return {
        "exported_by": f"longctx {__version__}",
        "checkpoint": str(inp.directory),
        "requested": str(checkpoint),
        "iteration": inp.report.iteration,
        "plan": inp.rp.where,
        "stage": dataclasses.asdict(inp.stage),
        "architecture": inp.arch.model_dump(),
        "padded_vocab_size": inp.report.padded_vocab_size,
        "tokenizer_md5": tok.md5,
        "tensors": {t.name: list(t.shape) for t in inp.plan.tensors},
    }


@dataclasses.dataclass(frozen=True)
class _Written:
    """What the export wrote into its staging directory."""

    config: dict[str, Any]
    tokenizer: TokenizerExport
    weight_bytes: int
    shards: int


def _write_staging(
    inp: _Inputs, staging: Path, ckpt: Path, dtype_name: str, version: str, max_shard_bytes: int
) -> _Written:
    """config.json (checked against transformers), generation_config.json, the tokenizer, the weights in
    shards and the provenance, all into `staging`."""
    cfg = hf_config(
        inp.family,
        inp.arch,
        vocab_size=inp.tokenizer.vocab_size,
        stage=inp.stage,
        manifest=inp.manifest,
        dtype=dtype_name,
        transformers_version=version,
        scaling=inp.stage.rope_scaling,
    )
    atomic_write_json(staging / "config.json", cfg)
    atomic_write_json(staging / "generation_config.json", generation_config(inp.manifest, version))
    check_config(staging, cfg)
    tok = export_tokenizer(inp.tokenizer, inp.manifest, staging, max_length=inp.stage.max_position_embeddings)
    writer = _write_weights(inp, staging, max_shard_bytes)
    weight_files = writer.close()
    atomic_write_json(staging / "longctx_export.json", _provenance(inp, tok, ckpt))
    shards = len([f for f in weight_files if f.endswith(".safetensors")])
    return _Written(cfg, tok, writer.total_bytes, shards)


def _report(inp: _Inputs, out_dir: Path, written: _Written, dtype_name: str, seconds: float) -> ExportReport:
    files = sorted(p.name for p in out_dir.iterdir())
    return ExportReport(
        out=str(out_dir),
        architecture=HF_ARCHITECTURE[inp.family],
        family=inp.family,
        checkpoint=str(inp.directory),
        iteration=inp.report.iteration,
        plan=inp.rp.where,
        stage=inp.stage.name,
        stage_source=inp.stage.source,
        rotary_base=inp.stage.rotary_base,
        max_position_embeddings=inp.stage.max_position_embeddings,
        rope_parameters=written.config["rope_parameters"],
        vocab_size=inp.tokenizer.vocab_size,
        padded_vocab_size=int(inp.report.padded_vocab_size or 0),
        dtype=dtype_name,
        tensors=len(inp.plan.tensors),
        parameters=sum(t.numel for t in inp.plan.tensors),
        weight_bytes=written.weight_bytes,
        files=files,
        shards=written.shards,
        largest_read_bytes=inp.reader.largest_read,
        tokenizer=written.tokenizer,
        notes=inp.notes + written.tokenizer.notes,
        seconds=seconds,
    )


def export_hf(
    checkpoint: str | os.PathLike[str],
    plan: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    stage: str | None = None,
    dtype: str = "auto",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    run_dir: str | os.PathLike[str] | None = None,
) -> ExportReport:
    """Export CHECKPOINT (save dir or iteration dir) of PLAN's `stage` (default: from its args or path)
    to the Hugging Face directory `out`; ExportError (or another LongctxError) before anything is
    written when an input is wrong."""
    t0 = time.perf_counter()
    version = _transformers_version()
    out_dir, ckpt = Path(out), Path(checkpoint)
    _check_out(out_dir)
    if max_shard_bytes <= 0:
        raise ExportError(f"the shard size must be positive, got {max_shard_bytes}")
    inp = _inputs(ckpt, Path(plan), stage, dtype, Path(run_dir) if run_dir is not None else None)
    refuse_out_inside(out_dir, ckpt, inp.directory)
    dtype_name = str(inp.dtype).removeprefix("torch.")
    created_parent = not out_dir.parent.exists()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        written = _write_staging(inp, staging, ckpt, dtype_name, version, max_shard_bytes)
        if out_dir.is_dir():
            out_dir.rmdir()  # checked empty above
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_parent:
            shutil.rmtree(out_dir.parent, ignore_errors=True)
        raise
    return _report(inp, out_dir, written, dtype_name, time.perf_counter() - t0)


__all__ = ["DEFAULT_MAX_SHARD_BYTES", "DTYPES", "ExportReport", "export_hf"]
