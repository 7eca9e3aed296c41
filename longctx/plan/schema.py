"""The plan schema: what a `stages/*.toml` file may say.

Unknown keys are errors (a typo must not silently fall back to a default). Stage values not given
come from `[defaults]`, then from the built-in defaults below.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

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
    # each field's docstring is its description (the key reference of docs/plans.md is generated from them)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)


class SweepMethod(_Strict):
    """A sweep candidate given as a method with parameters (`{ method = "men-safe", params = {…} }`)."""

    method: str
    """The longctx.rope method that gives the candidate's base (e.g. "men-safe")."""

    params: dict[str, Any] = Field(default_factory=dict)
    """The method's parameters (default: none, the method's own defaults)."""


# a sweep's candidates: an explicit base, a method's name (its default parameters), or a method table
SweepCandidate = RotaryBase | str | SweepMethod
# branches beyond this are a typo, or a grid search no cluster budget allows
MAX_SWEEP_CANDIDATES = 12


class RopeSpec(_Strict):
    """Exactly one of: an explicit integer base, a method of `longctx.rope` with its parameters, or a
    sweep — short branches at each candidate base, the stage then runs with the base their evaluation
    chose (`longctx.plan.rope_sweep`)."""

    base: RotaryBase | None = None
    """An explicit integer rotary base (--rotary-base) for the stage."""

    method: str | None = None
    """A longctx.rope method that chooses the base: fixed, abf, men, men-safe, liu, ntk (or yarn, a
    scaling, on Megatron-LM ≥ 0.19)."""

    params: dict[str, Any] = Field(default_factory=dict)
    """The method's parameters (default: none, the method's own defaults)."""

    sweep: list[SweepCandidate] | None = Field(default=None, min_length=2, max_length=MAX_SWEEP_CANDIDATES)
    """Candidates to train short branches at (explicit bases, method names, or `{ method, params }`
    tables; 2 to 12); the stage then runs at the base their evaluation chose."""

    tokens: StrictInt | None = Field(default=None, gt=0, le=MAX_STAGE_TOKENS)
    """Tokens each sweep branch trains (the branches together: len(sweep) × tokens); only with `sweep`."""

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
    """A stage's learning-rate schedule and optimizer settings (Megatron-LM's flags of the same names)."""

    lr: float = Field(default=1e-5, gt=0)
    """Peak learning rate (--lr); 1e-5, a continued-pretraining rate that keeps the base's knowledge."""

    min_lr: float = Field(default=1e-6, ge=0)
    """Learning rate at the end of the decay (--min-lr), at most `lr`; 1e-6, a tenth of the default peak."""

    decay_style: Literal["cosine", "WSD", "linear", "constant"] = "cosine"
    """How the rate decays over the stage (--lr-decay-style): cosine (default), WSD, linear or constant."""

    warmup_fraction: float | None = Field(default=0.05, ge=0, lt=1)
    """Share of the stage's iterations spent warming up, rounded up and stopping one iteration short of the
    stage; 0.05 (5 %). Ignored when `warmup_iters` is set."""

    warmup_iters: int | None = Field(default=None, ge=0)
    """Warm-up in iterations (--lr-warmup-iters), shorter than the stage; default: from `warmup_fraction`."""

    wsd_decay_fraction: float = Field(default=0.2, gt=0, le=1)
    """WSD only: the final share of iterations spent decaying (--lr-wsd-decay-iters, rounded up); 0.2."""

    wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = "linear"
    """WSD only: the shape of that decay (--lr-wsd-decay-style); linear."""

    weight_decay: float = Field(default=0.1, ge=0)
    """AdamW weight decay (--weight-decay); 0.1, the usual LLM pretraining value."""

    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    """Adam β1 (--adam-beta1); 0.9."""

    adam_beta2: float = Field(default=0.95, ge=0, lt=1)
    """Adam β2 (--adam-beta2); 0.95, the LLM pretraining value (steadier than 0.999 at large batches)."""

    adam_eps: float = Field(default=1e-8, gt=0)
    """Adam ε (--adam-eps); 1e-8."""

    clip_grad: float = Field(default=1.0, ge=0)
    """Gradient-norm clipping threshold (--clip-grad); 1.0 (0: no clipping)."""

    @model_validator(mode="after")
    def _check(self) -> LRSpec:
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is larger than lr {self.lr}")
        return self


