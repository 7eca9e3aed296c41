"""The exact `pretrain_gpt.py` argv of a stage (or a fork's entry script's) — the one place Megatron flags
are produced.

Every launch of a stage gets the same argv: `--save S_k --load S_k --pretrained-checkpoint S_{k-1}`.
Megatron-LM loads S_k when its tracker exists (a relaunch resumes: iteration, optimizer, scheduler,
RNG, consumed samples) and otherwise loads S_{k-1} with finetune semantics (weights only, iteration 0,
fresh optimizer) — so a job that dies at any point is simply launched again. The state machine checks
the disk first and repairs what Megatron would get wrong (a complete save the tracker does not name).
`--use-checkpoint-args` is never emitted: it would put the old RoPE base back.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePath

from longctx.errors import StageError
from longctx.megatron_versions import (
    RELEASES,
    MegatronFacts,
    first_version,
    packed_documents,
    removed_version,
)
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.entry import UPSTREAM_SCRIPT, family_values, render_family_args, trains_objective
from longctx.plan.rope_sweep import require_chosen
from longctx.plan.stage_artifact import stage_blend_file
from longctx.rope.megatron import check_conflicting_flags, rope_flags
from longctx.stage.checkout import require_checkout_version
from longctx.tokenizer.encoding import version_flags


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag with its values: rendered as one line of `stage args`."""

    name: str
    values: tuple[str, ...] = ()

    def words(self) -> list[str]:
        return [self.name, *self.values]

    def line(self) -> str:
        return " ".join([self.name, *self.values])


def _f(name: str, *values: object) -> Flag:
    return Flag(name, tuple(str(v) for v in values))


def _num(x: float) -> str:
    """1e-05 → '1e-05', 0.95 → '0.95', 1.0 → '1.0' (floats stay floats; Megatron parses them as float)."""
    return repr(float(x))


def tokenizer_flags(rp: ResolvedPlan) -> list[Flag]:
    kind, tok = rp.tokenizer.kind, rp.tokenizer.path
    flags = [_f("--tokenizer-type", kind)]
    if kind == "GPT2BPETokenizer":
        flags += [_f("--vocab-file", tok / "vocab.json"), _f("--merge-file", tok / "merges.txt")]
    else:
        flags.append(_f("--tokenizer-model", tok))
    # the switches that make this Megatron-LM encode as the plan declares (HF defaults differ by release)
    spec = rp.tokenizer.encoding()
    if spec is not None and spec.tokenizer_type == kind:
        flags += [_f(w) for w in version_flags(spec, rp.megatron.version)[2:]]
    flags.append(_f("--make-vocab-size-divisible-by", rp.make_vocab_size_divisible_by))
    return flags


def data_flags(rp: ResolvedPlan, st: ResolvedStage) -> list[Flag]:
    d = st.data
    if d is None:
        raise StageError(f"stage {st.name!r} has no data", where=str(rp.source), fix="set [defaults.data]")
    flags: list[Flag]
    if d.blend_file is not None:
        flags = [_f("--data-args-path", d.blend_file)]
    elif d.blend is not None:
        words: list[str] = []
        for w, p in d.blend:
            words += [_num(w), str(p)]
        flags = [Flag("--data-path", tuple(words))]
    elif d.prefixes is not None:
        flags = [Flag("--data-path", tuple(str(p) for p in d.prefixes))]
    else:
        flags = [_f("--data-args-path", stage_blend_file(rp, st))]
    cache = d.cache_dir if d.cache_dir is not None else rp.run_dir / "cache"
    flags += [_f("--split", d.split), _f("--data-cache-path", cache)]
    return flags


