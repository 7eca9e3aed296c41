"""Merging a block whose rows have no keys: flash-attn gives such rows lse +inf (and out 0), the math
kernel -inf. Either must leave the accumulated rows untouched, never NaN."""

from __future__ import annotations

import torch

from longctx.attention.kernels import MATH
from longctx.attention.merge import merge_


def _block(seed: int, sq: int = 6, sk: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, n, 2, 8, generator=g) for n in (sq, sk, sk))
    return MATH.forward(q, k, v, False, 8**-0.5)


def test_flash_attn_inf_lse_of_an_empty_block_leaves_the_rows_alone() -> None:
    out, lse = _block(0)
    out_acc, lse_acc = out.clone(), lse.clone()
    empty_out, empty_lse = torch.zeros_like(out), torch.full_like(lse, float("inf"))
    merge_(out_acc, lse_acc, empty_out, empty_lse)
    assert torch.equal(out_acc, out) and torch.equal(lse_acc, lse)


def test_an_accumulator_started_from_an_empty_flash_block_takes_the_next_block_whole() -> None:
    # the ring starts its accumulators from its own block, which flash-attn may have left empty
    out, lse = _block(1)
    out_acc = torch.zeros_like(out)
    lse_acc = torch.full_like(lse, float("inf"))
    merge_(out_acc, lse_acc, out, lse)
    torch.testing.assert_close(out_acc, out)
    torch.testing.assert_close(lse_acc, lse)


def test_rows_empty_on_both_sides_stay_zero_not_nan() -> None:
    out, lse = _block(2)
    out_acc, lse_acc = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    merge_(out_acc, lse_acc, torch.zeros_like(out), torch.full_like(lse, float("inf")))
    assert not out_acc.isnan().any() and torch.equal(out_acc, torch.zeros_like(out))
    assert torch.equal(lse_acc, torch.full_like(lse, float("-inf")))
