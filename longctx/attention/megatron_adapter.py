"""megatron-core `core_attention` module running longctx's ring / all-gather attention.

Megatron's own local `DotProductAttention` refuses context parallelism, builds its causal mask on
CUDA and materialises S×S scores; `LongctxCoreAttention` replaces it in a layer spec (see
`longctx_local_layer_spec`) so that a GPTModel with the local (non-TransformerEngine) spec trains
with `context_parallel_size > 1`, on CPU (gloo) or GPU (NCCL), and at CP = 1 through the same
kernels. Inputs must already be zigzag-sharded (`zigzag_split` on tokens, labels, loss mask and
position ids; megatron-core slices RoPE the same way through `get_pos_emb_on_this_cp_rank`).

Layouts: Megatron hands over query `[sq, b, np, hn]` and key/value `[sk, b, ng, hn]` (heads per
tensor-parallel rank); they are viewed as `[b, s, h, d]` with `transpose(0, 1)` (no copy) for the
kernels, and the result `[b, sq, np, hn]` goes back as Megatron's `[sq, b, np·hn]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import is_layer_window_attention
from torch import Tensor

from longctx.attention.allgather import allgather_attention
from longctx.attention.comm import group_size
from longctx.attention.prefix_cache import PrefixCache
from longctx.attention.ring import ring_attention
from longctx.attention.split import check_split
from longctx.errors import AttentionError

_WHERE = "LongctxCoreAttention"
_CAUSAL = {AttnMaskType.causal, AttnMaskType.causal_bottom_right}  # equal q/k lengths: same mask
_UNMASKED = {AttnMaskType.no_mask, AttnMaskType.padding}  # padding without a mask tensor = none
_COMM = {None: "p2p", "p2p": "p2p", "all_gather": "all_gather", "allgather": "all_gather"}


class LongctxCoreAttention(MegatronModule):
    """Drop-in `core_attention` (same constructor and forward as megatron's DotProductAttention)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout and dropout > 0:
            raise AttentionError(
                f"attention dropout {dropout} is not supported (layer {self.layer_number})",
                where=_WHERE,
                fix="set attention_dropout=0.0 in the TransformerConfig (long-context training runs without it)",
            )
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise AttentionError(
                f"softmax_type {config.softmax_type!r} is not supported", where=_WHERE, fix="use 'vanilla'"
            )
        if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, self.layer_number):
            raise AttentionError(
                f"sliding-window attention (window_size={config.window_size}) is not supported",
                where=_WHERE,
                fix="unset window_size or use TransformerEngine's attention for windowed layers",
            )
        self.causal = self._is_causal(attn_mask_type)
        if cp_comm_type not in _COMM:
            raise AttentionError(
                f"cp_comm_type {cp_comm_type!r} is not supported",
                where=_WHERE,
                fix="use 'p2p' (ring) or 'all_gather'; a2a variants need TransformerEngine",
            )
        self.cp_comm_type = _COMM[cp_comm_type]
        self.cp_group = self._cp_group(config, pg_collection)
        # Megatron's apply_query_key_layer_scaling divides the scale by the layer number and the
        # softmax multiplies it back: the maths is plain 1/sqrt(d), so it is not repeated here.
        head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        # set by an evaluation that reruns suffixes (`longctx.attention.prefix_cache`), else unused
        self.prefix_cache: PrefixCache | None = None

    @staticmethod
    def _is_causal(mask_type: AttnMaskType) -> bool:
        if mask_type in _CAUSAL:
            return True
        if mask_type in _UNMASKED:
            return False
        raise AttentionError(
            f"attention mask type {mask_type.name} is not supported",
            where=_WHERE,
            fix="use causal (GPT) or no_mask (bidirectional); documents go in packed_seq_params (document_params)",
        )

    @staticmethod
    def _cp_group(
        config: TransformerConfig, pg_collection: ProcessGroupCollection | None
    ) -> dist.ProcessGroup | None:
        cp = config.context_parallel_size
        group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
        if group is None and cp > 1:
            group = parallel_state.get_context_parallel_group(check_initialized=False)
        if cp > 1 and group_size(group) != cp:
            raise AttentionError(
                f"context_parallel_size is {cp} but the context-parallel group has {group_size(group)} rank(s)",
                where=_WHERE,
                fix="initialise megatron.core.parallel_state with the same context_parallel_size",
            )
        return group if cp > 1 else None

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> Tensor:
        cu_seqlens = None if packed_seq_params is None else _document_bounds(packed_seq_params)
        split = getattr(packed_seq_params, "split", "zigzag")
        if attention_bias is not None:
            raise AttentionError("attention bias is not supported", where=_WHERE)
        if attention_mask is not None:
            raise AttentionError(
                f"an explicit attention mask {list(attention_mask.shape)} is not supported "
                "(it would be an S×S tensor)",
                where=_WHERE,
                fix="build the data with create_attention_mask=False; the mask type says causal",
            )
        causal = self.causal if attn_mask_type is None else self._is_causal(attn_mask_type)
        cache = self.prefix_cache
        if (
            cache is not None
            and cache.mode != "off"
            and (cu_seqlens is not None or not causal or self.cp_group is not None)
        ):
            raise AttentionError(
                "a prefix cache needs causal attention over whole sequences in one process",
                where=_WHERE,
                fix="evaluate without documents and at CP = 1, or leave the cache off",
            )
        if cache is not None and cache.mode == "extend":
            return cache.extend(self.layer_number, query, key, value, self.softmax_scale)
        sq, b, heads, head_dim = query.shape
        fn = ring_attention if self.cp_comm_type == "p2p" else allgather_attention
        # [s, b, h, d] → [b, s, h, d] views; the kernels take strided inputs
        out = fn(
            query.transpose(0, 1),
            key.transpose(0, 1),
            value.transpose(0, 1),
            group=self.cp_group,
            causal=causal,
            softmax_scale=self.softmax_scale,
            cu_seqlens=cu_seqlens,
            split=split,
        )
        if cache is not None and cache.mode == "record":
            cache.record(self.layer_number, key, value)
        # [b, sq, np, hn] → [sq, b, np·hn]
        return out.transpose(0, 1).reshape(sq, b, heads * head_dim)


