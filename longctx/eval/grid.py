"""Passkey / needle-in-a-haystack prompts at exact token lengths and needle depths.

One item is a token sequence of exactly `length` tokens, assembled at the token level:

    [filler][needle: "the pass key of <name> is <key> ."][filler]
        [question: "the pass key of <name> is"][answer: the key]

`length` counts everything the model sees in one forward, the answer included, so an item at the
model's training length stays inside its window (and splits evenly for context parallelism). The
haystack is the first H = length − |question| − |answer| tokens; the needle starts at token
`round(depth · (H − |needle|))`: depth 0 puts it at token 0, depth 1 right before the question.

The phrasing is `longctx.eval.passkey_text`'s, which the demo corpus trains on, so models trained
on it are asked in the form they saw. Segments are tokenized as they appear mid-text (after ". "), so joined segments
are what the tokenizer produces for the joined text. Synthetic filler is whole sentences wherever
the arithmetic allows: the part before the needle is the tail of a sentence stream (only its first
sentence is cut, like a training sample that starts mid-document) and the part after it is whole
sentences chosen to fill the gap exactly (`natural=False` marks the rare item where a sentence had
to be cut). Held-out filler is a window of held-out tokens with the needle spliced in.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Literal

from longctx.errors import EvalError
from longctx.eval.passkey_text import (
    NAMES,
    any_digit_key,
    filler_sentence,
    passkey_prompt,
    passkey_statement,
    random_key,
)
from longctx.tokenizer.load import LoadedTokenizer

FillerKind = Literal["synthetic", "heldout"]
_CONTEXT = "."  # what precedes a segment when it is tokenized "mid-text"
_POOL = 512  # synthetic sentences tokenized once per builder
_MAX_KEY_TRIES = 200


@dataclasses.dataclass(frozen=True)
class PasskeyItem:
    """One passkey prompt: `prompt + answer` is exactly `length` tokens."""

    length: int
    depth: float
    index: int  # which key of the (length, depth) cell
    name: str
    key: str
    prompt: list[int]  # haystack + question
    answer: list[int]  # the key's tokens
    distractors: list[tuple[str, list[int]]]  # other keys, each as many tokens as `answer`
    needle: list[int]
    needle_start: int
    question_start: int
    natural: bool  # every filler sentence after the needle is whole
    digit_mask: list[bool]  # answer tokens that carry digits (not the spaces between them)
    # what closes the restatement after the key (infilling items: the rest of the needle's sentence);
    # empty for a continuation, whose answer ends the sequence
    closing: list[int] = dataclasses.field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.answer + self.closing

    @property
    def answer_start(self) -> int:
        return len(self.prompt)

    @property
    def answer_end(self) -> int:
        return len(self.prompt) + len(self.answer)

    def candidates(self) -> list[list[int]]:
        """Full sequences: the true key first, then each distractor."""
        return [self.tokens] + [self.prompt + d + self.closing for _, d in self.distractors]


def segment_tokens(tokenizer: LoadedTokenizer, text: str) -> list[int]:
    """Tokens of `text` as it appears after ". " in running text (SentencePiece and GPT-2 BPE alike)."""
    ctx = tokenizer.encode(_CONTEXT)
    both = tokenizer.encode(f"{_CONTEXT} {text}")
    if both[: len(ctx)] == ctx and len(both) > len(ctx):
        return both[len(ctx) :]
    return tokenizer.encode(text)


def needle_start(length: int, depth: float, question: int, answer: int, needle: int) -> int:
    """Token index of the needle's first token (see the module docstring)."""
    haystack = length - question - answer
    return round(depth * (haystack - needle))


def check_depths(depths: Sequence[float]) -> list[float]:
    out = [float(d) for d in depths]
    bad = [d for d in out if not 0.0 <= d <= 1.0]
    if bad or not out:
        raise EvalError(
            f"needle depths must be fractions in [0, 1]; got {bad or 'none'}",
            fix="e.g. --depths 0,0.25,0.5,0.75,1",
        )
    return out


