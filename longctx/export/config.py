"""`config.json` and `generation_config.json` of the exported model, and their read-back check.

Written as plain JSON for every reader of the directory: transformers ≥ 5 reads the RoPE base from
`rope_parameters`, transformers 4.x and vLLM from `rope_theta`, so both are written with the stage's
base. `head_dim` is explicit (Megatron's kv_channels need not be hidden / heads), the vocabulary is
the tokenizer's (padded rows are cut), `rms_norm_eps` is Megatron's `norm_epsilon`, there are no
biases, and `tie_word_embeddings` says whether the output layer is the embedding.

`check_config` loads the written file through the installed transformers' own config class and
compares every field the model reads with what was meant, so a version that reads a field differently
fails the export instead of producing a model that is silently different.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from longctx.arch import ModelArch
from longctx.errors import ExportError
from longctx.export.family import HF_ARCHITECTURE, Family
from longctx.export.stage import StageChoice
from longctx.rope.scaling import RopeScaling
from longctx.tokenizer.manifest import TokenizerManifest

DTYPE_NAMES = {"float32", "bfloat16", "float16"}


def rope_parameters(
    theta: float, scaling: RopeScaling | None, max_position_embeddings: int
) -> dict[str, Any]:
    """`rope_parameters` of the exported config: the default RoPE, or YaRN as Megatron-LM ≥ 0.19 trains
    it for GPT (`--position-embedding-type yarn`). YaRN's attention factor is written explicitly as
    Megatron's concentration factor mscale(s, mscale) / mscale(s, mscale_all_dim), and `factor` must equal
    max_position_embeddings / original_max_position_embeddings because transformers versions differ in
    which of the two they read."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    if scaling.type != "yarn":
        raise ExportError(
            f"RoPE scaling {scaling.type!r} is not exported (only YaRN, the scaling Megatron-LM trains GPT with)",
            fix="export a base-only or YaRN stage",
        )
    factor, original = float(scaling.factor), int(scaling.original_length)
    if factor * original != max_position_embeddings:
        raise ExportError(
            f"YaRN factor {factor:g} × original length {original} = {factor * original:g}, not the exported "
            f"length {max_position_embeddings}: transformers would scale differently depending on its version",
            fix="export at factor × original length (the stage's length)",
        )
    mscale = 1.0 if scaling.mscale is None else float(scaling.mscale)
    all_dim = 0.0 if scaling.mscale_all_dim is None else float(scaling.mscale_all_dim)
    return {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": 32.0 if scaling.beta_fast is None else float(scaling.beta_fast),
        "beta_slow": 1.0 if scaling.beta_slow is None else float(scaling.beta_slow),
        "attention_factor": _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim),
        "truncate": True,  # Megatron's correction_range_round_to_int
    }


def _yarn_mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def hf_config(
    family: Family,
    arch: ModelArch,
    *,
    vocab_size: int,
    stage: StageChoice,
    manifest: TokenizerManifest,
    dtype: str,
    transformers_version: str,
    scaling: RopeScaling | None = None,
) -> dict[str, Any]:
    theta = float(stage.rotary_base)
    rope = rope_parameters(theta, scaling, stage.max_position_embeddings)
    cfg: dict[str, Any] = {
        "architectures": [HF_ARCHITECTURE[family]],
        "model_type": family,
        "vocab_size": vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.ffn_hidden_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.query_groups,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": stage.max_position_embeddings,
        "initializer_range": arch.init_method_std,
        "rms_norm_eps": arch.norm_epsilon,
        "use_cache": True,
        "tie_word_embeddings": not arch.untie_embeddings_and_output_weights,
        "rope_theta": theta,
        "rope_parameters": rope,
        # transformers 4.x and vLLM read a scaling from rope_scaling
        **({"rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}} if scaling else {}),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": manifest.bos_id,
        "eos_token_id": manifest.eod_id,
        "pad_token_id": manifest.pad_id,
        "torch_dtype": dtype,
        "dtype": dtype,
        "transformers_version": transformers_version,
    }
    if family == "qwen3":
        cfg.update(
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=arch.num_layers,
            layer_types=["full_attention"] * arch.num_layers,
        )
    else:
        cfg.update(mlp_bias=False, pretraining_tp=1)
    return cfg


def generation_config(manifest: TokenizerManifest, transformers_version: str) -> dict[str, Any]:
    ids = {"bos_token_id": manifest.bos_id, "eos_token_id": manifest.eod_id, "pad_token_id": manifest.pad_id}
    return {**{k: v for k, v in ids.items() if v is not None}, "transformers_version": transformers_version}


def _rope_theta(cfg: Any) -> float | None:
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    theta = getattr(cfg, "rope_theta", None)
    return None if theta is None else float(theta)


def check_config(directory: Path, meant: dict[str, Any]) -> None:
    """Read config.json back with transformers; every field the model uses must be what was written."""
    from transformers import AutoConfig  # lazy: transformers loads slowly; only export needs it

    cfg = AutoConfig.from_pretrained(str(directory))
    read = {
        "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None),
        "hidden_act": cfg.hidden_act,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_theta": _rope_theta(cfg),
        "attention_bias": cfg.attention_bias,
    }
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    rope_type = params.get("rope_type", "default") if isinstance(params, dict) else "default"
    wrong = {k: (meant[k], v) for k, v in read.items() if v != meant[k]}
    want_type = meant.get("rope_parameters", {}).get("rope_type", "default")
    if rope_type != want_type:
        wrong["rope_type"] = (want_type, rope_type)
    if wrong:
        shown = "; ".join(f"{k}: wrote {a!r}, transformers reads {b!r}" for k, (a, b) in wrong.items())
        raise ExportError(
            f"transformers reads the written config.json differently: {shown}",
            where=str(directory / "config.json"),
            fix="use a transformers version that reads Qwen3/Llama configs as written here (≥ 4.51)",
        )


__all__ = ["DTYPE_NAMES", "check_config", "generation_config", "hf_config", "rope_parameters"]
