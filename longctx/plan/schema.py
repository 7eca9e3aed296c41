"""The plan schema: what a `stages/*.toml` file may say.

Unknown keys are errors (a typo must not silently fall back to a default). Stage values not given
come from `[defaults]`, then from the built-in defaults below.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from longctx.arch import ModelArch
from longctx.errors import LongctxError, PlanError
from longctx.megatron_versions import facts
from longctx.objective import Objective
from longctx.plan.eval_tasks import check_tasks, key_space_problem
from longctx.rope.base_bound import RotaryBase, base_problem
from longctx.util.wandb_settings import WandbSettings

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# megatron-core's TransformerConfig.recompute_modules choices (0.16.1)
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
# megatron-core's AttnBackend, less `local` (Megatron-LM allows it only with `--spec local`)
AttentionBackend = Literal["flash", "fused", "unfused", "auto"]


# a quadrillion tokens, far past any published pretraining run (tens of trillions): more is a typo
MAX_STAGE_TOKENS = 10**15


class _Strict(BaseModel):
    # inf passes `gt=0` (nan does not): no plan number is meant to be infinite
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SweepMethod(_Strict):
    """A sweep candidate given as a method with parameters (`{ method = "men-safe", params = {…} }`)."""

    method: str
    params: dict[str, Any] = Field(default_factory=dict)


# a sweep's candidates: an explicit base, a method's name (its default parameters), or a method table
SweepCandidate = RotaryBase | str | SweepMethod
# branches beyond this are a typo, or a grid search no cluster budget allows
MAX_SWEEP_CANDIDATES = 12


class RopeSpec(_Strict):
    """Exactly one of: an explicit integer base, a method of `longctx.rope` with its parameters, or a
    sweep — short branches at each candidate base, the stage then runs with the base their evaluation
    chose (`longctx.plan.sweep`)."""

    base: RotaryBase | None = None
    method: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    sweep: list[SweepCandidate] | None = Field(default=None, min_length=2, max_length=MAX_SWEEP_CANDIDATES)
    # the tokens each sweep branch trains (the branches together: len(sweep) × tokens)
    tokens: StrictInt | None = Field(default=None, gt=0, le=MAX_STAGE_TOKENS)

    @field_validator("sweep", mode="before")
    @classmethod
    def _bases(cls, v: Any) -> Any:
        # an explicit candidate is held to the bound of every base, with one message (not the union's three)
        for i, cand in enumerate(v if isinstance(v, list) else []):
            problem = None if isinstance(cand, str | dict | SweepMethod) else base_problem(cand)
            if problem is not None:
                raise ValueError(f"sweep candidate {i + 1}: rotary base {problem}")
        return v

    @model_validator(mode="after")
    def _one(self) -> RopeSpec:
        given = [k for k in ("base", "method", "sweep") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of `base` (an integer), `method` (a longctx.rope method) or `sweep` "
                f"(candidate bases or methods, with `tokens` per branch); got {given or 'none'}"
            )
        if (self.sweep is None) != (self.tokens is None):
            raise ValueError("`tokens` (each branch's tokens) goes with `sweep`, and a sweep needs it")
        if self.sweep is not None and self.params:
            raise ValueError(
                "a sweep's method candidates take their parameters as { method = …, params = {…} }"
            )
        return self


class LRSpec(_Strict):
    lr: float = Field(default=1e-5, gt=0)
    min_lr: float = Field(default=1e-6, ge=0)
    decay_style: Literal["cosine", "WSD", "linear", "constant"] = "cosine"
    warmup_fraction: float | None = Field(default=0.05, ge=0, lt=1)
    warmup_iters: int | None = Field(default=None, ge=0)
    # WSD: the final share of iterations spent decaying (Megatron --lr-wsd-decay-iters)
    wsd_decay_fraction: float = Field(default=0.2, gt=0, le=1)
    wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = "linear"
    weight_decay: float = Field(default=0.1, ge=0)
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.95, ge=0, lt=1)
    adam_eps: float = Field(default=1e-8, gt=0)
    clip_grad: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> LRSpec:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is larger than lr {self.lr}")
        return self


class TierMix(_Strict):
    """Stage data drawn from length tiers of a tokenized artifact (see `longctx.data.artifact.layout`)."""

    artifact: str
    tiers: dict[str, float]
    languages: list[str] | None = None
    # languages weighted by size^alpha with a floor, then renormalised; None = by size
    alpha: float | None = Field(default=None, gt=0, le=1)
    floor: float = Field(default=0.0, ge=0, lt=1)
    run: str | None = None


class DataSpec(_Strict):
    """Where a stage's tokens come from: exactly one source."""

    blend_file: str | None = None  # Megatron --data-args-path file: "w1 p1 w2 p2 …"
    blend: list[tuple[float, str]] | None = None  # [[weight, prefix], …]
    prefixes: list[str] | None = None  # size-weighted, as Megatron does for a plain list
    tier_mix: TierMix | None = None
    split: str = "99,1,0"
    cache_dir: str | None = None
    # "concat": attention runs across the documents a sample is stitched from (Megatron's default);
    # "documents": each token attends within its document only, boundaries after each EOD token
    packing: Literal["concat", "documents"] = "concat"
    # position ids restart at every document (Megatron's --reset-position-ids); needs "documents"
    reset_position_ids: bool = False

    @model_validator(mode="after")
    def _one(self) -> DataSpec:
        given = [k for k in ("blend_file", "blend", "prefixes", "tier_mix") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one data source of blend_file, blend, prefixes, tier_mix (got {given or 'none'})"
            )
        if self.blend is not None:
            for w, p in self.blend:
                if not w > 0:
                    raise ValueError(f"blend weight {w} for {p!r} must be positive")
        if self.reset_position_ids and self.packing != "documents":
            # megatron-core applies RoPE by sequence index and never reads position ids: without the
            # document mask resetting them would change nothing
            raise ValueError(
                'reset_position_ids = true needs packing = "documents": RoPE models ignore position ids, '
                "so with attention across documents the reset would do nothing"
            )
        return self


