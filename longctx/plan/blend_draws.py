"""What megatron-core's BlendedMegatronDatasetBuilder draws from each dataset of a blend at start-up.

For a weighted blend asked for N samples of one split part, megatron-core builds dataset i's GPTDataset
for target_i = ceil(ceil(N·w_i)·(1 + surplus)) samples (`mid_level_dataset_surplus`), sizes the blend
Σ_i ceil(N·w_i) and draws that many samples by weight (`helpers.build_blending_indices`). A GPTDataset
covers whole epochs of its part, so it can hold more than its target; a dataset drawn more often than
it holds stops start-up (`IndexError: The valid blend oversamples the contributing datasets` in
BlendedDataset._build_indices). A blend of prefixes alone is weighted by each part's one-epoch length.

The draw is megatron-core's own (its compiled helper, its weight normalisation and per-dataset sizes);
only GPTDataset's length is computed here, from the part's tokens with GPTDataset's epoch arithmetic.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

SURPLUS_STEP = 0.01  # a suggested surplus is rounded up to this
# past this many samples a weighted draw that provably fits is not drawn (its indices: 10 bytes a sample)
EXACT_DRAW_MAX = 10_000_000


def gpt_dataset_length(tokens: int, seq_length: int, num_samples: int | None) -> int:
    """len(GPTDataset) of a part holding `tokens`, asked for `num_samples` (None: one epoch): whole epochs
    until they hold num_samples·S + 1 tokens (`_get_num_epochs`), cut into samples of S + 1 tokens
    overlapping by one, the last partial one dropped (`build_sample_idx`, add_extra_token_to_sequence)."""
    if tokens <= 0:
        return 0
    epochs = 1 if num_samples is None else max(1, -(-(num_samples * seq_length + 1) // tokens))
    return (epochs * tokens - 1) // seq_length


@dataclasses.dataclass(frozen=True)
class BlendDraw:
    """One split part's blend as megatron-core builds it: per dataset its target, length and draws."""

    requested: int  # N: the samples the trainer asks of this part
    surplus: float
    weighted: bool
    requested_per_dataset: tuple[int, ...]  # ceil(N·w_i) (weighted), the blend's size is their sum
    targets: tuple[int | None, ...]  # the GPTDataset's num_samples (None: one epoch)
    lengths: tuple[int, ...]  # len(GPTDataset)
    drawn: tuple[int, ...]  # a large blend that provably fits: the bound floor(w·size) + 1 on each count

    @property
    def size(self) -> int:
        return sum(self.drawn)

    @property
    def oversampled(self) -> list[int]:
        """Datasets drawn more often than they hold, most oversampled first."""
        bad = [i for i, (d, n) in enumerate(zip(self.drawn, self.lengths, strict=True)) if d > n]
        return sorted(bad, key=lambda i: self.lengths[i] - self.drawn[i])


def _normalize(weights: Sequence[float]) -> list[float]:
    # megatron-core (and torch under it) loads only when a blend is drawn: a plan check without data
    # never pays for it
    from megatron.core.datasets.utils import normalize

    return list(normalize(list(weights)))


def default_surplus() -> float:
    """megatron-core's `mid_level_dataset_surplus` default (Megatron-LM's --mid-level-dataset-surplus too)."""
    # lazily, as in _normalize
    from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig

    return float(BlendedMegatronDatasetConfig.__dataclass_fields__["mid_level_dataset_surplus"].default)


def _draw(weights: Sequence[float], size: int) -> tuple[int, ...]:
    """How often megatron-core's compiled helper draws each dataset in a blend of `size` (BlendedDataset
    normalises the weights it is given before drawing)."""
    from megatron.core.datasets import helpers  # as in _normalize

    dataset_index = np.zeros(size, dtype=np.int16)
    sample_index = np.zeros(size, dtype=np.int64)
    helpers.build_blending_indices(
        dataset_index, sample_index, _normalize(weights), len(weights), size, False
    )
    return tuple(int(c) for c in np.bincount(dataset_index, minlength=len(weights)))


