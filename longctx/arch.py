"""The model architecture, in Megatron's own argument names.

Shared by the plan (explicit or taken from a checkpoint), the checkpoint tools (inferred from tensor
shapes), the Megatron-LM argv builder and the local trainer's model builder.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelArch(BaseModel):
    """A GPT architecture as Megatron's flags describe it (`--num-layers`, `--hidden-size`, …)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_query_groups: int | None = Field(default=None, gt=0, description="GQA groups; None = MHA")
    kv_channels: int | None = Field(default=None, gt=0, description="head dim; None = hidden/heads")
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    norm_epsilon: float = Field(default=1e-5, gt=0, allow_inf_nan=False)
    swiglu: bool = True
    qk_layernorm: bool = True
    untie_embeddings_and_output_weights: bool = True
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    rotary_percent: float = Field(default=1.0, gt=0, le=1.0)
    init_method_std: float = Field(default=0.02, gt=0, allow_inf_nan=False)
    num_experts: int | None = Field(default=None, gt=0)
    moe_router_topk: int = 2
    moe_shared_expert_intermediate_size: int | None = None
    moe_ffn_hidden_size: int | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelArch:
        groups = self.query_groups
        if self.num_attention_heads % groups:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_query_groups {groups}"
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; set kv_channels explicitly"
            )
        return self

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def widths(self) -> tuple[int, int, int, int, int]:
        """(hidden h, heads a, query groups g, head dim k, FFN f): the letters of the memory formulas."""
        return (
            self.hidden_size,
            self.num_attention_heads,
            self.query_groups,
            self.head_dim,
            self.ffn_hidden_size,
        )

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_percent)

    def param_count(self, padded_vocab_size: int) -> int:
        """Parameters of the model (embedding, layers, final norm, output layer when untied)."""
        h, L = self.hidden_size, self.num_layers
        d, nq, ng = self.head_dim, self.num_attention_heads, self.query_groups
        qkv = h * (nq + 2 * ng) * d
        proj = nq * d * h
        fc1 = h * self.ffn_hidden_size * (2 if self.swiglu else 1)
        fc2 = self.ffn_hidden_size * h
        norms = 2 * h + (2 * d if self.qk_layernorm else 0)
        if self.normalization == "LayerNorm":
            norms *= 2
        mlp = fc1 + fc2
        if self.num_experts:
            ffn = self.moe_ffn_hidden_size or self.ffn_hidden_size
            expert = h * ffn * (2 if self.swiglu else 1) + ffn * h
            mlp = self.num_experts * expert + h * self.num_experts
            if self.moe_shared_expert_intermediate_size:
                s = self.moe_shared_expert_intermediate_size
                mlp += h * s * (2 if self.swiglu else 1) + s * h
        per_layer = qkv + proj + mlp + norms
        emb = padded_vocab_size * h
        out = emb if self.untie_embeddings_and_output_weights else 0
        return L * per_layer + emb + out + h

    def megatron_flags(self) -> list[str]:
        """The architecture part of a Megatron-LM argv (defaults passed explicitly, for reproducibility)."""
        flags = [
            "--num-layers",
            str(self.num_layers),
            "--hidden-size",
            str(self.hidden_size),
            "--ffn-hidden-size",
            str(self.ffn_hidden_size),
            "--num-attention-heads",
            str(self.num_attention_heads),
            "--kv-channels",
            str(self.head_dim),
        ]
        if self.num_query_groups and self.num_query_groups != self.num_attention_heads:
            flags += ["--group-query-attention", "--num-query-groups", str(self.num_query_groups)]
        flags += ["--normalization", self.normalization, "--norm-epsilon", _num(self.norm_epsilon)]
        if self.swiglu:
            flags.append("--swiglu")
        if self.qk_layernorm:
            flags.append("--qk-layernorm")
        if self.untie_embeddings_and_output_weights:
            flags.append("--untie-embeddings-and-output-weights")
        if not self.add_bias_linear:
            flags.append("--disable-bias-linear")
        if self.add_qkv_bias:
            flags.append("--add-qkv-bias")
        flags += [
            "--rotary-percent",
            _num(self.rotary_percent),
            "--init-method-std",
            _num(self.init_method_std),
        ]
        if self.num_experts:
            flags += ["--num-experts", str(self.num_experts), "--moe-router-topk", str(self.moe_router_topk)]
            if self.moe_ffn_hidden_size:
                flags += ["--moe-ffn-hidden-size", str(self.moe_ffn_hidden_size)]
            if self.moe_shared_expert_intermediate_size:
                flags += [
                    "--moe-shared-expert-intermediate-size",
                    str(self.moe_shared_expert_intermediate_size),
                ]
        return flags

    def normalized(self) -> ModelArch:
        """The same architecture with defaults made explicit (head dim, query groups)."""
        return self.model_copy(update={"kv_channels": self.head_dim, "num_query_groups": self.query_groups})

    def diff(self, other: ModelArch) -> dict[str, tuple[Any, Any]]:
        """Fields that differ once defaults are explicit: {name: (self, other)}."""
        a, b = self.normalized().model_dump(), other.normalized().model_dump()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def _num(x: float) -> str:
    """Shortest faithful text for a float flag (1e-05 → 1e-05, 1.0 → 1.0)."""
    return repr(float(x))
