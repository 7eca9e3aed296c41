"""`inspect_checkpoint(path)`: what a torch_dist checkpoint is, from its metadata alone.

Reads `metadata.json`, `.metadata` (the DCP index) and the common state; never a tensor. The report
names fields after Megatron's arguments (`num_layers`, `kv_channels`, `padded_vocab_size`,
`rotary_base`, `iteration`, …) so they can be fed back as flags.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longctx.checkpoint.family import FamilyReport, detect_family, family_findings
from longctx.checkpoint.infer_arch import InferredArch, infer_arch
from longctx.checkpoint.keys import model_entries
from longctx.checkpoint.metadata import (
    BackendInfo,
    DcpIndex,
    Era,
    args_dict,
    read_backend,
    read_common_state,
    read_dcp_index,
)
from longctx.checkpoint.save_layout import ResolvedCheckpoint, Tracker, resolve_in_tree
from longctx.checkpoint.shapes import check_shapes
from longctx.checkpoint.tree import Tree, join, open_tree
from longctx.megatron_versions import common_state_releases
from longctx.report import Findings, to_jsonable

if TYPE_CHECKING:
    from longctx.arch import ModelArch

# saved args that matter when extending the context of a model
EXTENSION_ARGS = (
    "rotary_base", "seq_length", "max_position_embeddings", "position_embedding_type", "rotary_percent",
    "rotary_interleaved", "use_rope_scaling", "rope_scaling_factor", "rotary_seq_len_interpolation_factor",
    "tokenizer_type", "tokenizer_model", "vocab_file", "merge_file", "vocab_size", "padded_vocab_size",
    "make_vocab_size_divisible_by", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "context_parallel_size", "expert_model_parallel_size", "sequence_parallel", "use_distributed_optimizer",
    "ckpt_format", "bf16", "fp16", "micro_batch_size", "global_batch_size", "train_iters", "train_samples",
    "consumed_train_samples", "lr", "min_lr", "lr_decay_style", "lr_warmup_iters", "lr_decay_iters",
    "lr_wsd_decay_iters", "seed", "norm_epsilon", "attention_backend", "transformer_impl",
)  # fmt: skip

_DIST_OPT = re.compile(r"^(?:chained_\d+\.)?optimizer\.distributed\.dp_group_idx_(\d+)\.(.+)$")
_STATE_OPT = re.compile(r"^(?:chained_\d+\.)?optimizer\.state\.([A-Za-z0-9_]+)\.")


@dataclass
class OptimizerInfo:
    """Optimizer state stored in the checkpoint and its layout.

    layout: dp_reshardable (Megatron's default DistributedOptimizer save: flat per-bucket tensors per
    model-parallel rank), fully_reshardable (`--dist-ckpt-optim-fully-reshardable`: param-shaped),
    fully_sharded_model_space / model_space (non-distributed optimizer layouts), dp_zero_gather_scatter.
    """

    layout: str
    layout_source: str  # "content_metadata" (saved by Megatron) or "keys"
    dp_groups: int | None  # dp_group_idx_* count = TP × PP at save (DP-reshardable layouts)
    state_names: list[str]
    tensors: int
    bytes: int


@dataclass
class CheckpointReport:
    """Everything `longctx ckpt inspect` reports (JSON field names follow Megatron's arguments)."""

    path: str
    kind: str
    location: str
    archive: str | None
    tracker: dict[str, Any] | None
    complete_iterations: list[int]
    complete: bool
    incomplete_reason: str | None
    backend: BackendInfo | None
    megatron_core_era: str
    common_state_format: str
    dcp_metadata_version: str | None
    iteration: int | None
    iteration_source: str | None
    checkpoint_version: float | None
    contents: str
    optimizer: OptimizerInfo | None
    has_rng_state: bool
    has_opt_param_scheduler: bool
    tensor_count: int
    tensor_bytes: int
    model_tensor_count: int
    model_tensor_bytes: int
    bytes_object_count: int
    shard_files: int
    files_bytes: int
    dtypes: dict[str, int]
    tensor_model_parallel_size_from_layout: int | None
    arch: InferredArch
    family: FamilyReport
    padded_vocab_size: int | None
    saved_args: dict[str, Any]
    args: dict[str, Any] = field(repr=False)
    findings: Findings = field(default_factory=Findings)
    resolved: ResolvedCheckpoint | None = field(default=None, repr=False)
    index: DcpIndex | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.findings.ok

    def to_model_arch(self) -> ModelArch:
        return self.arch.to_model_arch()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            if name in ("resolved", "index"):
                continue
            out[name] = to_jsonable(getattr(self, name))
        return out


def _optimizer_info(index: DcpIndex, common: dict[str, Any] | None) -> OptimizerInfo | None:
    dist_groups: set[int] = set()
    names: set[str] = set()
    tensors = nbytes = 0
    has_gbuf = has_param_state = False
    state_kinds: set[str] = set()
    for key, t in index.tensors.items():
        m = _DIST_OPT.match(key)
        if m:
            dist_groups.add(int(m.group(1)))
            if ".gbuf_idx_" in "." + m.group(2):
                has_gbuf = True
                names.add(m.group(2).rsplit(".", 1)[-1])
            tensors += 1
            nbytes += t.nbytes
            continue
        m = _STATE_OPT.match(key)
        if m:
            state_kinds.add(m.group(1))
            names.add(m.group(1))
            tensors += 1
            nbytes += t.nbytes
    for key in index.bytes_keys:
        m = _DIST_OPT.match(key)
        if m:
            dist_groups.add(int(m.group(1)))
            if m.group(2).startswith("param_state"):
                has_param_state = True
    if not dist_groups and not state_kinds:
        return None
    content = (common or {}).get("content_metadata") or {}
    declared = content.get("distrib_optim_sharding_type") if isinstance(content, dict) else None
    if declared:
        layout, source = str(declared), "content_metadata"
    elif has_gbuf:
        layout, source = "dp_reshardable", "keys"
    elif has_param_state:
        layout, source = "dp_zero_gather_scatter", "keys"
    elif "param" in state_kinds:
        layout, source = "fully_reshardable", "keys"
    elif "fp32_param" in state_kinds:
        layout, source = "fully_sharded_model_space", "keys"
    else:
        layout, source = "model_space", "keys"
    return OptimizerInfo(
        layout=layout,
        layout_source=source,
        dp_groups=len(dist_groups) or None,
        state_names=sorted(names),
        tensors=tensors,
        bytes=nbytes,
    )


def _files_bytes(tree: Tree, rel: str, index: DcpIndex) -> int:
    on_disk = tree.file_sizes(rel)
    return sum(on_disk.get(name, 0) for name in index.files)


def _tracker_dict(t: Tracker | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"iteration": t.iteration, "release": t.release, "path": t.path}


def inspect_resolved(
    resolved: ResolvedCheckpoint, *, head_dim: int | None = None, stub_megatron: bool | None = None
) -> CheckpointReport:
    tree, rel = resolved.tree, resolved.checkpoint_rel
    findings = Findings()
    status = resolved.status()
    if not status.complete:
        findings.error("incomplete", f"the checkpoint is incomplete: {status.reason}", where=resolved.where)
    backend = _checked_backend(tree, rel, findings)
    index = read_dcp_index(tree, rel, stub_megatron=stub_megatron)
    check_shapes(index, resolved.where)
    common = read_common_state(tree, rel, index, stub_megatron=stub_megatron)
    state = common.state or {}
    args = args_dict(state)
    iteration, it_src = _iteration(resolved, state, findings)

    shapes = {k: t.shape for k, t in index.tensors.items()}
    arch = infer_arch(shapes, args, head_dim=head_dim, findings=findings)
    for note in arch.notes:
        findings.info("arch-note", note)
    family = detect_family(shapes, args)
    family_findings(family, resolved.where, findings)

    model_tensors = model_entries(index.tensors)
    optimizer = _optimizer_info(index, state)
    emb = index.tensors.get("embedding.word_embeddings.weight") or index.tensors.get("output_layer.weight")
    tp_layout = emb.chunks if emb is not None and emb.chunks else None
    _check_saved_layout(args, tp_layout, optimizer, arch.padded_vocab_size, findings)
    if common.era == "unknown":
        findings.warning(
            "no-common-state",
            "no common.pt and no common_state object: saved args and iteration are unavailable",
            where=resolved.where,
        )
    return CheckpointReport(
        path=str(resolved.source),
        kind=resolved.kind,
        location=resolved.where,
        archive=str(resolved.archive) if resolved.archive else None,
        tracker=_tracker_dict(resolved.tracker),
        complete_iterations=resolved.complete_iterations,
        complete=status.complete,
        incomplete_reason=status.reason,
        backend=backend,
        megatron_core_era=_megatron_core_era(common.era, backend),
        common_state_format=common.era,
        dcp_metadata_version=index.version,
        iteration=iteration,
        iteration_source=it_src,
        checkpoint_version=state.get("checkpoint_version"),
        contents="model+optimizer" if optimizer else "model",
        optimizer=optimizer,
        has_rng_state=any(k.startswith("rng_state") for k in index.bytes_keys) or "rng_state" in state,
        has_opt_param_scheduler="opt_param_scheduler" in state,
        tensor_count=len(index.tensors),
        tensor_bytes=index.tensor_bytes,
        model_tensor_count=len(model_tensors),
        model_tensor_bytes=sum(t.nbytes for t in model_tensors.values()),
        bytes_object_count=len(index.bytes_keys),
        shard_files=len(index.files),
        files_bytes=_files_bytes(tree, rel, index),
        dtypes=dict(Counter(t.dtype for t in model_tensors.values())),
        tensor_model_parallel_size_from_layout=tp_layout,
        arch=arch,
        family=family,
        padded_vocab_size=arch.padded_vocab_size,
        saved_args={k: args[k] for k in EXTENSION_ARGS if k in args},
        args=args,
        findings=findings,
        resolved=resolved,
        index=index,
    )


def _checked_backend(tree: Tree, rel: str, findings: Findings) -> BackendInfo | None:
    """metadata.json's backends; a sharded backend other than torch_dist is a warning."""
    backend = read_backend(tree, rel)
    if backend is not None and backend.sharded_backend not in (None, "torch_dist"):
        findings.warning(
            "backend",
            f"sharded backend is {backend.sharded_backend!r}; only torch_dist is read here",
            where=tree.where(join(rel, "metadata.json")),
        )
    return backend


def _megatron_core_era(common_era: Era, backend: BackendInfo | None) -> str:
    releases = common_state_releases()  # the release table's eras: common.pt, then the DCP object
    era = {"common.pt": releases["common.pt"], "common_state": releases["dcp"]}.get(common_era, "unknown")
    if common_era == "unknown" and backend is not None and backend.common_backend is None:
        era = releases["dcp"]  # metadata.json lost its common_backend fields with the DCP common state
    return era


def _iteration(
    resolved: ResolvedCheckpoint, state: dict[str, Any], findings: Findings
) -> tuple[int | None, str | None]:
    """(iteration, its source): the common state's, else the tracker's or the directory name's; a
    disagreement between the two is a warning (release dirs are loaded as iteration 0 anyway)."""
    iteration, it_src = None, None
    if isinstance(state.get("iteration"), int):
        iteration, it_src = int(state["iteration"]), "common state"
    elif resolved.iteration is not None:
        iteration = resolved.iteration
        it_src = "tracker" if resolved.tracker is not None else "directory name"
    if (
        resolved.iteration is not None
        and iteration is not None
        and resolved.iteration != iteration
        and not (resolved.tracker is not None and resolved.tracker.release)
    ):
        findings.warning(
            "iteration-mismatch",
            f"the common state says iteration {iteration} but the directory/tracker says {resolved.iteration}",
            where=resolved.where,
        )
    return iteration, it_src


def _check_saved_layout(
    args: dict[str, Any],
    tp_layout: int | None,
    optimizer: OptimizerInfo | None,
    padded: int | None,
    findings: Findings,
) -> None:
    """The saved args against what is stored: TP chunks, optimizer groups, embedding rows."""
    saved_tp = args.get("tensor_model_parallel_size")
    if tp_layout and isinstance(saved_tp, int) and saved_tp != tp_layout:
        findings.info(
            "tp-layout",
            f"args say TP {saved_tp}, the embedding is stored in {tp_layout} chunks",
        )
    if optimizer and optimizer.dp_groups and isinstance(saved_tp, int):
        pp = args.get("pipeline_model_parallel_size") or 1
        if optimizer.dp_groups != saved_tp * int(pp):
            findings.warning(
                "optimizer-groups",
                f"{optimizer.dp_groups} dp_group_idx_* optimizer groups, but TP×PP at save is {saved_tp * int(pp)}",
            )
    if (
        padded is not None
        and isinstance(args.get("padded_vocab_size"), int)
        and args["padded_vocab_size"] != padded
    ):
        findings.warning(
            "vocab",
            f"args say padded_vocab_size {args['padded_vocab_size']} but the embedding has {padded} rows",
        )


def inspect_checkpoint(
    path: str | os.PathLike[str], *, head_dim: int | None = None, stub_megatron: bool | None = None
) -> CheckpointReport:
    """Describe the checkpoint at PATH (save dir, iter/release dir, flat snapshot, .tar/.tar.tar).

    Raises CheckpointError when PATH holds no readable checkpoint (tracker garbage or pointing at a
    missing/unfinished iteration, missing or corrupt `.metadata`, a pickle outside the allow-list).
    """
    tree = open_tree(Path(path))
    return inspect_resolved(resolve_in_tree(tree), head_dim=head_dim, stub_megatron=stub_megatron)


__all__ = ["EXTENSION_ARGS", "CheckpointReport", "OptimizerInfo", "inspect_checkpoint", "inspect_resolved"]
