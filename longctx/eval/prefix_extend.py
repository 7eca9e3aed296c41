"""Rerunning only the answer positions of a causal model's items (`longctx.attention.prefix_cache`).

Greedy generation (`longctx.eval.task_score`) does one full forward per batch of items while it
records every layer's keys and values; each later round of a missed item reruns its answer positions
alone against them. A miss at 16K then costs one forward and a few suffix steps instead of up to
budget + 1 full forwards. One process only (CP = 1), causal models, and only while the recorded keys
and values fit `max_bytes`; otherwise `prefix_extender` gives None and greedy generation reruns
whole sequences as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from longctx.attention.megatron_adapter import LongctxCoreAttention
from longctx.attention.prefix_cache import PrefixCache
from longctx.eval.load import LoadedModel
from longctx.mcore.positions import rope_from_position_ids

# recorded keys and values of one batch at most this large (a 2-layer demo model at 16K, batch 4: 34 MB;
# a 9B model at 64K would need tens of GB, and evaluates under CP anyway)
MAX_BYTES = 1 << 30


class PrefixExtender:
    """Records a batch's keys and values during a full forward, then scores suffixes of its rows."""

    def __init__(self, loaded: LoadedModel, modules: list[LongctxCoreAttention], max_bytes: int) -> None:
        self.model = rope_from_position_ids(loaded.model)  # the suffix's RoPE angles from its positions
        self.device = loaded.parallel.device
        self.cache = PrefixCache()
        for m in modules:
            m.prefix_cache = self.cache
        cfg = loaded.model.config
        groups = cfg.num_query_groups or cfg.num_attention_heads
        head_dim = cfg.kv_channels or cfg.hidden_size // cfg.num_attention_heads
        elt = torch.finfo(cfg.params_dtype).bits // 8
        self.bytes_per_token = 2 * len(modules) * groups * head_dim * elt
        self.max_bytes = max_bytes

    def fits(self, batch: int, length: int) -> bool:
        return self.bytes_per_token * batch * length <= self.max_bytes

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Every forward inside records its keys and values (replacing the last batch's)."""
        self.cache.clear()
        self.cache.mode = "record"
        try:
            yield
        finally:
            self.cache.mode = "off"

    def argmax(self, rows: list[int], tokens: torch.Tensor, start: int) -> np.ndarray:
        """The argmax after each of `tokens` `[len(rows), m]`, which sit at positions start … start + m − 1
        of the recorded batch's `rows` (whose tokens before `start` are the recorded ones)."""
        b, m = tokens.shape
        positions = torch.arange(start, start + m).unsqueeze(0).expand(b, m)
        self.cache.mode, self.cache.start, self.cache.rows = "extend", start, rows
        try:
            with torch.inference_mode():
                logits = self.model(tokens.long().to(self.device), positions.to(self.device), None)
                return logits.float().argmax(-1).cpu().numpy().astype(np.int64)
        finally:
            self.cache.mode = "off"

    def release(self) -> None:
        self.cache.clear()


def prefix_extender(loaded: LoadedModel, *, max_bytes: int = MAX_BYTES) -> PrefixExtender | None:
    """An extender for `loaded`, or None where suffixes cannot be rerun alone (CP > 1, a bidirectional
    model, or attention that is not longctx's)."""
    modules = [m for m in loaded.model.modules() if isinstance(m, LongctxCoreAttention)]
    if loaded.parallel.cp > 1 or loaded.info.objective != "ar" or not modules:
        return None
    return PrefixExtender(loaded, modules, max_bytes)
