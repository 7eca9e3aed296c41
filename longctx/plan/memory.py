"""Memory per GPU of a Megatron GPT training step, and the smallest context-parallel size that fits.

The model (bytes per GPU; t = TP, p = PP, c = CP, d = DP, s = seq_length, s_c = s/c, b = micro batch,
h = hidden, a = heads, g = query groups, k = head dim, f = FFN, V = padded vocab, L = layers,
L_p = ceil(L/p) layers per pipeline stage):

* weights   2 B × P_gpu (bf16), P_gpu = params of the heaviest pipeline stage / t
* grads     4 B × P_gpu (fp32 main-grad buffer; `--accumulate-allreduce-grads-in-fp32`)
* optimizer 12 B × P_gpu / (d·c) with the distributed optimizer (fp32 master + Adam m and v, sharded
            over the data-parallel × context-parallel group), 12 B × P_gpu without it
* activations, per layer and micro batch: A = s_c·b × (sum of the terms below), each a tensor the
  backward keeps (bf16 = 2 B per element unless noted; t_sp = t with sequence parallel, else 1). The
  basis is Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models",
  §4.1: 34·h + 5·a·s bytes per token per layer (TP + SP divide everything by t); the terms here are that
  accounting for GQA, QK-norm, SwiGLU, no dropout (its masks are gone) and the attention kernel:
      norm_inputs   2 × 2h/t_sp            the inputs of the two norms (the residual stream)   [K: 4sbh]
      norm_outputs  2 × 2h/t_sp            their outputs = the inputs of linear_qkv and linear_fc1 [K: 2sbh+2sbh]
      qkv           2 × ((a+2g)k + (a+g)k·qk_norm)/t   Q, K, V (and their pre-norm copies with QK-norm)
                                                      [K: 6sbh for a = g]
      attn_out      2 × a·k/t              the attention output = linear_proj's input           [K: 2sbh]
      core_attn     flash, fused, auto: 4 B × a/t, the fp32 log-sum-exp (no s×s tensor);
                    unfused: 5 B × a·s/t, the s×s softmax output, dropout mask and dropout output
                    [K: 5as²b] (an upper bound at attention_dropout 0)
      mlp           2 × 3f/t (SwiGLU: fc1's output 2f, the activation's output f), 2 × 2f/t plain
                    [K: 8sbh + 8sbh for f = 4h]
  For baby_9b_dense at TP 4 + SP this is 34.3 kB per token per layer, next to the 34·h/t = 34.8 kB of
  Korthikanti et al. (2022), whose attention-score term flash attention removes. MoE layers are modelled
  with the dense terms (f = ffn_hidden_size).
  Pipeline (1F1B): the first stage holds n = min(p, microbatches) micro batches of its L_p layers. The
  embedding output and the final norm's input add 2 × 2h/t_sp per token. What each recompute policy
  keeps (Megatron-Core 0.16.1, `TransformerBlock._checkpointed_forward`, `TransformerLayer`), with
  I = 2 B × s_c·b·h/t_sp a layer's input:
  - none: n × L_p × A.
  - full, uniform, N layers per chunk (`--recompute-method uniform --recompute-num-layers N`; N divides
    L_p): only each chunk's input is kept, and one chunk is recomputed at a time in the backward →
    n × (L_p/N) × I + N × A.
  - full, block, N (`--recompute-method block`; 1 ≤ N ≤ L_p): the first N layers of the stage keep only
    their input, the other L_p − N keep everything → n × (N × I + (L_p − N) × A), plus one recomputed
    layer A when N = L_p (with N < L_p the recompute happens after the stored layers are freed).
  - selective (`--recompute-modules …`): each listed module's share C of A is dropped in every layer and
    rebuilt for one layer at a time → n × L_p × (A − C) + C, with C the sum of
      core_attn     the core_attn term (with flash/fused attention only the log-sum-exp: ~0.1 % of A)
      mlp           mlp + one norm output (2h/t_sp: the norm fused into linear_fc1 under
                    TransformerEngine is inside the checkpointed MLP); dense layers only
      layernorm     MoE layers: the pre-MLP norm's output (2h/t_sp); dense layers: 0, since the
                    TransformerEngine spec fuses both norms into linear_qkv / linear_fc1 and Megatron
                    skips them (the planner refuses it there)
      moe           mlp (the MoE layer, modelled with the dense terms)
      moe_act       2 × f/t, the activation's output (output-discarding checkpoint)
      shared_experts 0: shared-expert activations are not in the model (the estimate stays high)
    `mla_up_proj` has nothing to credit (longctx models no MLA; the planner refuses it).
* logits    8 B × s_c·b·V/t on the last stage: fp32 softmax kept for the backward (4 B), the bf16
            logits (2 B) and their bf16 gradient (2 B) — cross entropy grows with s×V (at 128K and a
            262K vocab this is larger than all weights).
* overhead  3 GiB fixed: CUDA context, NCCL buffers, library workspaces.
A stage fits when the sum stays under (1 − margin) × GPU memory.

The byte sizes above are those of a GPU run under Megatron-LM with TransformerEngine (`GPU_FUSED`).
The same formulas serve the local backend through a `DeviceModel` (`CPU_LOCAL_FP32`,
`CPU_LOCAL_BF16`): its element sizes, whether a separate fp32 master exists, no fixed overhead (the
benchmark measures above the process's start-up), and the layer as megatron-core's local spec with
longctx's attention builds it, whose unfused modules keep more per token and layer (bytes, e the
element size; `longctx bench memory` checks them against measured peaks):
    norm_inputs 4·2h: torch's RMSNorm keeps its input in fp32 (an fp32 copy of a bf16 input);
    norm_scaled 4·2h: x·rstd in fp32, which the weight multiply keeps; norm_outputs e·2h;
    qkv e·(a+2g)k: linear_qkv's output, which the QK-norms keep (q, k, v are views of it);
    qk_norm 4·(a+g)k, the QK-norms' x·rstd, and in bf16 their fp32 input copies, 4·(a+g)k more;
    attention e·(2ak + gk) in bf16, e·(3ak + gk) in fp32: q and k after RoPE, the [b, s, heads, d]
    copies longctx's attention keeps, its output and linear_proj's input;
    core_attn 4 B × a, the log-sum-exp; mlp e·5f: fc1's output 2f, SiLU's output f, the product f
    (linear_fc2's input) and its copy f.
Selective recompute of core_attn keeps the same on the local spec (the checkpointed attention keeps
its inputs, which are the copies), so it credits only the log-sum-exp.
Logits on the local backend are kept in fp32 three times (logits, softmax, gradient): 12 B × s×V.
On a GPU (`GPU_LOCAL_BF16`) torch's RMSNorm is one fused kernel: each norm keeps its bf16 input
(norm_inputs e·2h) and an fp32 rstd per row, so norm_scaled is 0 and qk_norm is 4 B × (a+g).

Calibration (tests/plan/test_memory.py): a 32K run of a Llama-like 8B model (262K vocab) on
A100-64GB at TP 4, SP, distributed optimizer and full recompute measured a 55.4 GB peak (the model,
with longctx's full-recompute default uniform / 1 layer: 51.2 GB); NeMo's Llama-3-8B recipes (TP 4, PP 2,
CP 2 @16K, 4 @64K, 8 @128K) run on 80 GB.
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
Kernels = Literal["fused", "local"]
RecomputeMethod = Literal["uniform", "block"]
AttentionBackend = Literal["flash", "fused", "unfused", "auto"]
# megatron-core 0.16.1 TransformerConfig.recompute_modules choices
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


@dataclasses.dataclass(frozen=True)
class DeviceModel:
    """What the device, the precision and the layer implementation make of the formulas (bytes)."""

    name: str
    weight_bytes: float  # per parameter, the model's own copy
    grad_bytes: float  # per parameter, the gradient the optimizer reads (fp32 main grads)
    optimizer_bytes: float  # per parameter before sharding: Adam m and v, and an fp32 master if separate
    element_bytes: float  # activations
    kernels: Kernels  # "fused": TransformerEngine / flash; "local": megatron-core's local spec, unfused
    logit_bytes: float  # per logit element of the last stage
    overhead_bytes: float  # fixed: CUDA context, communication buffers, workspaces
    # torch's RMSNorm on the CPU is composite and keeps fp32 copies of its input and of x·rstd; on CUDA
    # it is one fused kernel that keeps its input and the fp32 rstd only
    norm_fp32_copies: bool = True


GPU_FUSED = DeviceModel(
    "GPU, bf16 with fp32 main grads and masters, TransformerEngine / flash kernels",
    weight_bytes=2.0,
    grad_bytes=4.0,
    optimizer_bytes=12.0,
    element_bytes=2.0,
    kernels="fused",
    logit_bytes=float(LOGIT_BYTES),
    overhead_bytes=float(OVERHEAD_BYTES),
)
CPU_LOCAL_FP32 = DeviceModel(
    "CPU, fp32 (the masters are the weights), megatron-core local spec with longctx attention",
    weight_bytes=4.0,
    grad_bytes=4.0,
    optimizer_bytes=8.0,
    element_bytes=4.0,
    kernels="local",
    logit_bytes=12.0,
    overhead_bytes=0.0,
)
CPU_LOCAL_BF16 = DeviceModel(
    "CPU, bf16 with fp32 grads and masters, megatron-core local spec with longctx attention",
    weight_bytes=2.0,
    grad_bytes=4.0,
    optimizer_bytes=12.0,
    element_bytes=2.0,
    kernels="local",
    logit_bytes=12.0,
    overhead_bytes=0.0,
)
# measured on one H200 (torch 2.11, CUDA 13): 8 CP 1 configurations between 0.92 and 1.00 of this
# (tests/plan/data/gpu_local_bf16_peaks.json); allocations only, so no CUDA context (~0.5 GiB) in it
GPU_LOCAL_BF16 = DeviceModel(
    "GPU, bf16 with fp32 grads and masters, megatron-core local spec with longctx attention",
    weight_bytes=2.0,
    grad_bytes=4.0,
    optimizer_bytes=12.0,
    element_bytes=2.0,
    kernels="local",
    logit_bytes=12.0,
    overhead_bytes=0.0,
    norm_fp32_copies=False,
)


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
    recompute: Recompute = "none"
    distributed_optimizer: bool = True
    fp32_grads: bool = True
    recompute_method: RecomputeMethod = "uniform"  # full recompute only
    recompute_num_layers: int = 1  # full recompute only
    recompute_modules: tuple[str, ...] = ()  # selective recompute only
    attention_backend: AttentionBackend = "flash"
    device: DeviceModel = GPU_FUSED


class Budgeted:
    """An estimate whose `PARTS` (byte fields) add up to its total, against (1 − margin) × GPU memory."""

    PARTS: tuple[str, ...] = ()
    gpu_memory: float
    margin: float

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in self.PARTS)

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
        return {k: round(getattr(self, k) / GiB, 2) for k in (*self.PARTS, "total", "budget")}


@dataclasses.dataclass(frozen=True)
class MemoryEstimate(Budgeted):
    PARTS = ("weights", "grads", "optimizer", "activations", "logits", "overhead")

    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    overhead: float
    gpu_memory: float
    margin: float


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


def activation_terms(
    arch: ModelArch,
    tp: int,
    sequence_parallel: bool,
    *,
    attention_backend: AttentionBackend = "flash",
    seq_length: int | None = None,
    device: DeviceModel = GPU_FUSED,
) -> dict[str, float]:
    """Bytes per token per layer that the backward keeps, by what keeps them (the module docstring)."""
    if device.kernels == "local":
        return _local_activation_terms(arch, tp, device)
    h, a, g, k, f = arch.widths
    t_sp = tp if sequence_parallel else 1
    if attention_backend == "unfused":
        if seq_length is None:
            raise ValueError("unfused attention stores s×s probabilities: give seq_length")
        core_attn = 5.0 * a * seq_length / tp
    else:
        core_attn = 4.0 * a / tp
    return {
        "norm_inputs": 2.0 * 2 * h / t_sp,
        "norm_outputs": 2.0 * 2 * h / t_sp,
        "qkv": 2.0 * ((a + 2 * g) * k + ((a + g) * k if arch.qk_layernorm else 0)) / tp,
        "attn_out": 2.0 * a * k / tp,
        "core_attn": core_attn,
        "mlp": 2.0 * (3 if arch.swiglu else 2) * f / tp,
    }


def _local_activation_terms(arch: ModelArch, tp: int, device: DeviceModel) -> dict[str, float]:
    """`activation_terms` of megatron-core's local spec with longctx attention (no sequence parallel)."""
    h, a, g, k, f = arch.widths
    e = device.element_bytes
    qk = arch.qk_layernorm
    if not device.norm_fp32_copies:  # fused norms: the bf16 input and an fp32 rstd per row
        return {
            "norm_inputs": e * 2 * h,
            "norm_scaled": 0.0,
            "norm_outputs": e * 2 * h,
            "qkv": e * (a + 2 * g) * k / tp if qk else 0.0,
            "qk_norm": 4.0 * (a + g) / tp if qk else 0.0,
            "attention": e * (2 * a * k + g * k) / tp,
            "core_attn": 4.0 * a / tp,
            "mlp": e * 5 * f / tp if arch.swiglu else e * 3 * f / tp,
        }
    fp32_copy = 4.0 if e < 4 else 0.0  # torch's norms upcast a bf16 input and keep that copy
    return {
        "norm_inputs": 4.0 * 2 * h,
        "norm_scaled": 4.0 * 2 * h,
        "norm_outputs": e * 2 * h,
        "qkv": e * (a + 2 * g) * k / tp if qk else 0.0,
        "qk_norm": (4.0 + fp32_copy) * (a + g) * k / tp if qk else 0.0,
        "attention": e * ((2 if e < 4 else 3) * a * k + g * k) / tp,
        "core_attn": 4.0 * a / tp,
        "mlp": e * (5 if arch.swiglu else 3) * f / tp,
    }