class StageDefaults(_Strict):
    """Values every stage inherits unless it sets its own."""

    micro_batch_size: int | None = Field(default=None, gt=0)
    global_batch_size: int | None = Field(default=None, gt=0)
    global_batch_tokens: int | None = Field(default=None, gt=0)
    tensor_parallel: int | None = Field(default=None, gt=0)
    pipeline_parallel: int | None = Field(default=None, gt=0)
    context_parallel: int | Literal["auto"] | None = None
    sequence_parallel: bool | None = None
    # activation recomputation (longctx/plan/memory.py credits exactly what each setting recomputes):
    # "full" → --recompute-granularity full --recompute-method M --recompute-num-layers N (default uniform, 1);
    # "selective" → --recompute-granularity selective --recompute-modules (recompute_modules, required)
    recompute: Literal["none", "selective", "full"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = Field(default=None, gt=0)
    recompute_modules: list[RecomputeModule] | None = None
    nodes: int | None = Field(default=None, gt=0)
    # GPUs (local ranks) per node of this stage, where it differs from [cluster] (a rehearsal runs each
    # stage's CP ranks as one node)
    gpus_per_node: int | None = Field(default=None, gt=0, le=1024)
    lr: LRSpec | None = None
    data: DataSpec | None = None
    save_interval: int | None = Field(default=None, gt=0)
    eval_interval: int | None = Field(default=None, gt=0)
    eval_iters: int | None = Field(default=None, ge=0)
    log_interval: int | None = Field(default=None, gt=0)
    exit_duration_in_mins: int | None = Field(default=None, gt=0)
    extra_args: list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)  # numpy's seed range, which Megatron seeds


class StageSpec(StageDefaults):
    name: str
    seq_length: StrictInt = Field(gt=0)
    rope: RopeSpec
    tokens: StrictInt = Field(gt=0, le=MAX_STAGE_TOKENS)
    max_position_embeddings: StrictInt | None = Field(default=None, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                f"stage name {v!r} must be letters, digits, '_', '-', '.' (it names a directory)"
            )
        return v


class BaseCheckpoint(_Strict):
    """The checkpoint the first stage starts from."""

    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    iteration: int | None = Field(default=None, ge=0)
    seq_length: StrictInt = Field(gt=0, description="pretraining sequence length")
    rotary_base: RotaryBase = Field(description="pretraining --rotary-base")
    # model-only checkpoints (no optimizer/RNG) need --no-load-optim --no-load-rng on resume-like loads
    model_only: bool = False

    @model_validator(mode="after")
    def _where(self) -> BaseCheckpoint:
        if self.path is None and self.hub_id is None:
            raise ValueError("give `path` (a torch_dist save dir) and/or `hub_id`")
        return self


class TokenizerSpec(_Strict):
    path: str
    manifest: str
    megatron_type: str | None = None  # default: the manifest's tokenizer type


class ClusterSpec(_Strict):
    profile: str = "generic"
    gpus_per_node: int = Field(default=1, gt=0)
    gpu_memory_gib: float = Field(default=80.0, gt=0)
    # share of GPU memory kept free for fragmentation, NCCL buffers and the unexpected
    memory_margin: float = Field(default=0.10, ge=0, lt=1)
    max_nodes: int | None = Field(default=None, gt=0)


