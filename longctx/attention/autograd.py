"""One autograd wrapper for every context-parallel attention variant.

A variant is a pair of plain functions:
    forward(q, k, v, *args) -> (out, lse)
    backward(dout, q, k, v, out, lse, *args) -> (dq, dk, dv)
where `args` are non-tensor settings (process group, causality, scale, block kernel, …). Forward
saves q, k, v, out and the float32 LSE, nothing else: backward recomputes each block's probabilities
from them, so no S×S tensor lives between the two passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

ForwardFn = Callable[..., tuple[Tensor, Tensor]]
BackwardFn = Callable[..., tuple[Tensor, Tensor, Tensor]]


def attention_function(name: str, forward: ForwardFn, backward: BackwardFn) -> type[torch.autograd.Function]:
    """A `torch.autograd.Function` class whose `apply(q, k, v, *args)` runs `forward`/`backward`."""

    def fwd(ctx: Any, q: Tensor, k: Tensor, v: Tensor, *args: Any) -> Tensor:
        out, lse = forward(q, k, v, *args)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = args
        return out

    def bwd(ctx: Any, dout: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(dout, q, k, v, out, lse, *ctx.args)
        return (dq, dk, dv, *([None] * len(ctx.args)))

    return type(
        name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)}
    )