def packing_flags(rp: ResolvedPlan, st: ResolvedStage) -> list[Flag]:
    """Attention within documents on Megatron-LM, or why this Megatron-LM cannot train it as planned
    (`longctx.megatron_versions.packed_documents`: no document boundaries before 0.19; from 0.19 right at
    CP 1 only, positions always restarted). `plan check` reports the same verdict for every such stage."""
    d = st.data
    if d is None or d.packing != "documents":
        return []
    verdict = packed_documents(rp.megatron.version, st.cp, d.reset_position_ids)
    if not verdict.ok:
        raise StageError(
            f'stage {st.name!r}: packing = "documents" cannot run on Megatron-LM as planned: {verdict.what}',
            where=str(rp.source),
            fix=verdict.fix,
        )
    return [_f("--dataloader-inter-document-masking"), _f("--reset-position-ids")]


def lr_flags(st: ResolvedStage) -> list[Flag]:
    lr = st.lr
    flags = [
        _f("--lr", _num(lr.lr)),
        _f("--min-lr", _num(lr.min_lr)),
        _f("--lr-decay-style", lr.decay_style),
        _f("--lr-warmup-iters", st.warmup_iters),
        _f("--lr-decay-iters", st.train_iters),
    ]
    if lr.decay_style == "WSD":
        flags += [
            _f("--lr-wsd-decay-style", lr.wsd_decay_style),
            _f("--lr-wsd-decay-iters", st.wsd_decay_iters),
        ]
    flags += [
        _f("--weight-decay", _num(lr.weight_decay)),
        _f("--adam-beta1", _num(lr.adam_beta1)),
        _f("--adam-beta2", _num(lr.adam_beta2)),
        _f("--adam-eps", _num(lr.adam_eps)),
        _f("--clip-grad", _num(lr.clip_grad)),
    ]
    return flags


def _pairs(words: list[str]) -> list[Flag]:
    """Group a flat argv into flags (a word starting with -- opens a flag)."""
    out: list[Flag] = []
    for w in words:
        if w.startswith("--") or not out:
            out.append(Flag(w))
        else:
            last = out.pop()
            out.append(Flag(last.name, (*last.values, w)))
    return out


def family_flags(rp: ResolvedPlan, st: ResolvedStage) -> list[Flag]:
    """The entry script's own flags ([megatron].family_args) with the stage's values filled in."""
    rows = (st.padded_vocab_size, st.output_vocab_size)
    values = family_values(rp.objective, rp.vocab_size, rows)
    return _pairs(render_family_args(list(rp.megatron.family_args), values))


def launch_notes(rp: ResolvedPlan, st: ResolvedStage) -> list[str]:
    """What `stage args` says beside the flags: a fork's entry script, and what longctx cannot check from
    outside a diffusion fork (its noise under CP)."""
    meg = rp.megatron
    notes = []
    if PurePath(meg.entry_script).name != UPSTREAM_SCRIPT:
        notes.append(
            f"the launch runs the fork's entry script {meg.entry_script}, with "
            f"{len(meg.family_args)} words of its own flags ([megatron].family_args)"
        )
    if rp.objective.kind != "ar" and st.cp > 1:
        notes.append(
            f"stage {st.name} runs {meg.entry_script} with context parallel {st.cp}: the fork must draw t and the "
            "masks (or replacement tokens) over the full sequence before the CP split and share them across the "
            "TP/CP ranks of a sequence — the reference masked-diffusion fork draws them after the split, so every "
            "CP chunk gets the same mask pattern; longctx cannot check this from outside the fork"
        )
    return notes


def _model_flags(rp: ResolvedPlan, st: ResolvedStage) -> list[Flag]:
    """The architecture, this stage's RoPE (base and scaling) and lengths, no dropout, the tokenizer."""
    flags = _pairs(rp.arch.megatron_flags())
    # the base, and YaRN's flags for a YaRN stage (the planner refuses what the version cannot run)
    flags += _pairs(
        rope_flags(
            st.rotary_base,
            st.rope_scaling,
            rp.megatron.version,
            full_rotary=rp.arch.rotary_percent == 1.0,
        )
    )
    flags += [
        _f("--seq-length", st.seq_length),
        _f("--max-position-embeddings", st.max_position_embeddings),
        _f("--no-create-attention-mask-in-dataloader"),
    ]
    flags += [_f("--attention-dropout", "0.0"), _f("--hidden-dropout", "0.0")]
    flags += tokenizer_flags(rp)
    return flags


