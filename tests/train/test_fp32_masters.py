"""fp32 weights loaded into a bf16 run: the fp32 masters take the stored fp32 tensors, the bf16 model
their rounding. Seeding the masters from the bf16 model would lose every digit below bf16's before the
first step (at lr 1e-5 that is more than most updates move a weight)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from longctx.arch import ModelArch
from longctx.mcore.checkpoint import save_checkpoint
from longctx.mcore.model import ModelSettings, build_gpt_model
from longctx.mcore.parallel import eval_parallel
from longctx.train.precision import MainParams, load_weights
from tests.fixtures.run import ARCH


def _model(dtype: torch.dtype) -> torch.nn.Module:
    settings = ModelSettings(seq_length=64, rotary_base=10000, padded_vocab_size=128, params_dtype=dtype)
    return build_gpt_model(ModelArch(**ARCH), settings)


def test_bf16_masters_are_the_checkpoints_fp32_weights(tmp_path: Path) -> None:
    with eval_parallel(1):
        torch.manual_seed(0)
        fp32 = _model(torch.float32)
        src = save_checkpoint(tmp_path / "ckpt", 1, model=fp32, args=argparse.Namespace())
        half = _model(torch.bfloat16)
        main = MainParams(half.parameters())
        load_weights(main, half, src, half.sharded_state_dict())
    stored = dict(fp32.named_parameters())
    names = {id(p): n for n, p in half.named_parameters()}
    rounded_away = 0
    for p, master in zip(main.model_params, main.masters, strict=True):
        want = stored[names[id(p)]].detach()
        assert master.dtype == torch.float32 and torch.equal(master, want), names[id(p)]
        assert p.dtype == torch.bfloat16 and torch.equal(p, want.to(torch.bfloat16)), names[id(p)]
        rounded_away += int((want.to(torch.bfloat16).float() != want).sum())
    assert rounded_away > 0  # the fp32 weights do carry digits bf16 cannot hold
