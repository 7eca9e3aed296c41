"""Which keys of a torch_dist checkpoint are model tensors.

Besides the model, a save holds optimizer state (`optimizer.*`, or `chained_N.optimizer.*` when
several optimizers are chained), RNG state (`rng_state*`) and the common state that megatron-core
≥ 0.19 stores in the DCP index (`common_state/…`). Everything that reads a model's layout (its
family, its architecture, its size) looks at the rest only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

_NOT_MODEL = ("optimizer.", "chained_", "rng_state", "common_state")

V = TypeVar("V")


def is_model_key(key: str) -> bool:
    return not key.startswith(_NOT_MODEL)


def model_entries(entries: Mapping[str, V]) -> dict[str, V]:
    """The entries of `entries` (key → shape, tensor metadata, …) whose keys are model tensors."""
    return {k: v for k, v in entries.items() if is_model_key(k)}
