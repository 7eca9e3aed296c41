"""The micro model of a rehearsal: the plan's attention structure at a size a CPU trains at 128K.

What a long-context failure depends on is kept (the query-groups ratio, qk-norm, the rotary percent, the
normalisation, SwiGLU, untied embeddings, biases, MoE routing); what only makes a step expensive is shrunk
(layers, width, head dim, experts), and every reduction is stated so the report can say what the real
run will differ in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from longctx.arch import ModelArch


class MicroShapeOptions(BaseModel):
    """How far the rehearsal shrinks the plan's model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: int = Field(default=2, ge=1, le=8)
    """Transformer layers of the micro model (two: a layer's output feeds another's attention)."""
    head_dim: int = Field(default=16, ge=8, le=256)
    """The largest head dimension kept; a larger one is reduced to this and said so."""
    query_groups: int = Field(default=1, ge=1, le=8)
    """KV groups of a GQA model; the query heads follow from the plan's heads-per-group ratio."""
    max_heads: int = Field(default=8, ge=1, le=64)
    """The most query heads: a ratio above it is reduced (and said so)."""
    experts: int = Field(default=2, ge=2, le=16)
    """Experts of an MoE model (routing is kept; top-k is capped at this)."""


class MicroShape(BaseModel):
    """The micro architecture and, in words, each way it differs from the plan's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arch: ModelArch
    reductions: list[str] = Field(default_factory=list)


def _heads(arch: ModelArch, opts: MicroShapeOptions) -> tuple[int, int, list[str]]:
    """(query heads, query groups) keeping the plan's heads-per-group ratio where `max_heads` allows."""
    ratio = arch.num_attention_heads // arch.query_groups
    if arch.num_query_groups is None or arch.query_groups == arch.num_attention_heads:
        heads = min(arch.num_attention_heads, 2, opts.max_heads)  # MHA stays MHA
        return heads, heads, [f"query heads {arch.num_attention_heads} → {heads} (multi-head attention kept)"]
    groups = max(1, min(opts.query_groups, arch.query_groups))
    while groups > 1 and groups * ratio > opts.max_heads:
        groups -= 1
    kept = min(ratio, opts.max_heads)
    heads = groups * kept
    notes = [f"query heads {arch.num_attention_heads} → {heads}, query groups {arch.query_groups} → {groups}"]
    notes[0] += (
        f" (heads per group {ratio} kept)" if kept == ratio else f" (heads per group {ratio} → {kept})"
    )
    return heads, groups, notes


def micro_shape(arch: ModelArch, opts: MicroShapeOptions | None = None) -> MicroShape:
    """The plan's `arch` shrunk to a micro model that keeps its attention structure."""
    opts = opts or MicroShapeOptions()
    heads, groups, notes = _heads(arch, opts)
    head_dim = min(arch.head_dim, opts.head_dim)
    if head_dim != arch.head_dim:
        notes.append(f"head dim {arch.head_dim} → {head_dim} (attention FLOPs per head ∝ head dim)")
    hidden = heads * head_dim
    ffn = max(8, round(arch.ffn_hidden_size / arch.hidden_size * hidden))
    notes.append(
        f"layers {arch.num_layers} → {opts.layers}, hidden {arch.hidden_size} → {hidden}, "
        f"FFN {arch.ffn_hidden_size} → {ffn} (its ratio to hidden kept)"
    )
    update: dict[str, object] = {
        "num_layers": opts.layers,
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_query_groups": None if arch.num_query_groups is None else groups,
        "kv_channels": head_dim,
    }
    if arch.num_experts is not None:
        experts = min(arch.num_experts, opts.experts)
        topk = min(arch.moe_router_topk, experts)
        update.update(
            num_experts=experts,
            moe_router_topk=topk,
            moe_ffn_hidden_size=None if arch.moe_ffn_hidden_size is None else ffn,
            moe_shared_expert_intermediate_size=(
                None if arch.moe_shared_expert_intermediate_size is None else ffn
            ),
        )
        notes.append(f"experts {arch.num_experts} → {experts}, router top-k {arch.moe_router_topk} → {topk}")
    micro = ModelArch.model_validate({**arch.model_dump(), **update})
    return MicroShape(arch=micro, reductions=notes)
