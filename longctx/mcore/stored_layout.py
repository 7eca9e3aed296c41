"""How a checkpoint stores the model the trainer builds as a GPTModel: its block prefix and buffers.

The BERT-derived diffusion models keep their transformer layers under `encoder.` (GPTModel: `decoder.`)
and carry the masked-diffusion tokenizer's buffers (`subtokenizer.*`), which no GPTModel module
owns. The trainer reads the layout of the checkpoint it loads, maps the keys on load and save, and
writes the buffers back unchanged, so a user's own fork can continue from what longctx saves.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from megatron.core.dist_checkpointing.utils import apply_prefix_mapping
from megatron.core.dist_checkpointing.validation import StrictHandling
from megatron.core.transformer.module import MegatronModule
from torch.distributed.checkpoint import FileSystemReader

from longctx.mcore.checkpoint import common_strategy

Block = Literal["decoder", "encoder"]
BUFFER_PREFIX = "subtokenizer."


@dataclasses.dataclass
class StoredLayout:
    block: Block = "decoder"
    buffers: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def model_state(self, model: MegatronModule, *, buffers: bool = False) -> dict[str, Any]:
        """`model`'s sharded state dict under this layout's keys; with the buffers for a save (rank 0
        writes them), without for a load (no module of the model takes them)."""
        sd = model.sharded_state_dict()
        if self.block == "encoder":
            apply_prefix_mapping(sd, {"decoder.": "encoder."})
        if not buffers:
            return sd
        for name, value in self.buffers.items():
            sd[name] = ShardedTensor.from_rank_offsets(name, value.clone(), replica_id=_replica())
        return sd


def _replica() -> int:
    """Every rank holds the whole buffer; rank 0's copy is the main replica (the one written)."""
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _tensor_shapes(checkpoint_dir: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    md = FileSystemReader(str(checkpoint_dir)).read_metadata()
    return {
        k: (tuple(v.size), v.properties.dtype)
        for k, v in md.state_dict_metadata.items()
        if hasattr(v, "size")
    }


def read_layout(checkpoint_dir: str | Path) -> StoredLayout:
    """The layout of the torch_dist checkpoint `checkpoint_dir` (iter_N), its buffers' values loaded."""
    shapes = _tensor_shapes(Path(checkpoint_dir))
    block: Block = "encoder" if any(k.startswith("encoder.layers.") for k in shapes) else "decoder"
    wanted = {
        k: ShardedTensor.from_rank_offsets(k, torch.empty(shape, dtype=dtype), replica_id=_replica())
        for k, (shape, dtype) in shapes.items()
        if k.startswith(BUFFER_PREFIX)
    }
    buffers: dict[str, torch.Tensor] = {}
    if wanted:
        loaded = dist_checkpointing.load(
            wanted,
            str(checkpoint_dir),
            strict=StrictHandling.ASSUME_OK_UNEXPECTED,
            common_strategy=common_strategy(checkpoint_dir),
        )
        buffers = {k: loaded[k].detach().clone() for k in wanted}
    return StoredLayout(block, buffers)


__all__ = ["BUFFER_PREFIX", "StoredLayout", "read_layout"]
