from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.errors import TokenizerError
from longctx.tokenizer import padded_vocab_size, padding_table


def test_openeurollm_figures() -> None:
    assert padded_vocab_size(262145) == 262272
    assert padded_vocab_size(262145, 128, tp=4) == 262656
    assert padded_vocab_size(262145, divisible_by=128, tp=8) == 263168
    assert padding_table(262145)[4] == 262656


def test_gpt2_and_exact_multiples() -> None:
    assert padded_vocab_size(50257, 128, 1) == 50304
    assert padded_vocab_size(262144, 128, 8) == 262144


@settings(deadline=None)
@given(st.integers(1, 10**7), st.integers(1, 1024), st.integers(1, 64))
def test_rule(vocab: int, div: int, tp: int) -> None:
    padded = padded_vocab_size(vocab, div, tp)
    assert padded % (div * tp) == 0
    assert vocab <= padded < vocab + div * tp


@pytest.mark.parametrize("args", [(0, 128, 1), (262145, 0, 1), (262145, 128, -1), (262145, 128.0, 1)])
def test_rejects_non_positive(args: tuple) -> None:
    with pytest.raises(TokenizerError, match="must be a positive integer"):
        padded_vocab_size(*args)
