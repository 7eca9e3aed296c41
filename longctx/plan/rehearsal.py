"""A plan's rehearsal plan: the same stages, data, tokenizer, RoPE and objective on a micro model.

`rehearsal_plan(rp, options)` derives, from the user's resolved plan, a plan dictionary (written as
TOML into the rehearsal's own run directory) that keeps everything a long-context failure depends on
and shrinks only what makes a step expensive: the model (`longctx.plan.micro`), the batch (one
sequence), the iterations per stage, the evaluation. Each change is stated as a `Reduction`, so the
report says what the real run will differ in. RoPE bases are pinned to the values the user's plan
resolved (a method that reads the rotary dim would otherwise resolve another base for the micro head
dim); a sweep keeps its candidates, each as that base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field

from longctx.errors import LongctxError, PlanError
from longctx.plan import paths
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.eval_memory import eval_memory
from longctx.plan.memory import GiB
from longctx.plan.micro import MicroShapeOptions, micro_shape
from longctx.plan.rehearsal_mark import NAME_SUFFIX
from longctx.plan.schema import DataSpec, Plan, StageDefaults
from longctx.plan.stage_data import stage_blend
from longctx.util.fs import atomic_write_text


class RehearsalOptions(BaseModel):
    """What a rehearsal shrinks, and how far."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: MicroShapeOptions = Field(default_factory=MicroShapeOptions)
    iterations: int = Field(default=3, ge=2, le=100)
    """Training iterations per stage (one sequence each): enough to save, resume and see the loss move."""
    max_ranks: int = Field(default=8, ge=1, le=64)
    """The most processes one stage may run here; a plan's larger CP is reduced to fit (and said so)."""
    lr: float = Field(default=3e-3, gt=0)
    """The peak rate: the plan's (1e-5 for an extension) moves a random micro model too little to show
    the loss fall in a few iterations; the schedule's shape and its min/peak ratio are kept."""
    keys_per_cell: int = Field(default=1, ge=1, le=20)
    """Pass keys per (length, depth) cell of the evaluation."""
    depths: list[float] = Field(default_factory=lambda: [0.0, 0.5])
    """Needle depths evaluated (0: at the start, the longest distance)."""
    tokenizer: Path | None = None
    """A tokenizer to rehearse with instead of the plan's (with `manifest`): one of its kind."""
    manifest: Path | None = None
    """The manifest `tokenizer` is checked against instead of the plan's."""
    memory_gib: float = Field(default=16.0, gt=0)
    """The memory one rank may plan with here (the plan's per-GPU budget is the cluster's)."""
    backend: Literal["local", "megatron-lm"] = "local"
    """What trains the stages: longctx's trainer, or Megatron-LM's pretrain_gpt.py (the plan's [slurm] backend)."""
    megatron_lm: Path | None = None
    """megatron-lm: the checkout the stages run (the rehearsal plan's [megatron].path)."""


