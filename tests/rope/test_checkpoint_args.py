"""RoPE inputs from a checkpoint's saved Megatron args."""

from __future__ import annotations

from argparse import Namespace

import pytest

from longctx.errors import RopeError
from longctx.rope import rope_args_from_checkpoint_args

ARGS = dict(
    kv_channels=128, rotary_percent=1.0, rotary_base=100_000, seq_length=4_096, position_embedding_type="rope"
)


def test_full_rotary() -> None:
    got = rope_args_from_checkpoint_args(ARGS)
    assert (got.rotary_dim, got.head_dim, got.base, got.length) == (128, 128, 100_000, 4_096)
    assert got.partial_head_dim is None


def test_partial_rotary_and_namespace_and_fallbacks() -> None:
    got = rope_args_from_checkpoint_args(Namespace(**{**ARGS, "rotary_percent": 0.5}))
    assert (got.rotary_dim, got.partial_head_dim) == (64, 128)
    no_kv = {**ARGS, "kv_channels": None, "hidden_size": 4096, "num_attention_heads": 32}
    assert rope_args_from_checkpoint_args(no_kv).rotary_dim == 128
    assert rope_args_from_checkpoint_args({**ARGS, "kv_channels": None}, kv_channels=96).rotary_dim == 96


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"position_embedding_type": "learned_absolute"},
            "uses 'learned_absolute' position embeddings, not RoPE",
        ),
        ({"kv_channels": None}, "no kv_channels"),
        ({"rotary_base": None}, "lack rotary_base"),
        (
            {"kv_channels": 100, "rotary_percent": 0.25},
            r"rotary dim must be even .* \(kv_channels 100 × rotary_percent 0.25\)",
        ),
    ],
)
def test_bad_args(change: dict, message: str) -> None:
    with pytest.raises(RopeError, match=message) as err:
        rope_args_from_checkpoint_args({**ARGS, **change}, where="/ckpt/iter_0000100")
    assert err.value.where == "/ckpt/iter_0000100"
