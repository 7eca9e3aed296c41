"""Shapes an index may claim: a reader that sizes a buffer, a memory estimate or an architecture from an
index follows what it says, so an impossible shape is refused where the index is read."""

from __future__ import annotations

from longctx.checkpoint.metadata import DcpIndex
from longctx.errors import CheckpointError

# what one tensor of any model may hold: a stacked MoE layer of a trillion-parameter model is ~2^39
# elements; an index claiming more (or a negative dimension) is damaged or made up, and every reader that
# sizes a buffer or a memory estimate from it would follow
MAX_TENSOR_ELEMENTS = 1 << 42


def check_shapes(index: DcpIndex, where: str) -> None:
    """CheckpointError for a tensor of the index with a negative dimension or more than MAX_TENSOR_ELEMENTS."""
    for key, t in index.tensors.items():
        bad = [d for d in t.shape if not isinstance(d, int) or d < 0]
        if bad or t.numel > MAX_TENSOR_ELEMENTS:
            what = (
                f"dimension {bad[0]}" if bad else f"{t.numel:,} elements (more than {MAX_TENSOR_ELEMENTS:,})"
            )
            raise CheckpointError(
                f"the index (.metadata) gives tensor {key} the shape {list(t.shape)}: {what}; no model has it",
                where=where,
                fix="the .metadata file is damaged or not this checkpoint's: copy the save again",
            )
