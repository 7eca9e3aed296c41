"""Functions the CP worker pool runs on every rank (`fn(rank, world, group, **kwargs)`).

Every rank draws the same full-sequence inputs from a seed, keeps its zigzag shard, and returns its
local results as float64 CPU tensors; the test process gathers them and compares with a float64
reference on the full sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from longctx.attention import allgather_attention, ring_attention, zigzag_split
from longctx.attention import ring as ring_module
from longctx.errors import AttentionError

VARIANTS = {"ring": ring_attention, "allgather": allgather_attention}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def make_inputs(seed: int, b: int, s: int, hq: int, hkv: int, d: int) -> dict[str, torch.Tensor]:
    """Full-sequence q, k, v and an upstream gradient, float64, identical on every process."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(b, s, hq, d, generator=gen, dtype=torch.float64),
        "k": torch.randn(b, s, hkv, d, generator=gen, dtype=torch.float64),
        "v": torch.randn(b, s, hkv, d, generator=gen, dtype=torch.float64),
        "dout": torch.randn(b, s, hq, d, generator=gen, dtype=torch.float64),
    }


def attention_case(
    rank: int,
    world: int,
    group: Any,
    *,
    variants: list[str],
    causal: bool,
    shape: tuple[int, int, int, int, int],
    dtype: str,
    seed: int = 0,
    piece: int | None = None,
    query_tile: int | None = None,
) -> dict[str, dict[str, torch.Tensor]]:
    """Forward + backward of each variant on this rank's shard: {variant: {out, dq, dk, dv}}.

    `piece` sets the ring's keys per K/V message; `query_tile` replaces the ring's queries per
    backward kernel call (at least 768 otherwise), so that tiny sequences are cut into tiles too.
    """
    with _query_tile(query_tile):
        return _attention_case(rank, world, group, variants, causal, shape, dtype, seed, piece)


@contextlib.contextmanager
def _query_tile(tile: int | None) -> Iterator[None]:
    if tile is None:
        yield
        return
    saved = ring_module.ring_query_tile
    ring_module.ring_query_tile = lambda piece: (tile, 1)
    try:
        yield
    finally:
        ring_module.ring_query_tile = saved


def _attention_case(
    rank: int,
    world: int,
    group: Any,
    variants: list[str],
    causal: bool,
    shape: tuple[int, int, int, int, int],
    dtype: str,
    seed: int,
    piece: int | None,
) -> dict[str, dict[str, torch.Tensor]]:
    b, s, hq, hkv, d = shape
    full = make_inputs(seed, b, s, hq, hkv, d)
    dt = DTYPES[dtype]
    local = {name: zigzag_split(t, rank, world, seq_dim=1).to(dt) for name, t in full.items()}
    results: dict[str, dict[str, torch.Tensor]] = {}
    for variant in variants:
        q, k, v = (local[n].clone().requires_grad_() for n in ("q", "k", "v"))
        extra = {"piece": piece} if variant == "ring" else {}
        out = VARIANTS[variant](q, k, v, group=group, causal=causal, **extra)
        assert out.dtype == dt and out.shape == q.shape
        out.backward(local["dout"])
        results[variant] = {
            "out": out.detach().double(),
            "dq": q.grad.double(),  # type: ignore[union-attr]
            "dk": k.grad.double(),  # type: ignore[union-attr]
            "dv": v.grad.double(),  # type: ignore[union-attr]
        }
    return results


def make_stack(
    seed: int, layers: int, hidden: int, hq: int, hkv: int, d: int, b: int, s: int
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)

    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, dtype=torch.float64) / rows**0.5

    return {
        "x": torch.randn(b, s, hidden, generator=gen, dtype=torch.float64),
        "weights": [
            {
                "wq": w(hidden, hq * d),
                "wk": w(hidden, hkv * d),
                "wv": w(hidden, hkv * d),
                "wo": w(hq * d, hidden),
            }
            for _ in range(layers)
        ],
        "g": torch.randn(b, s, hidden, generator=gen, dtype=torch.float64),
    }


def stack_forward(
    x: torch.Tensor, weights: list[dict[str, torch.Tensor]], attn: Any, hq: int, hkv: int, d: int
):
    """Pre-norm residual attention blocks, x ← x + attn(n·Wq, n·Wk, n·Wv)·Wo with n = rms_norm(x),
    as in a transformer (keeps the scores well conditioned). Returns every layer's output."""
    outs = []
    b, s, _ = x.shape
    for w in weights:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        q = (n @ w["wq"]).view(b, s, hq, d)
        k = (n @ w["wk"]).view(b, s, hkv, d)
        v = (n @ w["wv"]).view(b, s, hkv, d)
        x = x + attn(q, k, v).reshape(b, s, hq * d) @ w["wo"]
        outs.append(x)
    return outs


def stacked_case(
    rank: int,
    world: int,
    group: Any,
    *,
    variant: str,
    causal: bool,
    layers: int,
    hidden: int,
    heads: tuple[int, int, int],
    b: int,
    s: int,
    seed: int = 0,
) -> dict[str, Any]:
    """`layers` stacked attention blocks in float32 on this rank's shard, with gradients."""
    hq, hkv, d = heads
    full = make_stack(seed, layers, hidden, hq, hkv, d, b, s)
    x = zigzag_split(full["x"], rank, world, 1).float().requires_grad_()
    weights = [{n: t.float().requires_grad_() for n, t in w.items()} for w in full["weights"]]
    fn = VARIANTS[variant]
    outs = stack_forward(x, weights, lambda q, k, v: fn(q, k, v, group=group, causal=causal), hq, hkv, d)
    outs[-1].backward(zigzag_split(full["g"], rank, world, 1).float())
    # weight gradients are partial sums per rank (each rank owns some tokens)
    wgrads = [{n: t.grad.clone() for n, t in w.items()} for w in weights]  # type: ignore[union-attr]
    if world > 1:
        for w in wgrads:
            for t in w.values():
                dist.all_reduce(t, group=group)
    return {
        "outs": [o.detach().double() for o in outs],
        "dx": x.grad.double(),  # type: ignore[union-attr]
        "wgrads": [{n: t.double() for n, t in w.items()} for w in wgrads],
    }


def odd_local_len_case(rank: int, world: int, group: Any, *, variant: str) -> str:
    """The message a CP group raises for a local length that is not two equal chunks."""
    q = torch.randn(1, 5, 2, 8)
    try:
        VARIANTS[variant](q, q, q, group=group, causal=True)
    except AttentionError as err:
        return str(err)
    return "no error"


def megatron_batch_case(rank: int, world: int, group: Any, *, seq: int) -> bool:
    """zigzag_split equals megatron-core's own get_batch_on_this_cp_rank on every key."""
    from megatron.core.utils import get_batch_on_this_cp_rank

    gen = torch.Generator().manual_seed(3)
    batch = {
        "tokens": torch.randint(0, 1000, (2, seq), generator=gen),
        "labels": torch.randint(0, 1000, (2, seq), generator=gen),
        "loss_mask": torch.rand(2, seq, generator=gen),
        "position_ids": torch.arange(seq).expand(2, seq).contiguous(),
        "attention_mask": torch.rand(2, 1, seq, seq, generator=gen) > 0.5,
    }
    ours = {
        key: zigzag_split(val, rank, world, seq_dim=2 if key == "attention_mask" else 1)
        for key, val in batch.items()
    }
    theirs = get_batch_on_this_cp_rank({k: v.clone() for k, v in batch.items()}, cp_group=group)
    return all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in batch)
