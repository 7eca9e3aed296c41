"""A stage with `attention_scale` starts from the previous weights with its query weights scaled (fp32, and
bf16 with its fp32 masters), and a resumed stage does not scale them again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longctx.train.spec import LRSchedule
from tests.fixtures.run import BASE_ITERS
from tests.train.helpers import run, saved_tensors, spec

KEY = "decoder.layers.self_attention.q_layernorm.weight"
LR = 1e-9  # the one step moves nothing that matters: what is saved is the loaded weights, scaled


@pytest.mark.parametrize("bf16", [False, True])
def test_the_stage_starts_from_scaled_query_weights(fresh_run: Path, tmp_path: Path, bf16: bool) -> None:
    base = saved_tensors(fresh_run / "base" / "checkpoints" / f"iter_{BASE_ITERS:07d}", prefixes=("decoder",))
    s = spec(
        fresh_run,
        tmp_path / "ckpt",
        train_iters=1,
        save_interval=1,
        bf16=bf16,
        pretrained=str(fresh_run / "base" / "checkpoints"),
        attention_scale=2.0,
        lr=LRSchedule(lr=LR, min_lr=LR, warmup_iters=0, decay_iters=2, decay_style="constant"),
    )
    run(s, tmp_path / "spec.json")
    log = Path(str(tmp_path / "spec.json") + ".log").read_text()
    assert "attention logits × 2 (folded into the query weights)" in log
    first = saved_tensors(tmp_path / "ckpt" / "iter_0000001")
    master = first[f"optimizer.state.param.{KEY}"] if bf16 else first[KEY]
    torch.testing.assert_close(master.float(), 2 * base[KEY].float(), rtol=1e-6, atol=1e-6)
    if bf16:
        assert torch.equal(first[KEY], master.to(torch.bfloat16))
    # the rest of the model as loaded
    other = "decoder.layers.self_attention.k_layernorm.weight"
    torch.testing.assert_close(first[other].float(), base[other].float(), rtol=1e-2, atol=1e-6)

    # resumed from its own save: scaled once, not twice
    s2 = s.model_copy(update={"train_iters": 2})
    run(s2, tmp_path / "spec2.json")
    assert "resumed from" in Path(str(tmp_path / "spec2.json") + ".log").read_text()
    second = saved_tensors(tmp_path / "ckpt" / "iter_0000002")
    again = second[f"optimizer.state.param.{KEY}"] if bf16 else second[KEY]
    torch.testing.assert_close(again.float(), 2 * base[KEY].float(), rtol=1e-5, atol=1e-6)
