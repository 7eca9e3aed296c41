"""bf16 training as Megatron-LM does it: fp32 masters that the optimizer steps, bf16 weights rounded from them.

Stepping bf16 weights directly loses every update below half a bf16 ulp: at lr 1e-5 (the learning
rate of the cluster plans) on weights of magnitude ~0.03 nearly no weight moves. Both runs below start
from the same fp32 base, and the bf16 run's masters start at that base itself (not its bf16 rounding).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from longctx.train.spec import LRSchedule
from tests.fixtures.run import BASE_ITERS
from tests.train.helpers import run, saved_tensors, spec

ITERS = 6
LR = 1e-5


def _train(run_dir: Path, out: Path, bf16: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    s = spec(
        run_dir,
        out / "ckpt",
        train_iters=ITERS,
        save_interval=ITERS,
        bf16=bf16,
        pretrained=str(run_dir / "base" / "checkpoints"),
        lr=LRSchedule(lr=LR, min_lr=LR, warmup_iters=0, decay_iters=ITERS, decay_style="constant"),
    )
    run(s, out / "spec.json")
    losses = [json.loads(line)["loss"] for line in Path(s.metrics_file).read_text().splitlines()]
    return saved_tensors(out / "ckpt" / f"iter_{ITERS:07d}"), losses


def test_bf16_at_lr_1e5_moves_every_weight_and_tracks_fp32(fresh_run: Path, tmp_path: Path) -> None:
    base = saved_tensors(
        fresh_run / "base" / "checkpoints" / f"iter_{BASE_ITERS:07d}", prefixes=("decoder", "embedding")
    )
    half, half_losses = _train(fresh_run, tmp_path / "bf16", bf16=True)
    full, full_losses = _train(fresh_run, tmp_path / "fp32", bf16=False)

    key = "decoder.layers.mlp.linear_fc1.weight"
    start = base[key]
    master = half[f"optimizer.state.param.{key}"]
    assert master.dtype == torch.float32
    moved = float((master != start).float().mean())
    assert moved > 0.99, f"only {moved:.1%} of the fp32 masters moved in {ITERS} steps at lr {LR}"
    # the model tensor is the master rounded: the layout a Megatron-LM bf16 save has
    assert half[key].dtype == torch.bfloat16 and torch.equal(half[key], master.to(torch.bfloat16))
    norms = {k: v.dtype for k, v in half.items() if k.startswith("decoder") and "layernorm" in k}
    assert norms and set(norms.values()) == {torch.bfloat16}, norms

    # the same direction of travel as fp32 training, and the same losses within bf16 compute noise
    step_half = (master - start).flatten()
    step_full = (full[f"optimizer.state.param.{key}"] - base[key]).flatten()
    cos = float(torch.nn.functional.cosine_similarity(step_half, step_full, dim=0))
    assert cos > 0.9, f"bf16 and fp32 updates point apart (cosine {cos:.3f})"
    assert len(half_losses) == len(full_losses) == ITERS
    for a, b in zip(half_losses, full_losses, strict=True):
        assert abs(a - b) / b < 2e-2, (half_losses, full_losses)
