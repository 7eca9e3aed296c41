"""The diffusion objectives' noise, drawn so that every parallel layout trains on the same corruption.

A sample's draws depend only on (seed, its index in the stage's sample order): its time t (stratified
over its global batch) and, per token, the uniform that decides whether it is corrupted and the
token it would become. They are drawn over the *full* sequence before the context-parallel split, so
each CP rank holds its zigzag shard of one corruption (not the same pattern repeated per chunk); TP
and CP ranks holding a sample draw the same, DP ranks hold different samples and draw differently;
a resume draws what the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from longctx.objective import Objective

_T_TAG = "longctx-noise-t"
_TOKEN_TAG = "longctx-noise-tokens"


def generator(tag: str, seed: int, index: int | str) -> torch.Generator:
    """A CPU generator determined by (tag, seed, index) alone."""
    digest = hashlib.blake2b(f"{tag}:{seed}:{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def alpha(obj: Objective, t: torch.Tensor) -> torch.Tensor:
    """α_t: the probability that a token is still clean at time t."""
    if obj.resolved_schedule == "linear":
        return 1.0 - t
    return 1.0 - (1.0 - obj.eps) * t


def alpha_rate(obj: Objective, t: torch.Tensor) -> torch.Tensor:
    """dα_t/dt (negative)."""
    slope = 1.0 if obj.resolved_schedule == "linear" else 1.0 - obj.eps
    return torch.full_like(t, -slope)


def noise_levels(obj: Objective, seed: int, indices: list[int], global_batch_size: int) -> torch.Tensor:
    """t (float64, [b]) of the samples `indices` (their positions in the stage's sample order).

    Antithetic: one uniform u per global batch; the k-th sample of the batch takes (u + k/GBS) mod 1,
    mapped onto [t_min, 1]. Otherwise each sample draws its own t."""
    t_min = obj.resolved_t_min
    out = torch.empty(len(indices), dtype=torch.float64)
    for j, i in enumerate(indices):
        batch, k = divmod(i, global_batch_size)
        if obj.antithetic:
            u = float(torch.rand((), generator=generator(_T_TAG, seed, batch), dtype=torch.float64))
            r = (u + k / global_batch_size) % 1.0
        else:
            r = float(torch.rand((), generator=generator(_T_TAG, seed, -1 - i), dtype=torch.float64))
        out[j] = t_min + (1.0 - t_min) * r
    return out


@dataclasses.dataclass
class Corruption:
    """The model's input and what the loss needs, all `[b, S]` over the full sequences."""

    inputs: torch.Tensor  # long: the corrupted tokens
    corrupted: torch.Tensor  # bool: masked (mdm) / resampled (udm) positions
    t: torch.Tensor  # float64: the sample's time at every position


def corrupt(
    obj: Objective,
    clean: torch.Tensor,
    indices: list[int],
    seed: int,
    global_batch_size: int,
    vocab_size: int,
) -> Corruption:
    """Corrupt the full sequences `clean` [b, S] of the samples `indices`.

    mdm: a token becomes `mask_id` with probability 1 − α_t. udm: with probability 1 − α_t it is
    replaced by a token uniform over [0, vocab_size) (which may be itself; `corrupted` marks the draw)."""
    if obj.kind == "ar":
        raise ValueError("the autoregressive objective has no noise")
    b, s = clean.shape
    t = noise_levels(obj, seed, indices, global_batch_size)
    keep = alpha(obj, t)
    u = torch.empty(b, s, dtype=torch.float64)
    repl = torch.empty(b, s, dtype=torch.long)
    for j, i in enumerate(indices):
        g = generator(_TOKEN_TAG, seed, i)
        u[j] = torch.rand(s, generator=g, dtype=torch.float64)
        repl[j] = torch.randint(0, vocab_size, (s,), generator=g)
    corrupted = u >= keep[:, None]
    if obj.kind == "mdm":
        if obj.mask_id is None:
            raise ValueError("the masked-diffusion objective needs its mask id resolved")
        inputs = torch.where(corrupted, torch.full_like(clean, obj.mask_id), clean)
    else:
        inputs = torch.where(corrupted, repl, clean)
    return Corruption(inputs, corrupted, t[:, None].expand(b, s).contiguous())


__all__ = ["Corruption", "alpha", "alpha_rate", "corrupt", "generator", "noise_levels"]
