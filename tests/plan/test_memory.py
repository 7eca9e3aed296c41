"""The memory model against published points (formula and sources in longctx/plan/memory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.arch import ModelArch
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.memory import (
    GiB,
    MemoryInputs,
    activation_bytes_per_token_layer,
    activation_terms,
    estimate,
    layer_activations,
    recompute_module_credit,
)

REPO = Path(__file__).resolve().parents[2]

LLAMA3_8B = ModelArch(
    num_layers=32,
    hidden_size=4096,
    ffn_hidden_size=14336,
    num_attention_heads=32,
    num_query_groups=8,
    kv_channels=128,
    qk_layernorm=False,
)
BABY = ModelArch(
    num_layers=36,
    hidden_size=4096,
    ffn_hidden_size=12288,
    num_attention_heads=32,
    num_query_groups=8,
    kv_channels=128,
)


def test_activations_match_korthikanti_without_the_attention_score_term() -> None:
    # Korthikanti et al. (2022): 34·h/t bytes per token per layer with TP + SP (plus 5·a·s/h·t for the
    # attention scores that flash attention does not store); baby_9b_dense is GQA with QK-norm.
    ours = activation_bytes_per_token_layer(BABY, tp=4, sequence_parallel=True)
    assert ours == pytest.approx(34 * 4096 / 4, rel=0.02)


def test_leonardo_32k_smoke_test_peak() -> None:
    # Leonardo, A100-64GB: 32K tokens, Llama-like 8B with the 262K OpenEuroLLM vocabulary, 2 nodes,
    # TP 4 + SP, distributed optimizer, full recompute → measured peak 55.4 GB.
    e = estimate(
        MemoryInputs(
            LLAMA3_8B,
            262144,
            32768,
            1,
            tp=4,
            pp=1,
            cp=1,
            dp=2,
            num_microbatches=64,
            sequence_parallel=True,
            recompute="full",
        ),
        gpu_memory_gib=64,
        margin=0.1,
    )
    assert e.total / 1e9 == pytest.approx(55.4, rel=0.15)
    assert e.fits


@pytest.mark.parametrize(("seq", "cp", "nodes"), [(16384, 2, 2), (65536, 4, 4), (131072, 8, 8)])
def test_nemo_llama3_8b_recipes_fit_on_80gb(seq: int, cp: int, nodes: int) -> None:
    # NeMo 2 llama3_8b_{16k,64k,128k}: TP 4, PP 2, CP 2/4/8, 8 GPUs per node, GBS 512, MBS 1.
    dp = nodes * 8 // (4 * 2 * cp)
    e = estimate(
        MemoryInputs(
            LLAMA3_8B,
            128256,
            seq,
            1,
            tp=4,
            pp=2,
            cp=cp,
            dp=dp,
            num_microbatches=512 // dp,
            sequence_parallel=True,
            recompute="none",
        ),
        gpu_memory_gib=80,
        margin=0.1,
    )
    assert e.fits, e.to_gib()


def test_memory_falls_with_cp_and_activation_share_halves() -> None:
    def est(cp: int):
        return estimate(
            MemoryInputs(
                BABY,
                262656,
                131072,
                1,
                tp=4,
                pp=1,
                cp=cp,
                dp=32 // cp,
                num_microbatches=2,
                sequence_parallel=True,
            ),
            gpu_memory_gib=64,
            margin=0.1,
        )

    e4, e8 = est(4), est(8)
    assert e8.activations == pytest.approx(e4.activations / 2, rel=0.01)
    assert e8.logits == pytest.approx(e4.logits / 2)
    assert e8.total < e4.total


def test_baby_plan_picks_the_smallest_cp_that_fits() -> None:
    rp = resolve_plan(load_plan(REPO / "stages" / "baby_9b_dense.toml"))
    got = {s.name: (s.cp, s.smallest_fitting_cp, s.memory.fits) for s in rp.stages}
    # 16K fits without CP; 64K needs CP 4 and 128K CP 8 — about 16K tokens per GPU, as the LUMI runs found
    assert got == {"16k": (1, 1, True), "64k": (4, 4, True), "128k": (8, 8, True)}
    for s in rp.stages:
        assert s.memory.total / GiB < 64 * 0.9
        assert s.tokens_per_iteration == 8_388_608


# -- what each recompute policy keeps (the formulas of longctx/plan/memory.py) -------------------------------


def _acts(**kw) -> float:
    base = dict(
        arch=BABY,
        padded_vocab_size=262656,
        seq_length=65536,
        micro_batch_size=1,
        tp=4,
        pp=1,
        cp=4,
        dp=8,
        num_microbatches=16,
        sequence_parallel=True,
    )
    return layer_activations(MemoryInputs(**{**base, **kw}))


TOKENS = 65536 / 4
A = activation_bytes_per_token_layer(BABY, tp=4, sequence_parallel=True) * TOKENS  # one layer, everything
IN = 2.0 * 4096 / 4 * TOKENS  # one layer's input (sequence parallel)


def test_activation_terms_add_up_to_the_per_layer_figure() -> None:
    terms = activation_terms(BABY, 4, True)
    assert sum(terms.values()) * TOKENS == A
    # baby_9b_dense at TP 4 + SP: norms 8 kB, Q/K/V with QK-norm copies 5.9 kB, attention output 2 kB, the
    # log-sum-exp 32 B, SwiGLU 18.4 kB per token per layer
    assert terms == {
        "norm_inputs": 4096.0,
        "norm_outputs": 4096.0,
        "qkv": 5632.0,
        "attn_out": 2048.0,
        "core_attn": 32.0,
        "mlp": 18432.0,
    }


def test_no_recompute_keeps_every_layer() -> None:
    assert _acts(recompute="none") == pytest.approx(36 * A)


@pytest.mark.parametrize("n", [1, 2, 4, 12, 36])
def test_full_uniform_keeps_chunk_inputs_and_one_chunk(n: int) -> None:
    assert _acts(recompute="full", recompute_method="uniform", recompute_num_layers=n) == pytest.approx(
        36 / n * IN + n * A
    )


@pytest.mark.parametrize("n", [1, 6, 35])
def test_full_block_keeps_n_inputs_and_the_other_layers_whole(n: int) -> None:
    assert _acts(recompute="full", recompute_method="block", recompute_num_layers=n) == pytest.approx(
        n * IN + (36 - n) * A
    )


def test_full_block_of_every_layer_is_uniform_one_layer() -> None:
    block = _acts(recompute="full", recompute_method="block", recompute_num_layers=36)
    assert block == pytest.approx(36 * IN + A)
    assert block == pytest.approx(_acts(recompute="full", recompute_method="uniform", recompute_num_layers=1))


def test_full_recompute_counts_every_micro_batch_in_flight() -> None:
    # PP 4: the first stage holds 4 micro batches of its 9 layers; one chunk is recomputed at a time
    got = _acts(recompute="full", recompute_method="uniform", recompute_num_layers=3, pp=4)
    assert got == pytest.approx(4 * (9 / 3) * IN + 3 * A)
    got = _acts(recompute="full", recompute_method="block", recompute_num_layers=3, pp=4)
    assert got == pytest.approx(4 * (3 * IN + 6 * A))


def test_selective_mlp_credits_swiglu_and_the_fused_norm_output() -> None:
    credit = recompute_module_credit("mlp", BABY, 4, True)
    assert credit == 18432.0 + 2048.0  # SwiGLU input 2f and output f, linear_fc1's norm output h
    assert credit / activation_bytes_per_token_layer(BABY, 4, True) == pytest.approx(0.596, abs=0.001)
    c = credit * TOKENS
    # every layer drops it, one layer's is rebuilt in its backward
    assert _acts(recompute="selective", recompute_modules=("mlp",)) == pytest.approx(36 * (A - c) + c)


def test_selective_core_attn_credits_only_the_log_sum_exp_with_flash() -> None:
    for backend in ("flash", "fused", "auto"):
        credit = recompute_module_credit("core_attn", BABY, 4, True, attention_backend=backend)
        assert credit == 4.0 * 32 / 4  # fp32, one per head and token
    # ~0.1 % of a layer: why the planner refuses it
    assert _acts(recompute="selective", recompute_modules=("core_attn",)) == pytest.approx(36 * A, rel=1e-3)


def test_unfused_attention_stores_the_korthikanti_score_term_and_core_attn_recompute_drops_it() -> None:
    s = 16384
    flash = activation_bytes_per_token_layer(BABY, 4, True)
    unfused = activation_bytes_per_token_layer(BABY, 4, True, attention_backend="unfused", seq_length=s)
    assert unfused - flash == 5.0 * 32 * s / 4 - 4.0 * 32 / 4  # 5·a·s/t instead of the log-sum-exp
    credit = recompute_module_credit("core_attn", BABY, 4, True, attention_backend="unfused", seq_length=s)
    assert credit == 5.0 * 32 * s / 4
    kw = dict(seq_length=s, cp=1, attention_backend="unfused")
    tokens = s
    a_layer = unfused * tokens
    got = _acts(recompute="selective", recompute_modules=("core_attn",), **kw)
    assert got == pytest.approx(36 * (a_layer - credit * tokens) + credit * tokens)


def test_credits_of_the_moe_modules() -> None:
    moe = BABY.model_copy(update={"num_experts": 8, "moe_shared_expert_intermediate_size": 4096})
    assert recompute_module_credit("moe", moe, 4, True) == 18432.0
    assert recompute_module_credit("moe_act", moe, 4, True) == 2.0 * 12288 / 4
    assert recompute_module_credit("layernorm", moe, 4, True) == 2048.0  # the pre-MLP norm's output
    assert recompute_module_credit("mlp", moe, 4, True) == 0.0  # Megatron skips MoE layers
    assert recompute_module_credit("shared_experts", moe, 4, True) == 0.0  # not in the model: stays high
    # dense: the norms are fused into the linears under TransformerEngine, there are no MoE layers
    for m in ("layernorm", "moe", "moe_act", "shared_experts", "mla_up_proj"):
        assert recompute_module_credit(m, BABY, 4, True) == 0.0
    with pytest.raises(ValueError, match="unknown recompute module 'attn'"):
        recompute_module_credit("attn", BABY, 4, True)


def test_leonardo_prediction_is_unchanged_by_the_recompute_model() -> None:
    # full recompute with longctx's default (uniform, 1 layer): the docstring's 51.2 GB, next to the measured 55.4
    e = estimate(
        MemoryInputs(
            LLAMA3_8B,
            262144,
            32768,
            1,
            tp=4,
            pp=1,
            cp=1,
            dp=2,
            num_microbatches=64,
            sequence_parallel=True,
            recompute="full",
            recompute_method="uniform",
            recompute_num_layers=1,
        ),
        gpu_memory_gib=64,
        margin=0.1,
    )
    assert e.total / 1e9 == pytest.approx(51.21, abs=0.01)
