"""The megatron-core adapter: same maths as megatron's attention, and a GPTModel at CP = 2 equal to CP = 1."""

from __future__ import annotations

import pytest
import torch

from longctx.errors import AttentionError
from tests.attention import megatron_cases
from tests.fixtures.attention import POOL_SIZE

pytest.importorskip("megatron.core")


def test_adapter_matches_megatron_local_attention_at_cp1(megatron_pool):
    pytest.importorskip("longctx.mcore.cpu")
    results = megatron_pool.run(megatron_cases.adapter_vs_megatron_local_case, POOL_SIZE, seq=24)
    r = results[0]
    assert r["shape_ok"] == 1.0
    for name in ("out", "dq", "dk", "dv"):
        assert r[name] < 1e-5, (name, r)


@pytest.mark.parametrize("cp", [2, 4])
def test_gpt_model_at_cp_equals_cp1(megatron_pool, cp):
    pytest.importorskip("longctx.mcore.model")
    # the pool spans 4 ranks: at CP = 2 there are two data-parallel replicas on the same data
    results = megatron_pool.run(megatron_cases.gpt_cp_case, POOL_SIZE, cp=cp, seq=24)
    for r in results:
        assert not r["missing"], r["missing"]
        assert abs(r["loss_cp"] - r["loss_full"]) <= 1e-5 * abs(r["loss_full"]), r
        for name, (diff, scale) in r["grads"].items():
            assert diff <= 1e-5 * max(scale, 1e-3), (name, diff, scale)


def test_construction_refuses_what_it_cannot_do():
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from longctx.attention.megatron_adapter import LongctxCoreAttention

    def config(**kw):
        base = dict(num_layers=1, hidden_size=32, num_attention_heads=4, attention_dropout=0.0)
        base.update(kw)
        return TransformerConfig(**base)

    def build(cfg, **kw):
        args = dict(config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
        args.update(kw)
        return LongctxCoreAttention(**args)

    with pytest.raises(AttentionError, match=r"attention dropout 0\.1 is not supported") as info:
        build(config(attention_dropout=0.1))
    assert "attention_dropout=0.0" in (info.value.fix or "")
    with pytest.raises(AttentionError, match="mask type arbitrary is not supported"):
        build(config(), attn_mask_type=AttnMaskType.arbitrary)
    with pytest.raises(AttentionError, match="cp_comm_type 'a2a' is not supported"):
        build(config(), cp_comm_type="a2a")

    attn = build(config())
    q = torch.randn(8, 1, 4, 8)
    with pytest.raises(AttentionError, match=r"explicit attention mask \[1, 1, 8, 8\]"):
        attn(q, q, q, torch.zeros(1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(AttentionError, match="packed sequences"):
        attn(q, q, q, None, packed_seq_params=object())
    out = attn(q, q, q, None)
    assert out.shape == (8, 1, 32)


def test_layer_spec_swaps_only_core_attention():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from longctx.attention.megatron_adapter import LongctxCoreAttention, longctx_local_layer_spec

    ours = longctx_local_layer_spec(qk_layernorm=True, normalization="RMSNorm")
    theirs = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    assert ours.submodules.self_attention.submodules.core_attention is LongctxCoreAttention
    assert (
        ours.submodules.self_attention.submodules.q_layernorm
        == theirs.submodules.self_attention.submodules.q_layernorm
    )
    assert ours.submodules.mlp == theirs.submodules.mlp
