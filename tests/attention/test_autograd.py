"""The autograd Function builder shared by the ring and all-gather variants."""

from __future__ import annotations

import torch

from longctx.attention.allgather import _AllGatherAttention
from longctx.attention.autograd import attention_function
from longctx.attention.kernels import MATH
from longctx.attention.ring import _RingAttention


def test_builder_saves_what_backward_needs_and_gradchecks():
    calls: list[tuple[bool, float]] = []

    def forward(q, k, v, causal, scale):
        return MATH.forward(q, k, v, causal, scale)

    def backward(dout, q, k, v, out, lse, causal, scale):
        calls.append((causal, scale))
        return MATH.backward(dout, q, k, v, out, lse, causal, scale)

    fn = attention_function("_Probe", forward, backward)
    assert fn.__name__ == "_Probe" and issubclass(fn, torch.autograd.Function)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 5, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 5, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: fn.apply(a, b, c, True, 0.5), (q, k, v))
    assert calls and all(c == (True, 0.5) for c in calls)  # settings reach backward unchanged


def test_both_variants_use_it():
    for fn in (_RingAttention, _AllGatherAttention):
        assert issubclass(fn, torch.autograd.Function)
        assert fn.forward.__qualname__.startswith("attention_function")