@dataclass
class DocumentParams(PackedSeqParams):
    """megatron-core PackedSeqParams that also say how the shards were cut (see `document_params`)."""

    split: str = "zigzag"


def document_params(cu_seqlens: Tensor, seq_len: int, split: str = "zigzag") -> PackedSeqParams:
    """What a GPTModel forward takes to attend within documents through `LongctxCoreAttention`.

    `cu_seqlens`: boundaries of the full (unsharded) sequences of the batch, concatenated
    (`[0, …, b·S]`, see `longctx.attention.documents`); the tokens stay in the `[s, b]` layout, sharded
    by `split`: "zigzag" (`zigzag_split`) or "balanced" (`balanced_split`, the document-aware split
    that evens the work per rank; RoPE must then follow the position ids, see
    `longctx.mcore.positions`). `qkv_format` 'sbhd' keeps megatron-core on its dense path (its THD
    handling is for TransformerEngine's per-document layout). `seq_len` is the full length S:
    megatron-core sizes the rotary table of a packed batch by `max_seqlen_*`.
    """
    check_split(split, where="document_params")
    return DocumentParams(
        qkv_format="sbhd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=seq_len,
        max_seqlen_kv=seq_len,
        split=split,
    )


def eod_document_bounds(tokens: Tensor, eod: int) -> Tensor:
    """Boundaries `[0, …, b·S]` (int32) of the documents in `tokens` `[b, S]`, samples concatenated,
    for `document_params`: a document ends after each EOD token (the EOD belongs to the document it
    closes, as with Megatron's --reset-attention-mask) and at every sample edge."""
    b, s = tokens.shape
    ends = (tokens == eod).nonzero()  # [n, 2] (sample, position), in row-major order
    cuts = ends[:, 0] * s + ends[:, 1] + 1
    edges = torch.arange(b + 1, dtype=cuts.dtype, device=cuts.device) * s
    return torch.unique(torch.cat([edges, cuts])).to(torch.int32)  # sorted; a cut at a sample edge once


def _document_bounds(params: PackedSeqParams) -> Tensor:
    if not isinstance(params, PackedSeqParams):
        raise AttentionError(
            f"packed sequences must come as megatron-core PackedSeqParams, got {type(params).__name__}",
            where=_WHERE,
            fix="pass document_params(cu_seqlens, local_len)",
        )
    if params.qkv_format == "thd":
        raise AttentionError(
            "packed sequences in THD layout (each document zigzag-split, TransformerEngine's format) are "
            "not supported",
            where=_WHERE,
            fix="keep [s, b] batches sharded with zigzag_split and pass document_params(cu_seqlens, local_len)",
        )
    cu = params.cu_seqlens_q
    if cu is None:
        raise AttentionError(
            "packed_seq_params without cu_seqlens_q", where=_WHERE, fix="use document_params"
        )
    kv = params.cu_seqlens_kv
    if kv is not None and kv is not cu and not torch.equal(kv.cpu(), cu.cpu()):
        raise AttentionError(
            "cu_seqlens_kv differs from cu_seqlens_q: self-attention within documents needs one set",
            where=_WHERE,
            fix="pass the same boundaries for queries and keys",
        )
    return cu


def longctx_local_layer_spec(**kwargs: Any) -> ModuleSpec:
    """megatron-core's `get_gpt_layer_local_spec(**kwargs)` with `LongctxCoreAttention` as core attention.

    Every keyword (num_experts, qk_layernorm, normalization, …) is passed through unchanged.
    """
    if kwargs.get("multi_latent_attention"):
        raise AttentionError(
            "multi-latent attention has different q/k and v head dims", where="longctx_local_layer_spec"
        )
    spec = get_gpt_layer_local_spec(**kwargs)
    spec.submodules.self_attention.submodules.core_attention = LongctxCoreAttention
    return spec


__all__ = [
    "DocumentParams",
    "LongctxCoreAttention",
    "document_params",
    "eod_document_bounds",
    "longctx_local_layer_spec",
]