class MegatronSpec(_Strict):
    """The Megatron-LM the cluster runs: flags it does not honour are refused, not emitted."""

    version: str = "0.16.1"
    path: str | None = None  # Megatron-LM checkout with pretrain_gpt.py (or $LONGCTX_MEGATRON_LM)
    # the script each launch runs, relative to the checkout (or absolute): a fork's own (a diffusion
    # fork's `pretrain_mask_diff.py`) for objectives pretrain_gpt.py does not train
    entry_script: str = "pretrain_gpt.py"
    # that script's own flags, after the model's; "{name}" words take the plan's values (longctx.plan.entry)
    family_args: list[str] = Field(default_factory=list)
    # the attention kernel (--attention-backend; `--use-flash-attn` selects nothing for megatron-core
    # models): flash (flash-attn through TransformerEngine), fused (cuDNN), unfused (TE's plain softmax
    # attention: stores the s×s probabilities, no context parallelism), auto (TE chooses)
    attention_backend: AttentionBackend = "flash"
    # runtime flags that do not change the maths (fusions, overlaps) — cluster specific
    performance_args: list[str] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        # a release the version table (longctx.megatron_versions) knows; checked against the checkout
        # itself when one is given (longctx.stage.checkout)
        try:
            facts(v)
        except LongctxError as err:
            raise ValueError(f"{err.what}; {err.fix}") from None
        return v


class LocalSpec(_Strict):
    """Settings of the local backend (CPU or one GPU)."""

    threads_per_process: int | None = Field(default=None, gt=0)
    eval_after_stage: bool = True
    # "longctx": ring attention (CP without TransformerEngine); "te": TransformerEngine's spec (GPU, CP 1
    # unless TE's own CP is wired); "megatron-local": megatron's DotProductAttention (CP 1)
    attention: Literal["longctx", "te", "megatron-local"] = "longctx"
    cp_comm: Literal["ring", "allgather"] = "ring"
    bf16: bool | None = None  # None: bf16 on GPU, fp32 on CPU


DEFAULT_EVAL_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
# [eval] fields added with the needle tasks: left out of the measured settings at their defaults
_ADDED = ("tasks", "any_digit_keys")
_READINGS = ("ruler_threshold", "relative_threshold")  # how results are read, not what is measured


