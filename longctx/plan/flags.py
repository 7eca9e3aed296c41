"""The one rule for user-supplied Megatron flags: what the planner owns, nobody else sets.

Megatron-LM keeps the last value of a repeated flag, so a word in `extra_args`, `[megatron] family_args`
or `[megatron] performance_args` that the planner also emits would silently undo the plan (a second
`--rotary-base` undoes the RoPE base longctx chose). Every such list is checked against one table, and
each refusal names the plan field to set instead. Megatron-LM's parser has `allow_abbrev=False`, so a
flag is matched by its full name only (the `--name=value` form included).
"""

from __future__ import annotations

from longctx.report import Findings

_RUN = "run_dir (the planner derives each stage's save and load directories)"
_DATA = "the stage's [data] (or [defaults.data])"
_TOKENIZER = "[tokenizer] (path, manifest, megatron_type)"
_MODEL = "[model] (or model_from_checkpoint = true)"
_SCHEDULE = "the stage's tokens, lr and schedule fields (or [defaults])"


def _table() -> dict[str, str]:
    groups: list[tuple[str, tuple[str, ...]]] = [
        ("the stage's rope (method/base) field", (
            "--rotary-base", "--position-embedding-type", "--rotary-scaling-factor",
            "--rotary-seq-len-interpolation-factor", "--use-rope-scaling", "--rope-scaling-factor", "--mscale",
            "--mscale-all-dim", "--yarn-beta-fast", "--yarn-beta-slow", "--yarn-original-max-position-embeddings",
            "--yarn-correction-range-round-to-int", "--no-yarn-correction-range-round-to-int",
            # validate_args turns this legacy switch into --position-embedding-type rope (undoing YaRN)
            "--use-rotary-position-embeddings", "--rope-type", "--rotary-interleaved", "--no-rope-freq")),
        ("the stage's seq_length (and max_position_embeddings)", (
            "--seq-length", "--encoder-seq-length", "--decoder-seq-length", "--max-position-embeddings")),
        ("the stage's tensor_parallel / pipeline_parallel / context_parallel / sequence_parallel", (
            "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
            "--sequence-parallel", "--cp-comm-type")),
        ("the stage's global_batch_size / global_batch_tokens / micro_batch_size", (
            "--global-batch-size", "--micro-batch-size", "--rampup-batch-size")),
        (_RUN, ("--save", "--load", "--pretrained-checkpoint", "--ckpt-format",
                "--exit-on-missing-checkpoint", "--tensorboard-dir")),
        (_TOKENIZER, ("--tokenizer-model", "--tokenizer-type", "--vocab-file", "--merge-file", "--vocab-size",
                      "--make-vocab-size-divisible-by")),
        (_DATA, ("--data-path", "--data-args-path", "--per-split-data-args-path", "--train-data-path",
                 "--valid-data-path", "--test-data-path", "--data-cache-path", "--split", "--mock-data")),
        (_SCHEDULE, (
            "--train-iters", "--train-samples", "--lr", "--min-lr", "--lr-decay-iters", "--lr-decay-samples",
            "--lr-decay-style", "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-fraction",
            "--lr-wsd-decay-iters", "--lr-wsd-decay-samples", "--lr-wsd-decay-style", "--save-interval",
            "--eval-interval", "--eval-iters", "--log-interval", "--exit-duration-in-mins", "--seed")),
        (_MODEL, ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
                  "--group-query-attention", "--num-query-groups", "--normalization", "--norm-epsilon",
                  "--swiglu", "--qk-layernorm", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                  "--add-qkv-bias", "--rotary-percent", "--init-method-std", "--num-experts", "--moe-router-topk",
                  "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size")),
        ("[megatron].attention_backend", ("--attention-backend",)),
        ("the stage's recompute and recompute_* fields", (
            "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules")),
    ]  # fmt: skip
    return {flag: field for field, flags in groups for flag in flags}


# flag → the plan field that sets it
OWNED_FLAGS: dict[str, str] = _table()

# flags no list may hold, whoever would set them: flag → why, and what to do instead
FORBIDDEN_FLAGS: dict[str, str] = {
    "--use-checkpoint-args": "it silently replaces the stage's --rotary-base (and other RoPE settings) "
    "with the checkpoint's",
    "--finetune": "longctx decides finetune semantics per launch (--pretrained-checkpoint on first launch)",
    "--use-flash-attn": "it selects nothing for megatron-core models (the kernel is --attention-backend, "
    "set by [megatron].attention_backend)",
    "--recompute-activations": "it recomputes only core_attn, which saves almost no memory with flash or "
    "fused attention (set recompute and recompute_* instead)",
    "--override-opt_param-scheduler": "it replaces the saved schedule on resume behind the planner's check "
    "(edit the plan's schedule and resume with --force, which adds it and records the override)",
}


def flag_name(word: str) -> str:
    """`--name` of a word (`--name=value` included); any other word unchanged."""
    return word.split("=", 1)[0]


def check_user_flags(words: list[str], list_name: str, where: str, findings: Findings) -> None:
    """One error finding per word of a user flag list that the planner owns or that is forbidden."""
    for word in words:
        name = flag_name(word)
        if name in FORBIDDEN_FLAGS:
            findings.error(
                "forbidden-flag",
                f"{list_name} has {name}: {FORBIDDEN_FLAGS[name]}",
                where=where,
                fix=f"remove {name}",
            )
        elif name in OWNED_FLAGS:
            findings.error(
                "owned-flag",
                f"{list_name} sets {name}, which the planner derives (Megatron-LM keeps the last value, so "
                "it would override the plan)",
                where=where,
                fix=f"remove {name} and set {OWNED_FLAGS[name]} instead",
            )
