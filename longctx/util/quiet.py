"""Silence megatron-core's import-time notices about optional packages (TransformerEngine, Apex).

They are printed on every import by every process and say only that the plain PyTorch paths are used,
which is what longctx chooses on CPU; real warnings stay visible.
"""

from __future__ import annotations

import warnings

_NOTICES = (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    r"full scope is deprecated",
    r"The following imports from `dynamic_context.py` will be removed",
)


def quiet_megatron_notices() -> None:
    for pattern in _NOTICES:
        warnings.filterwarnings("ignore", message=pattern)
