"""Block kernels and the LSE merge against textbook attention."""

from __future__ import annotations

import math

import pytest
import torch

from longctx.attention.kernels import CPU_FLASH, KERNEL_ENV, MATH, select_kernel
from longctx.attention.merge import merge_
from longctx.errors import AttentionError
from tests.fixtures.attention import reference_attention


def _inputs(sq=12, sk=12, hq=8, hkv=2, d=64, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, sq, hq, d, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, sk, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(2, sk, hkv, d, generator=gen, dtype=torch.float64).to(dtype)
    dout = torch.randn(2, sq, hq, d, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, dout


def _reference_lse(q, k, causal):
    g = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double().repeat_interleave(g, 2)) / math.sqrt(
        q.shape[-1]
    )
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


@pytest.mark.parametrize("kernel", [MATH, CPU_FLASH], ids=lambda k: k.name)
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_forward_backward_match_reference(kernel, causal):
    q, k, v, dout = _inputs()
    scale = 1 / math.sqrt(q.shape[-1])
    out, lse = kernel.forward(q, k, v, causal, scale)
    assert out.shape == q.shape and lse.shape == (2, 8, 12)
    assert lse.dtype == torch.float64
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref = reference_attention(qr, kr, vr, causal)
    ref.backward(dout)
    torch.testing.assert_close(out, ref.detach(), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, _reference_lse(q, k, causal), atol=1e-12, rtol=1e-12)
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, causal, scale)
    assert dk.shape == k.shape
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("kernel", [MATH, CPU_FLASH], ids=lambda k: k.name)
def test_blocks_merged_through_lse_equal_one_block(kernel):
    # keys split in two: merged outputs equal the single block; block backwards with the final
    # out/lse sum to the single block's gradients
    q, k, v, dout = _inputs(sq=10, sk=18)
    scale = 0.17
    out, lse = kernel.forward(q, k, v, False, scale)
    o1, l1 = kernel.forward(q, k[:, :7], v[:, :7], False, scale)
    o2, l2 = kernel.forward(q, k[:, 7:], v[:, 7:], False, scale)
    acc, lacc = o1.clone(), l1.clone().contiguous()
    merge_(acc, lacc, o2, l2)
    torch.testing.assert_close(acc, out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lacc, lse, atol=1e-12, rtol=1e-12)
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, False, scale)
    a = kernel.backward(dout, q, k[:, :7], v[:, :7], out, lse, False, scale)
    b = kernel.backward(dout, q, k[:, 7:], v[:, 7:], out, lse, False, scale)
    torch.testing.assert_close(a[0] + b[0], dq, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(torch.cat([a[1], b[1]], 1), dk, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(torch.cat([a[2], b[2]], 1), dv, atol=1e-12, rtol=1e-12)


def test_merge_keeps_float32_accumulators_for_bfloat16_blocks():
    acc = torch.zeros(1, 3, 2, 4)
    lse = torch.full((1, 2, 3), float("-inf"))
    block = torch.ones(1, 3, 2, 4, dtype=torch.bfloat16)
    merge_(acc, lse, block, torch.zeros(1, 2, 3))
    merge_(acc, lse, 3 * block, torch.zeros(1, 2, 3))
    assert acc.dtype == torch.float32
    torch.testing.assert_close(acc, torch.full_like(acc, 2.0))
    torch.testing.assert_close(lse, torch.full_like(lse, math.log(2)))


def test_selection_on_cpu(monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    cpu = torch.device("cpu")
    assert select_kernel(cpu, torch.float32).name == "cpu_flash"
    assert select_kernel(cpu, torch.bfloat16).name == "cpu_flash"
    assert select_kernel(cpu, torch.float32, "math").name == "math"
    monkeypatch.setenv(KERNEL_ENV, "math")
    assert select_kernel(cpu, torch.float32).name == "math"
    with pytest.raises(AttentionError, match="unknown attention kernel 'fast'"):
        select_kernel(cpu, torch.float32, "fast")
    with pytest.raises(AttentionError, match="'sdpa_flash' needs CUDA tensors, got cpu"):
        select_kernel(cpu, torch.bfloat16, "sdpa_flash")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["flash_attn", "sdpa_flash"])
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_kernels_match_math(name, causal):
    from longctx.attention.kernels import KERNELS, _flash_attn_module

    if name == "flash_attn" and _flash_attn_module() is None:
        pytest.skip("flash-attn not installed")
    kernel = KERNELS[name]
    q, k, v, dout = (t.to("cuda", torch.bfloat16) for t in _inputs(sq=128, sk=128))
    scale = 1 / math.sqrt(q.shape[-1])
    out, lse = kernel.forward(q, k, v, causal, scale)
    ref_out, ref_lse = MATH.forward(q, k, v, causal, scale)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=2.5e-2, rtol=2.5e-2)
    torch.testing.assert_close(lse.float(), ref_lse.float(), atol=2.5e-2, rtol=2.5e-2)
    got = kernel.backward(dout, q, k, v, ref_out, ref_lse, causal, scale)
    want = MATH.backward(dout, q, k, v, ref_out, ref_lse, causal, scale)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g.float(), w.float(), atol=5e-2, rtol=5e-2)
