"""RoPE inputs from a checkpoint's saved Megatron arguments (a plain mapping; nothing is read here)."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longctx.errors import RopeError
from longctx.rope.cossum import check_dims

_ROPE_TYPES = ("rope", "yarn")


@dataclass(frozen=True)
class RopeModelArgs:
    """What RoPE planning needs from a model: rotary dim (kv_channels × rotary_percent, truncated as
    Megatron does), head dim (kv_channels), the pretraining base and the pretraining length."""

    rotary_dim: int
    head_dim: int
    base: int
    length: int
    position_embedding_type: str

    @property
    def partial_head_dim(self) -> int | None:
        """head_dim when only part of each head is rotated, else None."""
        return self.head_dim if self.head_dim != self.rotary_dim else None


def rope_args_from_checkpoint_args(
    args: Mapping[str, Any] | Namespace,
    *,
    kv_channels: int | None = None,
    rotary_percent: float | None = None,
    where: str | None = None,
) -> RopeModelArgs:
    """Read rotary dim, base and length from saved Megatron args (a mapping or the saved Namespace:
    `kv_channels`, `rotary_percent`, `rotary_base`, `seq_length`); `kv_channels` and `rotary_percent`
    (e.g. from the architecture inferred from tensor shapes) fill missing ones."""
    if not isinstance(args, Mapping):
        args = vars(args)
    pe_type = str(args.get("position_embedding_type") or "rope")
    if pe_type not in _ROPE_TYPES:
        raise RopeError(
            f"the checkpoint uses {pe_type!r} position embeddings, not RoPE, so there is no rotary base to plan",
            where=where,
            fix="RoPE planning applies to models trained with --position-embedding-type rope",
        )
    kv = args.get("kv_channels") or kv_channels
    if not kv and args.get("hidden_size") and args.get("num_attention_heads"):
        kv = int(args["hidden_size"]) // int(args["num_attention_heads"])  # Megatron's default
    if not kv:
        raise RopeError(
            "the checkpoint's args have no kv_channels (nor hidden_size and num_attention_heads)",
            where=where,
            fix="pass --rotary-dim explicitly",
        )
    missing = [k for k in ("rotary_base", "seq_length") if args.get(k) is None]
    if missing:
        raise RopeError(
            f"the checkpoint's args lack {', '.join(missing)}",
            where=where,
            fix="pass --base and --from-length explicitly",
        )
    percent = float(args.get("rotary_percent") or rotary_percent or 1.0)
    rotary_dim = int(int(kv) * percent) if percent < 1.0 else int(kv)
    try:
        check_dims(rotary_dim, int(kv))
    except RopeError as err:
        raise RopeError(
            f"{err.what} (kv_channels {kv} × rotary_percent {percent:g})", where=where, fix=err.fix
        ) from None
    return RopeModelArgs(
        rotary_dim=rotary_dim,
        head_dim=int(kv),
        base=int(args["rotary_base"]),
        length=int(args["seq_length"]),
        position_embedding_type=pe_type,
    )
