"""The demo corpus: filler with named pass keys, each stated once and restated further on.

Each document is filler sentences from the evaluation's grammar (`longctx.eval.passkey_text`) with one
or more pass-key statements ("the pass key of <name> is <key> .") at random depths and one to three
restatements of each at random later points (and one more per 20 sentences in long documents). The
digits of a restatement are predictable only by copying them from its statement, at whatever gap
separates them, so a model learns to retrieve over the distances its training length holds. The
choices, each of which a small model needs (measured while building the published demo bases):

* `names=1`, one key per document, first: the question "the pass key of X is" then has one statement
  to match, so a copy circuit keyed on a single token ("is") suffices. A 2-layer model forms that
  circuit in 20M tokens; asked among several names it then answers with one of them at random;
* `names=K` after it: one to K statements under different names, restated in any order, so the
  restatement's first digit is predictable only by matching the name. The copy circuit from the first
  corpus learns that lookup in a few million tokens, where a model trained on several names from the
  start stayed at chance for 8–25M;
* keys of distinct digits written together (`random_key`) first: each digit is one token that names the
  next; `any_digit` then mixes in keys with repeated digits (`any_digit_key`), whose copy must match
  more than the last digit;
* the first restatement at a gap drawn uniformly from none to the document's length (a narrow gap range
  teaches a positional shortcut instead of a copy, and with both ends placed uniformly the longest
  gaps, which the evaluation's depth 0 asks for, would be rare), further ones anywhere after the
  statement, and one statement in eight opening the document, as a needle at depth 0 does. The density
  of restatements grows with position (each needs the statement before it), so a model that copies
  has a loss that falls with position inside its window.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

from longctx.eval.passkey_text import NAMES, any_digit_key, filler_sentence, passkey_statement, random_key

WORDS_PER_SENTENCE = 10  # the grammar's sentences are 9 to 13 words (about 14 tokens)


def _key(rng: random.Random, any_digit: float, taken: list[str]) -> str:
    """A key not in `taken`: of any digits with probability `any_digit`, else of distinct digits."""
    while True:
        key = any_digit_key(rng) if any_digit > 0 and rng.random() < any_digit else random_key(rng)
        if key not in taken:
            return key


def _placements(rng: random.Random, n_sent: int, stmt: str) -> list[tuple[int, int, str]]:
    """Where one key's statement (kind 0) and restatements (kind 1) go, as sentence indices."""
    # the first restatement's gap is uniform, from none (the evaluation's depth 1 asks right after the
    # needle) to the whole document (depth 0: the longest distance, rare if both ends were uniform)
    gap = rng.randint(0, n_sent)
    # one statement in eight opens the document, as a needle at depth 0 opens the evaluation's sequence
    first = 0 if rng.random() < 0.125 else rng.randint(0, n_sent - gap)
    at = [(first, 0, stmt), (first + gap, 1, stmt)]
    # and one more per 20 sentences: a long document restates its key often enough that copying it
    # shows in the mean loss (short documents, n < 20, draw exactly as without this term)
    return at + [(rng.randint(first, n_sent), 1, stmt) for _ in range(rng.randint(0, 2) + n_sent // 20)]


def document(rng: random.Random, approx_words: int, *, names: int = 1, any_digit: float = 0.0) -> str:
    """One document of about `approx_words` words: filler, one to `names` keys under distinct names,
    each restated one to three times after its statement."""
    n_sent = max(2, approx_words // WORDS_PER_SENTENCE)
    sentences = [filler_sentence(rng) for _ in range(n_sent)]
    count = 1 if names == 1 else rng.randint(1, names)  # names=1 draws as the one-key corpus always did
    chosen: list[str] = []
    keys: list[str] = []
    inserts: list[tuple[int, int, str]] = []
    for _ in range(count):
        name = rng.choice([n for n in NAMES if n not in chosen]) if chosen else rng.choice(NAMES)
        key = _key(rng, any_digit, keys)
        chosen.append(name)
        keys.append(key)
        inserts += _placements(rng, n_sent, passkey_statement(name, key))
    # inserted from the back so earlier indices stay valid; at one index a statement goes before the
    # restatements, so a restatement never precedes its statement
    for at, _, text in sorted(inserts, key=lambda x: (x[0], x[1]), reverse=True):
        sentences.insert(at, text)
    return " ".join(sentences)


def documents(
    count: int, *, seed: int, min_words: int, max_words: int, names: int = 1, any_digit: float = 0.0
) -> Iterator[str]:
    """`count` documents with lengths spread log-uniformly between min_words and max_words."""
    rng = random.Random(seed)
    lo, hi = math.log(min_words), math.log(max_words)
    for _ in range(count):
        yield document(rng, int(math.exp(rng.uniform(lo, hi))), names=names, any_digit=any_digit)


def write_jsonl(path: Path, docs: Iterator[str]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for text in docs:
            f.write(json.dumps({"text": text}) + "\n")
            n += 1
    return n
