"""A short smoke test of the one-device training paths, the first thing to run on a lent GPU.

Each check exercises one path that has failed on first contact with a GPU before (see the checks'
names), in the order of what they prove: every attention kernel of the device against the math
kernel (forward and backward, GQA, causal and full, contiguous and as Megatron's strided `[s, b, h, d]`
views), the model's loss and gradients with the default kernel against the math kernel, a norm's
output dtype in a bf16 model, one bf16 train step through fp32 masters, and last the all-reduce on the
default process group's device (NCCL last: a hang there must not cost the kernel results). Each check
is isolated: its failure (a CUDA error included, synchronised inside the check) is a row, and the
others still run. On CPU the same checks run on the CPU kernels, so the script is tested wherever the
suite runs.

    python -m longctx.train.device_smoke [--json] [--jsonl FILE] [--device cuda|cpu]

Prints one line per check (one JSON document with --json); --jsonl appends one JSON line per check to
FILE the moment it ends, so a hang or a crash later loses nothing already measured. Exits 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from longctx.arch import ModelArch
from longctx.attention.kernels import KERNEL_ENV, KERNELS, MATH, BlockKernel, flash_attn_available
from longctx.mcore.model import ModelSettings, build_gpt_model
from longctx.mcore.parallel import collective_device, init_training_parallel, teardown_training_parallel
from longctx.train.optim import build_optimizer
from longctx.train.precision import MainParams
from longctx.train.spec import LRSchedule
from longctx.util.machine import cpu_model

# bf16 kernels against an fp32 math reference on the same bf16 inputs
FWD_TOL = 2.5e-2
BWD_TOL = 5e-2
SMOKE_ARCH = ModelArch(
    num_layers=2,
    hidden_size=128,
    ffn_hidden_size=256,
    num_attention_heads=8,
    num_query_groups=2,
    kv_channels=16,
    qk_layernorm=True,
)


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


def _inputs(device: torch.device, head_dim: int, strided: bool) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout `[b, s, h, d]` in bf16. Strided: as Megatron hands them over, views of `[s, b, …]`
    tensors with k and v halves of one fused projection (no dimension contiguous but the last's)."""
    g = torch.Generator().manual_seed(0)
    b, s, hq, hkv = 2, 256, 8, 2
    if not strided:
        return tuple(
            torch.randn(b, s, h, head_dim, generator=g).to(device, torch.bfloat16) for h in (hq, hkv, hkv, hq)
        )
    q = torch.randn(s, b, hq, head_dim, generator=g).to(device, torch.bfloat16).transpose(0, 1)
    kv = torch.randn(s, b, hkv, 2 * head_dim, generator=g).to(device, torch.bfloat16)
    k, v = (t.transpose(0, 1) for t in kv.split(head_dim, dim=-1))
    dout = torch.randn(s, b, hq, head_dim, generator=g).to(device, torch.bfloat16).transpose(0, 1)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    return q, k, v, dout


def kernel_check(
    kernel: BlockKernel, device: torch.device, causal: bool, head_dim: int, strided: bool = False
) -> str:
    """Forward and backward of `kernel` against the math kernel; raises AssertionError on a mismatch."""
    q, k, v, dout = _inputs(device, head_dim, strided)
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


@contextmanager
def _kernel(name: str | None) -> Iterator[None]:
    """Force the attention block kernel by name (None: the device's default) for the block inside."""
    before = os.environ.pop(KERNEL_ENV, None)
    if name is not None:
        os.environ[KERNEL_ENV] = name
    try:
        yield
    finally:
        os.environ.pop(KERNEL_ENV, None)
        if before is not None:
            os.environ[KERNEL_ENV] = before


def _loss_and_grads(
    model: torch.nn.Module, device: torch.device, kernel: str | None
) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 500, (2, 256), generator=g).to(device)
    pos = torch.arange(256, device=device).unsqueeze(0).expand(2, -1)
    with _kernel(kernel):
        loss = model(tokens, pos, None, labels=tokens.roll(-1, 1)).float().mean()
        loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return float(loss.detach()), grads


