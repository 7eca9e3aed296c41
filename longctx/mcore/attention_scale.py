"""Sharper attention for a longer window: every layer's attention logits multiplied by a factor, folded
into the query weights when a stage starts from the previous stage's weights.

Why: a head that retrieves one needle spreads its softmax over every earlier token, so at four times
the length the needle's share of the attention falls unless its logit margin grows by about ln 4. A
model trained at 4K and carried to 16K by a RoPE base change retrieves at 16K only where its margins
happen to suffice (the CPU demo's 16K stage: 72 % of single needles at 16,384, by depth 18 · 7 · 19 ·
8 · 20 of 20); the same weights with logits × 1.3 read 29 of 30 at depths ¼, ½ and ¾ and lose nothing
at 4K. YaRN's attention factor gives that figure from the length ratio s alone: each of q and k is
scaled by 0.1·ln s + 1, so the logits by (0.1·ln s + 1)² = 1.297 at s = 4 (Peng et al., 2023;
`longctx.rope.scaling.yarn_logit_scale`).

Folding: with QK-norm the query's RMSNorm weight (γ, one per head dimension) multiplies the query
after its normalisation, so scaling γ scales q·k exactly; without it the query rows of `linear_qkv`
(per query group: its query heads' rows, then the key's, then the value's) and their bias are scaled.
The result is an ordinary checkpoint: evaluation, export and later stages need nothing special.
"""

from __future__ import annotations

import math

import torch
from megatron.core.models.gpt import GPTModel

from longctx.errors import TrainError


def query_multipliers(model: GPTModel, factor: float) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Each parameter that carries the queries' scale, with the multiplier (broadcast to its shape, 1
    outside the query rows) that scales every layer's attention logits by `factor`."""
    if factor <= 0 or not math.isfinite(factor):
        raise TrainError(f"attention logit scale {factor} is not a positive number")
    cfg = model.config
    if getattr(cfg, "layernorm_zero_centered_gamma", False):
        raise TrainError(
            "zero-centred norm weights (1 + γ) cannot take the attention scale as a product",
            fix="leave attention_scale at 1 for this model",
        )
    heads, groups = cfg.num_attention_heads, cfg.num_query_groups or cfg.num_attention_heads
    head_dim = cfg.kv_channels or cfg.hidden_size // heads
    out: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    for layer in model.decoder.layers:
        att = layer.self_attention
        q_norm = getattr(att, "q_layernorm", None)
        if q_norm is not None and getattr(q_norm, "weight", None) is not None:
            params = [q_norm.weight, getattr(q_norm, "bias", None)]
            out += [(t, torch.full((), factor)) for t in params if t is not None]
            continue
        for t in (att.linear_qkv.weight, getattr(att.linear_qkv, "bias", None)):
            if t is None or t.numel() == 0:
                continue
            # per query group (this rank's groups): its heads' query rows, then the key's, then the value's
            per_group = heads // groups
            rows = torch.ones(t.shape[0] // ((per_group + 2) * head_dim), (per_group + 2) * head_dim)
            rows[:, : per_group * head_dim] = factor
            out.append((t, rows.reshape(-1, *([1] * (t.dim() - 1)))))
    return out


def scale_attention_logits(
    model: GPTModel, factor: float, masters: dict[torch.nn.Parameter, torch.Tensor] | None = None
) -> int:
    """Multiply the attention logits of every layer of `model` by `factor` (in place, see the module
    docstring), and the fp32 masters of those parameters with them (`masters`: model parameter → its
    master, under mixed precision); returns the number of parameters scaled."""
    if factor == 1.0:
        return 0
    pairs = query_multipliers(model, factor)
    with torch.no_grad():
        for p, mult in pairs:
            p.mul_(mult.to(p.device, p.dtype))
            if masters is not None and p in masters:
                masters[p].mul_(mult.to(masters[p].device))
    return len(pairs)
