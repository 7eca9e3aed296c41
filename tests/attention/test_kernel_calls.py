"""The CUDA kernels' call paths, checked on CPU: the arguments each installed op really takes.

flash-attn ≥ 2.7 defines its kernels as torch custom ops (Python signature `(*args, **kwargs)`), so
a stand-in registered the same way, computing with the math kernel on CPU, drives the same call path.
PyTorch's SDPA flash backward is checked against its op schema and run on meta tensors.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from torch import Tensor

from longctx.attention import kernels
from longctx.errors import AttentionError


@torch.library.custom_op("longctx_test::flash_fwd", mutates_args=())
def _fa_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    return_softmax: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    assert window_size_left == window_size_right == -1 and dropout_p == 0.0 and not return_softmax
    out, lse = kernels.MATH.forward(q, k, v, causal, softmax_scale)
    return out, lse, q.new_empty(0), torch.zeros(2, dtype=torch.int64)


@torch.library.custom_op("longctx_test::flash_bwd", mutates_args=("dq", "dk", "dv"))
def _fa_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    softmax_lse: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
    deterministic: bool,
    rng_state: Tensor | None = None,
) -> Tensor:
    gq, gk, gv = kernels.MATH.backward(dout, q, k, v, out, softmax_lse, causal, softmax_scale)
    dq.copy_(gq), dk.copy_(gk), dv.copy_(gv)
    return softmax_lse.clone()


@pytest.fixture
def flash_attn_27(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.SimpleNamespace(_flash_attn_forward=_fa_forward, _flash_attn_backward=_fa_backward)
    monkeypatch.setattr(kernels, "_flash_attn_module", lambda: module)


def _qkv(sq: int = 16, hq: int = 4, hkv: int = 2, d: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    qkv = tuple(torch.randn(2, sq, h, d, generator=g, dtype=torch.float32) for h in (hq, hkv, hkv))
    return qkv  # type: ignore[return-value]


def test_custom_op_arguments_are_read_from_its_schema() -> None:
    assert kernels.argument_names(_fa_forward)[:3] == ["q", "k", "v"]
    assert "window_size_left" in kernels.argument_names(_fa_forward)
    assert kernels.argument_names(lambda *a, **kw: None) is None


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_custom_op_path_matches_math(flash_attn_27: None, causal: bool) -> None:
    q, k, v = _qkv()
    out, lse = kernels.FLASH_ATTN.forward(q, k, v, causal, 0.3)
    ref_out, ref_lse = kernels.MATH.forward(q, k, v, causal, 0.3)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    dout = torch.randn_like(out)
    got = kernels.FLASH_ATTN.backward(dout, q, k, v, out, lse, causal, 0.3)
    want = kernels.MATH.backward(dout, q, k, v, ref_out, ref_lse, causal, 0.3)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype))


def test_an_opaque_kernel_is_refused_not_called_without_arguments() -> None:
    with pytest.raises(AttentionError, match="cannot tell which arguments"):
        kernels._call_with_supported(lambda *a, **kw: None, q=1)


def test_sdpa_flash_backward_arguments_fit_the_op_schema() -> None:
    schema = torch.ops.aten._scaled_dot_product_flash_attention_backward.default._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    b, s, hq, hkv, d = 1, 16, 4, 2, 8
    q = torch.empty(b, s, hq, d, device="meta", dtype=torch.bfloat16)
    k = torch.empty(b, s, hkv, d, device="meta", dtype=torch.bfloat16)
    lse = torch.empty(b, hq, s, device="meta")
    args = kernels.sdpa_flash_backward_args(q, q, k, k, q, lse, True)
    assert len(args) == len(positional)
    named = {a.name: v for a, v in zip(positional, args, strict=True)}
    # a defined cum_seq tensor (even an empty one) selects the variable-length kernel
    assert named["cum_seq_q"] is None and named["cum_seq_k"] is None
    assert (named["max_q"], named["max_k"], named["is_causal"]) == (s, s, True)
    for a, v in zip(positional, args, strict=True):
        kind = str(a.type)
        if kind == "Tensor" and a.name not in ("cum_seq_q", "cum_seq_k"):
            assert isinstance(v, Tensor), a.name
        elif kind == "SymInt":
            assert isinstance(v, int), a.name
    # the op accepts them, with K/V at their own (GQA) head count, and returns dK/dV at that count
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(*args, scale=0.3)
    assert dq.shape == (b, hq, s, d) and dk.shape == dv.shape == (b, hkv, s, d)
    fwd = torch.ops.aten._scaled_dot_product_flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), 0.0, True, False, scale=0.3
    )
    assert fwd[0].shape == (b, hq, s, d) and fwd[2] is None  # dense forward: undefined cum_seq


def test_cpu_kernel_forced_on_cuda_is_refused() -> None:
    with pytest.raises(AttentionError, match="CPU tensors only"):
        kernels.select_kernel(torch.device("cuda"), torch.bfloat16, "cpu_flash")


def test_causal_block_must_be_square() -> None:
    q, k, v = _qkv()
    with pytest.raises(AttentionError, match="causal attention block with 16 queries and 8 keys"):
        kernels.CPU_FLASH.forward(q, k[:, :8], v[:, :8], True, 0.3)
    kernels.CPU_FLASH.forward(q, k[:, :8], v[:, :8], False, 0.3)  # a full block may be rectangular


def test_math_kernel_memory_refusal() -> None:
    # 4 live score tensors of b·h·sq·sk float32 values
    assert kernels.math_block_bytes(1, 32, 8192, 8192, torch.float32) == 4 * 32 * 8192 * 8192 * 4
    kernels.check_math_fits(10, 11, (1, 8, 8, 8), torch.float32)
    with pytest.raises(AttentionError, match=r"32\.0 GiB needed, 1\.0 GiB free") as err:
        kernels.check_math_fits(32 * 2**30, 2**30, (1, 8192, 32, 128), torch.float32)
    assert "bf16" in err.value.fix


def test_broken_flash_attn_warns_once_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    kernels._flash_attn_module.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="does not import.*undefined symbol"):
            assert kernels._flash_attn_module() is None
        assert kernels._flash_attn_module() is None  # cached: no second import, no second warning
    finally:
        kernels._flash_attn_module.cache_clear()