def attention_flags(st: ResolvedStage) -> list[Flag]:
    """The attention kernel. `--use-flash-attn` is never emitted: megatron-core models ignore it (Megatron-LM
    0.16 reads it only in a deterministic-mode check and in the legacy model); `--attention-backend` chooses
    TransformerEngine's kernel (and sets NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN to match)."""
    return [_f("--attention-backend", st.attention_backend)]


# What megatron-core's LanguageModule asserts (or sets) for each --attention-backend: the NVTE_* switches
# of TransformerEngine. A launch sets them, so values left over in the environment (a container's, or
# an earlier model built in the same process) cannot contradict the chosen kernel.
_ATTENTION_ENV = {
    "local": (0, 0, 0),
    "flash": (1, 0, 0),
    "fused": (0, 1, 0),
    "unfused": (0, 0, 1),
    "auto": (1, 1, 1),
}


def attention_backend_env(backend: str) -> dict[str, str]:
    """NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN as Megatron-LM expects them for `backend`."""
    flash, fused, unfused = _ATTENTION_ENV[backend]
    return {"NVTE_FLASH_ATTN": str(flash), "NVTE_FUSED_ATTN": str(fused), "NVTE_UNFUSED_ATTN": str(unfused)}


def recompute_flags(st: ResolvedStage) -> list[Flag]:
    """The recompute policy in Megatron's own options (never `--recompute-activations`: it means selective
    recompute of core_attn alone, which saves almost nothing with flash or fused attention)."""
    if st.recompute == "full":
        return [
            _f("--recompute-granularity", "full"),
            _f("--recompute-method", st.recompute_method),
            _f("--recompute-num-layers", st.recompute_num_layers),
        ]
    if st.recompute == "selective":
        if not st.recompute_modules:
            raise StageError(
                f"stage {st.name!r}: selective recompute without recompute_modules",
                fix="list recompute_modules (the planner refuses this plan)",
            )
        return [
            _f("--recompute-granularity", "selective"),
            _f("--recompute-modules", *st.recompute_modules),
        ]
    return []


def _parallel_flags(st: ResolvedStage) -> list[Flag]:
    """Parallelism, precision, the attention kernel, recomputation and batch sizes."""
    flags = [
        _f("--tensor-model-parallel-size", st.tp),
        _f("--pipeline-model-parallel-size", st.pp),
        _f("--context-parallel-size", st.cp),
    ]
    if st.cp > 1:
        flags.append(_f("--cp-comm-type", "p2p"))
    if st.sequence_parallel:
        flags.append(_f("--sequence-parallel"))
    flags += [
        _f("--use-distributed-optimizer"),
        # optimizer state saved param-shaped (not in DDP bucket order): the local backend resumes it and a
        # resume may change TP/PP/DP; it is gathered per bucket at save time (host memory, not GPU)
        _f("--dist-ckpt-optim-fully-reshardable"),
        _f("--bf16"),
        _f("--attention-softmax-in-fp32"),
        _f("--accumulate-allreduce-grads-in-fp32"),
    ]
    flags += attention_flags(st)
    flags += recompute_flags(st)
    flags += [
        _f("--micro-batch-size", st.micro_batch_size),
        _f("--global-batch-size", st.global_batch_size),
        _f("--train-iters", st.train_iters),
    ]
    return flags


def _checkpoint_flags(st: ResolvedStage, prev: Path, known: MegatronFacts) -> list[Flag]:
    """Save, load and start from (see the module docstring), and how a job exits to be relaunched."""
    flags = [
        _f("--ckpt-format", "torch_dist"),
        _f("--save", st.save_dir),
        _f("--load", st.save_dir),
        _f("--pretrained-checkpoint", prev),
        _f("--exit-on-missing-checkpoint"),
        _f("--save-interval", st.save_interval),
    ]
    if st.exit_duration_in_mins:
        flags.append(_f("--exit-duration-in-mins", st.exit_duration_in_mins))
    flags.append(_f("--exit-signal-handler"))
    if known.has_flag("--exit-signal"):
        flags.append(_f("--exit-signal", "SIGTERM"))
    return flags


