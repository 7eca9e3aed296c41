"""Per-device block kernels: one attention block in, `(out, lse)` out, and its backward.

A block is local queries against one K/V chunk, either fully visible or causal on the diagonal
(query i sees keys 0..i of the same chunk, so Sq == Sk). Zigzag sharding only ever needs these two
masks, which is why plain kernels suffice for the ring.

Layout at this interface: q `[b, sq, hq, d]`, k/v `[b, sk, hkv, d]` with hq a multiple of hkv
(query head h reads kv head h // (hq/hkv), as Megatron's `repeat_interleave`), out `[b, sq, hq, d]`
in the input dtype and lse `[b, hq, sq]` in float32 (float64 for float64 inputs). Kernels taking
`[b, h, s, d]` receive `transpose(1, 2)` views, which costs no copy.

The backward takes the *final* (merged) out and lse of the whole attention, not the block's own: with
them the block gradients are exact shares of the full gradient (P = exp(s − lse), D = rowsum(dO·O)).
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from longctx.errors import AttentionError

ForwardFn = Callable[[Tensor, Tensor, Tensor, bool, float], tuple[Tensor, Tensor]]
BackwardFn = Callable[
    [Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, float], tuple[Tensor, Tensor, Tensor]
]

KERNEL_ENV = "LONGCTX_ATTN_KERNEL"


@dataclass(frozen=True)
class BlockKernel:
    """A forward/backward pair for one attention block."""

    name: str
    forward: ForwardFn
    backward: BackwardFn


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for out/lse merges: float32, or float64 when the inputs are float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------------------------- math


def _math_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    acc = lse_dtype(q.dtype)
    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    # [b, hkv, g, sq, d] so that every group of query heads shares its kv head without a repeat
    qg = q.to(acc).permute(0, 2, 1, 3).reshape(b, hkv, g, sq, d)
    kg = k.to(acc).permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.to(acc).permute(0, 2, 1, 3).unsqueeze(2)
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(_upper_mask(sq, k.shape[1], q.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vg)
    out = out.reshape(b, hq, sq, d).permute(0, 2, 1, 3).to(q.dtype).contiguous()
    return out, lse.reshape(b, hq, sq)


def _math_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    acc = lse_dtype(q.dtype)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv

    def grouped(x: Tensor) -> Tensor:
        return x.to(acc).permute(0, 2, 1, 3).reshape(b, hkv, g, sq, x.shape[-1])

    qg, og, dog = grouped(q), grouped(out), grouped(dout)
    kg = k.to(acc).permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.to(acc).permute(0, 2, 1, 3).unsqueeze(2)
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(_upper_mask(sq, sk, q.device), float("-inf"))
    p = torch.exp(scores - lse.to(acc).reshape(b, hkv, g, sq, 1))
    dv = torch.matmul(p.transpose(-1, -2), dog).sum(2)
    dp = torch.matmul(dog, vg.transpose(-1, -2))
    delta = (dog * og).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = torch.matmul(ds, kg).reshape(b, hq, sq, d).permute(0, 2, 1, 3)
    dk = torch.matmul(ds.transpose(-1, -2), qg).sum(2).permute(0, 2, 1, 3)
    dv = dv.permute(0, 2, 1, 3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _upper_mask(sq: int, sk: int, device: torch.device) -> Tensor:
    # top-left aligned causal mask of one diagonal block (sq == sk there), True where masked
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


MATH = BlockKernel("math", _math_forward, _math_backward)


# ----------------------------------------------------------------------------------- CPU flash op


def _cpu_flash_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    # aten's CPU flash kernel takes [b, h, s, d] (strided views are fine), handles GQA itself and
    # returns lse in float32 (float64 for float64 inputs).
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal, scale=scale
    )
    return out.transpose(1, 2), lse


def _cpu_flash_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout.transpose(1, 2),
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        out.transpose(1, 2),
        lse.to(lse_dtype(q.dtype)),
        0.0,
        causal,
        scale=scale,
    )
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


CPU_FLASH = BlockKernel("cpu_flash", _cpu_flash_forward, _cpu_flash_backward)


# ---------------------------------------------------------------------------------- CUDA: flash-attn


def _flash_attn_module() -> ModuleType | None:
    try:  # optional dependency (extra `gpu`); imported only when a CUDA kernel is asked for
        from flash_attn import flash_attn_interface
    except Exception:
        return None
    return flash_attn_interface


def _call_with_supported(fn: Callable[..., Any], **kwargs: Any) -> Any:
    # flash-attn renamed arguments across 2.x (window_size → window_size_left/right, softcap added);
    # pass only the ones this version declares.
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # an opaque custom op: assume the 2.6+ names
        return fn(**kwargs)
    if "window_size" in params and "window_size_left" in kwargs:
        kwargs["window_size"] = (kwargs.pop("window_size_left"), kwargs.pop("window_size_right"))
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def _flash_attn_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    fa = _flash_attn_module()
    assert fa is not None
    res = _call_with_supported(
        fa._flash_attn_forward,
        q=q.contiguous(),
        k=k.contiguous(),
        v=v.contiguous(),
        dropout_p=0.0,
        softmax_scale=scale,
        causal=causal,
        window_size_left=-1,
        window_size_right=-1,
        softcap=0.0,
        alibi_slopes=None,
        return_softmax=False,
    )
    # 2.6+: (out, lse, S_dmask, rng_state); older: (out, q, k, v, out_padded, lse, S_dmask, rng_state)
    out, lse = (res[0], res[1]) if len(res) == 4 else (res[0], res[5])
    return out, lse


def _flash_attn_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    fa = _flash_attn_module()
    assert fa is not None
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _call_with_supported(
        fa._flash_attn_backward,
        dout=dout.contiguous(),
        q=q,
        k=k,
        v=v,
        out=out.contiguous(),
        softmax_lse=lse.float().contiguous(),
        dq=dq,
        dk=dk,
        dv=dv,
        dropout_p=0.0,
        softmax_scale=scale,
        causal=causal,
        window_size_left=-1,
        window_size_right=-1,
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        rng_state=None,
    )
    return dq, dk, dv


FLASH_ATTN = BlockKernel("flash_attn", _flash_attn_forward, _flash_attn_backward)


# ------------------------------------------------------------------------------- CUDA: SDPA flash


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=2)


def _sdpa_flash_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    # PyTorch's CUDA flash op wants equal head counts: K/V are repeated here, after communication.
    g = q.shape[2] // k.shape[2]
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2),
        _repeat_kv(k, g).transpose(1, 2),
        _repeat_kv(v, g).transpose(1, 2),
        0.0,
        causal,
        False,
        scale=scale,
    )
    return res[0].transpose(1, 2), res[1]


def _sdpa_flash_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    empty = torch.empty(0, dtype=torch.int64, device=q.device)  # dense (not varlen), no dropout
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout.transpose(1, 2),
        q.transpose(1, 2),
        _repeat_kv(k, g).transpose(1, 2),
        _repeat_kv(v, g).transpose(1, 2),
        out.transpose(1, 2),
        lse.float().contiguous(),
        empty,
        empty,
        sq,
        sk,
        0.0,
        causal,
        empty,
        empty,
        scale=scale,
    )
    dk = dk.transpose(1, 2)
    dv = dv.transpose(1, 2)
    if g > 1:
        dk = dk.reshape(b, sk, hkv, g, d).sum(3)
        dv = dv.reshape(b, sk, hkv, g, dv.shape[-1]).sum(3)
    return dq.transpose(1, 2), dk, dv


SDPA_FLASH = BlockKernel("sdpa_flash", _sdpa_flash_forward, _sdpa_flash_backward)


# ---------------------------------------------------------------------------------------- selection

KERNELS: dict[str, BlockKernel] = {k.name: k for k in (MATH, CPU_FLASH, FLASH_ATTN, SDPA_FLASH)}


def select_kernel(device: torch.device, dtype: torch.dtype, name: str | None = None) -> BlockKernel:
    """The block kernel for this device and dtype; `name` (or $LONGCTX_ATTN_KERNEL) forces one.

    CPU: aten's flash kernel (float32/float64/bfloat16/float16), else math. CUDA: flash-attn when
    importable and the dtype is half precision, else PyTorch's SDPA flash op for half precision,
    else math (float32/float64 on CUDA go to math, which materialises one block's scores).
    """
    name = name or os.environ.get(KERNEL_ENV) or None
    if name is not None:
        if name not in KERNELS:
            raise AttentionError(
                f"unknown attention kernel {name!r}",
                where=f"kernel argument or ${KERNEL_ENV}",
                fix=f"use one of {', '.join(sorted(KERNELS))}",
            )
        kernel = KERNELS[name]
        if kernel.name in ("flash_attn", "sdpa_flash") and device.type != "cuda":
            raise AttentionError(
                f"attention kernel {name!r} needs CUDA tensors, got {device}",
                where=f"kernel argument or ${KERNEL_ENV}",
                fix="use 'cpu_flash' or 'math' on CPU",
            )
        if kernel.name == "flash_attn" and _flash_attn_module() is None:
            raise AttentionError(
                "attention kernel 'flash_attn' asked for but flash-attn is not importable",
                fix="install the gpu extra (pip install 'longctx[gpu]') or use 'sdpa_flash'",
            )
        return kernel
    half = dtype in (torch.float16, torch.bfloat16)
    if device.type == "cpu":
        return CPU_FLASH if dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) else MATH
    if device.type == "cuda" and half:
        return FLASH_ATTN if _flash_attn_module() is not None else SDPA_FLASH
    return MATH


def default_scale(head_dim: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
