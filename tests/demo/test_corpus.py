"""The demo corpus: pass keys restated only after they are stated, at gaps spread over the whole
document; one key per document in keys a small copy circuit can follow (distinct digits written
together), or several under distinct names, some of repeated digits, that only a lookup by name follows."""

from __future__ import annotations

import random
import re
import statistics

from longctx.demo.corpus import WORDS_PER_SENTENCE, document, documents
from longctx.eval.passkey_text import random_key

STATEMENT = re.compile(r"the pass key of (\w+) is (\d+) \.")


def test_one_key_per_document_restated_after_it() -> None:
    rng = random.Random(0)
    for _ in range(200):
        words = rng.randint(40, 3000)
        text = document(rng, words)
        found = [(m.start(), m.group(1), m.group(2)) for m in STATEMENT.finditer(text)]
        extra = words // WORDS_PER_SENTENCE // 20
        assert 2 + extra <= len(found) <= 4 + extra, found  # the statement, 1–3 restatements, 1 per 20
        assert found[0][0] == 0 or text[: found[0][0]].count(" . ") >= 1  # filler before, or opens with it
        assert len({(name, key) for _, name, key in found}) == 1  # one key, one name


def test_gaps_cover_the_document() -> None:
    rng = random.Random(1)
    fractions = []
    for _ in range(400):
        text = document(rng, 190)  # under 20 sentences: the statement and 1–3 restatements alone
        starts = [m.start() for m in STATEMENT.finditer(text)]
        fractions += [(s - starts[0]) / len(text) for s in starts[1:]]
    # restatements land from right after the statement to the far end: no narrow band of gaps, and
    # the longest gaps (a needle at depth 0) are common, not a corner of the distribution
    assert min(fractions) < 0.06 and max(fractions) > 0.95  # 0.05: one statement after the other
    assert 0.35 < statistics.median(fractions) < 0.55
    assert sum(f > 0.8 for f in fractions) / len(fractions) > 0.1


def test_keys_are_distinct_digits_written_together() -> None:
    rng = random.Random(2)
    keys = [random_key(rng) for _ in range(500)]
    assert all(len(k) == 5 and k.isdigit() and len(set(k)) == 5 for k in keys)
    assert len(set(keys)) > 450
    assert len(random_key(rng, 12)) == 12  # more digits than there are: repeats allowed


def test_documents_are_seeded() -> None:
    a = list(documents(5, seed=3, min_words=50, max_words=500))
    assert a == list(documents(5, seed=3, min_words=50, max_words=500))
    assert a != list(documents(5, seed=4, min_words=50, max_words=500))


def test_named_keys_are_distinct_and_each_restated_after_its_statement() -> None:
    rng = random.Random(5)
    counts, repeated = [], 0
    for _ in range(300):
        text = document(rng, rng.randint(80, 170), names=4, any_digit=0.5)
        found = [(m.group(1), m.group(2)) for m in STATEMENT.finditer(text)]
        pairs = dict.fromkeys(found)  # first-seen order: the statements
        names, keys = [n for n, _ in pairs], [k for _, k in pairs]
        assert len(set(names)) == len(names) and len(set(keys)) == len(keys)  # a name has one key
        for name, key in pairs:  # the statement, then 1–3 restatements of the same key
            assert 2 <= found.count((name, key)) <= 4
        counts.append(len(pairs))
        repeated += sum(len(set(k)) < 5 for k in keys)
    assert set(counts) == {1, 2, 3, 4}  # one to four names, each count common
    assert min(counts.count(n) for n in (1, 2, 3, 4)) > 40
    # half the keys are drawn with repeats allowed, and 70 % of those repeat a digit
    assert 0.25 < repeated / sum(counts) < 0.45


def test_one_name_draws_as_the_one_key_corpus() -> None:
    """names=1 keeps the stream the copy phase and the tokenizer sample were built from."""
    a = list(documents(30, seed=7, min_words=80, max_words=170))
    assert a == list(documents(30, seed=7, min_words=80, max_words=170, names=1, any_digit=0.0))
    assert a != list(documents(30, seed=7, min_words=80, max_words=170, names=4))