def _logging_flags(st: ResolvedStage, stage_root: Path) -> list[Flag]:
    flags = [
        _f("--log-interval", st.log_interval),
        _f("--log-throughput"),
        _f("--tensorboard-dir", stage_root / "tensorboard"),
    ]
    if st.eval_interval:
        flags += [_f("--eval-interval", st.eval_interval), _f("--eval-iters", st.eval_iters)]
    else:
        flags += [_f("--eval-interval", st.train_iters + 1), _f("--eval-iters", 0)]
    flags += [_f("--distributed-timeout-minutes", 30)]
    return flags


def wandb_flags(st: ResolvedStage) -> list[Flag]:
    """The stage's W&B run (the plan's [wandb] table) as Megatron-LM's flags (none without it)."""
    w = st.wandb
    if w is None:
        return []
    return [
        _f("--wandb-project", w.project),
        _f("--wandb-exp-name", w.exp_name),
        _f("--wandb-save-dir", w.save_dir),
    ]


def stage_flags(rp: ResolvedPlan, st: ResolvedStage) -> list[Flag]:
    """All flags of a stage's pretrain_gpt.py launch, in a stable, documented order."""
    require_chosen(st.name, st.sweep)
    meg = rp.megatron
    prev = st.load_from
    if not trains_objective(meg.entry_script, list(meg.family_args), rp.objective):
        raise StageError(
            f"{UPSTREAM_SCRIPT} trains the autoregressive objective; the plan's objective is "
            f"{rp.objective.describe()}",
            where=f"{rp.where}: [megatron].entry_script",
            fix="name the diffusion fork's entry script and its flags in [megatron] (entry_script = "
            '"pretrain_mask_diff.py", family_args = [...]), or train with --backend local (CPU or one GPU)',
        )
    if prev is None:
        raise StageError(
            f"stage {st.name!r} has nothing to start from",
            where=str(rp.source),
            fix="set base.path (run `longctx ckpt fetch/adopt` first for hub checkpoints)",
        )
    if st.attention_scale != 1.0:
        raise StageError(
            f"stage {st.name!r} scales its attention logits by {st.attention_scale:.4g} at its start, which "
            "the local backend folds into the weights it loads; pretrain_gpt.py loads them unscaled",
            where=f"{rp.where}: stage {st.name} attention_scale",
            fix="train the stage with --backend local, or remove attention_scale from the stage",
        )
    require_checkout_version(rp)
    flags: list[Flag] = []
    flags += _model_flags(rp, st)
    flags += family_flags(rp, st)
    flags += _parallel_flags(st)
    flags += lr_flags(st)
    flags += [_f("--seed", st.seed)]
    flags += data_flags(rp, st)
    flags += packing_flags(rp, st)
    flags += _checkpoint_flags(st, prev, meg.facts)
    flags += _logging_flags(st, st.stage_dir)
    flags += wandb_flags(st)
    flags += _pairs(list(meg.performance_args))
    flags += _pairs(list(st.extra_args))
    _refuse_unhonoured(flags, meg.version, meg.facts, rp.source)
    check_conflicting_flags([f.name for f in flags])
    return flags


