"""The demo's 4K pass-key corpus trains the top of the 4K window.

With `packing = "documents"` a window only trains the distances its document pieces span. Documents
shorter than the window (or barely longer) almost never fill a window, so the last few dozen distances
of the window go untrained: the tiny MDM extended at RoPE base 28M read no key at 4,096 tokens (1 %),
every key at 4,064, its layer-0 heads putting a third of their attention on the tokens 4,073+ positions
away, and 0.09 % of its training tokens saw a distance in the top 1/64 of the window. Here each
stage's mix (70 % pass-key documents, 30 % short ones) must train the top 1/32 of the window at least
as often as `plan check --check-data` asks before it warns (a quarter of what whole windows, as
concatenation, would give).
"""

from __future__ import annotations

import numpy as np
import pytest

from longctx.data.coverage import distance_coverage
from longctx.demo.corpus import documents
from longctx.demo.published import family_dir
from longctx.demo.run import REACH_CORPORA
from longctx.plan.coverage_check import SPARSE
from longctx.tokenizer.load import load_tokenizer

WINDOW = {"long1k": 1024, "long4k": 4096, "long16k": 16384}
SAMPLE = 60  # documents tokenized per corpus: their lengths, resampled, stand for the corpus


@pytest.mark.parametrize("name", sorted(WINDOW))
def test_stage_corpus_fills_whole_windows(name: str) -> None:
    corpus, short = (next(c for c in REACH_CORPORA["16k"] if c.name == n) for n in (name, "short"))
    s = WINDOW[name]
    tok = load_tokenizer(family_dir("mdm") / "tokenizer")
    rng = np.random.default_rng(0)

    def lengths(c) -> np.ndarray:  # + the EOD tokenization appends
        docs = documents(
            SAMPLE,
            seed=c.seed,
            min_words=c.min_words,
            max_words=c.max_words,
            names=c.names,
            any_digit=c.any_digit,
        )
        return rng.choice(np.array([len(tok.encode(text)) + 1 for text in docs]), size=c.docs)

    top = s - s // 32
    # mixed as the demo's plans mix them: 70 % pass-key documents, 30 % the base's short ones
    got = distance_coverage(
        [lengths(corpus), lengths(short)], [0.7, 0.3], s, packing="documents", causal=False
    ).share_at(top)
    whole = 2 * (s - top) / s  # a whole window: its outer 2·(S − d) tokens see a distance ≥ d
    assert got >= SPARSE * whole, (
        f"{name}: {got:.3%} of the training tokens see a distance ≥ {top:,} of the {s:,}-token window; "
        f"whole windows give {whole:.3%} (documents of {corpus.min_words:,}–{corpus.max_words:,} words)"
    )