def activation_bytes_per_token_layer(
    arch: ModelArch,
    tp: int,
    sequence_parallel: bool,
    *,
    attention_backend: AttentionBackend = "flash",
    seq_length: int | None = None,
    device: DeviceModel = GPU_FUSED,
) -> float:
    terms = activation_terms(
        arch, tp, sequence_parallel, attention_backend=attention_backend, seq_length=seq_length, device=device
    )
    return sum(terms.values())


def recompute_module_credit(
    module: str,
    arch: ModelArch,
    tp: int,
    sequence_parallel: bool,
    *,
    attention_backend: AttentionBackend = "flash",
    seq_length: int | None = None,
    device: DeviceModel = GPU_FUSED,
) -> float:
    """Bytes per token per layer that `--recompute-modules <module>` stops keeping (module docstring)."""
    terms = activation_terms(
        arch, tp, sequence_parallel, attention_backend=attention_backend, seq_length=seq_length, device=device
    )
    if device.kernels == "local" and module == "core_attn":
        return terms["core_attn"]
    t_sp = tp if sequence_parallel else 1
    one_norm_output = 2.0 * arch.hidden_size / t_sp
    moe = bool(arch.num_experts)
    if module == "core_attn":
        return terms["core_attn"]
    if module == "mlp":
        return 0.0 if moe else terms["mlp"] + one_norm_output
    if module == "layernorm":
        return one_norm_output if moe else 0.0
    if module == "moe":
        return terms["mlp"] if moe else 0.0
    if module == "moe_act":
        return 2.0 * arch.ffn_hidden_size / tp if moe else 0.0
    if module in ("shared_experts", "mla_up_proj"):
        return 0.0
    raise ValueError(f"unknown recompute module {module!r}; Megatron knows {', '.join(RECOMPUTE_MODULES)}")


