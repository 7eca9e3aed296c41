"""The demo's 4K pass-key corpus trains the top of the 4K window.

With `packing = "documents"` a window only trains the distances its document pieces span. Documents
shorter than the window (or barely longer) almost never fill a window, so the last few dozen distances
of the window go untrained: the tiny MDM extended at RoPE base 28M read no key at 4,096 tokens (1 %),
every key at 4,064, its layer-0 heads putting a third of their attention on the tokens 4,073+ positions
away, and 0.09 % of its training tokens saw a distance in the top 1/64 of the window. Here the corpus must let whole windows lie
inside one document often enough that the top 1/64 of the window is trained at least a quarter as much
as whole windows (concatenation) would train it: about one window in four inside one document.
"""

from __future__ import annotations

import numpy as np
import pytest

from longctx.data.coverage import distance_coverage
from longctx.demo.corpus import documents
from longctx.demo.published import family_dir
from longctx.demo.run import STAGE_CORPORA
from longctx.tokenizer.load import load_tokenizer

WINDOW = {"long1k": 1024, "long4k": 4096}
SAMPLE = 60  # documents tokenized per corpus: their lengths, resampled, stand for the corpus


@pytest.mark.parametrize("name", sorted(WINDOW))
def test_stage_corpus_fills_whole_windows(name: str) -> None:
    corpus = next(c for c in STAGE_CORPORA if c.name == name)
    s = WINDOW[name]
    tok = load_tokenizer(family_dir("mdm") / "tokenizer")
    docs = documents(SAMPLE, seed=corpus.seed, min_words=corpus.min_words, max_words=corpus.max_words)
    lengths = np.array([len(tok.encode(text)) + 1 for text in docs])  # + the EOD tokenization appends
    lengths = np.random.default_rng(0).choice(lengths, size=corpus.docs)
    top = s - s // 64
    got = distance_coverage([lengths], [1.0], s, packing="documents", causal=False).share_at(top)
    # a whole window: the outer 2·(S − d) tokens of each window see a distance ≥ d
    whole = 2 * (s - top) / s
    assert got >= 0.25 * whole, (
        f"{name}: {got:.3%} of the training tokens see a distance ≥ {top:,} of the {s:,}-token window; "
        f"whole windows give {whole:.3%} (documents of {corpus.min_words:,}–{corpus.max_words:,} words "
        f"are {int(lengths.min()):,}–{int(lengths.max()):,} tokens)"
    )