def weighted_targets(weights: Sequence[float], requested: int, surplus: float) -> tuple[list[int], list[int]]:
    """(ceil(N·w_i), target_i) for a weighted blend, as megatron-core's builder computes them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (  # as in _normalize
        _get_size_per_split_per_dataset as per_dataset,
    )

    w = _normalize(weights)
    plain = [row[0] for row in per_dataset(w, [requested])]
    built = [row[0] for row in per_dataset(w, [requested], surplus=surplus)]
    return plain, built


def blend_draw(
    weights: Sequence[float] | None, tokens: Sequence[int], seq_length: int, requested: int, surplus: float
) -> BlendDraw | None:
    """The blend of one part over datasets whose parts hold `tokens`; `weights` None: weighted by size.
    None where megatron-core draws nothing (no sample asked, or an unweighted dataset of no sample)."""
    if requested <= 0 or not tokens or any(t <= 0 for t in tokens):
        return None
    if weights is not None:
        plain, targets = weighted_targets(weights, requested, surplus)
        lengths = [gpt_dataset_length(t, seq_length, n) for t, n in zip(tokens, targets, strict=True)]
        w = _normalize(weights)  # the builder normalised them once already
        bound = [math.floor(wi * sum(plain)) + 1 for wi in w]
        if sum(plain) > EXACT_DRAW_MAX and all(n >= b for n, b in zip(lengths, bound, strict=True)):
            # megatron-core's draw keeps every count within floor(w·size) + 1; where each dataset holds
            # that many the draw cannot oversample, and drawing it exactly would cost 10 bytes a sample
            drawn = tuple(bound)
        else:
            drawn = _draw(w, sum(plain))
        return BlendDraw(requested, surplus, True, tuple(plain), tuple(targets), tuple(lengths), drawn)
    lengths = [gpt_dataset_length(t, seq_length, None) for t in tokens]
    if any(n <= 0 for n in lengths):
        return None  # BlendedDataset refuses a zero weight before drawing: not this check's failure
    drawn = _draw([float(n) for n in lengths], min(requested, sum(lengths)))
    return BlendDraw(requested, surplus, False, tuple(lengths), (None,) * len(lengths), tuple(lengths), drawn)


def sufficient_surplus(
    weights: Sequence[float], tokens: Sequence[int], seq_length: int, draw: BlendDraw
) -> float:
    """The smallest surplus (rounded up to SURPLUS_STEP) whose GPTDatasets hold every draw of `draw`.
    The draws do not depend on the surplus; each dataset's length grows with it."""
    need = draw.surplus
    for i in draw.oversampled:
        # the smallest target whose epochs hold the draws (a GPTDataset holds at least its target)
        candidates = range((draw.targets[i] or 0) + 1, draw.drawn[i] + 1)  # its length grows with it
        enough = bisect.bisect_left(
            candidates, True, key=lambda t: gpt_dataset_length(tokens[i], seq_length, t) >= draw.drawn[i]
        )
        target = candidates[enough]
        # ceil(c·(1 + s)) reaches it once c·(1 + s) > target - 1
        need = max(need, (target - 1) / draw.requested_per_dataset[i] - 1)
    step = math.ceil(need / SURPLUS_STEP - 1e-9)
    while True:  # megatron-core's float arithmetic decides: step up until its targets suffice
        surplus = round(step * SURPLUS_STEP, 6)
        _, targets = weighted_targets(weights, draw.requested, surplus)
        lengths = [gpt_dataset_length(t, seq_length, n) for t, n in zip(tokens, targets, strict=True)]
        if all(n >= d for n, d in zip(lengths, draw.drawn, strict=True)):
            return surplus
        step += 1


__all__ = ["BlendDraw", "blend_draw", "default_surplus", "gpt_dataset_length", "sufficient_surplus"]
