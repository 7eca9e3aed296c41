"""Merging partial attention results through their log-sum-exp, in float32 (float64 for float64).

For two partial results over disjoint key sets, with lse = log Σ exp(scores):
    lse  = log(exp(lse_a) + exp(lse_b))
    out  = out_a · exp(lse_a − lse) + out_b · exp(lse_b − lse)
`torch.logaddexp` is exact for very different magnitudes (no overflow, -inf on one side is fine);
the weights are ≤ 1, so nothing overflows. Accumulators stay in float32 whatever the block dtype,
because rounding every partial output to bfloat16 compounds over the ring steps.
"""

from __future__ import annotations

import torch
from torch import Tensor


def merge_(out_acc: Tensor, lse_acc: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Fold one block into the accumulators, in place.

    out_acc `[b, s, h, d]` and lse_acc `[b, h, s]` (float32/float64, may be sequence slices of larger
    accumulators); block_out `[b, s, h, d]` (any float dtype), block_lse `[b, h, s]`.
    """
    block_lse = block_lse.to(lse_acc.dtype)
    new_lse = torch.logaddexp(lse_acc, block_lse)
    # [b, h, s] → [b, s, h, 1] to scale the rows of out
    w_old = (lse_acc - new_lse).exp_().transpose(1, 2).unsqueeze(-1)
    w_new = (block_lse - new_lse).exp_().transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_old).addcmul_(block_out, w_new)  # no block-sized temporary
    lse_acc.copy_(new_lse)
