"""Passkey prompts: exact token length, the needle at exactly the requested token index, the
demo corpus' phrasing, deterministic keys and distractors, and clear errors for bad inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from longctx.errors import EvalError
from longctx.eval.grid import PasskeyGrid, needle_start, segment_tokens

LENGTHS = [96, 257, 1000, 4096]
DEPTHS = [0.0, 0.1, 0.5, 0.9, 1.0]


def _occurrences(seq: list[int], sub: list[int]) -> list[int]:
    n = len(sub)
    return [i for i in range(len(seq) - n + 1) if seq[i : i + n] == sub]


def _check_item(tok: Any, it: Any) -> None:
    tokens = it.tokens
    assert len(tokens) == it.length  # exact length, answer included
    assert len(it.prompt) + len(it.answer) == it.length
    # the needle starts exactly where the depth says
    haystack = it.length - len(segment_tokens(tok, f"the pass key of {it.name} is")) - len(it.answer)
    assert it.needle_start == round(it.depth * (haystack - len(it.needle)))
    assert it.needle_start == needle_start(
        it.length, it.depth, it.length - it.question_start - len(it.answer), len(it.answer), len(it.needle)
    )
    assert tokens[it.needle_start : it.needle_start + len(it.needle)] == it.needle
    # ... and only there; the question ends the prompt; the key is the last tokens
    assert _occurrences(tokens, it.needle) == [it.needle_start]
    assert tok.decode(it.needle).strip() == f"the pass key of {it.name} is {it.key} ."
    assert tok.decode(it.prompt[it.question_start :]).strip() == f"the pass key of {it.name} is"
    assert tok.decode(it.answer).strip() == it.key
    digit_tokens = [t for t, keep in zip(it.answer, it.digit_mask, strict=True) if keep]
    assert "".join(tok.decode([t]).strip() for t in digit_tokens) == it.key.replace(" ", "")
    assert it.question_start == len(it.prompt) - (len(it.prompt) - it.question_start)
    if it.depth == 1.0:
        assert it.needle_start + len(it.needle) == it.question_start
    if it.depth == 0.0:
        assert it.needle_start == 0


@pytest.mark.parametrize("length", LENGTHS)
def test_exact_length_and_depth_sentencepiece(demo_tokenizer: Any, length: int) -> None:
    grid = PasskeyGrid(demo_tokenizer, distractors=3)
    items = grid.grid([length], DEPTHS, keys=3)
    assert len(items) == len(DEPTHS) * 3
    for it in items:
        _check_item(demo_tokenizer, it)
    # from the needle on, the assembled tokens are exactly what the tokenizer makes of that text
    # (segments are tokenized as they appear mid-text)
    for it in items:
        tail = demo_tokenizer.decode(it.tokens[it.needle_start :]).strip()
        assert segment_tokens(demo_tokenizer, tail) == it.tokens[it.needle_start :]


def test_exact_length_and_depth_gpt2_bpe(gpt2_like_dir: Path) -> None:
    from longctx.tokenizer import load_tokenizer

    tok = load_tokenizer(gpt2_like_dir)
    for it in PasskeyGrid(tok, distractors=2).grid([300, 1024], DEPTHS, keys=2):
        _check_item(tok, it)


def test_filler_is_whole_demo_sentences_after_the_needle(demo_tokenizer: Any) -> None:
    it = PasskeyGrid(demo_tokenizer).item(1024, 0.3)
    assert it.natural
    after = demo_tokenizer.decode(it.prompt[it.needle_start + len(it.needle) : it.question_start]).strip()
    # whole sentences: it ends with " ." and every sentence has the grammar's five parts
    assert after.endswith(".")
    for sentence in after.split(" . "):
        assert len(sentence.rstrip(" .").split()) >= 4


def test_deterministic_and_seeded(demo_tokenizer: Any) -> None:
    a = PasskeyGrid(demo_tokenizer, seed=1).grid([512], DEPTHS, keys=2)
    b = PasskeyGrid(demo_tokenizer, seed=1).grid([512], DEPTHS, keys=2)
    c = PasskeyGrid(demo_tokenizer, seed=2).grid([512], DEPTHS, keys=2)
    assert [x.tokens for x in a] == [x.tokens for x in b]
    assert [x.key for x in a] != [x.key for x in c]
    # an item does not depend on which other cells were built
    solo = PasskeyGrid(demo_tokenizer, seed=1).item(512, DEPTHS[3], 1)
    assert solo.tokens == a[3 * 2 + 1].tokens


def test_distractors_differ_and_match_the_key_in_tokens(demo_tokenizer: Any) -> None:
    for it in PasskeyGrid(demo_tokenizer, distractors=5).grid([256], [0.5], keys=4):
        keys = [k for k, _ in it.distractors]
        assert len(keys) == 5 and len(set(keys)) == 5 and it.key not in keys
        assert all(len(toks) == len(it.answer) for _, toks in it.distractors)
        for cand in it.candidates():
            assert len(cand) == it.length and cand[: len(it.prompt)] == it.prompt


def test_pinned_key_and_distractors(demo_tokenizer: Any) -> None:
    it = PasskeyGrid(demo_tokenizer).item(
        200, 0.5, key="3 3 3 3 3", distractor_keys=["1 1 1 1 1"], name="amber"
    )
    assert it.key == "3 3 3 3 3" and it.name == "amber"
    assert [k for k, _ in it.distractors] == ["1 1 1 1 1"]


def test_heldout_filler_exact(demo_tokenizer: Any) -> None:
    filler = list(range(10, 300)) * 20
    grid = PasskeyGrid(demo_tokenizer, filler="heldout", heldout_tokens=filler)
    for it in grid.grid([512, 1024], DEPTHS, keys=1):
        _check_item(demo_tokenizer, it)
        assert not it.natural


@pytest.mark.parametrize(
    ("kwargs", "call", "message"),
    [
        ({}, ("item", 512, 1.5), "needle depth 1.5 is outside [0, 1]"),
        ({}, ("grid", [512], [0.5, -0.1], 1), "needle depths must be fractions in [0, 1]"),
        ({}, ("item", 24, 0.5), "length 24 is too short for a passkey prompt"),
        ({}, ("grid", [512], [0.5], 0), "keys per cell must be ≥ 1"),
        ({"key_digits": 0}, None, "a pass key needs at least one digit"),
        ({"distractors": -1}, None, "the number of distractor keys must be ≥ 0"),
        ({"filler": "heldout"}, None, "held-out filler asked for, but no held-out tokens were given"),
        (
            {"filler": "heldout", "heldout_tokens": [5] * 100},
            ("item", 512, 0.5),
            "held-out filler has 100 tokens",
        ),
        ({"key_digits": 1, "distractors": 10}, ("item", 256, 0.5), "could not find 10 distractor keys"),
    ],
)
def test_bad_inputs(demo_tokenizer: Any, kwargs: dict, call: tuple | None, message: str) -> None:
    with pytest.raises(EvalError) as err:
        grid = PasskeyGrid(demo_tokenizer, **kwargs)
        if call is not None:
            getattr(grid, call[0])(*call[1:])
    assert message in err.value.what