class TierMix(_Strict):
    """Stage data drawn from length tiers of a tokenized artifact (see `longctx.data.artifact.chunk_layout`)."""

    artifact: str
    """The tokenized artifact's directory (a path, like the plan's others)."""

    tiers: dict[str, float]
    """Length tier → weight: the share of the stage's tokens drawn from each tier."""

    languages: list[str] | None = None
    """The languages to draw from (default: all of the artifact's)."""

    alpha: float | None = Field(default=None, gt=0, le=1)
    """Languages weighted by size^alpha (with `floor`), then renormalised; default: by size (alpha 1)."""

    floor: float = Field(default=0.0, ge=0, lt=1)
    """The smallest share any language gets before renormalising; 0 (no floor)."""

    run: str | None = None
    """The tokenization run whose shards to read, named `<run>_<language>_…` (default: unprefixed names)."""


class DataSpec(_Strict):
    """Where a stage's tokens come from: exactly one source."""

    blend_file: str | None = None
    """A Megatron --data-args-path file: "w1 p1 w2 p2 …"."""

    blend: list[tuple[float, str]] | None = None
    """An inline blend: `[[weight, prefix], …]`, weights positive."""

    prefixes: list[str] | None = None
    """Dataset prefixes weighted by their size, as Megatron does for a plain list."""

    tier_mix: TierMix | None = None
    """Length tiers of a tokenized artifact (`[stages.data.tier_mix]`)."""

    split: str = "99,1,0"
    """Megatron's --split (train, validation, test weights); "99,1,0" keeps 1 % for validation."""

    cache_dir: str | None = None
    """Megatron's --data-cache-path (default: `<run_dir>/cache`)."""

    packing: Literal["concat", "documents"] = "concat"
    """"concat": attention runs across the documents a sample is stitched from (Megatron's default);
    "documents": each token attends within its document only, boundaries after each EOD token."""

    reset_position_ids: bool = False
    """Position ids restart at every document (Megatron's --reset-position-ids); needs "documents"."""

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
    """Values every stage inherits unless it sets its own: a stage's set fields win over `[defaults]`'s, and
    those over the defaults below (`merged_over`). A default of None is worked out per stage by the rule its
    docstring names."""

    micro_batch_size: int = Field(default=1, gt=0)
    """Sequences per GPU per forward (--micro-batch-size); 1, what fits at long context."""

    global_batch_size: int | None = Field(default=None, gt=0)
    """Sequences per optimizer step (--global-batch-size); give it or `global_batch_tokens` (no default:
    the batch is the plan's decision)."""

    global_batch_tokens: int | None = Field(default=None, gt=0)
    """The global batch in tokens, rounded to whole sequences of the stage's length; instead of
    `global_batch_size` (a stage's own setting wins over the other in [defaults])."""

    tensor_parallel: int = Field(default=1, gt=0)
    """Tensor-parallel size (--tensor-model-parallel-size); 1 (none)."""

    pipeline_parallel: int = Field(default=1, gt=0)
    """Pipeline-parallel size (--pipeline-model-parallel-size); 1 (none)."""

    context_parallel: int | Literal["auto"] = 1
    """Context-parallel size (--context-parallel-size), or "auto": the smallest CP whose memory fits; 1."""

    sequence_parallel: bool | None = None
    """Sequence parallelism (--sequence-parallel), only with TP > 1; default: on whenever TP > 1."""

    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation (longctx/plan/memory.py credits what each setting recomputes): "full" →
    --recompute-granularity full with `recompute_method` and `recompute_num_layers`; "selective" →
    --recompute-granularity selective --recompute-modules; "none" (default) keeps every activation."""

    recompute_method: Literal["uniform", "block"] = "uniform"
    """Full recompute only: --recompute-method; uniform (Megatron's usual choice)."""

    recompute_num_layers: int = Field(default=1, gt=0)
    """Full recompute only: layers per recomputed chunk (uniform) or recomputed layers per pipeline stage
    (block), --recompute-num-layers; 1."""

    recompute_modules: list[RecomputeModule] = Field(default_factory=list)
    """Selective recompute only, and required there: --recompute-modules (default: none)."""

    nodes: int | None = Field(default=None, gt=0)
    """Nodes the stage runs on; default: as few as hold one TP·PP·CP group."""

    gpus_per_node: int | None = Field(default=None, gt=0, le=1024)
    """GPUs (local ranks) per node of this stage; default: [cluster].gpus_per_node (a rehearsal runs each
    stage's CP ranks as one node)."""

    lr: LRSpec = LRSpec()
    """The learning-rate schedule and optimizer (`[defaults.lr]`, `[stages.lr]`); a stage's table replaces
    [defaults]' whole; default: LRSpec's defaults."""

    data: DataSpec | None = None
    """The stage's data (`[defaults.data]`, `[stages.data]`); every stage needs one (no default)."""

    save_interval: int | None = Field(default=None, gt=0)
    """Iterations between checkpoints (--save-interval); default: ⌈iterations / 20⌉, 20 saves per stage."""

    eval_interval: int | None = Field(default=None, gt=0)
    """Iterations between validation-loss evaluations (--eval-interval); default: none."""

    eval_iters: int = Field(default=0, ge=0)
    """Validation iterations per evaluation (--eval-iters, with `eval_interval`); 0."""

    log_interval: int = Field(default=1, gt=0)
    """Iterations between log lines and metrics (--log-interval); 1, every iteration."""

    exit_duration_in_mins: int | None = Field(default=None, gt=0)
    """Minutes after which the trainer saves and exits (--exit-duration-in-mins); default: none (a Slurm
    job should set it to its time limit less the save margin)."""

    extra_args: list[str] = Field(default_factory=list)
    """Further Megatron-LM flags for the stage; flags the planner sets or forbids are refused."""

    seed: int = Field(default=1234, ge=0, le=2**32 - 1)
    """Random seed (--seed), in numpy's seed range, which Megatron seeds; 1234, Megatron-LM's default."""

    def merged_over(self, defaults: StageDefaults) -> StageDefaults:
        """These settings over `defaults` ([defaults]): what either sets, this one winning, and the built-in
        defaults for the rest. The result's `model_fields_set` is what the plan set."""
        # an explicit None (a plan built in code) means "not given", as TOML cannot write one
        given = {k: v for k in defaults.model_fields_set if (v := getattr(defaults, k)) is not None}
        own = (k for k in self.model_fields_set if k in StageDefaults.model_fields)
        given.update({k: v for k in own if (v := getattr(self, k)) is not None})
        return StageDefaults.model_validate(given)


class StageSpec(StageDefaults):
    """One `[[stages]]` entry: the stage's own values, and any of [defaults]' keys to override them."""

    name: str
    """The stage's name: letters, digits, '_', '-', '.' (it names the stage's directory)."""

    seq_length: StrictInt = Field(gt=0)
    """The stage's sequence length in tokens (--seq-length)."""

    rope: RopeSpec
    """The stage's RoPE: an explicit base, a method, or a sweep (`rope = { … }`)."""

    tokens: StrictInt = Field(gt=0, le=MAX_STAGE_TOKENS)
    """Tokens the stage trains; iterations are ⌈tokens / (global batch × seq_length)⌉."""

    max_position_embeddings: StrictInt | None = Field(default=None, gt=0)
    """Megatron's --max-position-embeddings, at least seq_length; default: seq_length."""

    attention_scale: Annotated[float, Field(ge=1, le=4)] | Literal["yarn"] = 1.0
    """Every layer's attention logits multiplied by this when the stage starts from the previous stage's
    weights, folded into the query weights (`longctx.mcore.attention_scale`): a number from 1 to 4, or
    "yarn", YaRN's attention factor squared, (0.1·ln s + 1)² for s = seq_length / the previous stage's
    (1.297 at s = 4); 1 (none). The local backend applies it; Megatron-LM cannot, and refuses the stage."""

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
    """The base checkpoint: a torch_dist save directory (give it and/or `hub_id`)."""

    hub_id: str | None = None
    """The Hugging Face hub repository the base comes from."""

    revision: str | None = None
    """The hub revision to pin (default: the repository's default branch)."""

    iteration: int | None = Field(default=None, ge=0)
    """The iteration the base's tracker must name (default: whatever it names)."""

    seq_length: StrictInt = Field(gt=0)
    """The base's pretraining sequence length."""

    rotary_base: RotaryBase
    """The base's pretraining --rotary-base."""

    model_only: bool = False
    """A model-only checkpoint (no optimizer or RNG state): loads add --no-load-optim --no-load-rng."""

    @model_validator(mode="after")
    def _where(self) -> BaseCheckpoint:
        if self.path is None and self.hub_id is None:
            raise ValueError("give `path` (a torch_dist save dir) and/or `hub_id`")
        return self


class TokenizerSpec(_Strict):
    """The tokenizer and the manifest that says what it must be."""

    path: str
    """The tokenizer: a Hugging Face tokenizer directory or a SentencePiece model."""

    manifest: str
    """The tokenizer manifest (tokenization/*.toml): md5, vocabulary size, special ids, type."""

    megatron_type: str | None = None
    """Megatron-LM's --tokenizer-type; default: the manifest's tokenizer type."""


class ClusterSpec(_Strict):
    """The cluster the plan is sized for."""

    profile: str = "generic"
    """The Slurm profile (longctx/resources/slurm/profiles, or a .toml path); "generic"."""

    gpus_per_node: int = Field(default=1, gt=0)
    """GPUs per node; 1."""

    gpu_memory_gib: float = Field(default=80.0, gt=0)
    """Memory per GPU in GiB, what the memory model fits stages into; 80 (an A100/H100 80 GB)."""

    memory_margin: float = Field(default=0.10, ge=0, lt=1)
    """Share of GPU memory kept free for fragmentation, NCCL buffers and the unexpected; 0.10."""

    max_nodes: int | None = Field(default=None, gt=0)
    """The most nodes a stage may use; default: no limit."""


class MegatronSpec(_Strict):
    """The Megatron-LM the cluster runs: flags it does not honour are refused, not emitted."""

    version: str = "0.16.1"
    """The Megatron-LM release (one the version table longctx.megatron_versions knows); "0.16.1"."""

    path: str | None = None
    """A Megatron-LM checkout with the entry script; default: $LONGCTX_MEGATRON_LM."""

    entry_script: str = "pretrain_gpt.py"
    """The script each launch runs, relative to the checkout (or absolute): a fork's own (a diffusion
    fork's `pretrain_mask_diff.py`) for objectives pretrain_gpt.py does not train; "pretrain_gpt.py"."""

    family_args: list[str] = Field(default_factory=list)
    """That script's own flags, after the model's; "{name}" words take the plan's values
    (longctx.plan.entry); default: none."""

    attention_backend: AttentionBackend = "flash"
    """The attention kernel (--attention-backend; `--use-flash-attn` selects nothing for megatron-core
    models): flash (flash-attn through TransformerEngine, default), fused (cuDNN), unfused (TE's plain
    softmax attention: stores the s×s probabilities, no context parallelism), auto (TE chooses)."""

    performance_args: list[str] = Field(default_factory=list)
    """Runtime flags that do not change the maths (fusions, overlaps), cluster specific; default: none."""

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
    """CPU threads per training process; default: the cores shared out among the processes."""

    eval_after_stage: bool = True
    """Evaluate each stage when it finishes (the plan's [eval]); true."""

    attention: Literal["longctx", "te", "megatron-local"] = "longctx"
    """"longctx" (default): ring attention (CP without TransformerEngine); "te": TransformerEngine's spec
    (GPU, CP 1 unless TE's own CP is wired); "megatron-local": megatron's DotProductAttention (CP 1)."""

    cp_comm: Literal["ring", "allgather"] = "ring"
    """How context-parallel ranks exchange keys and values: "ring" (default) or "allgather"."""

    bf16: bool | None = None
    """Train in bf16; default: bf16 on a GPU, fp32 on the CPU."""


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

    depths: list[float] = Field(default_factory=lambda: list(DEFAULT_EVAL_DEPTHS), min_length=1)
    """Needle depths, fractions of the context in [0, 1] (0: the needle at the start); 0, 0.25, … 1."""

    keys_per_cell: StrictInt = Field(default=2, ge=1, le=10_000)
    """Pass keys per (length, depth) cell, at most 10,000 so a typo cannot queue billions of forwards; 2."""

    distractors: StrictInt = Field(default=2, ge=0, le=100)
    """Distractor keys per item for the log-likelihood choice (0: greedy exact match only); 2."""

    key_digits: StrictInt = Field(default=5, ge=1, le=30)
    """Digits per pass key; 5."""

    filler: Literal["synthetic", "heldout"] = "synthetic"
    """The haystack: "synthetic" (the demo corpus' sentences, default) or "heldout" (the plan's held-out
    tokens)."""

    seed: StrictInt = Field(default=1234, ge=0)
    """Seed of the keys, depths and documents drawn; 1234."""

    loss_docs: StrictInt = Field(default=3, ge=1)
    """Held-out documents per length for the loss by position; 3."""

    buckets: Literal["log", "fixed"] = "log"
    """Position buckets of the loss by position: "log" (doubling, default) or "fixed" widths."""

    bucket_first: StrictInt = Field(default=16, ge=2)
    """The first bucket's width in tokens; 16."""

    short_docs: StrictInt = Field(default=16, ge=0)
    """Held-out documents for the short-context loss (0: none); 16."""

    packed_windows: StrictInt = Field(default=2, ge=0)
    """Windows per length packed from several held-out documents, scored across and within documents
    (0: none); 2."""

    elbo_window: StrictInt = Field(default=64, ge=2)
    """Diffusion models: the ELBO of a window this long (tokens) by the clean context around it; 64."""

    elbo_levels: list[float] = Field(default_factory=lambda: [0.125, 0.375, 0.625, 0.875], min_length=1)
    """Diffusion models: the noise levels in (0, 1] of that ELBO; 0.125, 0.375, 0.625, 0.875."""

    tasks: list[str] = Field(default_factory=lambda: ["single"], min_length=1)
    """Needle tasks (longctx.plan.eval_tasks), e.g. ["single", "multikey-2", "multivalue"]; "single"."""

    any_digit_keys: StrictBool = False
    """Keys of any digits, repeats allowed ("55829"); false: distinct digits, as keys were drawn before."""

    infill_threshold: float = Field(default=1.0, gt=0, le=1)
    """Diffusion models decode the corrupted key digits most confident first, one a round; below 1, a round
    also fixes every digit whose probability reaches this (fewer forwards, a few points lower); 1."""

    ruler_threshold: float = Field(default=0.856, gt=0, le=1)
    """Effective length per task: score ≥ this (RULER's rule, 0.856) …"""

    relative_threshold: float = Field(default=0.85, gt=0, le=1)
    """… or ≥ this fraction of the checkpoint's own score at the shortest evaluated length (NoLiMa's rule,
    0.85)."""

    batch_size: StrictInt = Field(default=4, ge=1)
    """Sequences per forward: memory only, the numbers stay the same; 4."""

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
    """A plan file (`stages/*.toml`): the base, the tokenizer, the model, the cluster and the stages."""

    name: str
    """The plan's name."""

    description: str = ""
    """One line on what the plan does (default: none)."""

    run_dir: str
    """The run directory (ledger, stages, cache, eval); --run-dir / $LONGCTX_RUN_DIR replace it."""

    base: BaseCheckpoint
    """The checkpoint the first stage starts from ([base])."""

    tokenizer: TokenizerSpec
    """The tokenizer and its manifest ([tokenizer])."""

    model: ModelArch | None = None
    """The architecture ([model], longctx.arch.ModelArch); required unless `model_from_checkpoint`."""

    model_from_checkpoint: bool = False
    """Read the architecture from the base checkpoint (and cross-check [model] against it when given)."""

    objective: Objective = Objective()
    """The training objective ([objective], longctx.objective); default: autoregressive."""

    cluster: ClusterSpec = ClusterSpec()
    """The cluster the plan is sized for ([cluster])."""

    megatron: MegatronSpec = MegatronSpec()
    """The Megatron-LM the cluster runs ([megatron])."""

    local: LocalSpec = LocalSpec()
    """The local backend's settings ([local])."""

    wandb: WandbSettings | None = None
    """W&B logging ([wandb]); default: none (TensorBoard events are always written)."""

    eval: EvalSpec = EvalSpec()
    """What the evaluation measures ([eval], docs/evaluation.md)."""

    slurm: dict[str, Any] = Field(default_factory=dict)
    """Slurm settings over the cluster's profile ([slurm], the keys of longctx.plan.slurm.PlanSlurm)."""

    defaults: StageDefaults = StageDefaults()
    """Values every stage inherits unless it sets its own ([defaults])."""

    stages: list[StageSpec] = Field(min_length=1)
    """The stages in order ([[stages]])."""

    plan_path: Path | None = Field(default=None, exclude=True)
    """Where the plan was read from (not a key): its paths resolve against this directory."""

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
