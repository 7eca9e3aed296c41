"""Merging partial attention results through their log-sum-exp, in float32 (float64 for float64).

For two partial results over disjoint key sets, with lse = log Σ exp(scores):
    lse  = log(exp(lse_a) + exp(lse_b))
    out  = out_a · exp(lse_a − lse) + out_b · exp(lse_b − lse)
`torch.logaddexp` is exact for very different magnitudes (no overflow, -inf on one side is fine);
the weights are ≤ 1, so nothing overflows. A row with no keys in a block has lse -inf from the math
kernel but +inf from flash-attn (its out is 0): both mean "nothing here", so +inf is read as -inf, and
a row empty on both sides keeps weight 0 instead of exp(-inf − -inf) = NaN. Accumulators stay in
float32 whatever the block dtype, because rounding every partial output to bfloat16 compounds over the
ring steps.
"""

from __future__ import annotations

import torch
from torch import Tensor


def merge_(out_acc: Tensor, lse_acc: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Fold one block into the accumulators, in place.

    out_acc `[b, s, h, d]` and lse_acc `[b, h, s]` (float32/float64, may be sequence slices of larger
    accumulators); block_out `[b, s, h, d]` (any float dtype), block_lse `[b, h, s]`.
    """
    block_lse = empty_rows_as_neg_inf(block_lse.to(lse_acc.dtype))
    old_lse = empty_rows_as_neg_inf(lse_acc)
    new_lse = torch.logaddexp(old_lse, block_lse)
    # rows empty on both sides: subtract 0, so both weights are exp(-inf) = 0
    shift = torch.where(new_lse == float("-inf"), torch.zeros_like(new_lse), new_lse)
    # [b, h, s] → [b, s, h, 1] to scale the rows of out
    w_old = (old_lse - shift).exp_().transpose(1, 2).unsqueeze(-1)
    w_new = (block_lse - shift).exp_().transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_old).addcmul_(block_out, w_new)  # no block-sized temporary
    lse_acc.copy_(new_lse)


def empty_rows_as_neg_inf(lse: Tensor) -> Tensor:
    """flash-attn's +inf lse of a row with no keys, as the -inf every other kernel gives it."""
    return lse.masked_fill(lse == float("inf"), float("-inf"))
