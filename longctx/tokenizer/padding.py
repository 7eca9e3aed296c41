"""Megatron's vocabulary padding rule.

Megatron sizes the embedding and output layer by the tokenizer's vocabulary rounded up to a multiple of
`--make-vocab-size-divisible-by` × tensor-parallel size, so that every TP rank holds an equal slice.
The padded size enters checkpoint shapes: a model trained at TP 4 (262145 → 262656) cannot be loaded
with a layout that pads to 262272 without resizing.
"""

from __future__ import annotations

from longctx.errors import TokenizerError

DEFAULT_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, divisible_by: int = DEFAULT_DIVISIBLE_BY, tp: int = 1) -> int:
    """Round `vocab_size` up to a multiple of `divisible_by * tp`.

    >>> padded_vocab_size(262145, 128, 1), padded_vocab_size(262145, 128, 4), padded_vocab_size(262145, 128, 8)
    (262272, 262656, 263168)
    """
    for name, value in (("vocab_size", vocab_size), ("divisible_by", divisible_by), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TokenizerError(
                f"{name} must be a positive integer, got {value!r}",
                fix="pass e.g. padded_vocab_size(262145, divisible_by=128, tp=4)",
            )
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def padding_table(
    vocab_size: int, divisible_by: int = DEFAULT_DIVISIBLE_BY, tps: tuple[int, ...] = (1, 2, 4, 8)
) -> dict[int, int]:
    """Padded size for each TP degree (for reports)."""
    return {tp: padded_vocab_size(vocab_size, divisible_by, tp) for tp in tps}
