"""What an evaluation measures (pydantic only: the CLI reads its defaults without importing torch)."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
# bump when a change of the code changes what the same settings measure: cached results then expire
RESULTS_VERSION = 5


class EvalSettings(BaseModel):
    """What is measured; everything here except `batch_size` changes the numbers.

    The defaults are what runs after each local stage: every checkpoint of the ladder at every length
    so far, cheap enough for the CPU demo (about 35 forwards per checkpoint and length, and two
    sequences scored twice for the packed windows)."""

    model_config = ConfigDict(extra="forbid")

    depths: list[float] = Field(default_factory=lambda: list(DEFAULT_DEPTHS))
    # bounded so a typo cannot queue billions of forwards: each key is a forward, each distractor a sequence
    keys_per_cell: int = Field(default=2, ge=1, le=10_000)
    distractors: int = Field(default=2, ge=0, le=100)
    key_digits: int = Field(default=5, ge=1)
    filler: Literal["synthetic", "heldout"] = "synthetic"
    seed: int = 1234
    loss_docs: int = Field(default=3, ge=1)
    buckets: Literal["log", "fixed"] = "log"
    bucket_first: int = Field(default=16, ge=2)
    short_docs: int = Field(default=16, ge=0)  # 0: no short-context loss
    # windows per length packed from several held-out documents, scored across and within documents
    packed_windows: int = Field(default=2, ge=0)  # 0: none
    # diffusion models: the ELBO of a window this long by the clean context around it, at these noise levels
    elbo_window: int = Field(default=64, ge=2)
    elbo_levels: list[float] = Field(default_factory=lambda: [0.125, 0.375, 0.625, 0.875])
    batch_size: int = Field(default=4, ge=1)

    def fingerprint(self, *extra: object) -> str:
        data = self.model_dump(exclude={"batch_size"})
        text = f"v{RESULTS_VERSION}|" + repr(sorted(data.items())) + "|" + "|".join(map(str, extra))
        return hashlib.sha256(text.encode()).hexdigest()[:20]