def layer_activations(inp: MemoryInputs) -> float:
    """Activation bytes of the first pipeline stage's layers under the recompute policy (module docstring)."""
    a = inp.arch
    tokens = inp.seq_length / inp.cp * inp.micro_batch_size
    t_sp = inp.tp if inp.sequence_parallel else 1
    kw = {"attention_backend": inp.attention_backend, "seq_length": inp.seq_length, "device": inp.device}
    per_layer = activation_bytes_per_token_layer(a, inp.tp, inp.sequence_parallel, **kw) * tokens
    layer_input = inp.device.element_bytes * tokens * a.hidden_size / t_sp
    layers = math.ceil(a.num_layers / inp.pp)
    in_flight = min(inp.pp, max(1, inp.num_microbatches))
    if inp.recompute == "full":
        n = min(inp.recompute_num_layers, layers)
        if inp.recompute_method == "uniform":
            # chunk inputs of every micro batch in flight, one chunk recomputed at a time
            return math.ceil(layers / n) * layer_input * in_flight + n * per_layer
        # block: N layers keep their input, the rest everything; one recomputed layer only when N = L_p
        stored = n * layer_input + (layers - n) * per_layer
        return stored * in_flight + max(0.0, per_layer - (layers - n) * per_layer)
    if inp.recompute == "selective":
        credit = tokens * sum(
            recompute_module_credit(m, a, inp.tp, inp.sequence_parallel, **kw)
            for m in dict.fromkeys(inp.recompute_modules)
        )
        # every layer drops the modules' share; one layer's is rebuilt at a time in the backward
        return (per_layer - credit) * layers * in_flight + credit
    return per_layer * layers * in_flight


def estimate(inp: MemoryInputs, *, gpu_memory_gib: float, margin: float) -> MemoryEstimate:
    a = inp.arch
    dev = inp.device
    p_gpu = params_per_gpu(a, inp.padded_vocab_size, inp.tp, inp.pp)
    weights = dev.weight_bytes * p_gpu
    grads = (dev.grad_bytes if inp.fp32_grads else 2.0) * p_gpu
    shard = inp.dp * inp.cp if inp.distributed_optimizer else 1
    optimizer = dev.optimizer_bytes * p_gpu / shard

    tokens = inp.seq_length / inp.cp * inp.micro_batch_size
    t_sp = inp.tp if inp.sequence_parallel else 1
    activations = layer_activations(inp)
    # embedding output and the final norm's input
    activations += 2 * dev.element_bytes * tokens * a.hidden_size / t_sp
    logits = dev.logit_bytes * tokens * inp.padded_vocab_size / inp.tp
    return MemoryEstimate(
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        logits=logits,
        overhead=dev.overhead_bytes,
        gpu_memory=gpu_memory_gib * GiB,
        margin=margin,
    )
