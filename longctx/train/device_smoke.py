"""A short smoke test of the one-device training paths, the first thing to run on a lent GPU.

Each check exercises one path that has failed on first contact with a GPU before (see the checks'
names): every attention kernel of the device against the math kernel (forward and backward, GQA,
causal and full), a norm's output dtype in a bf16 model, one bf16 train step through fp32 masters,
and an all-reduce on the default process group's device. On CPU the same checks run on the CPU
kernels, so the script itself is tested wherever the suite runs.

    python -m longctx.train.device_smoke [--json] [--device cuda|cpu]

Prints one line per check (one JSON document with --json) and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from longctx.arch import ModelArch
from longctx.attention.kernels import KERNELS, MATH, BlockKernel, flash_attn_available
from longctx.mcore.model import ModelSettings, build_gpt_model
from longctx.mcore.parallel import collective_device, init_training_parallel
from longctx.train.optim import build_optimizer
from longctx.train.precision import MainParams
from longctx.train.spec import LRSchedule
from longctx.util.machine import cpu_model

# bf16 kernels against an fp32 math reference on the same bf16 inputs
FWD_TOL = 2.5e-2
BWD_TOL = 5e-2
SMOKE_ARCH = ModelArch(
    num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=8, num_query_groups=2,
    kv_channels=16, qk_layernorm=True,
)  # fmt: skip


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


def device_kernels(device: torch.device) -> list[BlockKernel]:
    """The kernels a rank on `device` may select (flash-attn only when it imports)."""
    if device.type == "cpu":
        return [KERNELS["cpu_flash"]]
    names = ["sdpa_flash", *(["flash_attn"] if flash_attn_available() else [])]
    return [KERNELS[n] for n in names]


def _max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def kernel_check(kernel: BlockKernel, device: torch.device, causal: bool, head_dim: int) -> str:
    """Forward and backward of `kernel` against the math kernel; raises AssertionError on a mismatch."""
    g = torch.Generator().manual_seed(0)
    b, s, hq, hkv = 1, 256, 8, 2
    q, k, v, dout = (
        torch.randn(b, s, h, head_dim, generator=g).to(device, torch.bfloat16) for h in (hq, hkv, hkv, hq)
    )
    scale = 1 / math.sqrt(head_dim)
    out, lse = kernel.forward(q, k, v, causal, scale)
    ref_out, ref_lse = MATH.forward(q.float(), k.float(), v.float(), causal, scale)
    errs = {"out": _max_rel(out, ref_out), "lse": _max_rel(lse, ref_lse)}
    got = kernel.backward(dout, q, k, v, ref_out.to(q.dtype), ref_lse, causal, scale)
    want = MATH.backward(dout.float(), q.float(), k.float(), v.float(), ref_out, ref_lse, causal, scale)
    for name, a, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert a.shape == w.shape, f"{name} shape {tuple(a.shape)} != {tuple(w.shape)}"
        errs[name] = _max_rel(a, w)
    bad = {n: e for n, e in errs.items() if e > (FWD_TOL if n in ("out", "lse") else BWD_TOL)}
    assert not bad, f"relative error above tolerance: {bad}"
    return ", ".join(f"{n} {e:.1e}" for n, e in errs.items())


def _model(device: torch.device) -> torch.nn.Module:
    settings = ModelSettings(
        seq_length=256, rotary_base=10000, padded_vocab_size=512, params_dtype=torch.bfloat16
    )
    return build_gpt_model(SMOKE_ARCH, settings).to(device)


def norm_dtype_check(device: torch.device) -> str:
    model = _model(device)
    norm = model.decoder.final_layernorm
    out = norm(torch.randn(4, 1, SMOKE_ARCH.hidden_size, device=device, dtype=torch.bfloat16))
    dtypes = {str(p.dtype) for p in model.parameters()}
    assert out.dtype == torch.bfloat16, f"final norm returns {out.dtype}"
    assert dtypes == {"torch.bfloat16"}, f"parameter dtypes {dtypes}"
    return "final norm → bfloat16; every parameter bfloat16"


def train_step_check(device: torch.device) -> str:
    """One bf16 step at lr 1e-5: the masters move although the update is below a bf16 ulp."""
    torch.manual_seed(0)
    model = _model(device)
    main = MainParams(model.parameters())
    opt = build_optimizer(main.masters, LRSchedule(lr=1e-5, min_lr=1e-5, decay_iters=1))
    before = [m.detach().clone() for m in main.masters]
    tokens = torch.randint(0, 500, (2, 256), device=device)
    pos = torch.arange(256, device=device).unsqueeze(0).expand(2, -1)
    loss = model(tokens, pos, None, labels=tokens.roll(-1, 1)).float().mean()
    main.zero_grad()
    loss.backward()
    assert all(g.dtype == torch.float32 for g in main.grads()), "gradients are not fp32"
    opt.step()
    main.copy_to_model()
    moved = sum(int((m != b).sum()) for m, b in zip(main.masters, before, strict=True))
    total = sum(m.numel() for m in main.masters)
    assert math.isfinite(float(loss)), f"loss {float(loss)}"
    assert moved / total > 0.95, f"only {moved / total:.1%} of the masters moved"
    return f"loss {float(loss):.4f}; {moved / total:.1%} of fp32 masters moved"


def all_reduce_check(device: torch.device) -> str:
    on = collective_device()
    t = torch.ones(1, dtype=torch.float64, device=on)
    dist.all_reduce(t)
    assert float(t) == dist.get_world_size()
    return f"{dist.get_backend()} all-reduce of a {on.type} tensor"


def run_checks(device: torch.device) -> list[Check]:
    init_training_parallel(1, 1, seed=1)
    checks: list[tuple[str, Callable[[], str]]] = [("all_reduce", lambda: all_reduce_check(device))]
    for kernel in device_kernels(device):
        for causal in (True, False):
            for d in (64, 128):
                name = f"kernel {kernel.name} {'causal' if causal else 'full'} d{d}"
                checks.append((name, lambda k=kernel, c=causal, hd=d: kernel_check(k, device, c, hd)))
    checks += [("bf16 norm dtype", lambda: norm_dtype_check(device)),
               ("bf16 train step", lambda: train_step_check(device))]  # fmt: skip
    results = []
    for name, fn in checks:
        t0 = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as err:  # a failing check is reported with its cause, the others still run
            detail, ok = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}", False
        results.append(Check(name, ok, detail, time.perf_counter() - t0))
    return results


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"{cpu_model()} (torch {torch.__version__})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m longctx.train.device_smoke", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    ns = p.parse_args(argv)
    device = torch.device(ns.device)
    results = run_checks(device)
    ok = all(r.ok for r in results)
    if ns.json:
        print(json.dumps({"machine": machine(device), "ok": ok, "checks": [asdict(r) for r in results]}))
    else:
        print(f"device smoke test on {machine(device)}")
        for r in results:
            print(f"  {'ok  ' if r.ok else 'FAIL'} {r.name:32s} {r.seconds:6.2f} s  {r.detail}")
        print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
