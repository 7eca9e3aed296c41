"""Memory per GPU of a Megatron GPT training step, and the smallest context-parallel size that fits.

The model (bytes per GPU; t = TP, p = PP, c = CP, d = DP, s = seq_length, s_c = s/c, b = micro batch,
h = hidden, a = heads, g = query groups, k = head dim, f = FFN, V = padded vocab, L = layers):

* weights   2 B × P_gpu (bf16), P_gpu = params of the heaviest pipeline stage / t
* grads     4 B × P_gpu (fp32 main-grad buffer; `--accumulate-allreduce-grads-in-fp32`)
* optimizer 12 B × P_gpu / (d·c) with the distributed optimizer (fp32 master + Adam m and v, sharded
            over the data-parallel × context-parallel group), 12 B × P_gpu without it
* activations, per layer and micro batch (bf16 saved tensors, flash attention: no s×s term):
      2 B × s_c·b × [ 4h/t_sp  +  ((a+2g)k + (a+g)k·qk_norm + a·k)/t  +  3f/t ]  +  4 B × s_c·b·a/t
  — norm and linear inputs (4 tensors of width h, split by TP only with sequence parallel, t_sp),
  Q/K/V (and their pre-norm copies with QK-norm), the attention output, the SwiGLU input (2f) and
  output (f); plus the fp32 log-sum-exp of flash attention. With a plain FFN 3f becomes 2f.
  For baby_9b_dense at TP 4 + SP this is 34.3 kB per token per layer, next to the 34·h/t = 34.8 kB of
  Korthikanti et al. (2022), whose attention-score term flash attention removes.
  Selective recompute recomputes only core attention, which flash attention already does not store,
  so it is counted like none. Full recompute keeps 2 B × s_c·b·h/t_sp per layer plus one layer's
  activations while it is recomputed.
  Pipeline (1F1B): the first stage holds min(p, microbatches) micro batches of its L/p layers.
* logits    8 B × s_c·b·V/t on the last stage: fp32 softmax kept for the backward (4 B), the bf16
            logits (2 B) and their bf16 gradient (2 B) — cross entropy grows with s×V (at 128K and a
            262K vocab this is larger than all weights).
* overhead  3 GiB fixed: CUDA context, NCCL buffers, library workspaces.
A stage fits when the sum stays under (1 − margin) × GPU memory.

Calibration (tests/plan/test_memory.py): a 32K run of a Llama-like 8B model (262K vocab) on
A100-64GB at TP 4, SP, distributed optimizer and full recompute measured a 55.4 GB peak; NeMo's
Llama-3-8B recipes (TP 4, PP 2, CP 2 @16K, 4 @64K, 8 @128K) run on 80 GB.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from longctx.arch import ModelArch

GiB = 1024**3
OVERHEAD_BYTES = 3 * GiB
LOGIT_BYTES = 8

Recompute = Literal["none", "selective", "full"]


@dataclasses.dataclass(frozen=True)
class MemoryInputs:
    arch: ModelArch
    padded_vocab_size: int
    seq_length: int
    micro_batch_size: int
    tp: int
    pp: int
    cp: int
    dp: int
    num_microbatches: int
    sequence_parallel: bool
    recompute: Recompute = "selective"
    distributed_optimizer: bool = True
    fp32_grads: bool = True


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    overhead: float
    gpu_memory: float
    margin: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.overhead

    @property
    def budget(self) -> float:
        return self.gpu_memory * (1.0 - self.margin)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    @property
    def share(self) -> float:
        return self.total / self.gpu_memory

    def to_gib(self) -> dict[str, float]:
        fields = ("weights", "grads", "optimizer", "activations", "logits", "overhead", "total", "budget")
        return {k: round(getattr(self, k) / GiB, 2) for k in fields}


def params_per_gpu(arch: ModelArch, padded_vocab_size: int, tp: int, pp: int) -> float:
    """Parameters on the heaviest pipeline stage, divided by TP."""
    total = arch.param_count(padded_vocab_size)
    emb = padded_vocab_size * arch.hidden_size
    out = emb if arch.untie_embeddings_and_output_weights else 0
    layers = total - emb - out - arch.hidden_size
    per_layer = layers / arch.num_layers
    layers_per_stage = math.ceil(arch.num_layers / pp)
    # with PP the first stage carries the embedding, the last the output layer: take the heavier
    stage = total if pp == 1 else layers_per_stage * per_layer + max(emb, out)
    return stage / tp


def activation_bytes_per_token_layer(arch: ModelArch, tp: int, sequence_parallel: bool) -> float:
    h, a, g, k, f = (
        arch.hidden_size,
        arch.num_attention_heads,
        arch.query_groups,
        arch.head_dim,
        arch.ffn_hidden_size,
    )
    t_sp = tp if sequence_parallel else 1
    qkv = (a + 2 * g) * k + ((a + g) * k if arch.qk_layernorm else 0) + a * k
    ffn = (3 if arch.swiglu else 2) * f
    return 2.0 * (4 * h / t_sp + qkv / tp + ffn / tp) + 4.0 * a / tp


def estimate(inp: MemoryInputs, *, gpu_memory_gib: float, margin: float) -> MemoryEstimate:
    a = inp.arch
    p_gpu = params_per_gpu(a, inp.padded_vocab_size, inp.tp, inp.pp)
    weights = 2.0 * p_gpu
    grads = (4.0 if inp.fp32_grads else 2.0) * p_gpu
    shard = inp.dp * inp.cp if inp.distributed_optimizer else 1
    optimizer = 12.0 * p_gpu / shard

    tokens = inp.seq_length / inp.cp * inp.micro_batch_size
    t_sp = inp.tp if inp.sequence_parallel else 1
    per_layer = activation_bytes_per_token_layer(a, inp.tp, inp.sequence_parallel) * tokens
    layers = math.ceil(a.num_layers / inp.pp)
    in_flight = min(inp.pp, max(1, inp.num_microbatches))
    if inp.recompute == "full":
        kept = 2.0 * tokens * a.hidden_size / t_sp * layers * in_flight
        activations = kept + per_layer
    else:
        activations = per_layer * layers * in_flight
    # embedding output and the final norm's input
    activations += 2 * 2.0 * tokens * a.hidden_size / t_sp
    logits = LOGIT_BYTES * tokens * inp.padded_vocab_size / inp.tp
    return MemoryEstimate(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        logits=logits,
        overhead=float(OVERHEAD_BYTES),
        gpu_memory=gpu_memory_gib * GiB,
        margin=margin,
    )
