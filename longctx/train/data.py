"""Training data for the local backend: megatron-core's GPTDataset through its blended builder.

Samples are drawn in Megatron-LM's order (MegatronPretrainingSampler): global batch g holds samples
[g·GBS, (g+1)·GBS); within it, micro batch m of data-parallel rank r takes
m·(MBS·DP) + r·MBS … + MBS. Resuming at `consumed` samples continues exactly there.
Under context parallelism each sample is cut into this CP rank's shard (zigzag, or the
document-balanced split when attention stays within documents); a diffusion
objective corrupts the full samples first (`longctx.diffusion.noise`), so the shards are of one corruption.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from longctx.attention.documents import balanced_split
from longctx.attention.megatron_adapter import eod_document_bounds
from longctx.attention.split_cost import choose_split
from longctx.attention.zigzag import zigzag_split
from longctx.diffusion.noise import corrupt
from longctx.objective import Objective
from longctx.train.spec import TrainSpec

# one prefix builds a GPTDataset, several a BlendedDataset over them
TrainDataset = GPTDataset | BlendedDataset


class _Tokenizer:
    """What GPTDataset asks of a tokenizer (eod, pad, vocab size, identity for the cache hash)."""

    def __init__(self, spec: TrainSpec) -> None:
        self.eod = spec.tokenizer.eod_id
        self.pad = spec.tokenizer.pad_id if spec.tokenizer.pad_id is not None else -1
        self.vocab_size = spec.tokenizer.vocab_size
        self.unique_identifiers = {"class": "longctx", "md5": spec.tokenizer.md5}


def build_train_dataset(spec: TrainSpec) -> TrainDataset:
    """Build (rank 0 first, so the index cache is written once) and return the train dataset."""
    weights = [w for w, _ in spec.data]
    prefixes = [p for _, p in spec.data]
    blend = (prefixes, None if any(w is None for w in weights) else [float(w) for w in weights])
    config = GPTDatasetConfig(
        random_seed=spec.seed,
        sequence_length=spec.seq_length,
        blend=blend,
        split=spec.split,
        path_to_cache=spec.data_cache_path,
        tokenizer=_Tokenizer(spec),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mmap_bin_files=True,
    )
    sizes = [spec.train_iters * spec.global_batch_size, 0, 0]
    rank = dist.get_rank() if dist.is_initialized() else 0

    def build() -> TrainDataset:
        return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[0]

    if rank == 0:
        ds = build()
    if dist.is_initialized():
        dist.barrier()
    if rank != 0:
        ds = build()
    return ds


@dataclasses.dataclass
class MicroBatch:
    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    # document boundaries of the full (unsharded) samples, concatenated: [0, …, b·S], int32; None = concat
    cu_seqlens: torch.Tensor | None = None
    # diffusion objectives: `tokens` is the corrupted input, `labels` the clean tokens (no shift);
    # which positions were corrupted, and each position's time t
    corrupted: torch.Tensor | None = None
    t: torch.Tensor | None = None
    # the CP split the shards were cut with, which attention must read them by (`choose_split`)
    split: str = "zigzag"


@dataclasses.dataclass(frozen=True)
class NoiseSource:
    """What a diffusion objective's draws depend on (see `longctx.diffusion.noise`)."""

    objective: Objective
    seed: int
    global_batch_size: int
    vocab_size: int


def document_positions(cu_seqlens: torch.Tensor, b: int, s: int) -> torch.Tensor:
    """Position ids `[b, S]` restarting at 0 at every boundary (Megatron's --reset-position-ids)."""
    flat = torch.arange(b * s)
    cu = cu_seqlens.long()
    starts = cu[torch.searchsorted(cu, flat, right=True) - 1]
    return (flat - starts).view(b, s)


def global_batch_indices(consumed: int, gbs: int, mbs: int, dp: int, dp_rank: int) -> list[list[int]]:
    """Sample indices of this DP rank's micro batches in the global batch starting at `consumed`."""
    per_step = mbs * dp
    return [[consumed + m * per_step + dp_rank * mbs + j for j in range(mbs)] for m in range(gbs // per_step)]


def micro_batch(
    dataset: TrainDataset,
    indices: list[int],
    cp_rank: int,
    cp_size: int,
    *,
    documents_eod: int | None = None,
    reset_position_ids: bool = False,
    noise: NoiseSource | None = None,
    causal: bool = True,
    split: str | None = None,
) -> MicroBatch:
    """This CP rank's shard of the samples `indices`. `documents_eod`: the EOD id whose tokens end
    documents (packing = "documents"; the boundaries are of the full samples, the same on every
    rank); `reset_position_ids` restarts positions at each document (needs `documents_eod`).
    Under CP, samples with documents are cut by the split `choose_split` models faster for them (the
    document-balanced `balanced_split`, for the objective's `causal` or bidirectional work, or zigzag),
    dense ones by zigzag; every tensor, position ids included, the same way, so RoPE (taken from the
    position ids) is right on every rank; `split` forces one of the two.
    `noise`: a diffusion objective's corruption of the clean tokens (GPTDataset's labels, unshifted)."""
    samples = [dataset[i] for i in indices]
    stack = {
        k: torch.stack([torch.as_tensor(s[k]) for s in samples])
        for k in ("tokens", "labels", "loss_mask", "position_ids")
    }
    if noise is not None:
        clean = stack["labels"].long()
        c = corrupt(noise.objective, clean, indices, noise.seed, noise.global_batch_size, noise.vocab_size)
        stack.update(tokens=c.inputs, labels=clean, corrupted=c.corrupted, t=c.t)
    cu_seqlens = None
    if documents_eod is not None:
        # from the clean tokens: a diffusion objective masks or replaces EODs like any token, and the
        # documents' bounds are the data's, not the noise's (else a masked EOD joins two documents)
        cu_seqlens = eod_document_bounds(stack["labels" if noise is not None else "tokens"], documents_eod)
        if reset_position_ids:
            stack["position_ids"] = document_positions(cu_seqlens, *stack["tokens"].shape)
    if cp_size < 2 or cu_seqlens is None:
        split = "zigzag"
    elif split is None:
        b, s = stack["tokens"].shape
        split = choose_split(tuple(cu_seqlens.tolist()), batch=b, seq_len=s, world=cp_size, causal=causal)
    if split == "balanced" and cp_size > 1:
        cu = cu_seqlens
        stack = {
            k: balanced_split(v, cu, cp_rank, cp_size, causal=causal).contiguous() for k, v in stack.items()
        }
    elif cp_size > 1:
        stack = {k: zigzag_split(v, cp_rank, cp_size, seq_dim=1).contiguous() for k, v in stack.items()}
    return MicroBatch(
        stack["tokens"].long(),
        stack["labels"].long(),
        stack["loss_mask"].float(),
        stack["position_ids"].long(),
        cu_seqlens,
        stack.get("corrupted"),
        stack.get("t"),
        split,
    )