class EvalSpec(_Strict):
    """`[eval]`: what the evaluation of this plan measures. `stage run` (after each local stage), `eval
    run`, `eval summary` and the demo use these values unless an option overrides one; every field but
    `batch_size` changes the numbers (and the cache key of the results).

    The defaults are cheap enough for the CPU demo's evaluation after each stage (about 35 forwards per
    checkpoint and length, and two sequences scored twice for the packed windows)."""

    # needle depths, fractions of the context in [0, 1] (0 = the needle at the start)
    depths: list[float] = Field(default_factory=lambda: list(DEFAULT_EVAL_DEPTHS), min_length=1)
    # pass keys per (length, depth) cell; bounded so a typo cannot queue billions of forwards
    keys_per_cell: StrictInt = Field(default=2, ge=1, le=10_000)
    # distractor keys per item for the log-likelihood choice (0: greedy exact match only)
    distractors: StrictInt = Field(default=2, ge=0, le=100)
    key_digits: StrictInt = Field(default=5, ge=1, le=30)
    # the haystack: "synthetic" (the demo corpus' sentences) or "heldout" (the plan's held-out tokens)
    filler: Literal["synthetic", "heldout"] = "synthetic"
    seed: StrictInt = Field(default=1234, ge=0)
    # held-out documents per length for the loss by position
    loss_docs: StrictInt = Field(default=3, ge=1)
    buckets: Literal["log", "fixed"] = "log"
    bucket_first: StrictInt = Field(default=16, ge=2)
    short_docs: StrictInt = Field(default=16, ge=0)  # 0: no short-context loss
    # windows per length packed from several held-out documents, scored across and within documents
    packed_windows: StrictInt = Field(default=2, ge=0)  # 0: none
    # diffusion models: the ELBO of a window this long by the clean context around it, at these noise levels
    elbo_window: StrictInt = Field(default=64, ge=2)
    elbo_levels: list[float] = Field(default_factory=lambda: [0.125, 0.375, 0.625, 0.875], min_length=1)
    # needle tasks (longctx.plan.eval_tasks): "single" alone by default; e.g. ["single", "multikey-2", "multivalue"]
    tasks: list[str] = Field(default_factory=lambda: ["single"], min_length=1)
    # keys of any digits, repeats allowed ("55829"); false: distinct digits, as keys were drawn before
    any_digit_keys: StrictBool = False
    # diffusion models decode the corrupted key digits most confident first, one a round; below 1, a round
    # also fixes every digit whose probability reaches this (fewer forwards, a few points lower)
    infill_threshold: float = Field(default=1.0, gt=0, le=1)
    # effective length per task: score ≥ this (RULER's rule) …
    ruler_threshold: float = Field(default=0.856, gt=0, le=1)
    # … or ≥ this fraction of the checkpoint's own score at the shortest evaluated length (NoLiMa's rule)
    relative_threshold: float = Field(default=0.85, gt=0, le=1)
    # sequences per forward: memory only, the numbers stay the same
    batch_size: StrictInt = Field(default=4, ge=1)

    @field_validator("depths")
    @classmethod
    def _depths(cls, v: list[float]) -> list[float]:
        bad = [d for d in v if not 0.0 <= d <= 1.0]
        if bad:
            raise ValueError(f"needle depths must be fractions in [0, 1]; got {bad}")
        if len(set(v)) != len(v):
            raise ValueError(f"needle depths repeat: {v}")
        return v

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v: list[str]) -> list[str]:
        return check_tasks(v)

    @model_validator(mode="after")
    def _enough_keys(self) -> EvalSpec:
        # the rule `eval run` would meet only after loading the model, checked wherever settings are made
        problem = key_space_problem(self.key_digits, self.any_digit_keys, self.distractors, self.tasks)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("elbo_levels")
    @classmethod
    def _levels(cls, v: list[float]) -> list[float]:
        bad = [t for t in v if not 0.0 < t <= 1.0]
        if bad:
            raise ValueError(f"noise levels are in (0, 1], got {bad}")
        return v

    def measured(self) -> dict[str, Any]:
        """The fields that change the numbers: all but batch_size and the thresholds (which only read
        them), and the task fields only where they differ from their defaults, so the settings of plans
        without them measure, and are cached, as before."""
        data = self.model_dump(exclude={"batch_size", *_READINGS})
        for k in _ADDED:
            if data[k] == type(self).model_fields[k].get_default(call_default_factory=True):
                del data[k]
        return data

    def changes_from(self, other: EvalSpec) -> list[str]:
        """`keys_per_cell 2 → 20` for each field (but batch_size) that differs from `other`'s."""
        mine, theirs = self.model_dump(exclude={"batch_size"}), other.model_dump(exclude={"batch_size"})
        return [f"{k} {_text(theirs[k])} → {_text(mine[k])}" for k in mine if mine[k] != theirs.get(k)]

    def describe(self) -> str:
        """One line: `20 keys per cell × 5 depths (0–100 %), 2 distractors, 5-digit keys, …`."""
        depths = ", ".join(f"{d:.0%}" for d in self.depths)
        return (
            f"{self.keys_per_cell} keys per cell × {len(self.depths)} depths ({depths}), "
            f"{self.distractors} distractors, {self.key_digits}-digit keys, {self.filler} filler, "
            f"seed {self.seed}"
        ) + self._describe_tasks()

    def _describe_tasks(self) -> str:
        """`, tasks single, multikey-2, keys of any digits` where they differ from the defaults; else empty."""
        text = f", tasks {', '.join(self.tasks)}" if self.tasks != ["single"] else ""
        return text + (", keys of any digits" if self.any_digit_keys else "")


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in value)
    return str(value)


class Plan(_Strict):
    name: str
    description: str = ""
    run_dir: str
    base: BaseCheckpoint
    tokenizer: TokenizerSpec
    model: ModelArch | None = None
    model_from_checkpoint: bool = False
    objective: Objective = Objective()
    cluster: ClusterSpec = ClusterSpec()
    megatron: MegatronSpec = MegatronSpec()
    local: LocalSpec = LocalSpec()
    wandb: WandbSettings | None = None  # W&B logging (optional; TensorBoard events are always written)
    eval: EvalSpec = EvalSpec()  # what the evaluation measures (docs/evaluation.md)
    slurm: dict[str, Any] = Field(default_factory=dict)
    defaults: StageDefaults = StageDefaults()
    stages: list[StageSpec] = Field(min_length=1)
    # where the plan was read from; paths in it resolve against this directory
    plan_path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.model is None and not self.model_from_checkpoint:
            raise ValueError("give a [model] table or set model_from_checkpoint = true")
        names = [s.name for s in self.stages]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"stage names must be unique; repeated: {sorted(dup)}")
        return self

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise PlanError(
            f"plan {self.name!r} has no stage {name!r}",
            where=str(self.plan_path or self.name),
            fix=f"use one of: {', '.join(s.name for s in self.stages)}",
        )
