"""Context-parallel attention without TransformerEngine: ring and all-gather variants, zigzag
sharding helpers, per-device block kernels and a megatron-core `core_attention` adapter.

Layout at the API: `[batch, seq, heads, head_dim]`, each rank passing its zigzag shard
(chunks r and 2·CP−1−r of 2·CP). The megatron adapter takes Megatron's `[seq, batch, heads, dim]`.
"""

from longctx.attention.allgather import allgather_attention
from longctx.attention.ring import ring_attention
from longctx.attention.zigzag import (
    check_zigzag_len,
    zigzag_all_gather,
    zigzag_chunk_ids,
    zigzag_gather,
    zigzag_positions,
    zigzag_split,
)

__all__ = [
    "allgather_attention",
    "check_zigzag_len",
    "ring_attention",
    "zigzag_all_gather",
    "zigzag_chunk_ids",
    "zigzag_gather",
    "zigzag_positions",
    "zigzag_split",
]
