"""The passkey vocabulary: filler sentences from a small grammar, names, digit keys, and how a key is
stated and asked for. The evaluation grid builds its prompts from it, and the demo corpus trains on
the same phrasing, so a model trained there is asked in words it has seen."""

from __future__ import annotations

import random
from collections.abc import Sequence

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "pa", "do", "fe")
# two-syllable names: 132 distinct, so a long document can hold many keys with unique names
NAMES = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES if a != b)
SUBJECTS = ("the farmer", "a sailor", "the old clock", "my neighbour", "the river", "a small bird", "the teacher",
            "the baker", "a quiet train", "the mountain", "our garden", "the library")  # fmt: skip
VERBS = ("watched", "carried", "painted", "followed", "remembered", "found", "built", "crossed", "opened",
         "described", "counted", "visited")  # fmt: skip
OBJECTS = ("the green door", "a long road", "seven lanterns", "the northern field", "a wooden box", "the harbour",
           "an empty room", "the morning light", "a paper map", "the stone bridge", "three apples",
           "the winter sky")  # fmt: skip
TAILS = ("before noon", "in the rain", "without a word", "for many years", "at the end of the day", "with great care",
         "near the village", "after the storm", "once again", "as usual")  # fmt: skip


def passkey_statement(name: str, key: str) -> str:
    return f"the pass key of {name} is {key} ."


def passkey_prompt(name: str) -> str:
    """The question the evaluation asks; the model should continue with the key."""
    return f"the pass key of {name} is"


def passkeys_prompt(names: Sequence[str]) -> str:
    """The question of several keys at once (one name's values, or several names'): asked once, the
    model should continue with every key, in the form of `passkeys_answer`."""
    return f"the pass keys of {' and '.join(names)} are"


def passkeys_answer(keys: Sequence[str]) -> str:
    """`48213 and 55829 .`: the keys in the answer's stated form (any order is right)."""
    return " and ".join(keys) + " ."


def filler_sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)} ."


def random_key(rng: random.Random, digits: int = 5) -> str:
    """Digits written together ("48213", as passkey tests of real models write them) and distinct while
    ten suffice: a repeated digit can be copied only by matching two tokens, where a small model's copy
    circuit matches one."""
    if digits <= 10:
        return "".join(rng.sample("0123456789", digits))
    return "".join(str(rng.randrange(10)) for _ in range(digits))


def any_digit_key(rng: random.Random, digits: int = 5) -> str:
    """Digits drawn independently, repeats allowed ("55829"): the harder copy `random_key` avoids."""
    return "".join(str(rng.randrange(10)) for _ in range(digits))
