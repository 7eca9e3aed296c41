"""The demo corpus: filler with one pass key per document, stated once and restated further on.

Each document is filler sentences from the evaluation's grammar (`longctx.eval.passkey_text`) with one
pass-key statement at a random depth and one to three restatements at random later points (and one
more per 20 sentences in long documents). The digits
of a restatement are predictable only by copying them from the statement, at whatever gap separates
them, so a model learns to retrieve over the distances its training length holds. The choices, each of
which a small model needs (measured while building the published demo base):

* one key per document: the question "the pass key of X is" then has one statement to match, so a
  copy circuit keyed on a single token ("is") suffices, as in the evaluation's haystacks;
* keys of distinct digits written together (`random_key`): each digit is one token that names the next;
* the first restatement at a gap drawn uniformly from none to the document's length (a narrow gap range
  teaches a positional shortcut instead of a copy, and with both ends placed uniformly the longest
  gaps, which the evaluation's depth 0 asks for, would be rare), further ones anywhere after the
  statement, and one document in eight opening with its key, as a needle at depth 0 does. The density
  of restatements grows with position (each needs the statement before it), so a model that copies
  has a loss that falls with position inside its window.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

from longctx.eval.passkey_text import NAMES, filler_sentence, passkey_statement, random_key

WORDS_PER_SENTENCE = 10  # the grammar's sentences are 9 to 13 words (about 14 tokens)


def document(rng: random.Random, approx_words: int) -> str:
    """One document of about `approx_words` words: filler, one key, one to three restatements after it."""
    n_sent = max(2, approx_words // WORDS_PER_SENTENCE)
    sentences = [filler_sentence(rng) for _ in range(n_sent)]
    stmt = passkey_statement(rng.choice(NAMES), random_key(rng))
    # the first restatement's gap is uniform, from none (the evaluation's depth 1 asks right after the
    # needle) to the whole document (depth 0: the longest distance, rare if both ends were uniform)
    gap = rng.randint(0, n_sent)
    # one document in eight opens with its key, as a needle at depth 0 opens the evaluation's sequence
    first = 0 if rng.random() < 0.125 else rng.randint(0, n_sent - gap)
    inserts = [(first, stmt), (first + gap, stmt)]
    # and one more per 20 sentences: a long document restates its key often enough that copying it
    # shows in the mean loss (short documents, n < 20, draw exactly as without this term)
    inserts += [(rng.randint(first, n_sent), stmt) for _ in range(rng.randint(0, 2) + n_sent // 20)]
    # inserted from the back so earlier indices stay valid; a restatement never precedes the statement
    for at, text in sorted(inserts, key=lambda x: x[0], reverse=True):
        sentences.insert(at, text)
    return " ".join(sentences)


def documents(count: int, *, seed: int, min_words: int, max_words: int) -> Iterator[str]:
    """`count` documents with lengths spread log-uniformly between min_words and max_words."""
    rng = random.Random(seed)
    lo, hi = math.log(min_words), math.log(max_words)
    for _ in range(count):
        yield document(rng, int(math.exp(rng.uniform(lo, hi))))


def write_jsonl(path: Path, docs: Iterator[str]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for text in docs:
            f.write(json.dumps({"text": text}) + "\n")
            n += 1
    return n
