"""RoPE from each token's position id, so that positions are right on every CP rank of any split.

megatron-core's GPTModel ignores `position_ids` under RoPE: it builds the angles of positions
0 … S−1 and, under context parallelism, keeps the zigzag chunks of this rank
(`get_pos_emb_on_this_cp_rank`). That is right only for zigzag shards of unpacked sequences: the
document-balanced split holds other positions, and `reset_position_ids` (positions restarting at each
document, what Megatron-LM's THD path does through TransformerEngine) would be silently ignored.

`rope_from_position_ids(model)` makes the model's rotary embedding take the angles of the position
ids passed to `model(tokens, position_ids, …)`: `[s, b, 1, dim]`, one row of angles per sample, which
megatron-core's RoPE application broadcasts over heads. For plain positions under zigzag this gives
exactly the tensor megatron-core would build (the same float32 products). A forward without position
ids falls back to megatron-core's own.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from megatron.core.models.gpt import GPTModel
from torch import Tensor

_ATTR = "_longctx_position_ids"


def rotary_angles(rotary: Any, position_ids: Tensor) -> Tensor:
    """`[s, b, 1, dim]` RoPE angles of `position_ids` `[b, s]` for megatron-core's RotaryEmbedding
    `rotary` (its inverse frequencies, interpolation factor and interleaving)."""
    inv = rotary.inv_freq
    pos = position_ids.to(device=inv.device, dtype=inv.dtype)
    if rotary.seq_len_interpolation_factor is not None:
        pos = pos * (1 / rotary.seq_len_interpolation_factor)
    freqs = pos[..., None] * inv  # [b, s, dim/2]
    if rotary.rotary_interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb.transpose(0, 1)[:, :, None, :]


def rope_from_position_ids(model: GPTModel) -> GPTModel:
    """Make `model`'s RoPE follow the position ids of each forward (see the module docstring)."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None or getattr(model, "position_embedding_type", None) != "rope":
        return model
    original = rotary.forward

    def forward(
        self: Any, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group: Any = None
    ) -> Tensor:
        positions = getattr(self, _ATTR, None)
        if positions is None or offset:
            return original(max_seq_len, offset, packed_seq, cp_group)
        if self.inv_freq.device != positions.device:  # megatron-core moves it to the device once, too
            self.inv_freq = self.inv_freq.to(positions.device)
        return rotary_angles(self, positions)

    def capture(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        positions = args[1] if len(args) > 1 else kwargs.get("position_ids")
        setattr(rotary, _ATTR, positions)

    rotary.forward = types.MethodType(forward, rotary)
    model.register_forward_pre_hook(capture, with_kwargs=True)
    return model


def built_rotary_base(model: GPTModel) -> float | None:
    """The RoPE base `model` was built with, read back from its inverse frequencies (None without RoPE):
    the last one is base^-(d-2)/d for rotary dim d, so the base comes back to float32's precision."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if rotary is None or getattr(model, "position_embedding_type", None) != "rope":
        return None
    inv = rotary.inv_freq.detach().double().cpu()
    dim = 2 * inv.numel()
    if dim <= 2:
        return None
    return float(inv[-1] ** (-dim / (dim - 2)))
