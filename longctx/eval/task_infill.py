"""The needle tasks of a diffusion model, by infilling.

A closed task item (`longctx.eval.needles`, `closed=True`) ends with restatements
`the pass key of <name> is <key> .`, one per key the question asks: multi-key and the absent control
one (of the asked name), multi-value V (all of the one name), multi-query one per asked name. The
digit tokens of every restatement's key are corrupted together, as the single task corrupts its one
key: the [MASK] id (MDM) or uniformly drawn tokens (UDM); everything else stays clean. The corrupted
positions of all slots are decoded together, most confident first (`longctx.eval.unmask`); each slot's
infilled key is its restatement's key tokens with the decoded ones in the corrupted places.

Scoring (`longctx.eval.task_score.judge`): multi-key, the asked key in its slot; multi-query, each
name's key in that name's slot; multi-value, the slots' keys are the V values in any order (the
restatements name the same person, so no slot belongs to one value); the absent control records
which present key, if any, its slot returns. All slots are as wide as the keys are (they have the
same number of tokens), so the corruption gives nothing away.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from longctx.eval.needles import TaskItem
from longctx.eval.task_score import Decode, TaskItemScore, judge
from longctx.eval.unmask import Infilled, InfillFn, infill_batched
from longctx.objective import ObjectiveKind

_TAG = "longctx-eval-needle-tasks"


def corrupted_positions(item: TaskItem) -> list[int]:
    """Every slot's digit positions, in slot order."""
    return [p for s in item.slots for p in s.positions]


def _infilled(item: TaskItem, infilled: Infilled, decode: Decode) -> tuple[list[str], list[int]]:
    """Each slot's infilled key (as text) and the infilled tokens of all slots."""
    best = infilled.tokens
    at = 0
    texts, tokens = [], []
    for slot in item.slots:
        filled = list(slot.answer)
        for p in slot.positions:
            filled[p - slot.answer_start] = int(best[at])
            at += 1
        texts.append(decode(filled))
        tokens += filled
    return texts, tokens


def score_task_infill(
    items: Sequence[TaskItem],
    infill: InfillFn,
    decode: Decode,
    *,
    kind: ObjectiveKind,
    mask_id: int | None,
    vocab_size: int,
    seed: int,
    threshold: float,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
) -> list[TaskItemScore]:
    """Every closed item infilled and judged; the corruption is fixed per (seed, task, length, depth, index)."""
    for it in items:
        if not it.closed:
            raise ValueError("infilling scores closed items (TaskGrid.item(..., closed=True))")
    done = infill_batched(
        items,
        infill,
        positions=corrupted_positions,
        noise_key=lambda it: f"{it.task}:{it.length}:{it.depth}:{it.index}",
        tag=_TAG,
        kind=kind,
        mask_id=mask_id,
        vocab_size=vocab_size,
        seed=seed,
        threshold=threshold,
        batch_size=batch_size,
        advance=advance,
    )
    return [judge(it, *_infilled(it, d, decode)) for it, d in zip(items, done, strict=True)]