def model_kernel_check(device: torch.device) -> str:
    """The bf16 model's loss and gradients with the device's default kernel against the math kernel:
    the kernels inside Megatron's layers, on its own layouts, not only on test tensors. One model
    serves both: on a GPU megatron-core initialises from its own CUDA RNG tracker, which a
    `torch.manual_seed` does not rewind, so two builds would compare different weights."""
    torch.manual_seed(0)
    model = _model(device)
    loss, grads = _loss_and_grads(model, device, None)
    ref_loss, ref_grads = _loss_and_grads(model, device, "math")
    rel = abs(loss - ref_loss) / abs(ref_loss)
    cos = float(torch.nn.functional.cosine_similarity(grads, ref_grads, dim=0))
    assert math.isfinite(loss) and rel < 1e-2, f"loss {loss:.5f} vs math {ref_loss:.5f}"
    assert cos > 0.99, f"gradient cosine {cos:.4f} against the math kernel's"
    return f"loss {loss:.5f} vs math {ref_loss:.5f} (rel {rel:.1e}); gradient cosine {cos:.5f}"


def all_reduce_check(device: torch.device) -> str:
    on = collective_device()
    t = torch.ones(1, dtype=torch.float64, device=on)
    dist.all_reduce(t)
    assert float(t) == dist.get_world_size()
    return f"{dist.get_backend()} all-reduce of a {on.type} tensor"


def checks_in_order(device: torch.device) -> list[tuple[str, Callable[[], str]]]:
    """Kernels first, the model next, the collective last (see the module)."""
    checks: list[tuple[str, Callable[[], str]]] = []
    for kernel in device_kernels(device):
        for strided in (False, True):
            for causal in (True, False):
                for d in (64, 128):
                    name = f"kernel {kernel.name} {'causal' if causal else 'full'} d{d}{' strided' if strided else ''}"
                    checks.append(
                        (
                            name,
                            lambda k=kernel, c=causal, hd=d, st=strided: kernel_check(k, device, c, hd, st),
                        )
                    )
    checks += [
        ("model loss+grads vs math", lambda: model_kernel_check(device)),
        ("bf16 norm dtype", lambda: norm_dtype_check(device)),
        ("bf16 train step", lambda: train_step_check(device)),
        ("all_reduce", lambda: all_reduce_check(device)),
    ]
    return checks


def run_check(name: str, fn: Callable[[], str], device: torch.device) -> Check:
    t0 = time.perf_counter()
    try:
        detail = fn()
        if device.type == "cuda":  # an asynchronous CUDA error belongs to this check, not the next
            torch.cuda.synchronize()
        ok = True
    except Exception as err:  # a failing check is reported with its cause, the others still run
        detail, ok = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}", False
    return Check(name, ok, detail, time.perf_counter() - t0)


def run_checks(device: torch.device, jsonl: Path | None = None) -> list[Check]:
    init_training_parallel(1, 1, seed=1)
    results = []
    try:
        for name, fn in checks_in_order(device):
            result = run_check(name, fn, device)
            results.append(result)
            if jsonl is not None:
                append_line(jsonl, asdict(result))
    finally:
        teardown_training_parallel()
    return results


def append_line(path: Path, record: dict) -> None:
    """One JSON line, on disk before the next check starts (a later hang or crash keeps it)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
    p.add_argument("--jsonl", type=Path, help="append one JSON line per check to this file as it ends")
    ns = p.parse_args(argv)
    device = torch.device(ns.device)
    results = run_checks(device, ns.jsonl)
    ok = all(r.ok for r in results)
    if ns.json:
        print(json.dumps({"machine": machine(device), "ok": ok, "checks": [asdict(r) for r in results]}))
    else:
        print(f"device smoke test on {machine(device)}")
        for r in results:
            print(f"  {'ok  ' if r.ok else 'FAIL'} {r.name:40s} {r.seconds:6.2f} s  {r.detail}")
        print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
