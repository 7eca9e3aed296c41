"""The attention logit scale folded into the query weights: the same model as one whose softmax scale is
multiplied by the factor, with QK-norm (its γ) and without it (the query rows of the fused qkv projection,
bias included), grouped queries in both; and the fp32 masters scaled alike."""

from __future__ import annotations

import pytest
import torch

from longctx.arch import ModelArch
from longctx.attention.megatron_adapter import LongctxCoreAttention
from longctx.errors import TrainError
from longctx.mcore.attention_scale import scale_attention_logits
from longctx.mcore.model import ModelSettings, build_gpt_model
from longctx.mcore.parallel import eval_parallel
from longctx.rope.scaling import yarn_logit_scale
from tests.fixtures.run import ARCH

S, VOCAB, FACTOR = 48, 128, 1.3


@pytest.mark.parametrize("qk_norm", [True, False])
def test_folded_scale_equals_a_sharper_softmax(qk_norm: bool) -> None:
    arch = ModelArch(**{**ARCH, "qk_layernorm": qk_norm, "add_qkv_bias": not qk_norm})
    tokens = torch.randint(0, VOCAB, (2, S), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(S).expand(2, S)
    with eval_parallel(1), torch.no_grad():
        torch.manual_seed(0)
        model = build_gpt_model(arch, ModelSettings(seq_length=S, rotary_base=10000, padded_vocab_size=VOCAB))
        model.eval()
        if not qk_norm:  # megatron-core initialises biases to zero: give the query bias something to scale
            for layer in model.decoder.layers:
                layer.self_attention.linear_qkv.bias.normal_(std=0.5)
        plain = model(tokens, positions, None)
        cores = [m for m in model.modules() if isinstance(m, LongctxCoreAttention)]
        for m in cores:
            m.softmax_scale *= FACTOR
        want = model(tokens, positions, None)
        for m in cores:
            m.softmax_scale /= FACTOR
        masters = {p: p.detach().double().clone() for p in model.parameters()}
        before = {p: m.clone() for p, m in masters.items()}
        scaled = scale_attention_logits(model, FACTOR, masters)
        got = model(tokens, positions, None)
    assert scaled == (2 if qk_norm else 4)  # per layer: γ_q, or the qkv weight and bias
    assert not torch.allclose(plain, want, atol=1e-3)  # the scale matters at all
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    changed = [p for p in masters if not torch.equal(masters[p], before[p])]
    assert len(changed) == scaled
    for p in changed:  # each master took the same multiplier as its parameter
        torch.testing.assert_close(masters[p].float(), p.detach(), rtol=1e-6, atol=1e-7)


def test_scale_refuses_what_it_cannot_fold() -> None:
    with eval_parallel(1):
        model = build_gpt_model(
            ModelArch(**ARCH), ModelSettings(seq_length=S, rotary_base=10000, padded_vocab_size=VOCAB)
        )
        with pytest.raises(TrainError, match="not a positive number"):
            scale_attention_logits(model, 0.0)


def test_yarn_logit_scale() -> None:
    assert yarn_logit_scale(16384, 4096) == pytest.approx(1.2965, abs=1e-4)  # (0.1·ln 4 + 1)²
    assert yarn_logit_scale(131072, 4096) == pytest.approx((0.1 * 3.4657 + 1) ** 2, abs=1e-4)
    assert yarn_logit_scale(4096, 4096) == 1.0 and yarn_logit_scale(2048, 4096) == 1.0
