"""Zigzag sequence sharding for context parallelism, laid out exactly as Megatron does it.

The sequence is cut into 2·CP equal chunks; CP rank r holds chunks r and 2·CP−1−r, concatenated in
that order. With a causal mask every rank then owns one early and one late chunk, so the attention
work per rank is the same. Tokens, labels, loss masks and position ids (global positions, so RoPE
stays right) must all be split with the same helper; at CP = 1 the tensor is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.attention.comm import all_gather_dim0, group_size
from longctx.errors import AttentionError


def check_zigzag_len(seq_len: int, cp_size: int, *, what: str = "sequence") -> None:
    """Raise AttentionError unless `seq_len` splits into 2·cp_size equal chunks."""
    if cp_size < 1:
        raise AttentionError(f"context-parallel size must be ≥ 1, got {cp_size}")
    if cp_size > 1 and seq_len % (2 * cp_size) != 0:
        raise AttentionError(
            f"{what} length {seq_len} is not divisible by 2·CP = {2 * cp_size} (CP = {cp_size})",
            where="zigzag sharding",
            fix=f"pad or cut the sequence to a multiple of {2 * cp_size}",
        )


def zigzag_chunk_ids(cp_rank: int, cp_size: int) -> tuple[int, int]:
    """The two chunk indices (of 2·cp_size) that `cp_rank` holds."""
    if not 0 <= cp_rank < cp_size:
        raise AttentionError(f"CP rank {cp_rank} is outside 0..{cp_size - 1}")
    return cp_rank, 2 * cp_size - 1 - cp_rank


def zigzag_split(x: Tensor, cp_rank: int, cp_size: int, seq_dim: int = 1) -> Tensor:
    """This rank's zigzag shard of `x` along `seq_dim` (bit-identical to Megatron's layout)."""
    seq_dim = seq_dim % x.dim()
    check_zigzag_len(x.shape[seq_dim], cp_size)
    if cp_size == 1:
        return x
    first, second = zigzag_chunk_ids(cp_rank, cp_size)
    chunks = x.view(
        *x.shape[:seq_dim], 2 * cp_size, x.shape[seq_dim] // (2 * cp_size), *x.shape[seq_dim + 1 :]
    )
    index = torch.tensor([first, second], dtype=torch.long, device=x.device)
    picked = chunks.index_select(seq_dim, index)
    return picked.view(*x.shape[:seq_dim], -1, *x.shape[seq_dim + 1 :])


def zigzag_gather(shards: Sequence[Tensor], seq_dim: int = 1) -> Tensor:
    """Inverse of `zigzag_split`: the full tensor from every rank's shard, given in CP-rank order."""
    cp_size = len(shards)
    if cp_size == 0:
        raise AttentionError("zigzag_gather needs at least one shard")
    if cp_size == 1:
        return shards[0]
    shapes = {tuple(s.shape) for s in shards}
    if len(shapes) != 1:
        raise AttentionError(f"zigzag shards differ in shape: {sorted(shapes)}", where="zigzag_gather")
    seq_dim = seq_dim % shards[0].dim()
    local = shards[0].shape[seq_dim]
    if local % 2:
        raise AttentionError(
            f"zigzag shard length {local} is odd; a shard holds two equal chunks", where="zigzag_gather"
        )
    half = local // 2
    ordered: list[Tensor] = [shards[0]] * (2 * cp_size)
    for rank, shard in enumerate(shards):
        first, second = zigzag_chunk_ids(rank, cp_size)
        ordered[first] = shard.narrow(seq_dim, 0, half)
        ordered[second] = shard.narrow(seq_dim, half, half)
    return torch.cat(ordered, dim=seq_dim)


def zigzag_positions(seq_len: int, cp_rank: int, cp_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Global position ids of this rank's tokens, `[seq_len / cp_size]` (int64)."""
    return zigzag_split(torch.arange(seq_len, device=device), cp_rank, cp_size, seq_dim=0)


def zigzag_all_gather(x: Tensor, group: dist.ProcessGroup | None, seq_dim: int = 1) -> Tensor:
    """Collective form of `zigzag_gather`: every rank of `group` gets the full tensor (no autograd)."""
    if group_size(group) == 1:
        return x
    gathered = all_gather_dim0(x, group)
    return zigzag_gather(list(gathered.unbind(0)), seq_dim=seq_dim)
