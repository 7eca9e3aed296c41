"""From a plan to resolved stages: every number a launch needs, plus the findings of validation.

`resolve_plan(plan)` returns a `ResolvedPlan` and raises PlanError when any rule fails;
`validate_plan(plan)` returns the findings without raising (for `plan check`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from longctx.arch import ModelArch
from longctx.checkpoint import inspect_checkpoint
from longctx.checkpoint.family import FamilyReport
from longctx.errors import LongctxError, PlanError, RopeError
from longctx.megatron_versions import packed_documents
from longctx.objective import Objective
from longctx.plan import memory, paths
from longctx.plan.entry import check_entry_script, check_family_args
from longctx.plan.flags import check_user_flags
from longctx.plan.load import load_plan
from longctx.plan.objective_check import (
    check_against_base,
    check_schedule,
    check_vocab_rows,
    resolve_objective,
    vocab_rows,
)
from longctx.plan.rehearsal_mark import refuse_rehearsal_dir
from longctx.plan.rope_sweep import SWEEP_DIR, ResolvedSweep, resolve_sweep
from longctx.plan.schema import ClusterSpec, EvalSpec, LocalSpec, LRSpec, Plan, StageDefaults, StageSpec
from longctx.plan.slurm import PlanSlurm, parse_plan_slurm
from longctx.plan.values import (
    BaseValues,
    MegatronValues,
    StageData,
    TokenizerValues,
    resolve_base,
    resolve_data,
    resolve_megatron,
    resolve_tokenizer,
    resolve_wandb,
    stage_wandb,
)
from longctx.report import Findings
from longctx.rope import choose_base
from longctx.rope.megatron import megatron_rope_flags
from longctx.rope.methods import BaseChoice
from longctx.rope.scaling import RopeScaling, yarn_logit_scale
from longctx.tokenizer.manifest import TokenizerManifest, load_manifest
from longctx.util.wandb_settings import WandbSettings

CP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
# the scalings a stage may carry beyond its base: export writes YaRN's rope_parameters, evaluation and the
# local trainer refuse it by name; Megatron-LM's llama3 and PI would reach neither
CARRIED_SCALINGS = ("yarn",)


@dataclasses.dataclass
class ResolvedStage:
    index: int
    name: str
    spec: StageSpec
    seq_length: int
    max_position_embeddings: int
    rotary_base: int
    rope_method: str
    rope_explanation: str
    tp: int
    pp: int
    cp: int
    dp: int
    nodes: int
    gpus_per_node: int
    sequence_parallel: bool
    recompute: str
    recompute_method: str | None  # full: uniform | block
    recompute_num_layers: int | None  # full: layers per chunk (uniform) or recomputed layers (block)
    recompute_modules: tuple[str, ...]  # selective: --recompute-modules
    attention_backend: str
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    train_iters: int
    tokens_planned: int
    tokens_realized: int
    lr: LRSpec
    warmup_iters: int
    wsd_decay_iters: int | None
    save_interval: int
    eval_interval: int | None
    eval_iters: int
    log_interval: int
    exit_duration_in_mins: int | None
    data: StageData | None  # the stage's data (or [defaults.data]), paths absolute
    extra_args: list[str]
    seed: int
    padded_vocab_size: int
    memory: memory.MemoryEstimate
    smallest_fitting_cp: int | None
    save_dir: Path  # Megatron's --save/--load directory: <stage_dir>/checkpoints
    load_from: Path | None  # the previous stage's save dir, or the base checkpoint
    stage_dir: Path  # <run_dir>/stages/<name>: logs, metrics, tensorboard, eval
    wandb: WandbSettings | None = None  # the stage's W&B run (None: no [wandb])
    output_vocab_size: int | None = None  # output-layer rows when not padded_vocab_size
    rope_scaling: RopeScaling | None = None  # YaRN on top of rotary_base (Megatron-LM ≥ 0.19 only)
    attention_scale: float = 1.0  # attention logits × this at the stage's start (the local backend folds it)
    # a RoPE sweep (`longctx.plan.rope_sweep`): its candidates and choice, and one branch stage per candidate
    sweep: ResolvedSweep | None = None
    branches: tuple[ResolvedStage, ...] = ()
    branch_of: str | None = None  # a branch: the stage it sweeps for

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    def summary(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "seq_length": self.seq_length,
            "rotary_base": self.rotary_base,
            "rope_method": self.rope_method,
            "rope_scaling": scaling_summary(self.rope_scaling),
            "attention_scale": self.attention_scale,
            "rope_sweep": self.sweep.summary() if self.sweep else None,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "dp": self.dp,
            "nodes": self.nodes,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "train_iters": self.train_iters,
            "tokens_planned": self.tokens_planned,
            "tokens_realized": self.tokens_realized,
            "memory_gib": self.memory.to_gib(),
            "memory_fits": self.memory.fits,
            "smallest_fitting_cp": self.smallest_fitting_cp,
            "vocab_rows": {
                "input": self.padded_vocab_size,
                "output": self.output_vocab_size or self.padded_vocab_size,
            },
        }


def scaling_summary(scaling: RopeScaling | None) -> dict[str, Any] | None:
    """A stage's scaling as JSON (its set fields), None for a base-only stage."""
    if scaling is None:
        return None
    return {k: v for k, v in dataclasses.asdict(scaling).items() if v is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResolvedPlan:
    """A plan resolved once: every value a launch, a chain, an evaluation or an export needs, paths absolute.

    Downstream of `longctx.plan` nothing reads `plan` (the raw schema) or resolves a path again: they take
    these fields (tests/test_architecture.py holds the rule)."""

    plan: Plan
    """The raw plan, for `longctx.plan` itself only (validation, the stage data of a tier mix)."""

    name: str
    """The plan's name."""

    description: str
    """The plan's one-line description ("" when none)."""

    source: Path | None
    """The plan file it was read from (None for a plan built in memory)."""

    run_dir: Path
    """The run directory (run_dir, or --run-dir / $LONGCTX_RUN_DIR), absolute: ledger, stages, cache, eval."""

    tokenizer: TokenizerValues
    """The tokenizer, its manifest and the Megatron tokenizer type."""

    base: BaseValues
    """The base checkpoint: path, hub id, pretraining length and rotary base."""

    megatron: MegatronValues
    """The Megatron-LM release, its facts, checkout, entry script and flag lists."""

    cluster: ClusterSpec
    """The cluster: profile name, GPUs per node, GPU memory, margin, max nodes (no paths)."""

    local: LocalSpec
    """The local backend's settings (threads, attention, CP communication, precision; no paths)."""

    slurm: PlanSlurm
    """The plan's [slurm] table, typed: `slurm.on(profile, where)` is the cluster profile with it laid on."""

    wandb: WandbSettings | None
    """W&B logging, save_dir absolute (None: TensorBoard only); each stage's run is `ResolvedStage.wandb`."""

    arch: ModelArch
    """The model's architecture ([model], or read from the base checkpoint)."""

    vocab_size: int
    """The tokenizer's vocabulary size (the manifest's)."""

    make_vocab_size_divisible_by: int
    """Megatron's --make-vocab-size-divisible-by (the manifest's, else 128)."""

    stages: list[ResolvedStage]
    """The stages in order, every number derived."""

    findings: Findings
    """What validation found (errors make `resolve_plan` raise)."""

    objective: Objective
    """The plan's training objective, [MASK] id decided."""
    eval: EvalSpec
    """What every evaluation of this plan measures (its [eval] table, defaults filled in): the evaluation
    after each local stage, `eval run`, `eval summary` and the demo; their options override single fields."""

    @property
    def where(self) -> str:
        """How messages name the plan: its file, else its name."""
        return str(self.source or self.name)

    def stage(self, name: str) -> ResolvedStage:
        """A stage, or a sweep branch by its name (`<stage>.rope-<base>`)."""
        for st in self.stages:
            for branch in st.branches:
                if branch.name == name:
                    return branch
        self.plan.stage(name)  # raises the helpful error for unknown names
        return next(s for s in self.stages if s.name == name)

    def launchable(self, names: Sequence[str] | None = None) -> list[ResolvedStage]:
        """The stages (or the named ones) as they launch: a stage whose RoPE sweep is pending is its
        branches, which run first and whose argv differs from the stage's only in the base; others
        themselves."""
        stages = [self.stage(n) for n in names] if names is not None else list(self.stages)
        return [
            b for st in stages for b in (st.branches if st.sweep is not None and st.sweep.pending else (st,))
        ]

    def check_base_family(self, family: FamilyReport, findings: Findings) -> None:
        """The plan's objective against the family the base checkpoint was trained as (`check_base_family`)."""
        check_base_family(self.plan, family, self.vocab_size, findings)


def _where(plan: Plan, stage_index: int | None = None, field: str | None = None) -> str:
    loc = str(plan.plan_path or plan.name)
    if stage_index is not None:
        loc += f": stages[{stage_index}] ({plan.stages[stage_index].name!r})"
    if field:
        loc += f".{field}"
    return loc


def _arch(plan: Plan, vocab: int, findings: Findings) -> ModelArch:
    if plan.model is not None:
        if plan.model_from_checkpoint:
            _cross_check_arch(plan, plan.model, vocab, findings)
        return plan.model
    try:
        report = inspect_checkpoint(_base_path(plan))
        check_base_family(plan, report.family, vocab, findings)
        return report.arch.to_model_arch()
    except LongctxError as err:
        raise PlanError(
            f"model_from_checkpoint = true but the base checkpoint cannot be inspected: {err.what}",
            where=_where(plan, field="base.path"),
            fix="give an explicit [model] table or a readable base checkpoint",
        ) from None


def _base_path(plan: Plan) -> Path:
    if plan.base.path is None:
        raise PlanError("base.path is not set", where=_where(plan, field="base"), fix="set base.path")
    return paths.resolve(plan.base.path, plan, field="base.path")


def _cross_check_arch(plan: Plan, arch: ModelArch, vocab: int, findings: Findings) -> None:
    try:
        report = inspect_checkpoint(_base_path(plan))
        inferred = report.arch.to_model_arch()
    except LongctxError as err:
        findings.warning(
            "arch-unchecked", f"base checkpoint not readable, [model] not cross-checked: {err.what}"
        )
        return
    check_base_family(plan, report.family, vocab, findings)
    for name, (mine, theirs) in arch.diff(inferred).items():
        findings.error(
            "arch-mismatch",
            f"[model].{name} differs from the base checkpoint",
            expected=theirs,
            found=mine,
            where=_where(plan, field=f"model.{name}"),
            fix="make the plan's [model] match the checkpoint",
        )


def check_base_family(plan: Plan, family: FamilyReport, vocab: int, findings: Findings) -> None:
    """The plan's objective against the family the base checkpoint was trained as (an autoregressive
    plan on a diffusion model would ruin it; a masked-diffusion plan needs the checkpoint's [MASK] row)."""
    obj = resolve_objective(plan.objective, vocab)
    check_against_base(obj, family, vocab_rows(obj, vocab, 1, 1), _where(plan, field="base.path"), findings)


def _tokenizer_manifest(plan: Plan) -> tuple[Path, TokenizerManifest]:
    manifest_path = paths.resolve(plan.tokenizer.manifest, plan, field="tokenizer.manifest")
    try:
        return manifest_path, load_manifest(manifest_path)
    except LongctxError as err:
        raise PlanError(
            f"tokenizer manifest cannot be read: {err.what}",
            where=_where(plan, field="tokenizer.manifest"),
            fix=err.fix or "point tokenizer.manifest at a tokenization/*.toml file",
        ) from None


def _rope_window(plan: Plan, length: int) -> int:
    """The span of offsets the RoPE methods are given for a window of `length` tokens: a causal model
    sees offsets 0 … L − 1; a bidirectional one −(L − 1) … L − 1, whose sin terms span 2L, so its
    pretrained and target windows are read as 2·L (UltraLLaDA's rule; the ratio methods are unchanged)."""
    return length if plan.objective.causal else 2 * length


@dataclasses.dataclass(frozen=True)
class _Rope:
    """A stage's RoPE: the base, the method that chose it and why, and a scaling on top (YaRN) or None."""

    base: int
    method: str
    explanation: str
    scaling: RopeScaling | None = None
    sweep: ResolvedSweep | None = None


def _rope(plan: Plan, i: int, stage: StageSpec, arch: ModelArch, findings: Findings) -> _Rope:
    if stage.rope.base is not None:
        # an explicit base still gets the diagnostics (e.g. a base below Men's bound for this length)
        explicit = choose_base(
            "fixed",
            rotary_dim=arch.rotary_dim,
            head_dim=arch.head_dim,
            pretrain_base=plan.base.rotary_base,
            pretrain_length=_rope_window(plan, plan.base.seq_length),
            target_length=_rope_window(plan, stage.seq_length),
            base=stage.rope.base,
        )
        for f in explicit.findings:
            if f.level != "info":
                findings.append(dataclasses.replace(f, where=_where(plan, i, "rope.base")))
        return _Rope(stage.rope.base, "fixed", f"explicit base {stage.rope.base:,}")

    if stage.rope.sweep is not None:
        return _sweep_rope(plan, i, stage, arch)
    try:
        choice = choose_base(
            stage.rope.method or "",
            rotary_dim=arch.rotary_dim,
            head_dim=arch.head_dim,
            pretrain_base=plan.base.rotary_base,
            pretrain_length=_rope_window(plan, plan.base.seq_length),
            target_length=_rope_window(plan, stage.seq_length),
            with_diagnostics=False,
            **stage.rope.params,
        )
    except LongctxError as err:
        raise PlanError(
            f"RoPE method cannot be applied: {err.what}", where=_where(plan, i, "rope"), fix=err.fix
        ) from None
    if choice.scaling is not None:
        _check_scaling(plan, i, choice, findings)
    for f in choice.findings:
        findings.append(dataclasses.replace(f, where=_where(plan, i, "rope")))
    why = choice.explanation
    if not plan.objective.causal:
        why += " (bidirectional attention: windows read as 2·L)"
    return _Rope(choice.base, choice.method, why, choice.scaling)


def _sweep_rope(plan: Plan, i: int, stage: StageSpec, arch: ModelArch) -> _Rope:
    """A swept stage's RoPE: the chosen base once `rope sweep` chose it, else the smallest candidate
    (pending: the stage does not launch before its branches are evaluated)."""

    def method_base(method: str, params: dict[str, Any]) -> int:
        choice = choose_base(
            method,
            rotary_dim=arch.rotary_dim,
            head_dim=arch.head_dim,
            pretrain_base=plan.base.rotary_base,
            pretrain_length=_rope_window(plan, plan.base.seq_length),
            target_length=_rope_window(plan, stage.seq_length),
            with_diagnostics=False,
            **params,
        )
        if choice.scaling is not None:
            raise RopeError(
                f"{method} scales RoPE beyond its base", fix="sweep base methods or explicit bases"
            )
        return choice.base

    sweep = resolve_sweep(
        stage.name,
        stage.rope,
        stage_tokens=stage.tokens,
        directory=paths.stage_dir(plan, stage.name) / SWEEP_DIR,
        run_dir=paths.run_dir(plan),
        method_base=method_base,
        where=_where(plan, i, "rope.sweep"),
    )
    bases = ", ".join(f"{b:,}" for b in sweep.bases)
    if sweep.chosen is not None:
        why = f"chosen by rope sweep among {bases}: {sweep.chosen.reason}"
        return _Rope(sweep.chosen.base, "sweep", why, sweep=sweep)
    why = f"rope sweep pending among {bases} ({sweep.branch_tokens:,} tokens per branch)"
    return _Rope(min(sweep.bases), "sweep (pending)", why, sweep=sweep)


def _check_scaling(plan: Plan, i: int, choice: BaseChoice, findings: Findings) -> None:
    """A method that changes more than the base (a scaling) is trained by Megatron-LM only, with the flags
    its release gives GPT models (`megatron_rope_flags` refuses what a release would ignore), and only YaRN
    is carried on (CARRIED_SCALINGS); the local backend refuses a scaled stage when it is launched."""
    where, version = _where(plan, i, "rope.method"), plan.megatron.version
    if not plan.objective.causal:
        findings.error(
            "rope-scaling",
            f"RoPE method {choice.method!r} with a bidirectional objective: the planner reads its windows as "
            "2·L, which would double the scaling's original length, and no bidirectional scaling is checked",
            where=where,
            fix="use a base method (fixed, abf, men, men-safe, liu, ntk)",
        )
        return
    try:
        megatron_rope_flags(choice, version)
    except RopeError as err:
        findings.error(
            "rope-scaling",
            f"RoPE method {choice.method!r} cannot run on Megatron-LM {version} ([megatron].version): {err.what}",
            where=where,
            fix=err.fix or "use a base method (fixed, abf, men, men-safe, liu, ntk)",
        )
        return
    if choice.method not in CARRIED_SCALINGS:
        findings.error(
            "rope-scaling",
            f"RoPE method {choice.method!r}: Megatron-LM {version} runs it, but longctx carries no scaling "
            f"but {', '.join(CARRIED_SCALINGS)} (export, evaluation and the local trainer would not reproduce it)",
            where=where,
            fix=f"use {' or '.join(CARRIED_SCALINGS)}, or a base method (fixed, abf, men, men-safe, liu, ntk)",
        )


def resolve_plan(plan: Plan) -> ResolvedPlan:
    resolved = validate_plan(plan)
    if not resolved.findings.ok:
        errs = resolved.findings.errors
        first = errs[0]
        more = f" (+{len(errs) - 1} more: {', '.join(e.code for e in errs[1:])})" if len(errs) > 1 else ""
        detail = first.message
        if first.expected is not None or first.found is not None:
            detail += f" (expected {first.expected}, found {first.found})"
        raise PlanError(f"plan does not validate: {detail}{more}", where=first.where, fix=first.fix)
    return resolved


def validate_plan(plan: Plan) -> ResolvedPlan:
    findings = Findings()
    _check_megatron_flags(plan, findings)
    manifest_path, manifest = _tokenizer_manifest(plan)
    vocab, divisible_by = manifest.vocab_size, manifest.make_vocab_size_divisible_by or 128
    arch = _arch(plan, vocab, findings)
    objective = resolve_objective(plan.objective, vocab)
    check_schedule(plan.objective, _where(plan, field="objective"), findings)
    check_entry_script(plan.megatron.entry_script, _where(plan, field="megatron.entry_script"), findings)
    check_family_args(
        list(plan.megatron.family_args), objective, _where(plan, field="megatron.family_args"), findings
    )
    stages: list[ResolvedStage] = []
    prev_base = plan.base.rotary_base
    prev_len = plan.base.seq_length
    for i, spec in enumerate(plan.stages):
        st = _resolve_stage(plan, i, spec, arch, vocab, divisible_by, findings)
        _check_after_previous(plan, st, prev_base, prev_len, findings)
        _check_documents_on_megatron(plan, st, findings)
        _check_attention_scale(plan, st, findings)
        prev_base, prev_len = st.rotary_base, st.seq_length
        stages.append(st)
    return ResolvedPlan(
        plan=plan,
        name=plan.name,
        description=plan.description,
        source=plan.plan_path,
        run_dir=paths.run_dir(plan),
        tokenizer=resolve_tokenizer(plan, manifest_path, manifest),
        base=resolve_base(plan),
        megatron=resolve_megatron(plan),
        cluster=plan.cluster,
        local=plan.local,
        slurm=parse_plan_slurm(dict(plan.slurm), f"{_where(plan)}: slurm"),
        wandb=resolve_wandb(plan),
        arch=arch,
        vocab_size=vocab,
        make_vocab_size_divisible_by=divisible_by,
        stages=stages,
        findings=findings,
        objective=objective,
        eval=plan.eval,
    )


def _check_attention_scale(plan: Plan, st: ResolvedStage, findings: Findings) -> None:
    """A stage that sharpens its attention at its start: the local backend folds the scale into the weights
    it loads; Megatron-LM loads them as saved, so `--backend megatron-lm` refuses the stage."""
    if st.attention_scale == 1.0:
        return
    what = f"attention logits × {st.attention_scale:.4g} at the stage's start, folded into the query weights"
    where = _where(plan, st.index, "attention_scale")
    if "megatron" in plan.model_fields_set:
        findings.warning(
            "attention-scale-local",
            f"`--backend megatron-lm` refuses this stage: {what} by the local backend only",
            where=where,
            fix="train the stage with --backend local, or remove attention_scale",
        )
    else:
        findings.info("attention-scale-local", f"local backend: {what}", where=where)


def _check_documents_on_megatron(plan: Plan, st: ResolvedStage, findings: Findings) -> None:
    """What the plan's Megatron-LM does with a stage packed by document. A plan that names its Megatron-LM
    ([megatron]) is meant for the cluster: there a stage it would train otherwise is a warning (the argv
    builder refuses it); a plan for the local backend gets the same verdict as information."""
    if st.data is None or st.data.packing != "documents":
        return
    verdict = packed_documents(plan.megatron.version, st.cp, st.data.reset_position_ids)
    where = _where(plan, st.index, "data.packing")
    if verdict.ok:
        findings.info("megatron-documents", verdict.what, where=where)
    elif "megatron" in plan.model_fields_set:
        findings.warning(
            "megatron-documents",
            f"`--backend megatron-lm` refuses this stage: {verdict.what}",
            where=where,
            fix=verdict.fix,
        )
    else:
        findings.info("megatron-documents", f"local backend only: {verdict.what}", where=where)


def _check_after_previous(
    plan: Plan, st: ResolvedStage, prev_base: int, prev_len: int, findings: Findings
) -> None:
    """A stage against the one before it (the base model for the first): bases do not decrease, lengths
    should not, and a YaRN stage's original length is the length the model last trained at."""
    i = st.index
    if st.rotary_base < prev_base:
        findings.error(
            "rope-base-decreasing",
            f"rotary base {st.rotary_base:,} is lower than the previous stage's {prev_base:,}",
            where=_where(plan, i, "rope"),
            expected=f">= {prev_base:,}",
            found=st.rotary_base,
            fix="bases must not decrease from stage to stage (a scaling keeps the base its params name: "
            "set params.base)",
        )
    if st.seq_length < prev_len:
        findings.warning(
            "seq-length-decreasing",
            f"seq_length {st.seq_length} is shorter than the previous stage's {prev_len}",
            where=_where(plan, i, "seq_length"),
        )
    scaling = st.rope_scaling
    if scaling is not None and scaling.original_length != prev_len:
        findings.warning(
            "scaling-original-length",
            f"{scaling.type} scales from an original length of {scaling.original_length:,} tokens, but the "
            f"model entering this stage last trained at {prev_len:,}",
            where=_where(plan, i, "rope.params"),
            fix=f"set params.original_length = {prev_len} (and params.factor, or leave it to default to "
            "seq_length / original_length) unless the scaling is meant to start from another length",
        )


# -- one stage, step by step ----------------------------------------------------------------------------
# settings → parallelism checks → global batch → CP → layout → memory → schedule → data → extra_args.
# Findings keep the order the steps run in and `resolve_plan` reports the first error, so keep it.


@dataclasses.dataclass(frozen=True)
class _StageContext:
    """What every step of resolving one stage reads: the plan, the stage, and where findings go."""

    plan: Plan
    index: int
    spec: StageSpec
    findings: Findings
    merged: StageDefaults
    """The stage's settings over [defaults] over the built-in defaults (`StageDefaults.merged_over`)."""

    def where(self, field: str) -> str:
        return _where(self.plan, self.index, field)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The stage's length and parallelism settings, merged over [defaults] (CP is chosen later)."""

    seq: int
    max_pos: int
    gpn: int
    tp: int
    pp: int
    sp: bool
    recompute: str
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_modules: tuple[str, ...]
    attention_backend: str
    mbs: int
    nodes_given: int | None


def _settings(ctx: _StageContext) -> _Settings:
    m = ctx.merged
    tp, recompute = m.tensor_parallel, m.recompute
    # sequence parallelism: on with TP > 1 unless set, and never without TP
    sp = (tp > 1 if m.sequence_parallel is None else m.sequence_parallel) and tp > 1
    return _Settings(
        seq=ctx.spec.seq_length,
        max_pos=ctx.spec.max_position_embeddings or ctx.spec.seq_length,
        gpn=m.gpus_per_node or ctx.plan.cluster.gpus_per_node,
        tp=tp,
        pp=m.pipeline_parallel,
        sp=sp,
        recompute=recompute,
        recompute_method=m.recompute_method if recompute == "full" else None,
        recompute_num_layers=m.recompute_num_layers if recompute == "full" else None,
        recompute_modules=tuple(m.recompute_modules) if recompute == "selective" else (),
        attention_backend=ctx.plan.megatron.attention_backend,
        mbs=m.micro_batch_size,
        nodes_given=m.nodes,
    )


def _check_parallelism(ctx: _StageContext, s: _Settings, arch: ModelArch) -> None:
    """TP must divide heads and query groups, PP the layers, TP the length (with SP); max_pos ≥ seq."""
    if arch.num_attention_heads % s.tp:
        ctx.findings.error(
            "tp-heads",
            f"num_attention_heads {arch.num_attention_heads} is not divisible by TP {s.tp}",
            where=ctx.where("tensor_parallel"),
            fix="choose a TP that divides the heads",
        )
    if arch.query_groups % s.tp:
        ctx.findings.error(
            "tp-groups",
            f"num_query_groups {arch.query_groups} is not divisible by TP {s.tp}",
            where=ctx.where("tensor_parallel"),
            fix="choose a TP that divides the query groups",
        )
    if arch.num_layers % s.pp:
        ctx.findings.error(
            "pp-layers",
            f"num_layers {arch.num_layers} is not divisible by PP {s.pp}",
            where=ctx.where("pipeline_parallel"),
            fix="choose a PP that divides the layers",
        )
    if s.sp and s.seq % s.tp:
        ctx.findings.error(
            "sp-seq",
            f"seq_length {s.seq} is not divisible by TP {s.tp} (sequence parallel)",
            where=ctx.where("seq_length"),
            fix="make seq_length a multiple of TP",
        )
    if s.max_pos < s.seq:
        ctx.findings.error(
            "max-position",
            f"max_position_embeddings {s.max_pos} is below seq_length {s.seq}",
            where=ctx.where("max_position_embeddings"),
            expected=f">= {s.seq}",
            found=s.max_pos,
            fix="drop max_position_embeddings (it defaults to seq_length) or raise it",
        )


def _check_recompute(ctx: _StageContext, s: _Settings, arch: ModelArch) -> None:
    """The recompute policy means what Megatron will do: full needs a method and a layer count Megatron
    accepts; selective needs modules that recompute something in this model with this attention kernel."""
    per_stage = arch.num_layers // s.pp
    for field, applies in (
        ("recompute_method", "full"),
        ("recompute_num_layers", "full"),
        ("recompute_modules", "selective"),
    ):
        if s.recompute != applies and field in ctx.merged.model_fields_set:
            ctx.findings.warning(
                "recompute-unused",
                f"{field} is set but recompute is {s.recompute!r}; it applies to recompute = {applies!r} only",
                where=ctx.where(field),
            )
    if s.recompute == "full":
        n, method = s.recompute_num_layers or 1, s.recompute_method
        if n > per_stage:
            ctx.findings.error(
                "recompute-num-layers",
                f"recompute_num_layers {n} is more than the {per_stage} layers per pipeline stage",
                where=ctx.where("recompute_num_layers"),
                expected=f"1 … {per_stage}",
                found=n,
                fix=f"choose a recompute_num_layers between 1 and {per_stage}",
            )
        elif method == "uniform" and per_stage % n:
            ctx.findings.error(
                "recompute-num-layers",
                f"recompute_num_layers {n} does not divide the {per_stage} layers per pipeline stage "
                "(uniform recompute checkpoints chunks of that many layers; Megatron fails on a partial one)",
                where=ctx.where("recompute_num_layers"),
                expected=f"a divisor of {per_stage}",
                found=n,
                fix=f'choose a divisor of {per_stage}, or recompute_method = "block"',
            )
    elif s.recompute == "selective":
        for problem in _recompute_module_problems(ctx, s, arch):
            ctx.findings.error(
                "recompute-modules",
                problem,
                where=ctx.where("recompute_modules"),
                fix='list modules that hold memory (e.g. ["mlp"]), or use recompute = "full" or "none"',
            )


def _recompute_module_problems(ctx: _StageContext, s: _Settings, arch: ModelArch) -> list[str]:
    mods = list(s.recompute_modules)
    if not mods:
        return ['recompute = "selective" needs recompute_modules (Megatron\'s default is core_attn alone)']
    problems = []
    dup = sorted({m for m in mods if mods.count(m) > 1})
    if dup:
        problems.append(f"recompute_modules repeats {', '.join(dup)}")
    moe = bool(arch.num_experts)
    if "core_attn" in mods and s.attention_backend != "unfused":
        share = memory.recompute_module_credit("core_attn", arch, s.tp, s.sp) / (
            memory.activation_bytes_per_token_layer(arch, s.tp, s.sp)
        )
        problems.append(
            f"core_attn with attention_backend {s.attention_backend!r} saves almost nothing: the kernel "
            f"keeps no s×s tensor, only a log-sum-exp per head and token ({share:.2%} of a layer's "
            "activations), while its recompute repeats the attention forward, the costliest part at long "
            "context"
        )
    if "mla_up_proj" in mods:
        problems.append("mla_up_proj needs multi-latent attention, which longctx models do not have")
    if "layernorm" in mods and not moe:
        problems.append(
            "layernorm recomputes nothing in a dense model: TransformerEngine fuses both norms into "
            "linear_qkv and linear_fc1 and Megatron skips them"
        )
    if "mlp" in mods and moe:
        problems.append("mlp recomputes dense MLP layers only; this model's MLPs are MoE layers (use moe)")
    for m in ("moe", "moe_act", "shared_experts"):
        if m in mods and not moe:
            problems.append(f"{m} recomputes MoE layers; this model is dense (use mlp)")
    if "moe_act" in mods and moe and "--moe-grouped-gemm" not in ctx.plan.megatron.performance_args:
        problems.append("moe_act needs --moe-grouped-gemm (Megatron refuses it otherwise)")
    if "shared_experts" in mods and moe and not arch.moe_shared_expert_intermediate_size:
        problems.append("shared_experts recomputes shared experts; this model has none")
    return problems


def _check_attention(ctx: _StageContext, s: _Settings, cp: int) -> None:
    """TransformerEngine runs context parallelism with its flash and fused kernels only."""
    if s.attention_backend == "unfused" and cp > 1:
        ctx.findings.error(
            "attention-backend-cp",
            f"attention_backend 'unfused' has no context parallelism (TransformerEngine runs CP with flash "
            f"and fused attention only), but this stage needs CP {cp}",
            where=_where(ctx.plan, field="megatron.attention_backend"),
            fix='use attention_backend = "flash" or "fused", or context_parallel = 1',
        )


def _check_megatron_flags(plan: Plan, findings: Findings) -> None:
    """[megatron]'s flag lists must not set what the planner derives (one rule: longctx.plan.flags)."""
    for name in ("performance_args", "family_args"):
        words = list(getattr(plan.megatron, name))
        check_user_flags(words, name, _where(plan, field=f"megatron.{name}"), findings)


def _global_batch(ctx: _StageContext, s: _Settings) -> int:
    """The global batch in sequences, from global_batch_size or global_batch_tokens (the stage's own
    setting wins over [defaults]); the micro batch when neither is set (an error finding)."""
    spec = ctx.spec
    gbs_seqs, gbs_tokens = ctx.merged.global_batch_size, ctx.merged.global_batch_tokens
    if spec.global_batch_size is not None and spec.global_batch_tokens is not None:
        ctx.findings.error(
            "batch-both",
            "give global_batch_size or global_batch_tokens, not both",
            where=ctx.where("global_batch_size"),
        )
    if spec.global_batch_size is not None:
        gbs_tokens = None
    elif spec.global_batch_tokens is not None:
        gbs_seqs = None
    if gbs_seqs is None and gbs_tokens is None:
        ctx.findings.error(
            "batch-missing",
            "no global batch: set global_batch_size (sequences) or global_batch_tokens",
            where=ctx.where("global_batch_size"),
            fix="set it in the stage or in [defaults]",
        )
        return s.mbs
    if gbs_seqs is not None:
        return gbs_seqs
    gbs = max(1, round(gbs_tokens / s.seq))
    if gbs * s.seq != gbs_tokens:
        ctx.findings.info(
            "batch-rounded",
            f"global_batch_tokens {gbs_tokens:,} → {gbs} sequences of {s.seq} ({gbs * s.seq:,} tokens)",
            where=ctx.where("global_batch_tokens"),
        )
    return gbs


@dataclasses.dataclass(frozen=True)
class _Sizing:
    """Nodes, DP and the per-GPU memory estimate for a candidate CP, given the stage's settings and batch."""

    plan: Plan
    arch: ModelArch
    s: _Settings
    padded_vocab_size: int
    gbs: int

    def layout(self, cp: int) -> tuple[int, int]:
        """(nodes, DP): the given nodes, else as few as hold one TP·PP·CP group."""
        s = self.s
        group = s.tp * s.pp * cp
        nodes = s.nodes_given if s.nodes_given is not None else max(1, math.ceil(group / s.gpn))
        world = nodes * s.gpn
        return nodes, max(1, world // group)

    def estimate(self, cp: int) -> memory.MemoryEstimate:
        s = self.s
        _, dp = self.layout(cp)
        return memory.estimate(
            memory.MemoryInputs(
                arch=self.arch,
                padded_vocab_size=self.padded_vocab_size,
                seq_length=s.seq,
                micro_batch_size=s.mbs,
                tp=s.tp,
                pp=s.pp,
                cp=cp,
                dp=dp,
                num_microbatches=max(1, self.gbs // max(1, s.mbs * dp)),
                sequence_parallel=s.sp,
                recompute=s.recompute,
                recompute_method=s.recompute_method or "uniform",
                recompute_num_layers=s.recompute_num_layers or 1,
                recompute_modules=s.recompute_modules,
                attention_backend=s.attention_backend,
            ),
            gpu_memory_gib=self.plan.cluster.gpu_memory_gib,
            margin=self.plan.cluster.memory_margin,
        )

    def cp_ok(self, cp: int) -> bool:
        """Whether a CP splits the length (seq % 2·CP) and, with nodes given, divides the world."""
        s = self.s
        if cp > 1 and s.seq % (2 * cp):
            return False
        return s.nodes_given is None or (s.nodes_given * s.gpn) % (s.tp * s.pp * cp) == 0


def _choose_cp(ctx: _StageContext, sizing: _Sizing) -> tuple[int, int | None]:
    """(CP, the smallest candidate CP that fits in memory or None): "auto" takes the smallest, a number is
    checked against the length."""
    seq = sizing.s.seq
    fitting = [c for c in CP_CANDIDATES if sizing.cp_ok(c) and sizing.estimate(c).fits]
    smallest = fitting[0] if fitting else None
    cp_cfg = ctx.merged.context_parallel
    if cp_cfg == "auto":
        if smallest is not None:
            return smallest, smallest
        ctx.findings.error(
            "cp-none-fits",
            f"no context-parallel size up to {CP_CANDIDATES[-1]} fits seq_length {seq} "
            f"in {ctx.plan.cluster.gpu_memory_gib:g} GiB",
            where=ctx.where("context_parallel"),
            fix="raise TP, use full recompute, lower micro_batch_size or add GPU memory",
        )
        return 1, smallest
    cp = int(cp_cfg)
    if cp > 1 and seq % (2 * cp):
        ctx.findings.error(
            "cp-seq",
            f"seq_length {seq} is not divisible by 2·CP = {2 * cp}",
            where=ctx.where("context_parallel"),
            expected=f"a multiple of {2 * cp}",
            found=seq,
            fix="choose a CP with seq_length % (2·CP) == 0",
        )
    return cp, smallest


def _check_layout(ctx: _StageContext, sizing: _Sizing, cp: int) -> tuple[int, int]:
    """(nodes, DP) for the chosen CP; the world must divide by TP·PP·CP, the nodes fit the cluster, and the
    global batch divide by micro batch × DP."""
    s, gbs = sizing.s, sizing.gbs
    nodes, dp = sizing.layout(cp)
    group = s.tp * s.pp * cp
    if (nodes * s.gpn) % group:
        ctx.findings.error(
            "world-divisible",
            f"{nodes} nodes × {s.gpn} GPUs = {nodes * s.gpn} is not a multiple of TP·PP·CP = {group}",
            where=ctx.where("nodes"),
            fix="choose nodes so that the world divides by TP·PP·CP",
        )
    max_nodes = ctx.plan.cluster.max_nodes
    if max_nodes is not None and nodes > max_nodes:
        ctx.findings.error(
            "too-many-nodes",
            f"{nodes} nodes exceed the cluster's max_nodes {max_nodes}",
            where=ctx.where("nodes"),
        )
    if gbs % (s.mbs * dp):
        ctx.findings.error(
            "batch-divisible",
            f"global batch {gbs} is not divisible by micro_batch_size × DP = {s.mbs} × {dp}",
            where=ctx.where("global_batch_size"),
            expected=f"a multiple of {s.mbs * dp}",
            found=gbs,
            fix="change the global batch, the micro batch or the number of nodes",
        )
    return nodes, dp


def _check_memory(ctx: _StageContext, est: memory.MemoryEstimate, smallest: int | None) -> None:
    if est.fits:
        return
    gpu_gib = ctx.plan.cluster.gpu_memory_gib
    hint = f"smallest CP that fits: {smallest}" if smallest else "no CP up to 64 fits"
    ctx.findings.error(
        "memory",
        f"needs {est.total / memory.GiB:.1f} GiB per GPU, over the "
        f"{est.budget / memory.GiB:.1f} GiB budget of a {gpu_gib:g} GiB GPU; {hint}",
        where=ctx.where("context_parallel"),
        expected=f"<= {est.budget / memory.GiB:.1f} GiB",
        found=f"{est.total / memory.GiB:.1f} GiB",
        fix=f"set context_parallel = {smallest}" if smallest else "raise TP or use full recompute",
    )


@dataclasses.dataclass(frozen=True)
class _Schedule:
    """Iterations and the learning-rate schedule in iterations."""

    tokens_per_iter: int
    iters: int
    lr: LRSpec
    warmup: int
    wsd: int | None
    save_interval: int


def _schedule(ctx: _StageContext, seq: int, gbs: int) -> _Schedule:
    """Iterations enough for the stage's tokens (at least one global batch of them), warmup shorter than
    the stage, the WSD decay and the save interval (default: 20 saves per stage) in iterations."""
    spec = ctx.spec
    tokens_per_iter = gbs * seq
    if spec.tokens < tokens_per_iter:
        ctx.findings.error(
            "tokens-below-batch",
            f"tokens {spec.tokens:,} are less than one global batch "
            f"({gbs} × {seq} = {tokens_per_iter:,} tokens)",
            where=ctx.where("tokens"),
            fix="raise tokens or lower the global batch",
        )
    iters = max(1, math.ceil(spec.tokens / tokens_per_iter))
    lr = ctx.merged.lr
    # Megatron asserts warm-up < decay (the stage's iterations): a fraction rounded up to the whole stage
    # (one iteration at 10 %) is rounding, so it stops one short; an explicit count that long is refused
    if lr.warmup_iters is None:
        warmup = min(math.ceil((lr.warmup_fraction or 0.0) * iters), iters - 1)
    else:
        warmup = lr.warmup_iters
    if warmup >= iters:
        ctx.findings.error(
            "warmup",
            f"warmup {warmup} iterations is not shorter than the stage ({iters})",
            where=ctx.where("lr.warmup_iters"),
            fix="shorten the warmup",
        )
    wsd = math.ceil(lr.wsd_decay_fraction * iters) if lr.decay_style == "WSD" else None
    save_interval = ctx.merged.save_interval or max(1, math.ceil(iters / 20))
    return _Schedule(tokens_per_iter, iters, lr, warmup, wsd, save_interval)


def _data(ctx: _StageContext) -> StageData | None:
    data = ctx.merged.data
    if data is None:
        ctx.findings.error(
            "data-missing",
            "no data for this stage",
            where=ctx.where("data"),
            fix="set [stages.data] or [defaults.data]",
        )
    return resolve_data(ctx.plan, ctx.spec.name, data)


def _extra_args(ctx: _StageContext) -> list[str]:
    """The stage's extra_args; a flag the planner owns or forbids is an error finding."""
    extra = list(ctx.merged.extra_args)
    check_user_flags(extra, "extra_args", ctx.where("extra_args"), ctx.findings)
    return extra


def _check_not_shorter_than_base(ctx: _StageContext, seq: int) -> None:
    base_len = ctx.plan.base.seq_length
    if seq < base_len:
        ctx.findings.warning(
            "shorter-than-base",
            f"seq_length {seq} is shorter than the base model's {base_len}",
            where=ctx.where("seq_length"),
        )


def _load_from(plan: Plan, i: int) -> Path | None:
    """The previous stage's save dir, or (first stage) the base checkpoint."""
    if i > 0:
        return paths.stage_save_dir(plan, plan.stages[i - 1].name)
    return paths.resolve(plan.base.path, plan, field="base.path") if plan.base.path else None


def _resolve_stage(
    plan: Plan, i: int, spec: StageSpec, arch: ModelArch, vocab: int, divisible_by: int, findings: Findings
) -> ResolvedStage:
    ctx = _StageContext(plan, i, spec, findings, spec.merged_over(plan.defaults))
    s = _settings(ctx)
    padded, out_rows = _vocab_rows(ctx, arch, vocab, divisible_by, s.tp)
    rope = _rope(plan, i, spec, arch, findings)
    _check_parallelism(ctx, s, arch)
    _check_recompute(ctx, s, arch)
    sizing = _Sizing(plan, arch, s, padded, _global_batch(ctx, s))
    layout = _layout(ctx, sizing)
    sched = _schedule(ctx, s.seq, sizing.gbs)
    data = _data(ctx)
    extra = _extra_args(ctx)
    _check_not_shorter_than_base(ctx, s.seq)
    main = _stage(ctx, sizing, layout, sched, rope, _Inputs(data, extra, out_rows))
    if rope.sweep is None:
        return main
    return dataclasses.replace(main, branches=_branches(ctx, main, rope.sweep))


def _vocab_rows(
    ctx: _StageContext, arch: ModelArch, vocab: int, divisible_by: int, tp: int
) -> tuple[int, int | None]:
    """(input rows, output rows when they differ) at this stage's TP; the first stage checks them."""
    objective = resolve_objective(ctx.plan.objective, vocab)
    padded, out_rows = vocab_rows(objective, vocab, divisible_by, tp)
    if ctx.index == 0:
        check_vocab_rows(
            objective,
            vocab,
            (padded, out_rows),
            arch.untie_embeddings_and_output_weights,
            _where(ctx.plan, field="objective"),
            ctx.findings,
        )
    return padded, out_rows


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The chosen parallel layout: CP, DP, nodes, the memory estimate at it and the smallest CP that fits."""

    cp: int
    dp: int
    nodes: int
    memory: memory.MemoryEstimate
    smallest_cp: int | None


def _layout(ctx: _StageContext, sizing: _Sizing) -> _Layout:
    cp, smallest = _choose_cp(ctx, sizing)
    _check_attention(ctx, sizing.s, cp)
    nodes, dp = _check_layout(ctx, sizing, cp)
    est = sizing.estimate(cp)
    _check_memory(ctx, est, smallest)
    return _Layout(cp, dp, nodes, est, smallest)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The rest of what a stage is built from: its data, extra flags and output-layer rows."""

    data: StageData | None
    extra_args: list[str]
    output_vocab_size: int | None


def _stage(
    ctx: _StageContext, sizing: _Sizing, layout: _Layout, sched: _Schedule, rope: _Rope, inputs: _Inputs
) -> ResolvedStage:
    """The resolved stage from the steps' results (a swept stage without its branches)."""
    plan, spec, m, s = ctx.plan, ctx.spec, ctx.merged, sizing.s
    gbs, mbs = sizing.gbs, s.mbs
    return ResolvedStage(
        index=ctx.index,
        name=spec.name,
        spec=spec,
        seq_length=s.seq,
        max_position_embeddings=s.max_pos,
        rotary_base=int(rope.base),
        rope_method=rope.method,
        rope_explanation=rope.explanation,
        tp=s.tp,
        pp=s.pp,
        cp=layout.cp,
        dp=layout.dp,
        nodes=layout.nodes,
        gpus_per_node=s.gpn,
        sequence_parallel=s.sp,
        recompute=s.recompute,
        recompute_method=s.recompute_method,
        recompute_num_layers=s.recompute_num_layers,
        recompute_modules=s.recompute_modules,
        attention_backend=s.attention_backend,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        num_microbatches=max(1, gbs // max(1, mbs * layout.dp)),
        train_iters=sched.iters,
        tokens_planned=spec.tokens,
        tokens_realized=sched.iters * sched.tokens_per_iter,
        lr=sched.lr,
        warmup_iters=sched.warmup,
        wsd_decay_iters=sched.wsd,
        save_interval=sched.save_interval,
        eval_interval=m.eval_interval,
        eval_iters=m.eval_iters,
        log_interval=m.log_interval,
        exit_duration_in_mins=m.exit_duration_in_mins,
        data=inputs.data,
        extra_args=inputs.extra_args,
        seed=m.seed,
        padded_vocab_size=sizing.padded_vocab_size,
        memory=layout.memory,
        smallest_fitting_cp=layout.smallest_cp,
        save_dir=paths.stage_save_dir(plan, spec.name),
        load_from=_load_from(plan, ctx.index),
        stage_dir=paths.stage_dir(plan, spec.name),
        wandb=stage_wandb(resolve_wandb(plan), spec.name, paths.stage_dir(plan, spec.name)),
        output_vocab_size=inputs.output_vocab_size,
        rope_scaling=rope.scaling,
        attention_scale=_attention_scale(plan, ctx.index, spec),
        sweep=rope.sweep,
    )


def _attention_scale(plan: Plan, i: int, spec: StageSpec) -> float:
    """The stage's attention logit scale as a number ("yarn": from its length over the previous one's)."""
    if spec.attention_scale != "yarn":
        return float(spec.attention_scale)
    previous = plan.stages[i - 1].seq_length if i > 0 else plan.base.seq_length
    return yarn_logit_scale(spec.seq_length, previous)


def _branches(ctx: _StageContext, main: ResolvedStage, sweep: ResolvedSweep) -> tuple[ResolvedStage, ...]:
    """One branch stage per sweep candidate: the stage at its candidate base, shortened to the sweep's
    tokens (its LR schedule fitted to them), saved under the sweep's directory."""
    local = Findings()
    short = dataclasses.replace(
        ctx, spec=ctx.spec.model_copy(update={"tokens": sweep.branch_tokens}), findings=local
    )
    sched = _schedule(short, main.seq_length, main.global_batch_size)
    for f in local.errors:
        ctx.findings.append(
            dataclasses.replace(f, message=f"sweep branches: {f.message}", where=ctx.where("rope.tokens"))
        )
    out = []
    for cand in sweep.candidates:
        home = sweep.branch_dir(cand)
        out.append(
            dataclasses.replace(
                main,
                name=sweep.branch_name(cand),
                rotary_base=cand.base,
                rope_method="sweep branch",
                rope_explanation="; ".join(cand.sources),
                train_iters=sched.iters,
                tokens_planned=sweep.branch_tokens,
                tokens_realized=sched.iters * sched.tokens_per_iter,
                lr=sched.lr,
                warmup_iters=sched.warmup,
                wsd_decay_iters=sched.wsd,
                save_interval=min(sched.save_interval, sched.iters),
                save_dir=home / "checkpoints",
                stage_dir=home,
                wandb=None,
                sweep=None,
                branches=(),
                branch_of=main.name,
            )
        )
    return tuple(out)


def open_plan(path: str | os.PathLike[str], run_dir: str | os.PathLike[str] | None = None) -> ResolvedPlan:
    """Load a plan (a file, or the name of a shipped plan) and resolve it: the one way in for commands.
    `run_dir` (or $LONGCTX_RUN_DIR) replaces the plan's run_dir. Raises PlanError when it does not validate."""
    rp = resolve_plan(load_plan(path, run_dir=run_dir))
    refuse_rehearsal_dir(rp.name, Path(rp.run_dir), rp.where)
    return rp
