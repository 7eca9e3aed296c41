"""Silence megatron-core's notices about optional packages (TransformerEngine, Apex) and torch's
deprecation notices raised inside megatron-core's checkpointing.

They are printed by every process and say only that the plain PyTorch paths are used (what longctx
chooses on CPU) or that megatron-core uses an older torch API; real warnings stay visible.
"""

from __future__ import annotations

import warnings

_NOTICES = (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    r"full scope is deprecated",
    r"The following imports from `dynamic_context.py` will be removed",
    # torch's deprecation notices triggered inside megatron-core's dist_checkpointing
    r"`load_state_dict` is deprecated",
    r"Please use DTensor instead and we are deprecating ShardedTensor",
)


def quiet_megatron_notices() -> None:
    for pattern in _NOTICES:
        warnings.filterwarnings("ignore", message=pattern)
