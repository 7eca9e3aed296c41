"""Build a megatron-core GPTModel from a `ModelArch` with longctx's attention in the layer spec."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Literal

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from longctx.arch import ModelArch
from longctx.attention.megatron_adapter import LongctxCoreAttention, longctx_local_layer_spec
from longctx.errors import TrainError
from longctx.mcore.cpu import apply_cpu_compat

# the plan's names for the context-parallel exchange → TransformerConfig.cp_comm_type
CP_COMM_TYPES = {"ring": "p2p", "allgather": "all_gather"}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """What a stage changes on top of the architecture."""

    seq_length: int
    rotary_base: int
    padded_vocab_size: int
    tensor_model_parallel_size: int = 1
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    params_dtype: torch.dtype = torch.float32
    recompute: str | None = None  # None | "selective" | "full"
    recompute_method: str = "uniform"  # full recompute: "uniform" | "block"
    recompute_num_layers: int = 1  # full recompute: layers per chunk (uniform) or recomputed (block)
    # "longctx": our ring/all-gather attention (CP without TE); "te": TransformerEngine spec;
    # "megatron-local": megatron's DotProductAttention (CP 1 only, needs CUDA for its mask).
    attention: Literal["longctx", "te", "megatron-local"] = "longctx"
    cp_comm: Literal["ring", "allgather"] = "ring"  # how CP ranks exchange K/V (longctx attention)
    causal: bool = True  # False: bidirectional attention (the diffusion objectives)
    # output-layer rows when they differ from the input embedding's (a masked-diffusion model's [MASK]
    # row is input-only); untied models only
    output_vocab_size: int | None = None


def transformer_config(arch: ModelArch, s: ModelSettings) -> TransformerConfig:
    on_cpu = not torch.cuda.is_available()
    kwargs: dict[str, object] = dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.query_groups,
        kv_channels=arch.head_dim,
        normalization=arch.normalization,
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=arch.swiglu,
        activation_func=F.silu if arch.swiglu else F.gelu,
        add_bias_linear=arch.add_bias_linear,
        add_qkv_bias=arch.add_qkv_bias,
        qk_layernorm=arch.qk_layernorm,
        init_method_std=arch.init_method_std,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=s.tensor_model_parallel_size,
        context_parallel_size=s.context_parallel_size,
        cp_comm_type=CP_COMM_TYPES[s.cp_comm],
        sequence_parallel=s.sequence_parallel,
        params_dtype=s.params_dtype,
        bf16=s.params_dtype == torch.bfloat16,
        use_cpu_initialization=on_cpu,
        # fused kernels need CUDA (and some need TE / apex); the plain paths are exact
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
    )
    if s.recompute == "full":
        kwargs.update(
            recompute_granularity="full",
            recompute_method=s.recompute_method,
            recompute_num_layers=s.recompute_num_layers,
        )
    elif s.recompute == "selective":
        kwargs.update(recompute_granularity="selective")
    if arch.num_experts:
        kwargs.update(
            num_moe_experts=arch.num_experts,
            moe_router_topk=arch.moe_router_topk,
            moe_ffn_hidden_size=arch.moe_ffn_hidden_size or arch.ffn_hidden_size,
            moe_shared_expert_intermediate_size=arch.moe_shared_expert_intermediate_size,
            # the alltoall dispatcher creates a torch.cuda.Stream; allgather computes the same on CPU
            moe_token_dispatcher_type="alltoall" if torch.cuda.is_available() else "allgather",
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=0.0,
        )
    return TransformerConfig(**kwargs)


def layer_spec(arch: ModelArch, s: ModelSettings) -> ModuleSpec:
    """The layer spec of `s.attention`, with a bidirectional mask when `s.causal` is False."""
    spec = _attention_spec(arch, s)
    if not s.causal:
        spec.submodules.self_attention.params["attn_mask_type"] = AttnMaskType.no_mask
    return spec


def _attention_spec(arch: ModelArch, s: ModelSettings) -> ModuleSpec:
    """Megatron's local GPT layer spec with longctx's core attention (CP without TransformerEngine)."""
    if s.attention == "te":
        if importlib.util.find_spec("transformer_engine") is None:
            raise TrainError(
                'attention = "te" needs TransformerEngine, which is not installed',
                fix="pip install 'longctx[gpu]' on a CUDA machine, or use attention = \"longctx\"",
            )
        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=arch.num_experts, qk_layernorm=arch.qk_layernorm
        )
    if s.attention == "megatron-local":
        return get_gpt_layer_local_spec(
            num_experts=arch.num_experts, qk_layernorm=arch.qk_layernorm, normalization=arch.normalization
        )
    return longctx_local_layer_spec(
        num_experts=arch.num_experts, qk_layernorm=arch.qk_layernorm, normalization=arch.normalization
    )


def build_gpt_model(
    arch: ModelArch, s: ModelSettings, *, pre_process: bool = True, post_process: bool = True
) -> GPTModel:
    """A megatron-core GPTModel; model-parallel state must already be initialised."""
    apply_cpu_compat()
    config = transformer_config(arch, s)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(arch, s),
        vocab_size=s.padded_vocab_size,
        max_sequence_length=s.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=not arch.untie_embeddings_and_output_weights,
        position_embedding_type="rope",
        rotary_percent=arch.rotary_percent,
        rotary_base=int(s.rotary_base),
    )
    if s.output_vocab_size is not None and s.output_vocab_size != s.padded_vocab_size and post_process:
        _own_output_layer(model, config, arch, s)
    return cast_parameters(model, s.params_dtype)


def _own_output_layer(model: GPTModel, config: TransformerConfig, arch: ModelArch, s: ModelSettings) -> None:
    """An output layer of `output_vocab_size` rows in place of GPTModel's (which has the input's)."""
    if not arch.untie_embeddings_and_output_weights:
        raise TrainError(
            f"a tied model has one vocabulary: {s.padded_vocab_size} input rows cannot feed "
            f"{s.output_vocab_size} output rows",
            fix="set [model] untie_embeddings_and_output_weights = true, or give equal input_rows and output_rows",
        )
    model.output_layer = tensor_parallel.ColumnParallelLinear(
        config.hidden_size,
        s.output_vocab_size,
        config=config,
        init_method=config.init_method,
        bias=False,
        skip_bias_add=False,
        gather_output=not model.parallel_output,
        tp_group=model.pg_collection.tp,
    )


def cast_parameters(model: GPTModel, dtype: torch.dtype) -> GPTModel:
    """Every floating parameter in `dtype`, as Megatron-LM's bf16 module holds them: megatron-core's
    local norms are created in fp32 whatever `params_dtype` says, and a bf16 checkpoint holds bf16 norms.
    Parameters only: RoPE's inverse frequencies (not a parameter) stay fp32."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model


def cp_exchanges(model: GPTModel) -> set[str]:
    """The context-parallel exchanges the model's longctx attention layers dispatch on ("p2p" for the
    ring, "all_gather"): what the forward actually runs, read from the modules rather than the settings."""
    return {m.cp_comm_type for m in model.modules() if isinstance(m, LongctxCoreAttention)}
