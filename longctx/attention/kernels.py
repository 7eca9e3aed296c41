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

import functools
import inspect
import math
import os
import warnings
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


def check_square(q: Tensor, k: Tensor, causal: bool, kernel: str) -> None:
    """A causal block is a diagonal block (Sq == Sk). Kernels disagree on how a causal mask aligns when
    Sq != Sk (flash-attn bottom-right, PyTorch top-left), so such a block would be silently wrong."""
    if causal and q.shape[1] != k.shape[1]:
        raise AttentionError(
            f"causal attention block with {q.shape[1]} queries and {k.shape[1]} keys in kernel {kernel!r}",
            where="attention block decomposition",
            fix="causal blocks must be diagonal (equal query and key lengths); this is a bug in the caller",
        )


# the math kernel holds ~4 score-sized tensors at once in backward (scores, P, dP, dS)
_MATH_LIVE_SCORES = 4


def math_block_bytes(b: int, hq: int, sq: int, sk: int, dtype: torch.dtype) -> int:
    """Peak bytes of the math kernel's score tensors for one block."""
    return _MATH_LIVE_SCORES * b * hq * sq * sk * torch.empty((), dtype=lse_dtype(dtype)).element_size()


def check_math_fits(need: int, free: int, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Refuse a math block that cannot fit in the device's free memory (rather than an OOM mid-step)."""
    if need > free:
        raise AttentionError(
            f"attention block {tuple(shape)} in {dtype} goes to the math kernel, which materialises its "
            f"scores: {need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free on the GPU",
            where="attention kernel selection (float32/float64 on CUDA has no flash kernel)",
            fix="train in bf16 ([local] bf16 = true), or shorten the blocks with a larger context-parallel size",
        )


def _check_math_on_cuda(q: Tensor, k: Tensor) -> None:
    if q.is_cuda:
        b, sq, hq, _ = q.shape
        free, _total = torch.cuda.mem_get_info(q.device)
        check_math_fits(math_block_bytes(b, hq, sq, k.shape[1], q.dtype), free, tuple(q.shape), q.dtype)


def _math_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    check_square(q, k, causal, "math")
    _check_math_on_cuda(q, k)
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
    check_square(q, k, causal, "math")
    _check_math_on_cuda(q, k)
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
    check_square(q, k, causal, "cpu_flash")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal, scale=scale
    )
    return out.transpose(1, 2), lse


def _cpu_flash_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    check_square(q, k, causal, "cpu_flash")
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


@functools.cache
def _flash_attn_module() -> ModuleType | None:
    """flash-attn's interface module, imported once (optional dependency, extra `gpu`); None when absent.
    An installed flash-attn that fails to import (a build for another torch or CUDA) is said once."""
    try:
        from flash_attn import flash_attn_interface
    except ModuleNotFoundError:
        return None
    except (ImportError, OSError, RuntimeError) as err:
        warnings.warn(
            f"flash-attn is installed but does not import ({type(err).__name__}: {err}); attention uses "
            "PyTorch's flash kernel instead. Fix: reinstall flash-attn for this torch and CUDA.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return flash_attn_interface


def flash_attn_available() -> bool:
    return _flash_attn_module() is not None


def argument_names(fn: Callable[..., Any]) -> list[str] | None:
    """The argument names `fn` really takes. flash-attn ≥ 2.7 defines its kernels as torch custom ops,
    whose Python signature is `(*args, **kwargs)`; their schema names the arguments. None: unknowable."""
    overload = getattr(fn, "_opoverload", None)
    if overload is not None:
        return [a.name for a in overload._schema.arguments]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if all(p.kind in variadic for p in params.values()):
        return None
    return [name for name, p in params.items() if p.kind not in variadic]


def _call_with_supported(fn: Callable[..., Any], **kwargs: Any) -> Any:
    # flash-attn renamed arguments across 2.x (window_size → window_size_left/right, softcap added);
    # pass exactly the ones this version declares.
    names = argument_names(fn)
    if names is None:
        raise AttentionError(
            f"cannot tell which arguments {getattr(fn, '__qualname__', fn)!r} takes (its signature is "
            "only *args/**kwargs and it carries no op schema)",
            where="flash-attn's flash_attn_interface",
            fix="install a flash-attn release longctx knows (2.6–2.8), or use the 'sdpa_flash' kernel",
        )
    if "window_size" in names and "window_size_left" in kwargs:
        kwargs["window_size"] = (kwargs.pop("window_size_left"), kwargs.pop("window_size_right"))
    return fn(**{k: v for k, v in kwargs.items() if k in names})


def _flash_attn_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    check_square(q, k, causal, "flash_attn")
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
    check_square(q, k, causal, "flash_attn")
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


def _sdpa_flash_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    # PyTorch's CUDA flash op takes [b, h, s, d] and GQA natively (fewer K/V heads than query heads)
    check_square(q, k, causal, "sdpa_flash")
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, causal, False, scale=scale
    )
    return res[0].transpose(1, 2), res[1]


def sdpa_flash_backward_args(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool
) -> tuple[Any, ...]:
    """The positional arguments of aten::_scaled_dot_product_flash_attention_backward for a dense block.

    `cum_seq_q`/`cum_seq_k` must be *undefined* (None) for the dense path: any defined tensor, even an
    empty one, selects the variable-length kernel. The philox seed/offset only matter with dropout; they
    are passed as the forward returns them for dropout 0 (a 2-element and a 0-d int64 tensor)."""
    sq, sk = q.shape[1], k.shape[1]
    seed = torch.zeros(2, dtype=torch.int64, device=q.device)
    offset = torch.zeros((), dtype=torch.int64, device=q.device)
    return (
        dout.transpose(1, 2),
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        out.transpose(1, 2),
        lse.float().contiguous(),
        None,
        None,
        sq,
        sk,
        0.0,
        causal,
        seed,
        offset,
    )


def _sdpa_flash_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    check_square(q, k, causal, "sdpa_flash")
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
        *sdpa_flash_backward_args(dout, q, k, v, out, lse, causal), scale=scale
    )
    # GQA: the op returns dK/dV with the K/V head count, summed over each group's query heads
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


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
        if kernel.name == "cpu_flash" and device.type != "cpu":
            raise AttentionError(
                f"attention kernel 'cpu_flash' runs on CPU tensors only, got {device}",
                where=f"kernel argument or ${KERNEL_ENV}",
                fix="use 'flash_attn' or 'sdpa_flash' (or 'math') on CUDA",
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
