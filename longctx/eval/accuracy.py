"""Counts, confidence intervals and effective context length for passkey accuracies.

An accuracy from 20 keys is a count, not a number to two decimals: every accuracy is reported with
its count and the Wilson 95 % score interval (it stays inside [0, 1] and behaves at 0/n and n/n, where
the normal approximation collapses). A cell "spans chance" when its interval reaches the accuracy of
guessing: 1/(distractors + 1) for the log-likelihood choice, 10^-digits for the greedy exact key.

Effective context length, as RULER defines it: the longest evaluated length up to which the model
stays at or above a threshold — here at every evaluated length ≤ L and every needle depth, greedy
exact match of the whole key ≥ the threshold. One number per checkpoint says whether an extension
worked.

Per needle task (`longctx.plan.eval_tasks`), two effective lengths of the task's score at each length
(greedy exact match over all its items): RULER's absolute rule, the longest length up to which the
score stays ≥ 85.6 % (Llama-2-7B's mean at 4K in RULER's paper), and NoLiMa's relative rule, the
longest length up to which it stays ≥ 0.85 × the checkpoint's own score at its shortest evaluated
length. Both thresholds are settings (`[eval].ruler_threshold`, `[eval].relative_threshold`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
EFFECTIVE_THRESHOLD = 0.9
RULER_THRESHOLD = 0.856
RELATIVE_THRESHOLD = 0.85


def wilson_interval(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `hits` successes in `n` trials; (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= hits <= n:
        raise ValueError(f"{hits} hits out of {n} trials")
    p = hits / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # exact ends at 0/n and n/n (rounding would otherwise leave 1e-17 above 0 or below 1)
    lo = 0.0 if hits == 0 else max(0.0, centre - half)
    hi = 1.0 if hits == n else min(1.0, centre + half)
    return lo, hi


def hits_of(accuracy: float | None, n: int) -> int | None:
    """The count behind a stored accuracy over `n` items (accuracies are means of 0/1 outcomes)."""
    if accuracy is None or n <= 0 or math.isnan(accuracy):
        return None
    return round(accuracy * n)


def chance_loglik(distractors: int) -> float:
    return 1.0 / (distractors + 1)


def chance_greedy(digits: int) -> float:
    return 10.0**-digits


def spans(interval: tuple[float, float], chance: float) -> bool:
    return interval[0] <= chance <= interval[1]


def effective_length(
    cells_by_length: Mapping[int, Sequence[float]], threshold: float = EFFECTIVE_THRESHOLD
) -> int | None:
    """The longest length L with every cell (depth) at every evaluated length ≤ L at or above
    `threshold`; None when the shortest evaluated length already falls below it (or nothing was)."""
    best: int | None = None
    for length in sorted(cells_by_length):
        cells = cells_by_length[length]
        if not cells or any(math.isnan(a) or a < threshold for a in cells):
            break
        best = length
    return best


def ruler_effective_length(scores: Mapping[int, float], threshold: float = RULER_THRESHOLD) -> int | None:
    """The longest length L with the score ≥ `threshold` at every evaluated length ≤ L (None when the
    shortest already falls below)."""
    return effective_length({n: [a] for n, a in scores.items()}, threshold)


def relative_effective_length(
    scores: Mapping[int, float], fraction: float = RELATIVE_THRESHOLD
) -> int | None:
    """The longest length L with the score ≥ `fraction` × the score at the shortest evaluated length, at
    every evaluated length ≤ L; None without scores or when that reference score is 0 (or NaN): there is
    nothing to keep a fraction of."""
    if not scores:
        return None
    reference = scores[min(scores)]
    if math.isnan(reference) or reference <= 0:
        return None
    return effective_length({n: [a] for n, a in scores.items()}, fraction * reference)


def paired_delta_interval(
    nll: Sequence[float],
    base_nll: Sequence[float],
    tokens: Sequence[int],
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """95 % percentile-bootstrap interval of the token-weighted loss difference of two checkpoints on the
    same documents (resampling documents, paired); None with fewer than two documents."""
    a, b, n = np.asarray(nll, float), np.asarray(base_nll, float), np.asarray(tokens, float)
    if len(a) < 2 or len(a) != len(b) or len(a) != len(n) or n.sum() <= 0:
        return None
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    weight = n[idx].sum(axis=1)
    delta = (a[idx].sum(axis=1) - b[idx].sum(axis=1)) / weight
    lo, hi = np.percentile(delta, [2.5, 97.5])
    return float(lo), float(hi)