class PasskeyGrid:
    """Builds `PasskeyItem`s for one tokenizer; deterministic in (seed, length, depth, index)."""

    def __init__(
        self,
        tokenizer: LoadedTokenizer,
        *,
        seed: int = 1234,
        key_digits: int = 5,
        distractors: int = 3,
        filler: FillerKind = "synthetic",
        heldout_tokens: Sequence[int] | None = None,
        any_digit_keys: bool = False,
    ) -> None:
        if key_digits < 1:
            raise EvalError(f"a pass key needs at least one digit, got {key_digits}")
        if distractors < 0:
            raise EvalError(f"the number of distractor keys must be ≥ 0, got {distractors}")
        if filler == "heldout" and not heldout_tokens:
            raise EvalError(
                "held-out filler asked for, but no held-out tokens were given",
                fix="use --filler synthetic, or give the plan's data (its held-out split) as the filler source",
            )
        if filler not in ("synthetic", "heldout"):
            raise EvalError(f"unknown filler {filler!r}", fix="use synthetic or heldout")
        self.tok = tokenizer
        self.seed = seed
        self.key_digits = key_digits
        self.distractors = distractors
        self.filler = filler
        self.heldout = list(heldout_tokens or [])
        self.any_digit_keys = any_digit_keys
        self._pool: list[list[int]] | None = None
        self._by_len: dict[int, list[int]] = {}
        self._reach: list[bool] = []

    # -- synthetic filler ------------------------------------------------------------------------
    def _sentences(self) -> list[list[int]]:
        if self._pool is None:
            rng = random.Random(f"filler-pool:{self.seed}")
            texts = [filler_sentence(rng) for _ in range(_POOL)]
            # only sentences with tokens: every draw of the filler loops below then adds at least one
            self._pool = [toks for toks in (segment_tokens(self.tok, t) for t in texts) if toks]
            if not self._pool:
                raise EvalError(
                    "the tokenizer encodes every filler sentence to no token, so no haystack can be built",
                    fix="evaluate with the model's own tokenizer, or use --filler heldout",
                )
            for i, toks in enumerate(self._pool):
                self._by_len.setdefault(len(toks), []).append(i)
            # reach[r]: r tokens can be filled with whole pool sentences (unbounded repetition)
            limit = 6 * max(self._by_len)
            reach = [False] * (limit + 1)
            reach[0] = True
            for r in range(1, limit + 1):
                reach[r] = any(r >= n and reach[r - n] for n in self._by_len)
            self._reach = reach
        return self._pool

    def _left(self, n: int, rng: random.Random) -> list[int]:
        """The last `n` tokens of a stream of whole sentences (ends on a sentence boundary)."""
        pool = self._sentences()
        out: list[int] = []
        while len(out) < n:
            out = list(pool[rng.randrange(len(pool))]) + out
        return out[len(out) - n :] if n else []

    def _right(self, n: int, rng: random.Random) -> tuple[list[int], bool]:
        """Exactly `n` tokens of whole sentences when possible; else a cut last sentence."""
        pool = self._sentences()
        reach, lens = self._reach, sorted(self._by_len)
        limit = len(reach) - 1
        chosen: list[list[int]] = []
        remaining = n
        # random sentences down to the last 5–6 sentence lengths, which the table then fills exactly
        # (every remainder that large is reachable unless all sentence lengths share a factor)
        while remaining > limit:
            s = pool[rng.randrange(len(pool))]
            chosen.append(s)
            remaining -= len(s)
        if reach[remaining]:
            while remaining > 0:
                fits = [n_ for n_ in lens if n_ <= remaining and reach[remaining - n_]]
                n_ = rng.choice(fits)
                chosen.append(pool[rng.choice(self._by_len[n_])])
                remaining -= n_
            return [t for s in chosen for t in s], True
        # too few tokens for any whole sentence: cut one
        out = [t for s in chosen for t in s]
        while len(out) < n:
            out += pool[rng.randrange(len(pool))]
        return out[:n], False

    def filler_before(self, n: int, rng: random.Random) -> list[int]:
        """`n` filler tokens that end on a sentence boundary (the tail of a sentence stream)."""
        return self._left(n, rng)

    def filler_between(self, n: int, rng: random.Random) -> tuple[list[int], bool]:
        """Exactly `n` filler tokens of whole sentences when possible (False: the last one is cut)."""
        return self._right(n, rng)

    # -- keys ------------------------------------------------------------------------------------
    def new_key(self, rng: random.Random) -> str:
        """A key of `key_digits` digits: distinct digits, or any digits with `any_digit_keys`."""
        return (any_digit_key if self.any_digit_keys else random_key)(rng, self.key_digits)

    def answer_tokens(self, name: str, key: str) -> list[int]:
        """The tokens of `key` continuing the question of `name`."""
        return self._answer(name, key, segment_tokens(self.tok, passkey_prompt(name)))

    def _answer(self, name: str, key: str, question: list[int]) -> list[int]:
        full = segment_tokens(self.tok, f"{passkey_prompt(name)} {key}")
        if full[: len(question)] != question or len(full) == len(question):
            raise EvalError(
                "the tokenizer merges the question and the key into shared tokens, so the key cannot "
                "be scored as a continuation",
                where=f"{passkey_prompt(name)!r} + {key!r}",
                fix="evaluate with a tokenizer that splits on whitespace (SentencePiece, GPT-2 BPE)",
            )
        return full[len(question) :]

    def _distractors(
        self, name: str, key: str, answer: list[int], question: list[int], rng: random.Random
    ) -> list[tuple[str, list[int]]]:
        out: list[tuple[str, list[int]]] = []
        seen = {key}
        tries = 0
        while len(out) < self.distractors:
            tries += 1
            if tries > _MAX_KEY_TRIES * max(1, self.distractors):
                raise EvalError(
                    f"could not find {self.distractors} distractor keys of {len(answer)} tokens like {key!r}",
                    fix="use fewer --distractors or more --key-digits",
                )
            d = self.new_key(rng)
            if d in seen:
                continue
            toks = self._answer(name, d, question)
            if len(toks) != len(answer):
                continue
            seen.add(d)
            out.append((d, toks))
        return out

    # -- items -----------------------------------------------------------------------------------
    def item(
        self,
        length: int,
        depth: float,
        index: int = 0,
        *,
        key: str | None = None,
        distractor_keys: Sequence[str] | None = None,
        name: str | None = None,
        closed: bool = False,
    ) -> PasskeyItem:
        """The item of cell (length, depth) number `index`; `key`/`name`/`distractor_keys` pin them
        (tests use that for models whose answer is known). `closed`: the restatement ends as the needle's
        sentence does (" ."), so the key sits inside the text — what infilling a key means for a
        bidirectional model; otherwise the key ends the sequence, as a continuation does."""
        if not 0.0 <= depth <= 1.0:
            raise EvalError(
                f"needle depth {depth} is outside [0, 1]", fix="give depths as fractions, e.g. 0.5"
            )
        rng = random.Random(f"passkey:{self.seed}:{length}:{depth!r}:{index}")
        name = name or rng.choice(NAMES)
        key = key or self.new_key(rng)
        needle = segment_tokens(self.tok, passkey_statement(name, key))
        question = segment_tokens(self.tok, passkey_prompt(name))
        answer = self._answer(name, key, question)
        if distractor_keys is not None:
            distractors = []
            for d in distractor_keys:
                toks = self._answer(name, d, question)
                if len(toks) != len(answer):
                    raise EvalError(f"distractor {d!r} has {len(toks)} tokens, the key {len(answer)}")
                distractors.append((d, toks))
        else:
            distractors = self._distractors(name, key, answer, question, rng)
        digits = [any(ch.isdigit() for ch in self.tok.decode([t])) for t in answer]
        closing = self._closing(needle, question, answer) if closed else []
        ask = len(question) + len(answer) + len(closing)  # what follows the haystack
        haystack = length - ask
        if haystack < len(needle):
            raise EvalError(
                f"length {length} is too short for a passkey prompt: the needle, question and answer "
                f"alone take {len(needle) + ask} tokens",
                fix=f"use lengths of at least {2 * (len(needle) + ask)} tokens",
            )
        start = needle_start(length, depth, len(question) + len(closing), len(answer), len(needle))
        after = haystack - start - len(needle)
        if self.filler == "synthetic":
            left = self._left(start, rng)
            right, natural = self._right(after, rng)
        else:
            need = start + after
            if len(self.heldout) < need:
                raise EvalError(
                    f"held-out filler has {len(self.heldout)} tokens, the length {length} needs {need}",
                    fix="use --filler synthetic or more held-out data",
                )
            offset = rng.randrange(len(self.heldout) - need + 1)
            window = self.heldout[offset : offset + need]
            left, right, natural = window[:start], window[start:], False
        prompt = left + needle + right + question
        item = PasskeyItem(
            length=length,
            depth=depth,
            index=index,
            name=name,
            key=key,
            prompt=prompt,
            answer=answer,
            distractors=distractors,
            needle=needle,
            needle_start=start,
            question_start=start + len(needle) + after,
            natural=natural,
            digit_mask=digits if any(digits) else [True] * len(answer),
            closing=closing,
        )
        if len(item.tokens) != length or item.tokens[start : start + len(needle)] != needle:
            raise AssertionError("passkey item assembled wrongly")  # the arithmetic above guarantees it
        return item

    @staticmethod
    def _closing(needle: list[int], question: list[int], answer: list[int]) -> list[int]:
        """The needle's tokens after its key (the sentence's end), which a closed restatement repeats."""
        head = question + answer
        if needle[: len(head)] != head:
            raise EvalError(
                "the tokenizer splits the statement's key differently from the restatement's, so the "
                "restatement cannot be closed as the needle is",
                fix="evaluate with a tokenizer that splits on whitespace (SentencePiece, GPT-2 BPE)",
            )
        return needle[len(head) :]

    def cell(self, length: int, depth: float, keys: int, *, closed: bool = False) -> list[PasskeyItem]:
        return [self.item(length, depth, i, closed=closed) for i in range(keys)]

    def grid(
        self, lengths: Sequence[int], depths: Sequence[float], keys: int, *, closed: bool = False
    ) -> list[PasskeyItem]:
        if keys < 1:
            raise EvalError(f"keys per cell must be ≥ 1, got {keys}")
        return [
            it for n in lengths for d in check_depths(depths) for it in self.cell(n, d, keys, closed=closed)
        ]
