"""Items of the needle tasks beyond `single` (`longctx.plan.eval_tasks`), at exact token lengths.

An item is exactly `length` tokens: a haystack of H tokens holding every needle ("the pass key of
<name> is <key> ."), then a tail. Its first needle is the asked one (multi-value: the first value's
statement; multi-query: the first asked name's; the absent control: the first present needle) and
starts at token `round(depth · (H − |needle|))`, as the single task's needle does. The other needles
go before or after it wherever they fit, each side drawn with odds proportional to its free room, at
uniformly drawn filler offsets (so they sit at other depths and never overlap). Filler is the passkey
grid's: whole sentences between needles, the tail of a sentence stream before the first.

The tail, for a causal model (generation):

* multikey-K, absent-K: `the pass key of <asked> is` + the key's tokens (absent: a present key's,
  only a first guess of the generation);
* multivalue-V: `the pass keys of <name> are` + `K1 and K2 … and KV .`;
* multiquery-Q: `the pass keys of <A> and <B> … are` + `KA and KB … .`.

The part after the question (`reference`) is the answer in its stated form: its length is the
generation budget (any order of the same keys has the same length), and it is where generation starts.

For a diffusion model (`closed`): one restatement `the pass key of <name> is <key> .` per asked key —
multikey and absent one (absent: a present key's tokens in its slot, corrupted anyway), multivalue V of
the one name, multiquery one per asked name — whose key digits are the slots to infill (`Slot`).

All keys of an item are distinct and have the same number of tokens, so a slot's width tells nothing.
"""

from __future__ import annotations

import dataclasses
import random

from longctx.errors import EvalError
from longctx.eval.grid import PasskeyGrid, needle_start, segment_tokens
from longctx.eval.passkey_text import (
    NAMES,
    passkey_prompt,
    passkey_statement,
    passkeys_answer,
    passkeys_prompt,
)
from longctx.plan.eval_tasks import TaskSpec

_MAX_KEY_TRIES = 200


@dataclasses.dataclass(frozen=True)
class Needle:
    name: str
    key: str
    start: int  # its first token
    tokens: list[int]


@dataclasses.dataclass(frozen=True)
class Slot:
    """A restated key of a closed item: the name, the key in place, the positions of its digit tokens."""

    name: str
    key: str
    positions: list[int]
    answer: list[int]  # the restatement's key tokens (digits and the pieces between them)
    answer_start: int


@dataclasses.dataclass(frozen=True)
class TaskItem:
    task: str
    spec: TaskSpec
    length: int
    depth: float
    index: int
    needles: list[Needle]  # the asked needle first
    asked: list[str]  # the names the question asks
    expected: list[str]  # the keys the answer must hold (none for the absent control)
    tokens: list[int]  # exactly `length`
    haystack: int  # tokens before the tail (question or restatements)
    answer_start: int  # causal: the first generated position (the reference's start)
    reference: list[int]  # causal: the answer in its stated form; empty for closed items
    slots: list[Slot]  # closed: one per restatement; empty for causal items
    natural: bool  # every filler gap between and after the needles is whole sentences
    closed: bool

    @property
    def present(self) -> list[str]:
        """The keys stated in the haystack."""
        return [n.key for n in self.needles]


