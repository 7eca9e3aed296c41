"""A synthetic corpus with genuinely long documents and long-range dependencies.

Documents are filler sentences (a small grammar over a fixed word list, so the local statistics are
learnable) interleaved with two kinds of long-range structure:

* pass keys — "the pass key of <name> is <digits> ." stated and restated later, at gaps from a few
  tokens to the whole document: the digits of the restatement are predictable only by looking back;
* echoes — a paragraph repeated verbatim thousands of tokens later.

A model that uses its context has lower loss on restatements and echoes than on filler, and the gap
needs attention over the distance between them: exactly what a context extension must deliver. The
sentences and phrasing are the passkey evaluation's own (`longctx.eval.passkey_text`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

from longctx.eval.passkey_text import NAMES, filler_sentence, passkey_statement, random_key


def document(rng: random.Random, approx_words: int, *, key_every: int = 6) -> str:
    """One document of about `approx_words` words with pass keys and an echo spread across it.

    About one sentence in `key_every` is a pass-key statement. Each key is restated later at a gap
    drawn log-uniformly from one sentence to the whole document, so short gaps (which a model learns
    to bridge first, inside a short pretraining window) and long ones (which only a longer context can
    bridge) both occur at every training length. Names are unique within a document, so a restatement
    has exactly one answer.
    """
    n_sent = max(4, approx_words // 8)
    sentences = [filler_sentence(rng) for _ in range(n_sent)]
    n_keys = min(len(NAMES), max(1, n_sent // key_every))
    names = rng.sample(NAMES, n_keys)
    # positions are chosen on the filler, then inserted from the back so earlier indices stay valid
    inserts: list[tuple[int, str]] = []
    for name in names:
        stmt = passkey_statement(name, random_key(rng))
        first = rng.randrange(0, n_sent)
        gap = int(math.exp(rng.uniform(0.0, math.log(n_sent))))
        inserts.append((first, stmt))
        inserts.append((min(n_sent, first + gap), stmt))
    # an echo: a paragraph repeated verbatim further on
    if n_sent >= 24:
        start = rng.randrange(0, n_sent // 3)
        para = " ".join(sentences[start : start + 6])
        inserts.append((rng.randrange(start + 6, n_sent + 1), para))
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
