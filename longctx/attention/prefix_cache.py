"""Keys and values of a full forward kept per layer, so that a causal model can rerun a suffix alone.

Greedy generation by Jacobi iteration (`longctx.eval.task_score`) reruns the whole sequence each time
an answer token changes; at 16K and beyond each rerun costs as much as the first forward although
only the last few tokens differ. With a `PrefixCache` on every `LongctxCoreAttention` of a model, a
forward in `record` mode keeps each layer's keys and values (after RoPE), and a forward in `extend`
mode over tokens at positions `start …` attends to the recorded keys and values before `start` and
to its own: the same attention the full forward computes for those queries, at the cost of the
suffix. One process only (CP = 1): under context parallelism a rank holds a shard of the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx.errors import AttentionError

CacheMode = Literal["off", "record", "extend"]


@dataclass
class PrefixCache:
    """Recorded keys and values by layer number, `[s, b, groups, head_dim]` as megatron-core hands them."""

    mode: CacheMode = "off"
    start: int = 0  # extend: the absolute position of the suffix's first token
    rows: list[int] = field(default_factory=list)  # extend: the recorded batch rows the suffix continues
    keys: dict[int, Tensor] = field(default_factory=dict)
    values: dict[int, Tensor] = field(default_factory=dict)

    def record(self, layer: int, key: Tensor, value: Tensor) -> None:
        self.keys[layer], self.values[layer] = key.detach(), value.detach()

    def clear(self) -> None:
        self.keys.clear()
        self.values.clear()

    def extend(self, layer: int, query: Tensor, key: Tensor, value: Tensor, scale: float) -> Tensor:
        """Causal attention of the suffix `query` `[m, b, h, d]` over the recorded prefix and the
        suffix's own `key`/`value` `[m, b, g, d]`; `[m, b, h·d]` like the core attention returns."""
        if layer not in self.keys:
            raise AttentionError(f"no keys recorded for layer {layer}", where="PrefixCache.extend")
        rows = torch.tensor(self.rows, dtype=torch.long, device=key.device)
        k = torch.cat([self.keys[layer][: self.start].index_select(1, rows), key])
        v = torch.cat([self.values[layer][: self.start].index_select(1, rows), value])
        m, b, heads, dim = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, k, v))  # [b, heads, s, d]
        if k.shape[1] != heads:  # grouped queries: each key/value head serves heads / groups queries
            k, v = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v))
        # query i sits at position start + i: it sees every recorded key and the suffix's keys up to i
        mask = torch.ones(m, k.shape[2], dtype=torch.bool, device=q.device).tril(diagonal=self.start)
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)
        return out.to(query.dtype).permute(2, 0, 1, 3).reshape(m, b, heads * dim)
