"""Scoring the needle tasks (`longctx.eval.needles`) of a causal model: greedy generation, then a check
of which keys the output holds.

Generation keeps every sequence exactly `length` tokens (so it splits into 2·CP chunks as the passkey
grid does): the answer's positions at the end of the item hold a guess, first the reference answer,
and one forward over the whole item gives the argmax at each of them. Where the argmax first differs
from the guess, the guess is replaced from there on by the argmax, and the forward repeats until guess
and argmax agree everywhere (Jacobi iteration of greedy decoding). Under a causal mask position t sees
only tokens ≤ t, so every agreeing prefix is the greedy decoding's, each forward fixes at least one
more token, and the result is exactly the greedy continuation of `budget` tokens — in one forward
when the model answers the reference, in at most budget + 1 otherwise. Every CP rank gets the same
argmax, so all ranks iterate alike. With a `PrefixExtender` (one process), the rounds after the first
rerun only the positions from the answers' start on, against the first forward's keys and values.

A key counts as returned when it appears in the decoded output as a whole number (no digit right
before or after it). An item is a hit when every expected key is returned, in any order (multi-value:
all values; multi-query: every name's key; multi-key: the asked key). The absent-name control is never
a hit; it records which present key, if any, the output returns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import torch
from pydantic import BaseModel

from longctx.eval.needles import TaskItem
from longctx.eval.prefix_extend import PrefixExtender
from longctx.eval.score import ScoreFn, length_chunks

Decode = Callable[[list[int]], str]


class TaskItemScore(BaseModel):
    task: str
    length: int
    depth: float
    index: int
    asked: list[str]
    expected: list[str]  # the keys the answer must hold (none for the control)
    present: list[str]  # the keys stated in the haystack
    needle_starts: list[int]  # the asked needle first
    output: str  # the greedy generation (infilling: the slots' keys, "; "-separated), decoded
    output_tokens: list[int]
    found: list[bool]  # per expected key: returned
    hit: bool  # every expected key returned (never for the control)
    present_key: str | None = None  # control: the present key the output returns, if any


def returned(text: str, key: str) -> bool:
    """`key` appears in `text` as a whole number."""
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", text) is not None


def judge(item: TaskItem, outputs: Sequence[str], tokens: list[int]) -> TaskItemScore:
    """The score of `item` from its output: one text (a generation), or one per restated slot
    (infilling: slot j must hold expected key j, except multi-value, where the slots' keys must be the
    values in any order)."""
    text = " ; ".join(outputs)
    if len(outputs) > 1 and item.spec.kind == "multivalue":
        left = list(outputs)
        found = []
        for key in item.expected:  # each slot returns one value at most
            j = next((j for j, o in enumerate(left) if returned(o, key)), None)
            found.append(j is not None)
            if j is not None:
                left.pop(j)
    elif len(outputs) > 1:
        found = [returned(o, k) for o, k in zip(outputs, item.expected, strict=True)]
    else:
        found = [returned(text, k) for k in item.expected]
    present = next((k for k in item.present if returned(text, k)), None) if item.spec.control else None
    return TaskItemScore(
        task=item.task,
        length=item.length,
        depth=item.depth,
        index=item.index,
        asked=item.asked,
        expected=item.expected,
        present=item.present,
        needle_starts=[n.start for n in item.needles],
        output=text,
        output_tokens=tokens,
        found=found,
        hit=bool(found) and all(found),
        present_key=present,
    )


def greedy_answers(
    items: Sequence[TaskItem],
    score: ScoreFn,
    *,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
    extend: PrefixExtender | None = None,
) -> list[list[int]]:
    """Each item's greedy continuation of `len(item.reference)` tokens (see the module docstring).
    With `extend`, the rounds after the first rerun the answer positions alone."""
    out: dict[int, list[int]] = {}
    for chunk in length_chunks([it.length for it in items], batch_size):
        seqs = {i: list(items[i].tokens) for i in chunk}
        # the extender for this batch, where its keys and values fit
        ext = extend if extend is not None and extend.fits(len(chunk), items[chunk[0]].length) else None
        with ext.recording() if ext is not None else nullcontext():
            argmax = score(torch.tensor([seqs[i] for i in chunk], dtype=torch.long)).argmax
        if advance is not None:
            advance(len(chunk))
        # the items still changing: a settled one leaves the batch
        active = [i for r, i in enumerate(chunk) if _advance(seqs[i], items[i].answer_start, argmax[r])]
        # every answer's first prediction comes from the token before it: from there on a suffix suffices
        start = min(items[i].answer_start for i in chunk) - 1
        for _ in range(max(len(items[i].reference) for i in chunk)):
            if not active:
                break
            if ext is not None:
                rows = [chunk.index(i) for i in active]
                suffix = torch.tensor([seqs[i][start:] for i in active], dtype=torch.long)
                argmax, offset = ext.argmax(rows, suffix, start)[:, :-1], start
            else:
                argmax = score(torch.tensor([seqs[i] for i in active], dtype=torch.long)).argmax
                offset = 0
            active = [
                i for r, i in enumerate(active) if _advance(seqs[i], items[i].answer_start, argmax[r], offset)
            ]
        if ext is not None:
            ext.release()
        for i in chunk:
            out[i] = seqs[i][items[i].answer_start :]
    return [out[i] for i in range(len(items))]


def _advance(seq: list[int], start: int, argmax: Sequence[int], offset: int = 0) -> bool:
    """Replace `seq`'s guess from its first disagreement with the argmax on; False where none is left.
    `argmax[j]` is the prediction after token `offset + j`."""
    for t in range(start, len(seq)):
        if int(argmax[t - 1 - offset]) != seq[t]:
            seq[t:] = [int(x) for x in argmax[t - 1 - offset :]]
            return True
    return False


def score_tasks(
    items: Sequence[TaskItem],
    score: ScoreFn,
    decode: Decode,
    *,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
    extend: PrefixExtender | None = None,
) -> list[TaskItemScore]:
    """Every item's greedy answer, judged."""
    answers = greedy_answers(items, score, batch_size=batch_size, advance=advance, extend=extend)
    return [judge(it, [decode(a)], a) for it, a in zip(items, answers, strict=True)]