def _refuse_unhonoured(flags: list[Flag], version: str, known: MegatronFacts, where: Path | None) -> None:
    """Refuse a flag the version's parser lacks (added later, or removed) or its GPT model ignores (a RoPE
    flag whose value only reaches GPT from a later release), as the release table (`known`) says."""
    for f in flags:
        if known.has_flag(f.name) is False:
            added, removed = first_version(f.name), removed_version(f.name)
            when = (
                f"removed in {'.'.join(map(str, removed))}"
                if removed and known.version >= removed
                else f"added in {'.'.join(map(str, added or (0, 0, 0)))}"
            )
            raise StageError(
                f"{f.name} does not exist in Megatron-LM {version} ({when}): its parser would refuse the launch",
                where=str(where) if where else None,
                fix="drop the flag or set [megatron].version to the version the cluster runs",
            )
        if f.name not in known.gpt_honours and any(f.name in r.gpt_honours for r in RELEASES):
            since = next(r.version for r in RELEASES if f.name in r.gpt_honours)
            raise StageError(
                f"{f.name} is accepted but ignored for GPT models by Megatron-LM {version}: its value reaches "
                f"pretrain_gpt.py's model only from {'.'.join(map(str, since))} (before, only MLA reads it)",
                where=str(where) if where else None,
                fix="drop the flag (the RoPE would silently not be scaled), or use Megatron-LM ≥ "
                f"{'.'.join(map(str, since))} and set [megatron].version",
            )


# a resumed stage whose LR schedule was changed on purpose (`stage run --force`): Megatron-LM takes the
# scheduler's values from the argv instead of asserting they equal the checkpoint's
OVERRIDE_SCHEDULER_FLAG = "--override-opt_param-scheduler"


def argv(
    rp: ResolvedPlan, st: ResolvedStage, script: str | None = None, *, override_scheduler: bool = False
) -> list[str]:
    """The stage's argv after `script` (default: the plan's entry script); `override_scheduler` (only when
    asked) appends OVERRIDE_SCHEDULER_FLAG."""
    words = [script or rp.megatron.entry_script]
    for f in stage_flags(rp, st):
        words += f.words()
    if override_scheduler:
        words.append(OVERRIDE_SCHEDULER_FLAG)
    return words


def render_lines(rp: ResolvedPlan, st: ResolvedStage) -> list[str]:
    return [f.line() for f in stage_flags(rp, st)]


# What a launch on a machine without CUDA adds to the argv (longctx.mcore.run_megatron_lm runs it):
# gloo instead of NCCL, weights initialised on the CPU, megatron-core's own layers instead of
# TransformerEngine's, and none of the fused CUDA/Apex kernels (rope fusion is on by default and
# needs TE: transformer_config.py raises "apply_rope_fusion is not available" without it).
CPU_FLAGS: tuple[str, ...] = (
    "--distributed-backend", "gloo",
    "--use-cpu-initialization",
    "--transformer-impl", "local",
    "--no-rope-fusion",
    "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion",
    "--no-masked-softmax-fusion",
    "--no-gradient-accumulation-fusion",
    "--no-persist-layer-norm",
)  # fmt: skip


# Megatron-LM's local DotProductAttention refuses context parallelism; without TransformerEngine the
# layers take longctx's ring attention through Megatron-LM's --spec hook instead.
CP_SPEC_FLAGS: tuple[str, ...] = ("--spec", "longctx.mcore.megatron_lm_spec", "layer_spec")
# The local DotProductAttention also holds every head's s × s scores (and their softmax, kept for the
# backward): a 16,384-token CP 1 stage of a 4-head micro model peaked at 12.4 GiB per rank against 0.19 GiB
# modelled. Past this length a CPU launch takes longctx's attention at CP 1 too (memory linear in s).
LOCAL_ATTENTION_MAX_TOKENS = 8192


def cpu_flags(context_parallel: int = 1, seq_length: int = 0) -> list[str]:
    """The flags a CPU-only launch appends to a stage's argv (see CPU_FLAGS): CP_SPEC_FLAGS too at CP > 1, or
    at a length past LOCAL_ATTENTION_MAX_TOKENS."""
    spec = context_parallel > 1 or seq_length > LOCAL_ATTENTION_MAX_TOKENS
    return [*CPU_FLAGS, *(CP_SPEC_FLAGS if spec else ())]
