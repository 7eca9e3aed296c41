"""From a plan to resolved stages: every number a launch needs, plus the findings of validation.

`resolve_plan(plan)` returns a `ResolvedPlan` and raises PlanError when any rule fails;
`validate_plan(plan)` returns the findings without raising (for `plan validate`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from longctx.arch import ModelArch
from longctx.errors import LongctxError, PlanError
from longctx.plan import memory, paths
from longctx.plan.schema import DataSpec, LRSpec, Plan, StageSpec
from longctx.report import Findings

CP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)

# flags longctx derives itself; a stage's extra_args must not set them behind the planner's back
OWNED_FLAGS = {
    "--seq-length", "--max-position-embeddings", "--rotary-base", "--position-embedding-type",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--global-batch-size", "--micro-batch-size", "--train-iters", "--save", "--load",
    "--pretrained-checkpoint", "--tokenizer-model", "--tokenizer-type", "--data-path", "--data-args-path",
    "--num-layers", "--hidden-size", "--num-attention-heads",
}  # fmt: skip
FORBIDDEN_FLAGS = {
    "--use-checkpoint-args": "it silently replaces the stage's --rotary-base (and other RoPE settings) "
    "with the checkpoint's",
    "--finetune": "longctx decides finetune semantics per launch (--pretrained-checkpoint on first launch)",
}


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
    data: DataSpec | None
    extra_args: list[str]
    seed: int
    padded_vocab_size: int
    memory: memory.MemoryEstimate
    smallest_fitting_cp: int | None
    save_dir: Path
    load_from: Path | None  # the previous stage's save dir, or the base checkpoint

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
            "tp": self.tp, "pp": self.pp, "cp": self.cp, "dp": self.dp,
            "nodes": self.nodes,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "train_iters": self.train_iters,
            "tokens_planned": self.tokens_planned,
            "tokens_realized": self.tokens_realized,
            "memory_gib": self.memory.to_gib(),
            "memory_fits": self.memory.fits,
            "smallest_fitting_cp": self.smallest_fitting_cp,
        }  # fmt: skip


@dataclasses.dataclass
class ResolvedPlan:
    plan: Plan
    arch: ModelArch
    vocab_size: int
    make_vocab_size_divisible_by: int
    stages: list[ResolvedStage]
    findings: Findings

    @property
    def run_dir(self) -> Path:
        return paths.run_dir(self.plan)

    def stage(self, name: str) -> ResolvedStage:
        self.plan.stage(name)  # raises the helpful error for unknown names
        return next(s for s in self.stages if s.name == name)


def _where(plan: Plan, stage_index: int | None = None, field: str | None = None) -> str:
    loc = str(plan.plan_path or plan.name)
    if stage_index is not None:
        loc += f": stages[{stage_index}] ({plan.stages[stage_index].name!r})"
    if field:
        loc += f".{field}"
    return loc


def _merged(plan: Plan, stage: StageSpec, field: str, default: Any) -> Any:
    value = getattr(stage, field)
    if value is None:
        value = getattr(plan.defaults, field)
    return default if value is None else value


def _arch(plan: Plan, findings: Findings) -> ModelArch:
    if plan.model is not None:
        if plan.model_from_checkpoint:
            _cross_check_arch(plan, plan.model, findings)
        return plan.model
    try:
        from longctx.checkpoint import inspect_checkpoint

        report = inspect_checkpoint(_base_path(plan))
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


def _cross_check_arch(plan: Plan, arch: ModelArch, findings: Findings) -> None:
    try:
        from longctx.checkpoint import inspect_checkpoint

        inferred = inspect_checkpoint(_base_path(plan)).arch.to_model_arch()
    except LongctxError as err:
        findings.warning(
            "arch-unchecked", f"base checkpoint not readable, [model] not cross-checked: {err.what}"
        )
        return
    for name, (mine, theirs) in arch.diff(inferred).items():
        findings.error(
            "arch-mismatch",
            f"[model].{name} differs from the base checkpoint",
            expected=theirs,
            found=mine,
            where=_where(plan, field=f"model.{name}"),
            fix="make the plan's [model] match the checkpoint",
        )


def _tokenizer_vocab(plan: Plan, findings: Findings) -> tuple[int, int]:
    from longctx.tokenizer.manifest import load_manifest

    manifest_path = paths.resolve(plan.tokenizer.manifest, plan, field="tokenizer.manifest")
    try:
        manifest = load_manifest(manifest_path)
    except LongctxError as err:
        raise PlanError(
            f"tokenizer manifest cannot be read: {err.what}",
            where=_where(plan, field="tokenizer.manifest"),
            fix=err.fix or "point tokenizer.manifest at a tokenization/*.toml file",
        ) from None
    return manifest.vocab_size, manifest.make_vocab_size_divisible_by or 128


def _rope(plan: Plan, i: int, stage: StageSpec, arch: ModelArch, findings: Findings) -> tuple[int, str, str]:
    from longctx.rope import choose_base

    if stage.rope.base is not None:
        # an explicit base still gets the diagnostics (e.g. a base below Men's bound for this length)
        explicit = choose_base(
            "fixed",
            rotary_dim=arch.rotary_dim,
            head_dim=arch.head_dim,
            pretrain_base=plan.base.rotary_base,
            pretrain_length=plan.base.seq_length,
            target_length=stage.seq_length,
            base=stage.rope.base,
        )
        for f in explicit.findings:
            if f.level != "info":
                findings.append(dataclasses.replace(f, where=_where(plan, i, "rope.base")))
        return stage.rope.base, "fixed", f"explicit base {stage.rope.base:,}"

    try:
        choice = choose_base(
            stage.rope.method or "",
            rotary_dim=arch.rotary_dim,
            head_dim=arch.head_dim,
            pretrain_base=plan.base.rotary_base,
            pretrain_length=plan.base.seq_length,
            target_length=stage.seq_length,
            with_diagnostics=False,
            **stage.rope.params,
        )
    except LongctxError as err:
        raise PlanError(
            f"RoPE method cannot be applied: {err.what}", where=_where(plan, i, "rope"), fix=err.fix
        ) from None
    if choice.scaling is not None:
        raise PlanError(
            f"RoPE method {choice.method!r} changes more than the base; stages train at their length with a "
            "new base only",
            where=_where(plan, i, "rope.method"),
            fix="use fixed, abf, men, men-safe, liu or ntk",
        )
    for f in choice.findings:
        findings.append(dataclasses.replace(f, where=_where(plan, i, "rope")))
    return choice.base, choice.method, choice.explanation


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
    arch = _arch(plan, findings)
    vocab, divisible_by = _tokenizer_vocab(plan, findings)
    stages: list[ResolvedStage] = []
    prev_base = plan.base.rotary_base
    prev_len = plan.base.seq_length
    for i, spec in enumerate(plan.stages):
        st = _resolve_stage(plan, i, spec, arch, vocab, divisible_by, findings)
        if st.rotary_base < prev_base:
            findings.error(
                "rope-base-decreasing",
                f"rotary base {st.rotary_base:,} is lower than the previous stage's {prev_base:,}",
                where=_where(plan, i, "rope"),
                expected=f">= {prev_base:,}",
                found=st.rotary_base,
                fix="bases must not decrease from stage to stage",
            )
        if st.seq_length < prev_len:
            findings.warning(
                "seq-length-decreasing",
                f"seq_length {st.seq_length} is shorter than the previous stage's {prev_len}",
                where=_where(plan, i, "seq_length"),
            )
        prev_base, prev_len = st.rotary_base, st.seq_length
        stages.append(st)
    return ResolvedPlan(plan, arch, vocab, divisible_by, stages, findings)


def _resolve_stage(
    plan: Plan, i: int, spec: StageSpec, arch: ModelArch, vocab: int, divisible_by: int, findings: Findings
) -> ResolvedStage:
    from longctx.tokenizer.padding import padded_vocab_size

    w = lambda field: _where(plan, i, field)  # noqa: E731
    gpn = plan.cluster.gpus_per_node
    seq = spec.seq_length
    tp = _merged(plan, spec, "tensor_parallel", 1)
    pp = _merged(plan, spec, "pipeline_parallel", 1)
    sp = bool(_merged(plan, spec, "sequence_parallel", tp > 1)) and tp > 1
    recompute = _merged(plan, spec, "recompute", "selective")
    mbs = _merged(plan, spec, "micro_batch_size", 1)
    nodes_given = _merged(plan, spec, "nodes", None)
    padded = padded_vocab_size(vocab, divisible_by, tp)
    max_pos = spec.max_position_embeddings or seq
    rotary_base, rope_method, rope_expl = _rope(plan, i, spec, arch, findings)

    if arch.num_attention_heads % tp:
        findings.error(
            "tp-heads",
            f"num_attention_heads {arch.num_attention_heads} is not divisible by TP {tp}",
            where=w("tensor_parallel"),
            fix="choose a TP that divides the heads",
        )
    if arch.query_groups % tp:
        findings.error(
            "tp-groups",
            f"num_query_groups {arch.query_groups} is not divisible by TP {tp}",
            where=w("tensor_parallel"),
            fix="choose a TP that divides the query groups",
        )
    if arch.num_layers % pp:
        findings.error(
            "pp-layers",
            f"num_layers {arch.num_layers} is not divisible by PP {pp}",
            where=w("pipeline_parallel"),
            fix="choose a PP that divides the layers",
        )
    if sp and seq % tp:
        findings.error(
            "sp-seq",
            f"seq_length {seq} is not divisible by TP {tp} (sequence parallel)",
            where=w("seq_length"),
            fix="make seq_length a multiple of TP",
        )
    if max_pos < seq:
        findings.error(
            "max-position",
            f"max_position_embeddings {max_pos} is below seq_length {seq}",
            where=w("max_position_embeddings"),
            expected=f">= {seq}",
            found=max_pos,
            fix="drop max_position_embeddings (it defaults to seq_length) or raise it",
        )

    gbs_seqs = _merged(plan, spec, "global_batch_size", None)
    gbs_tokens = _merged(plan, spec, "global_batch_tokens", None)
    if spec.global_batch_size is not None and spec.global_batch_tokens is not None:
        findings.error(
            "batch-both",
            "give global_batch_size or global_batch_tokens, not both",
            where=w("global_batch_size"),
        )
    if spec.global_batch_size is not None:
        gbs_tokens = None
    elif spec.global_batch_tokens is not None:
        gbs_seqs = None
    if gbs_seqs is None and gbs_tokens is None:
        findings.error(
            "batch-missing",
            "no global batch: set global_batch_size (sequences) or global_batch_tokens",
            where=w("global_batch_size"),
            fix="set it in the stage or in [defaults]",
        )
        gbs = mbs
    elif gbs_seqs is not None:
        gbs = gbs_seqs
    else:
        gbs = max(1, round(gbs_tokens / seq))
        if gbs * seq != gbs_tokens:
            findings.info(
                "batch-rounded",
                f"global_batch_tokens {gbs_tokens:,} → {gbs} sequences of {seq} ({gbs * seq:,} tokens)",
                where=w("global_batch_tokens"),
            )

    cp_cfg = _merged(plan, spec, "context_parallel", 1)

    def layout(cp: int) -> tuple[int, int]:
        group = tp * pp * cp
        nodes = nodes_given if nodes_given is not None else max(1, math.ceil(group / gpn))
        world = nodes * gpn
        return nodes, max(1, world // group)

    def estimate(cp: int) -> memory.MemoryEstimate:
        _, dp = layout(cp)
        return memory.estimate(
            memory.MemoryInputs(
                arch=arch,
                padded_vocab_size=padded,
                seq_length=seq,
                micro_batch_size=mbs,
                tp=tp,
                pp=pp,
                cp=cp,
                dp=dp,
                num_microbatches=max(1, gbs // max(1, mbs * dp)),
                sequence_parallel=sp,
                recompute=recompute,
            ),
            gpu_memory_gib=plan.cluster.gpu_memory_gib,
            margin=plan.cluster.memory_margin,
        )

    def cp_ok(cp: int) -> bool:
        if cp > 1 and seq % (2 * cp):
            return False
        return nodes_given is None or (nodes_given * gpn) % (tp * pp * cp) == 0

    fitting = [c for c in CP_CANDIDATES if cp_ok(c) and estimate(c).fits]
    smallest = fitting[0] if fitting else None
    if cp_cfg == "auto":
        if smallest is None:
            findings.error(
                "cp-none-fits",
                f"no context-parallel size up to {CP_CANDIDATES[-1]} fits seq_length {seq} "
                f"in {plan.cluster.gpu_memory_gib:g} GiB",
                where=w("context_parallel"),
                fix="raise TP, use full recompute, lower micro_batch_size or add GPU memory",
            )
            cp = 1
        else:
            cp = smallest
    else:
        cp = int(cp_cfg)
        if cp > 1 and seq % (2 * cp):
            findings.error(
                "cp-seq",
                f"seq_length {seq} is not divisible by 2·CP = {2 * cp}",
                where=w("context_parallel"),
                expected=f"a multiple of {2 * cp}",
                found=seq,
                fix="choose a CP with seq_length % (2·CP) == 0",
            )
    nodes, dp = layout(cp)
    group = tp * pp * cp
    if (nodes * gpn) % group:
        findings.error(
            "world-divisible",
            f"{nodes} nodes × {gpn} GPUs = {nodes * gpn} is not a multiple of TP·PP·CP = {group}",
            where=w("nodes"),
            fix="choose nodes so that the world divides by TP·PP·CP",
        )
    if plan.cluster.max_nodes is not None and nodes > plan.cluster.max_nodes:
        findings.error(
            "too-many-nodes",
            f"{nodes} nodes exceed the cluster's max_nodes {plan.cluster.max_nodes}",
            where=w("nodes"),
        )
    if gbs % (mbs * dp):
        findings.error(
            "batch-divisible",
            f"global batch {gbs} is not divisible by micro_batch_size × DP = {mbs} × {dp}",
            where=w("global_batch_size"),
            expected=f"a multiple of {mbs * dp}",
            found=gbs,
            fix="change the global batch, the micro batch or the number of nodes",
        )
    est = estimate(cp)
    if not est.fits:
        hint = f"smallest CP that fits: {smallest}" if smallest else "no CP up to 64 fits"
        findings.error(
            "memory",
            f"needs {est.total / memory.GiB:.1f} GiB per GPU, over the "
            f"{est.budget / memory.GiB:.1f} GiB budget of a {plan.cluster.gpu_memory_gib:g} GiB GPU; {hint}",
            where=w("context_parallel"),
            expected=f"<= {est.budget / memory.GiB:.1f} GiB",
            found=f"{est.total / memory.GiB:.1f} GiB",
            fix=f"set context_parallel = {smallest}" if smallest else "raise TP or use full recompute",
        )

    tokens_per_iter = gbs * seq
    if spec.tokens < tokens_per_iter:
        findings.error(
            "tokens-below-batch",
            f"tokens {spec.tokens:,} are less than one global batch "
            f"({gbs} × {seq} = {tokens_per_iter:,} tokens)",
            where=w("tokens"),
            fix="raise tokens or lower the global batch",
        )
    iters = max(1, math.ceil(spec.tokens / tokens_per_iter))
    lr: LRSpec = _merged(plan, spec, "lr", LRSpec())
    warmup = (
        lr.warmup_iters if lr.warmup_iters is not None else math.ceil((lr.warmup_fraction or 0.0) * iters)
    )
    if warmup >= iters and iters > 1:
        findings.error(
            "warmup",
            f"warmup {warmup} iterations is not shorter than the stage ({iters})",
            where=w("lr.warmup_iters"),
            fix="shorten the warmup",
        )
    wsd = math.ceil(lr.wsd_decay_fraction * iters) if lr.decay_style == "WSD" else None
    save_interval = _merged(plan, spec, "save_interval", max(1, math.ceil(iters / 20)))
    data = _merged(plan, spec, "data", None)
    if data is None:
        findings.error(
            "data-missing",
            "no data for this stage",
            where=w("data"),
            fix="set [stages.data] or [defaults.data]",
        )
    extra = list(_merged(plan, spec, "extra_args", []))
    for flag in extra:
        name = flag.split("=", 1)[0]
        if name in FORBIDDEN_FLAGS:
            findings.error(
                "forbidden-flag",
                f"extra_args has {name}: {FORBIDDEN_FLAGS[name]}",
                where=w("extra_args"),
                fix=f"remove {name}",
            )
        elif name in OWNED_FLAGS:
            findings.error(
                "owned-flag",
                f"extra_args sets {name}, which the planner derives",
                where=w("extra_args"),
                fix=f"remove {name} and set the plan field instead",
            )
    if seq < plan.base.seq_length:
        findings.warning(
            "shorter-than-base",
            f"seq_length {seq} is shorter than the base model's {plan.base.seq_length}",
            where=w("seq_length"),
        )

    load_from = (
        paths.stage_save_dir(plan, plan.stages[i - 1].name)
        if i > 0
        else (paths.resolve(plan.base.path, plan, field="base.path") if plan.base.path else None)
    )
    return ResolvedStage(
        index=i, name=spec.name, spec=spec, seq_length=seq, max_position_embeddings=max_pos,
        rotary_base=int(rotary_base), rope_method=rope_method, rope_explanation=rope_expl,
        tp=tp, pp=pp, cp=cp, dp=dp, nodes=nodes, gpus_per_node=gpn, sequence_parallel=sp, recompute=recompute,
        micro_batch_size=mbs, global_batch_size=gbs, num_microbatches=max(1, gbs // max(1, mbs * dp)),
        train_iters=iters, tokens_planned=spec.tokens, tokens_realized=iters * tokens_per_iter, lr=lr,
        warmup_iters=warmup, wsd_decay_iters=wsd, save_interval=save_interval,
        eval_interval=_merged(plan, spec, "eval_interval", None), eval_iters=_merged(plan, spec, "eval_iters", 0),
        log_interval=_merged(plan, spec, "log_interval", 1),
        exit_duration_in_mins=_merged(plan, spec, "exit_duration_in_mins", None),
        data=data, extra_args=extra, seed=_merged(plan, spec, "seed", 1234), padded_vocab_size=padded,
        memory=est, smallest_fitting_cp=smallest, save_dir=paths.stage_save_dir(plan, spec.name), load_from=load_from,
    )  # fmt: skip