class Reduction(BaseModel):
    """One way the rehearsal differs from the real run, and what the real run needs instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    what: str
    stage: str | None = None
    real_needs: str | None = None


class RehearsalPlan(BaseModel):
    """The derived plan (as the TOML written for it) and every reduction it made."""

    model_config = ConfigDict(extra="forbid")

    source: str
    plan: dict[str, Any]
    reductions: list[Reduction] = Field(default_factory=list)


def _cp_for(st: ResolvedStage, max_ranks: int) -> tuple[int, str | None]:
    """The stage's CP where this machine runs that many ranks, else the largest that divides the
    sequence into 2·CP zigzag halves and fits `max_ranks`; with the reason when reduced."""
    if st.cp <= max_ranks:
        return st.cp, None
    cp = max_ranks
    while cp > 1 and st.seq_length % (2 * cp):
        cp -= 1
    return cp, f"CP {st.cp} → {cp}: this rehearsal runs at most {max_ranks} ranks per stage (--max-ranks)"


def _absolute(text: str, plan: Plan, field: str) -> str:
    return str(paths.resolve(text, plan, field=field))


def _data(spec: DataSpec, plan: Plan, where: str) -> dict[str, Any]:
    """The data table with every path absolute (resolved against the user's plan and environment)."""
    out = spec.model_dump(mode="json", exclude_none=True, exclude={"cache_dir"})
    if spec.blend_file is not None:
        out["blend_file"] = _absolute(spec.blend_file, plan, f"{where}.blend_file")
    if spec.blend is not None:
        out["blend"] = [[w, _absolute(p, plan, f"{where}.blend")] for w, p in spec.blend]
    if spec.prefixes is not None:
        out["prefixes"] = [_absolute(p, plan, f"{where}.prefixes") for p in spec.prefixes]
    if spec.tier_mix is not None:
        out["tier_mix"]["artifact"] = _absolute(spec.tier_mix.artifact, plan, f"{where}.tier_mix.artifact")
    return out


def _rope(st: ResolvedStage, iterations: int) -> dict[str, Any]:
    if st.sweep is None:
        return {"base": st.rotary_base}
    return {"sweep": list(st.sweep.bases), "tokens": iterations * st.seq_length}


def _stage(st: ResolvedStage, plan: Plan, opts: RehearsalOptions, notes: list[Reduction]) -> dict[str, Any]:
    cp, why = _cp_for(st, opts.max_ranks)
    if why:
        notes.append(Reduction(what=why, stage=st.name, real_needs=f"{st.world} GPUs at CP {st.cp}"))
    out: dict[str, Any] = {
        "name": st.name,
        "seq_length": st.seq_length,
        "tokens": opts.iterations * st.seq_length,
        "rope": _rope(st, opts.iterations),
        "context_parallel": cp,
        # each stage runs exactly its CP ranks (DP 1) on this one host, whatever the others run
        "nodes": 1,
        "gpus_per_node": cp,
        "max_position_embeddings": st.max_position_embeddings,
    }
    notes.append(
        Reduction(
            what=f"{st.train_iters:,} iterations of {st.global_batch_size} × {st.seq_length:,} → "
            f"{opts.iterations} of 1 × {st.seq_length:,}; TP {st.tp} → 1, PP {st.pp} → 1",
            stage=st.name,
            real_needs=f"{st.nodes} nodes × {st.gpus_per_node} GPUs, "
            f"{st.memory.to_gib()['total']:.1f} GiB per GPU (memory model)",
        )
    )
    out.update(_kept(st.spec))
    spec = st.spec.data
    if spec is not None:
        out["data"] = _data(spec, plan, f"stages.{st.name}.data")
    return out


def _tokenizer(rp: ResolvedPlan, opts: RehearsalOptions, notes: list[Reduction]) -> dict[str, Any]:
    tok = {
        "path": str(opts.tokenizer or rp.tokenizer.path),
        "manifest": str(opts.manifest or rp.tokenizer.manifest_path),
    }
    if rp.plan.tokenizer.megatron_type:
        tok["megatron_type"] = rp.plan.tokenizer.megatron_type
    if opts.tokenizer is not None:
        notes += _vocabulary(rp)
        notes.append(
            Reduction(
                what=f"tokenizer {rp.tokenizer.path} → {opts.tokenizer} (checked against {tok['manifest']})",
                real_needs=f"the plan's tokenizer, checked against {rp.tokenizer.manifest_path}",
            )
        )
    return tok


def _vocabulary(rp: ResolvedPlan) -> list[Reduction]:
    """What the plan's vocabulary costs at each length, which the rehearsal's smaller one does not show:
    training logits per GPU (the memory model) and one evaluation sequence's logits on one GPU."""
    vocab = rp.tokenizer.manifest.vocab_size
    out = []
    for st in rp.stages:
        ev = eval_memory(
            rp.arch, st.padded_vocab_size, st.seq_length, 1, batch=1, gpu_memory_gib=1.0, margin=0.0
        )
        out.append(
            Reduction(
                what=f"vocabulary {vocab:,} → the rehearsal tokenizer's",
                stage=st.name,
                real_needs=f"training logits {st.memory.logits / GiB:.1f} GiB per GPU at TP {st.tp} / CP {st.cp} "
                f"(memory model); evaluation of one {st.seq_length:,}-token sequence on one GPU "
                f"{ev.logits / GiB:.1f} GiB of logits",
            )
        )
    return out


def _check_options(opts: RehearsalOptions) -> None:
    if (opts.tokenizer is None) != (opts.manifest is None):
        raise PlanError(
            "a rehearsal tokenizer needs its manifest (and a manifest its tokenizer)",
            where="--tokenizer / --manifest",
            fix="give both, or neither to rehearse with the plan's tokenizer",
        )
    bad = [d for d in opts.depths if not 0.0 <= d <= 1.0]
    if bad or not opts.depths:
        raise PlanError(
            f"needle depths must be fractions in [0, 1], got {opts.depths}",
            where="--depths",
            fix="e.g. --depths 0,0.5",
        )


def _defaults(rp: ResolvedPlan, opts: RehearsalOptions, notes: list[Reduction]) -> dict[str, Any]:
    d = rp.plan.defaults
    given = d.lr.model_dump(mode="json", exclude_none=True) if "lr" in d.model_fields_set else {}
    lr = given | {"lr": opts.lr}
    first = rp.stages[0].lr
    lr["min_lr"] = float(f"{opts.lr * (first.min_lr / first.lr):.6g}")
    lr.pop("warmup_iters", None)
    lr["warmup_fraction"] = 0.0  # a warm-up iteration of a few would train at rate 0
    notes.append(
        Reduction(what=f"peak learning rate {first.lr:g} → {opts.lr:g}, no warm-up (min/peak ratio kept)")
    )
    out: dict[str, Any] = {
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "sequence_parallel": False,
        "nodes": 1,
        "save_interval": 1,
        "log_interval": 1,
        "lr": lr,
    }
    out.update(_kept(d))
    if d.data is not None:
        out["data"] = _data(d.data, rp.plan, "defaults.data")
    return out


def _blend_surplus(rp: ResolvedPlan, notes: list[Reduction]) -> list[str]:
    """Megatron-LM builds every validation and test blend at start-up. Asked for the rehearsal's one sample
    (batch 1), a weighted blend of n datasets is sized Σ ceil(w·1) = n, and megatron-core's draw then takes
    more from the heaviest dataset than the ceil(ceil(w)·1.005) it built for it (IndexError at start-up); a
    surplus of n per dataset covers any draw of n. A real run's blends ask for hundreds of samples, and its
    datasets' parts hold whole epochs of them."""
    try:
        entries = max(len(stage_blend(rp, st).entries) for st in rp.stages)
    except LongctxError:  # unreadable data: the rehearsal's data checks say so before any launch
        return []
    if entries <= 1:
        return []
    notes.append(
        Reduction(
            what=f"megatron-core's mid-level blend surplus 0.005 → {entries} (validation and test blends of "
            f"{entries} datasets asked for one sample)",
            real_needs="the default, where each dataset's validation part holds more windows than its draw",
        )
    )
    return ["--mid-level-dataset-surplus", str(entries)]


# what a stage (or [defaults]) sets that the rehearsal keeps as it is: code paths, not cost
KEPT = (
    "recompute",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "seed",
    "eval_interval",
    "eval_iters",
    "extra_args",
)


def _kept(spec: StageDefaults) -> dict[str, Any]:
    # what the plan set: a built-in default stays a default in the rehearsal's plan
    return {
        key: getattr(spec, key)
        for key in KEPT
        if key in spec.model_fields_set and getattr(spec, key) is not None
    }


def _eval(rp: ResolvedPlan, opts: RehearsalOptions) -> dict[str, Any]:
    ev = rp.eval.model_dump(mode="json")
    ev.update(
        keys_per_cell=opts.keys_per_cell,
        depths=opts.depths,
        distractors=0,
        loss_docs=1,
        short_docs=2,
        packed_windows=0,
    )
    return ev


def rehearsal_plan(rp: ResolvedPlan, run_dir: Path, opts: RehearsalOptions | None = None) -> RehearsalPlan:
    """The rehearsal of `rp` in `run_dir`: a plan dictionary and the reductions it made."""
    opts = opts or RehearsalOptions()
    _check_options(opts)
    plan = rp.plan
    notes: list[Reduction] = []
    shape = micro_shape(rp.arch, opts.shape)
    notes += [Reduction(what=f"model: {r}") for r in shape.reductions]
    megatron = plan.megatron.model_dump(mode="json", exclude_none=True)
    if opts.megatron_lm is not None or rp.megatron.path is not None:
        megatron["path"] = str(opts.megatron_lm or rp.megatron.path)
    data: dict[str, Any] = {
        "name": plan.name + NAME_SUFFIX,
        "description": f"rehearsal of {plan.name} on a micro model (longctx rehearse)",
        "run_dir": str(run_dir),
        "base": {
            "path": "${RUN_DIR}/base/checkpoints",
            "seq_length": rp.base.seq_length,
            "rotary_base": rp.base.rotary_base,
            "model_only": True,
        },
        "tokenizer": _tokenizer(rp, opts, notes),
        "model": shape.arch.model_dump(mode="json", exclude_none=True),
        "objective": plan.objective.model_dump(mode="json", exclude_none=True),
        "cluster": {
            "profile": "local",
            "gpus_per_node": 1,
            "gpu_memory_gib": opts.memory_gib,
            "memory_margin": plan.cluster.memory_margin,
        },
        "megatron": megatron,
        # what `stage run` is given (--backend) and what a chain of this plan would run: the trainer rehearsed
        "slurm": {"backend": opts.backend},
        "local": plan.local.model_dump(mode="json", exclude_none=True) | {"eval_after_stage": False},
        "eval": _eval(rp, opts),
        "defaults": _defaults(rp, opts, notes),
        "stages": [_stage(st, plan, opts, notes) for st in rp.stages],
    }
    if opts.backend == "megatron-lm":
        surplus = _blend_surplus(rp, notes)
        # a stage's own extra_args replace [defaults]' whole list: the surplus goes into each
        for part in (data["defaults"], *(st for st in data["stages"] if "extra_args" in st)):
            part["extra_args"] = [*part.get("extra_args", []), *surplus]
    notes.append(
        Reduction(
            what="the base: a micro model initialised here (the plan's base has the real shape)",
            real_needs=str(rp.base.path or rp.base.hub_id),
        )
    )
    if plan.wandb is not None:
        notes.append(Reduction(what="W&B logging off (a rehearsal never writes into the team's project)"))
    return RehearsalPlan(source=str(plan.plan_path or plan.name), plan=data, reductions=notes)


def write_rehearsal_plan(rehearsal: RehearsalPlan, path: Path) -> Path:
    """The derived plan as TOML (what `stage run`, `slurm submit` and `eval` are given)."""
    header = (
        f"# Rehearsal of {rehearsal.source}, derived by `longctx rehearse`: a micro model through every\n"
        "# stage of the plan. Its checkpoints are a rehearsal's, never the real run's.\n\n"
    )
    atomic_write_text(path, header + tomli_w.dumps(rehearsal.plan))
    return path
