"""Input checks shared by every attention entry point; each failure names the shapes involved."""

from __future__ import annotations

from torch import Tensor

from longctx.errors import AttentionError


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, cp_size: int, causal: bool, where: str) -> None:
    """Validate local q/k/v chunks `[batch, seq, heads, dim]` for attention over a CP group."""
    shapes = f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise AttentionError(
            f"q, k and v must be 4-d [batch, seq, heads, head_dim]; got {shapes}",
            where=where,
            fix="reshape to [batch, seq, heads, head_dim] (Megatron's [s, b, h, d] goes through the megatron adapter)",
        )
    devices = {str(t.device) for t in (q, k, v)}
    if len(devices) != 1:
        raise AttentionError(
            f"q, k and v are on different devices ({q.device}, {k.device}, {v.device}); {shapes}",
            where=where,
            fix="move q, k and v to the same device",
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionError(
            f"q, k and v have different dtypes ({q.dtype}, {k.dtype}, {v.dtype}); {shapes}",
            where=where,
            fix="cast q, k and v to one dtype",
        )
    if not q.is_floating_point():
        raise AttentionError(f"attention needs floating-point tensors, got {q.dtype}; {shapes}", where=where)
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise AttentionError(
            f"batch sizes differ: {shapes}", where=where, fix="pass one batch for q, k and v"
        )
    if q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
        raise AttentionError(
            f"sequence lengths differ: {shapes}",
            where=where,
            fix="self-attention over one sequence: q, k and v must hold the same local tokens",
        )
    if not (q.shape[3] == k.shape[3] == v.shape[3]):
        raise AttentionError(
            f"head dims differ: {shapes} (q {q.shape[3]}, k {k.shape[3]}, v {v.shape[3]})",
            where=where,
            fix="project q, k and v to the same head_dim",
        )
    if k.shape[2] != v.shape[2]:
        raise AttentionError(f"k and v have different head counts: {shapes}", where=where)
    if k.shape[2] == 0 or q.shape[2] % k.shape[2] != 0:
        raise AttentionError(
            f"KV heads ({k.shape[2]}) do not divide query heads ({q.shape[2]}): {shapes}",
            where=where,
            fix="use a number of query groups that divides the number of attention heads",
        )
    if causal and cp_size > 1 and q.shape[1] % 2 != 0:
        raise AttentionError(
            f"local sequence length {q.shape[1]} (global {q.shape[1] * cp_size} at CP = {cp_size}) is not "
            f"divisible by 2·CP = {2 * cp_size}: {shapes}",
            where=where,
            fix=f"use a global sequence length that is a multiple of {2 * cp_size} and shard it with zigzag_split",
        )
