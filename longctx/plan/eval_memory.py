"""Memory per GPU of longctx's evaluation (forward only, one GPU per CP rank), and the CP size a stage's
evaluation needs.

`eval run` loads the whole model on every CP rank (bf16 on a GPU, no TP) and scores batches of
`batch` sequences of length s under `torch.inference_mode`, so nothing is kept for a backward: layer
by layer, only the live layer's tensors exist. Per GPU, with s_c = s / CP and the terms of
`longctx.plan.memory`:

* weights      2 B × P (bf16)
* activations  b·s_c × (A + 2·2h): one layer's tensors (the sum of `activation_terms`, the most a
               layer holds at once) and the residual stream entering it; the ring's K/V buffers of
               the layer are in A's qkv term
* logits       b·s_c × V × 2 B (the bf16 output layer) + one slice's fp32 log-softmax and top-2
               (`longctx.eval.score._SLICE` rows × V × 12 B)
* overhead     3 GiB fixed (CUDA context, NCCL, workspaces), as for training

The smallest CP (a power of two up to the GPUs of one eval node) at which a batch of 4, 2 or 1
sequences stays under (1 − margin) × GPU memory is the CP of the stage's eval job, with the largest
such batch.
"""

from __future__ import annotations

import dataclasses

from longctx.arch import ModelArch
from longctx.errors import PlanError
from longctx.plan.memory import OVERHEAD_BYTES, Budgeted, GiB, activation_terms, params_per_gpu

WEIGHT_BYTES = 2.0
LOGIT_SLICE_ROWS = 2048  # rows of logits turned into fp32 scores at once (longctx.eval.score._SLICE)


@dataclasses.dataclass(frozen=True)
class EvalMemory(Budgeted):
    PARTS = ("weights", "activations", "logits", "overhead")

    cp: int
    weights: float
    activations: float
    logits: float
    overhead: float
    gpu_memory: float
    margin: float


def eval_memory(
    arch: ModelArch,
    padded_vocab_size: int,
    seq_length: int,
    cp: int,
    *,
    batch: int,
    gpu_memory_gib: float,
    margin: float,
) -> EvalMemory:
    """The evaluation's peak per GPU at context-parallel size `cp` (the module docstring)."""
    tokens = batch * seq_length / cp
    layer = sum(activation_terms(arch, 1, False).values()) + 2.0 * 2 * arch.hidden_size
    return EvalMemory(
        cp=cp,
        weights=WEIGHT_BYTES * params_per_gpu(arch, padded_vocab_size, 1, 1),
        activations=tokens * layer,
        logits=tokens * padded_vocab_size * 2.0
        + min(tokens, LOGIT_SLICE_ROWS * batch) * padded_vocab_size * 12.0,
        overhead=float(OVERHEAD_BYTES),
        gpu_memory=gpu_memory_gib * GiB,
        margin=margin,
    )


BATCHES = (4, 2, 1)  # eval run's default --batch-size first; long lengths fall back to fewer per forward


def eval_cp(
    arch: ModelArch,
    padded_vocab_size: int,
    seq_length: int,
    *,
    max_cp: int,
    gpu_memory_gib: float,
    margin: float,
    where: str | None = None,
) -> tuple[EvalMemory, int]:
    """The smallest power-of-two CP ≤ `max_cp` (the length splitting into 2·CP chunks) at which some
    batch of `BATCHES` fits, with the largest such batch: (its estimate, the batch)."""
    cp, tried = 1, []
    while cp <= max(1, max_cp):
        if cp == 1 or seq_length % (2 * cp) == 0:
            for batch in BATCHES:
                est = eval_memory(
                    arch,
                    padded_vocab_size,
                    seq_length,
                    cp,
                    batch=batch,
                    gpu_memory_gib=gpu_memory_gib,
                    margin=margin,
                )
                if est.fits:
                    return est, batch
            tried.append(est)
        cp *= 2
    shown = "; ".join(f"CP {e.cp}: {e.total / GiB:.1f} GiB" for e in tried)
    raise PlanError(
        f"evaluating {seq_length:,} tokens one sequence at a time does not fit one node's GPUs ({shown}; "
        f"budget {(1 - margin) * gpu_memory_gib:.1f} GiB per GPU)",
        where=where,
        fix="give the eval job a profile whose nodes have more GPUs or more memory per GPU, or evaluate "
        "the stage at shorter lengths by hand (`longctx eval run … --lengths`)",
    )