class TaskGrid:
    """Builds `TaskItem`s with a `PasskeyGrid`'s tokenizer, keys and filler; deterministic in (seed,
    task, length, depth, index)."""

    def __init__(self, grid: PasskeyGrid) -> None:
        self.grid = grid
        self.tok = grid.tok

    def items(
        self, spec: TaskSpec, length: int, depths: list[float], keys: int, *, closed: bool = False
    ) -> list[TaskItem]:
        return [self.item(spec, length, d, i, closed=closed) for d in depths for i in range(keys)]

    def item(
        self,
        spec: TaskSpec,
        length: int,
        depth: float,
        index: int = 0,
        *,
        closed: bool = False,
        keys: list[str] | None = None,
    ) -> TaskItem:
        """The item of cell (length, depth) number `index`; `keys` pins the needles' keys (tests)."""
        if spec.kind == "single":
            raise EvalError("the single task's items are the passkey grid's (PasskeyGrid.item)")
        rng = random.Random(f"{spec.name}:{self.grid.seed}:{length}:{depth!r}:{index}")
        stated, asked = self._names(spec, rng)
        keys = keys or self._keys(len(stated), stated[0], rng)
        needles = [
            segment_tokens(self.tok, passkey_statement(n, k)) for n, k in zip(stated, keys, strict=True)
        ]
        expected = [] if spec.control else keys if spec.kind in ("multivalue", "multiquery") else keys[:1]
        if closed:
            tail, reference = self._restatements(spec, asked, keys), []
        else:
            tail, reference = self._question(spec, asked, keys)
        haystack = length - len(tail) - len(reference)
        if haystack < sum(map(len, needles)):
            raise EvalError(
                f"length {length} is too short for {spec.name}: its needles, question and answer alone take "
                f"{sum(map(len, needles)) + len(tail) + len(reference)} tokens",
                fix=f"use lengths of at least {2 * (sum(map(len, needles)) + len(tail) + len(reference))} tokens",
            )
        first = needle_start(length, depth, len(tail), len(reference), len(needles[0]))
        starts = [first, *place_others(haystack, first, len(needles[0]), [len(n) for n in needles[1:]], rng)]
        filled, natural = self._haystack(haystack, list(zip(starts, needles, strict=True)), rng)
        tokens = filled + tail + reference
        slots = self._slots(haystack, tail, asked, keys, spec) if closed else []
        item = TaskItem(
            task=spec.name,
            spec=spec,
            length=length,
            depth=depth,
            index=index,
            needles=[Needle(n, k, s, t) for n, k, s, t in zip(stated, keys, starts, needles, strict=True)],
            asked=asked,
            expected=list(expected),
            tokens=tokens,
            haystack=haystack,
            answer_start=haystack + len(tail),
            reference=reference,
            slots=slots,
            natural=natural,
            closed=closed,
        )
        if len(tokens) != length or any(
            tokens[s : s + len(t)] != t for s, t in zip(starts, needles, strict=True)
        ):
            raise AssertionError("needle-task item assembled wrongly")  # the arithmetic above guarantees it
        return item

    # -- names and keys --------------------------------------------------------------------------
    @staticmethod
    def _names(spec: TaskSpec, rng: random.Random) -> tuple[list[str], list[str]]:
        """(the name of each needle, the names asked): distinct names, the asked one's needle first."""
        if spec.kind == "multivalue":
            name = rng.choice(NAMES)
            return [name] * spec.count, [name]
        names = rng.sample(NAMES, spec.count + (1 if spec.control else 0))
        if spec.kind == "multikey":
            return names, names[:1]
        if spec.kind == "multiquery":
            return names, list(names)
        return names[:-1], names[-1:]  # absent: the last name is asked, and stated nowhere

    def _keys(self, n: int, name: str, rng: random.Random) -> list[str]:
        """`n` distinct keys with as many tokens (after `name`'s question) as the first."""
        keys = [self.grid.new_key(rng)]
        width = len(self.grid.answer_tokens(name, keys[0]))
        tries = 0
        while len(keys) < n:
            tries += 1
            if tries > _MAX_KEY_TRIES * n:
                raise EvalError(
                    f"could not draw {n} distinct keys of {width} tokens",
                    fix="use fewer needles or more --key-digits",
                )
            k = self.grid.new_key(rng)
            if k not in keys and len(self.grid.answer_tokens(name, k)) == width:
                keys.append(k)
        return keys

    # -- the tail --------------------------------------------------------------------------------
    def _question(self, spec: TaskSpec, asked: list[str], keys: list[str]) -> tuple[list[int], list[int]]:
        """(question, reference answer) of a causal item."""
        if spec.kind in ("multikey", "absent"):
            question = segment_tokens(self.tok, passkey_prompt(asked[0]))
            return question, self.grid.answer_tokens(asked[0], keys[0])
        prompt = passkeys_prompt(asked)
        question = segment_tokens(self.tok, prompt)
        full = segment_tokens(self.tok, f"{prompt} {passkeys_answer(keys)}")
        if full[: len(question)] != question or len(full) == len(question):
            raise EvalError(
                "the tokenizer merges the question and the keys into shared tokens",
                where=repr(prompt),
                fix="evaluate with a tokenizer that splits on whitespace (SentencePiece, GPT-2 BPE)",
            )
        return question, full[len(question) :]

    def _restated(self, spec: TaskSpec, asked: list[str], keys: list[str]) -> list[tuple[str, str]]:
        """(name, key) of each restatement of a closed item."""
        if spec.kind == "multivalue":
            return [(asked[0], k) for k in keys]
        if spec.kind == "multiquery":
            return list(zip(asked, keys, strict=True))
        return [(asked[0], keys[0])]

    def _restatements(self, spec: TaskSpec, asked: list[str], keys: list[str]) -> list[int]:
        return [
            t
            for n, k in self._restated(spec, asked, keys)
            for t in segment_tokens(self.tok, passkey_statement(n, k))
        ]

    def _slots(
        self, haystack: int, tail: list[int], asked: list[str], keys: list[str], spec: TaskSpec
    ) -> list[Slot]:
        """Where each restatement's key digits are, in the item's tokens."""
        slots, at = [], haystack
        for name, key in self._restated(spec, asked, keys):
            question = segment_tokens(self.tok, passkey_prompt(name))
            answer = self.grid.answer_tokens(name, key)
            start = at + len(question)
            digits = [
                start + j for j, t in enumerate(answer) if any(c.isdigit() for c in self.tok.decode([t]))
            ]
            slots.append(Slot(name, key, digits or list(range(start, start + len(answer))), answer, start))
            at += len(segment_tokens(self.tok, passkey_statement(name, key)))
        if at != haystack + len(tail):
            raise EvalError(
                "the tokenizer splits a restatement differently from its question and key",
                fix="evaluate with a tokenizer that splits on whitespace (SentencePiece, GPT-2 BPE)",
            )
        return slots

    # -- the haystack ----------------------------------------------------------------------------
    def _haystack(
        self, size: int, needles: list[tuple[int, list[int]]], rng: random.Random
    ) -> tuple[list[int], bool]:
        """`size` tokens: each needle at its start, filler around them."""
        order = sorted(needles, key=lambda x: x[0])
        gaps, at = [], 0
        for start, toks in order:
            gaps.append(start - at)
            at = start + len(toks)
        gaps.append(size - at)
        if self.grid.filler == "heldout":
            fill = self._heldout(sum(gaps), rng)
            pieces = [fill[sum(gaps[:i]) : sum(gaps[: i + 1])] for i in range(len(gaps))]
            natural = False
        else:
            pieces = [self.grid.filler_before(gaps[0], rng)]
            natural = True
            for g in gaps[1:]:
                piece, whole = self.grid.filler_between(g, rng)
                pieces.append(piece)
                natural = natural and whole
        out = list(pieces[0])
        for (_, toks), piece in zip(order, pieces[1:], strict=True):
            out += toks + piece
        return out, natural

    def _heldout(self, need: int, rng: random.Random) -> list[int]:
        held = self.grid.heldout
        if len(held) < need:
            raise EvalError(
                f"held-out filler has {len(held)} tokens, this item needs {need}",
                fix="use --filler synthetic or more held-out data",
            )
        offset = rng.randrange(len(held) - need + 1)
        return held[offset : offset + need]


def place_others(haystack: int, start: int, size: int, others: list[int], rng: random.Random) -> list[int]:
    """Starts of needles of lengths `others` in a haystack of `haystack` tokens whose needle of `size`
    tokens starts at `start`: each goes before or after it (odds by the free room on each side, among the
    sides it still fits), at uniformly drawn filler offsets there; no two overlap."""
    room = [start, haystack - start - size]
    side_of: list[int] = []
    for n in others:
        fits = [s for s in (0, 1) if room[s] >= n]
        if not fits:
            raise EvalError(
                f"no room for {len(others) + 1} needles in a haystack of {haystack} tokens",
                fix="use longer lengths or fewer needles",
            )
        side = rng.choices(fits, weights=[room[s] for s in fits])[0]
        side_of.append(side)
        room[side] -= n
    starts = [0] * len(others)
    for side, base in ((0, 0), (1, start + size)):
        mine = [i for i, s in enumerate(side_of) if s == side]
        offsets = sorted(rng.randint(0, room[side]) for _ in mine)
        used = 0
        for i, off in zip(mine, offsets, strict=True):
            starts[i] = base + off + used
            used += others[i]
    return starts
