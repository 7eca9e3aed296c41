"""megatron-core jobs for the CP worker pool (need every pool rank: parallel_state spans the world)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from longctx.attention import zigzag_split


def _init_parallel(cp: int) -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, context_parallel_size=cp)


def _tiny_arch() -> Any:
    from longctx.arch import ModelArch

    return ModelArch(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        normalization="RMSNorm",
        qk_layernorm=True,
    )


def adapter_vs_megatron_local_case(rank: int, world: int, group: Any, *, seq: int) -> dict[str, float]:
    """CP = 1: LongctxCoreAttention against megatron's own DotProductAttention (explicit causal mask)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from longctx.attention.megatron_adapter import LongctxCoreAttention
    from longctx.mcore.cpu import apply_cpu_compat, seed_model_parallel_rng

    apply_cpu_compat()
    _init_parallel(1)
    seed_model_parallel_rng(1)  # megatron's attention forks its RNG tracker for dropout
    try:
        config = TransformerConfig(
            num_layers=1,
            hidden_size=64,
            num_attention_heads=8,
            num_query_groups=2,
            kv_channels=16,
            attention_dropout=0.0,
            use_cpu_initialization=True,
            masked_softmax_fusion=False,
            attention_softmax_in_fp32=True,
        )
        kwargs = dict(
            config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self"
        )
        ours, theirs = LongctxCoreAttention(**kwargs), DotProductAttention(**kwargs)
        gen = torch.Generator().manual_seed(5)
        q = torch.randn(seq, 2, 8, 16, generator=gen, requires_grad=True)
        k = torch.randn(seq, 2, 2, 16, generator=gen, requires_grad=True)
        v = torch.randn(seq, 2, 2, 16, generator=gen, requires_grad=True)
        g = torch.randn(seq, 2, 8 * 16, generator=gen)
        out = ours(q, k, v, None)
        (dq, dk, dv) = torch.autograd.grad(out, (q, k, v), g)
        mask = torch.ones(seq, seq, dtype=torch.bool).triu(1).view(1, 1, seq, seq)  # True = masked
        ref = theirs(q, k, v, mask)
        (rq, rk, rv) = torch.autograd.grad(ref, (q, k, v), g)
        return {
            "shape_ok": float(out.shape == ref.shape),
            "out": (out - ref).abs().max().item(),
            "dq": (dq - rq).abs().max().item(),
            "dk": (dk - rk).abs().max().item(),
            "dv": (dv - rv).abs().max().item(),
        }
    finally:
        parallel_state.destroy_model_parallel()


def _loss_and_grads(model: Any, tokens, labels, loss_mask, positions, total_tokens: float):
    per_token = model(tokens, positions, None, labels=labels)  # [b, s] (local tokens)
    loss = (per_token.float() * loss_mask).sum() / total_tokens
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def gpt_cp_case(rank: int, world: int, group: Any, *, cp: int, seq: int, batch: int = 2) -> dict[str, Any]:
    """The same GPTModel at CP = 1 on the full sequence and at CP = `cp` on zigzag shards.

    Returns both losses and, per parameter, the max abs gradient difference and the gradient scale.
    """
    from megatron.core import parallel_state

    from longctx.mcore.cpu import apply_cpu_compat, seed_model_parallel_rng
    from longctx.mcore.model import ModelSettings, build_gpt_model

    apply_cpu_compat()
    arch = _tiny_arch()
    vocab = 128
    gen = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, vocab, (batch, seq), generator=gen)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    loss_mask = (torch.rand(batch, seq, generator=gen) > 0.1).float()
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq).contiguous()
    total = loss_mask.sum().item()
    try:
        _init_parallel(1)
        seed_model_parallel_rng(1234)
        full_model = build_gpt_model(
            arch, ModelSettings(seq_length=seq, rotary_base=10000, padded_vocab_size=vocab)
        )
        loss_full, grads_full = _loss_and_grads(full_model, tokens, labels, loss_mask, positions, total)
        state = full_model.state_dict()

        _init_parallel(cp)
        seed_model_parallel_rng(1234)
        cp_model = build_gpt_model(
            arch,
            ModelSettings(
                seq_length=seq, rotary_base=10000, padded_vocab_size=vocab, context_parallel_size=cp
            ),
        )
        cp_model.load_state_dict(state)
        cp_group = parallel_state.get_context_parallel_group()
        cp_rank = parallel_state.get_context_parallel_rank()

        def shard(t: torch.Tensor) -> torch.Tensor:
            return zigzag_split(t, cp_rank, cp, seq_dim=1)

        loss_cp, grads_cp = _loss_and_grads(
            cp_model, shard(tokens), shard(labels), shard(loss_mask), shard(positions), total
        )
        # each CP rank holds the gradient of its own tokens' loss: the sum is the full gradient
        dist.all_reduce(loss_cp, group=cp_group)
        for t in grads_cp.values():
            dist.all_reduce(t, group=cp_group)
        missing = sorted(set(grads_full) ^ set(grads_cp))
        diffs = {
            n: ((grads_cp[n] - g).abs().max().item(), g.abs().max().item())
            for n, g in grads_full.items()
            if n in grads_cp
        }
        return {"loss_full": loss_full.item(), "loss_cp": loss_cp.item(), "grads": diffs, "missing": missing}
    finally:
        parallel_state.destroy_model_parallel()
