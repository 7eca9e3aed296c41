"""Greedy decoding of a diffusion model's corrupted positions: the most confident first.

A masked-diffusion model predicts every corrupted position from the same input; taking the argmax
at all of them from one forward asks each digit of a key to find the key on its own (where it is, and
which of it), with nothing of the digits beside it. Masked-diffusion models are decoded step by
step instead (MaskGIT's and LLaDA's samplers): each round fixes the positions the model is surest
of, the next forward reads them as context, and the rest are predicted again. Here a round fixes
every still-corrupted position whose top probability reaches `threshold` (Fast-dLLM's parallel rule)
and always at least the most confident one, so `threshold = 1` decodes one position per round and
a key the model is sure of costs one forward. A uniform-noise model decodes the same way: its
corrupted positions keep their drawn tokens until they are fixed.

The first forward's log-probs (every position corrupted) are kept too: they give the joint
log-likelihood of a key against its distractors, which must not depend on what greedy decoding chose.
Under context parallelism every rank sees the same summed log-probs, so all ranks fix the same
positions and stay in step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import torch

from longctx.diffusion.noise import generator
from longctx.eval.score import length_chunks
from longctx.objective import ObjectiveKind

# inputs [b, S] and, per row, the positions to read → per row [n, vocab] float32 log-probs there
InfillFn = Callable[[torch.Tensor, Sequence[torch.Tensor]], list[torch.Tensor]]


class Infillable(Protocol):
    """An item infilling can corrupt: its length and its tokens."""

    @property
    def length(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...


T = TypeVar("T", bound=Infillable)


@dataclasses.dataclass(frozen=True)
class Infilled:
    """One item's corrupted positions: the log-probs there from the first forward (all corrupted),
    [n, vocab], and the tokens greedy decoding fixed there, in the same order."""

    logprobs: torch.Tensor
    tokens: list[int]


def corrupt(
    kind: ObjectiveKind,
    tokens: list[int],
    positions: Sequence[int],
    *,
    mask_id: int | None,
    vocab_size: int,
    generator: torch.Generator,
) -> list[int]:
    """`tokens` with `positions` replaced by [MASK] (MDM) or by uniformly drawn tokens (UDM)."""
    out = list(tokens)
    if kind == "mdm":
        if mask_id is None:
            raise ValueError("a masked-diffusion model needs its [MASK] id")
        for p in positions:
            out[p] = mask_id
        return out
    repl = torch.randint(0, vocab_size, (len(positions),), generator=generator).tolist()
    for p, r in zip(positions, repl, strict=True):
        out[p] = r
    return out


def fix_confident(logprobs: torch.Tensor, left: list[int], threshold: float) -> list[tuple[int, int]]:
    """The (index into the positions, token) pairs one round fixes among the indices `left`: each whose
    top probability reaches `threshold`, and the most confident one in any case (ties: the first)."""
    conf, best = logprobs[left].max(-1)
    top = int(conf.argmax())
    sure = conf.exp() >= threshold
    return [(left[k], int(best[k])) for k in range(len(left)) if k == top or bool(sure[k])]


def _decode_chunk(
    inputs: torch.Tensor, wants: list[torch.Tensor], infill: InfillFn, threshold: float
) -> list[Infilled]:
    first: dict[int, torch.Tensor] = {}
    fixed: list[list[int]] = [[-1] * len(w) for w in wants]
    left = [list(range(len(w))) for w in wants]
    rows = list(range(len(wants)))
    while rows:
        logprobs = infill(inputs[rows], [wants[r] for r in rows])
        for r, lp in zip(rows, logprobs, strict=True):
            first.setdefault(r, lp)
            if not left[r]:
                continue
            for k, tok in fix_confident(lp, left[r], threshold):
                fixed[r][k] = tok
                inputs[r, int(wants[r][k])] = tok
                left[r].remove(k)
        rows = [r for r in rows if left[r]]
    return [Infilled(first[r], fixed[r]) for r in range(len(wants))]


def infill_batched(
    items: Sequence[T],
    infill: InfillFn,
    *,
    positions: Callable[[T], list[int]],
    noise_key: Callable[[T], str],
    tag: str,
    kind: ObjectiveKind,
    mask_id: int | None,
    vocab_size: int,
    seed: int,
    threshold: float,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
) -> list[Infilled]:
    """Each item's `positions(item)` corrupted (the noise fixed per (tag, seed, noise_key(item))) and
    decoded most confident first, items of one length batched together."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"the decoding threshold is a probability in (0, 1], got {threshold}")
    out: dict[int, Infilled] = {}
    for chunk in length_chunks([it.length for it in items], batch_size):
        inputs, wants = [], []
        for i in chunk:
            it = items[i]
            where = positions(it)
            g = generator(tag, seed, noise_key(it))
            inputs.append(
                corrupt(kind, it.tokens, where, mask_id=mask_id, vocab_size=vocab_size, generator=g)
            )
            wants.append(torch.tensor(where, dtype=torch.long))
        done = _decode_chunk(torch.tensor(inputs, dtype=torch.long), wants, infill, threshold)
        out.update(zip(chunk, done, strict=True))
        if advance is not None:
            advance(len(chunk))
    return [out[i] for i in range(len(items))]


__all__ = ["InfillFn", "Infillable", "Infilled", "corrupt", "fix_confident", "infill_batched"]
