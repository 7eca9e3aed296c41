"""Which Hugging Face class a checkpoint becomes, and what the exporter refuses to map.

Two targets, the architectures the plans use:

    qwen3   Qwen3ForCausalLM  GQA, QK-norm (per-head RMSNorm on q and k before RoPE), RMSNorm, SwiGLU
    llama   LlamaForCausalLM  the same without QK-norm

both without biases, tied or untied, full rotary dimension, plain RoPE or YaRN (the stage's: checked
in longctx.export.stage). Anything else — MoE, LayerNorm, a non-gated MLP, biases, partial or
interleaved rotary, llama3 or linear RoPE scaling, multi-token prediction, MLA — is refused with the
reason rather than exported approximately: such a model would load, run and be silently different.

Diffusion LMs (Ermine MDM/UDM) have no transformers class at all: bidirectional attention and a
denoising objective, which no causal-LM class computes. They are recognised by their layout (the
transformer under `encoder.`, Ermine's `subtokenizer.` buffers, time-conditioning weights) or by the
arguments of Ermine's diffusion entry point.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from longctx.arch import ModelArch
from longctx.checkpoint.infer_arch import InferredArch
from longctx.errors import ExportError

Family = Literal["qwen3", "llama"]
HF_ARCHITECTURE: dict[Family, str] = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}

_DIFFUSION_ARGS = ("target_length", "subtokenizer_type", "padded_output", "padded_input", "random_ratio")
_TIME_KEYS = ("time_embed", "t_embedder", "adaLN", "adaln")

# saved Megatron args that change the maths without changing any tensor shape: (name, is-fine test, why)
_ARG_RULES: tuple[tuple[str, Any, str], ...] = (
    (
        "position_embedding_type",
        lambda v: v in (None, "rope", "yarn"),
        "only RoPE (plain or YaRN) models are mapped",
    ),
    ("rotary_interleaved", lambda v: not v, "interleaved RoPE pairs other dimensions than transformers"),
    ("use_rope_scaling", lambda v: not v, "Megatron's llama3 RoPE scaling is not exported"),
    (
        "rotary_seq_len_interpolation_factor",
        lambda v: v in (None, 1, 1.0),
        "position interpolation is not exported",
    ),
    ("apply_layernorm_1p", lambda v: not v, "zero-centred norm weights (1 + w) are not exported"),
    ("layernorm_zero_centered_gamma", lambda v: not v, "zero-centred norm weights (1 + w) are not exported"),
    ("multi_latent_attention", lambda v: not v, "multi-latent attention has no Qwen3/Llama counterpart"),
    ("qk_l2_norm", lambda v: not v, "L2 QK-norm differs from Qwen3's RMSNorm"),
    ("squared_relu", lambda v: not v, "the MLP must be SwiGLU"),
    ("mtp_num_layers", lambda v: not v, "multi-token-prediction layers have no transformers counterpart"),
    ("window_size", lambda v: v is None, "sliding-window attention is not exported"),
    ("softmax_scale", lambda v: v is None, "a custom softmax scale differs from 1/sqrt(head_dim)"),
)


def diffusion_reason(keys: Iterable[str], args: Mapping[str, Any]) -> str | None:
    """Why the checkpoint is a diffusion LM (None when nothing says so)."""
    keys = list(keys)
    if any(k.startswith("encoder.layers.") for k in keys):
        return (
            "its transformer is stored under `encoder.` (Ermine's MaskedDiffModel), not GPTModel's `decoder.`"
        )
    if any(k.startswith("subtokenizer.") for k in keys):
        return "it carries Ermine's [MASK] subtokenizer buffers (`subtokenizer.*`)"
    if any(t in k for k in keys for t in _TIME_KEYS):
        return "it has time-conditioning weights (a diffusion model's timestep embedding)"
    given = [a for a in _DIFFUSION_ARGS if args.get(a) is not None]
    if given:
        return f"its saved args have Ermine's diffusion flags ({', '.join(given)})"
    return None


def refuse_diffusion(keys: Iterable[str], args: Mapping[str, Any], where: str) -> None:
    reason = diffusion_reason(keys, args)
    if reason is not None:
        raise ExportError(
            f"this is a diffusion language model (Ermine MDM/UDM family): {reason}. transformers has no "
            "class for it — its attention is bidirectional and it predicts masked or noised tokens, which "
            "no causal-LM class computes",
            where=where,
            fix="evaluate it with longctx's own diffusion evaluation; only autoregressive (ARM) checkpoints "
            "export to Hugging Face",
        )


def choose_family(arch: ModelArch, inferred: InferredArch, args: Mapping[str, Any], where: str) -> Family:
    """qwen3 or llama; every reason the checkpoint maps to neither, at once."""
    problems: list[str] = []
    if arch.num_experts or inferred.num_experts:
        problems.append(
            f"mixture of experts ({arch.num_experts or inferred.num_experts} experts): dense models only"
        )
    if arch.normalization != "RMSNorm":
        problems.append(f"{arch.normalization}: the targets use RMSNorm")
    if not arch.swiglu:
        problems.append("a non-gated MLP: the targets use SwiGLU")
    if arch.add_bias_linear or arch.add_qkv_bias:
        problems.append("linear biases: the targets have none")
    if arch.rotary_percent != 1.0:
        problems.append(f"rotary_percent {arch.rotary_percent}: the targets rotate the full head dim")
    if inferred.mtp_num_layers:
        problems.append("multi-token-prediction layers")
    for name, fine, why in _ARG_RULES:
        if name in args and not fine(args[name]):
            problems.append(f"{name}={args[name]!r}: {why}")
    if problems:
        raise ExportError(
            "the exporter does not map this architecture to a transformers class: " + "; ".join(problems),
            where=where,
            fix="export Qwen3-style (GQA, QK-norm, RMSNorm, SwiGLU, no bias) or Llama-style (the same without "
            "QK-norm) models; a near match would load in transformers and compute something else",
        )
    return "qwen3" if arch.qk_layernorm else "llama"


__all__ = ["HF_ARCHITECTURE", "Family", "choose_family", "diffusion_reason", "refuse_diffusion"]
