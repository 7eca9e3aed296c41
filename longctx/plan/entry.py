"""The script a Megatron-LM launch runs and that script's own flags.

Upstream `pretrain_gpt.py` trains the autoregressive loss. A diffusion family is trained by a fork with
its own entry script and flags (the masked-diffusion fork's `pretrain_mask_diff.py` takes `--padded-input`,
`--padded-output`, `--target-length`, …). The plan names both in `[megatron]`: `entry_script`, and
`family_args`, whose `{name}` words take the plan's values so that they cannot drift from the objective and
the vocabulary rows the planner checked against the checkpoint:

    family_args = ["--padded-input", "{padded_input}", "--padded-output", "{padded_output}",
                   "--target-length", "1"]
"""

from __future__ import annotations

import string
from pathlib import PurePath

from longctx.objective import Objective
from longctx.report import Findings

UPSTREAM_SCRIPT = "pretrain_gpt.py"

PLACEHOLDERS: dict[str, str] = {
    "vocab_size": "the tokenizer's vocabulary size",
    "mask_id": "the [MASK] id (masked diffusion only)",
    "input_rows": "the input embedding's rows",
    "output_rows": "the output layer's rows",
    "padded_input": "input rows past the vocabulary and, for masked diffusion, its [MASK] row",
    "padded_output": "output rows past the vocabulary",
}


def _fields(word: str) -> list[str]:
    """The `{name}` fields of one word (ValueError: unbalanced braces)."""
    return [name for _, name, _, _ in string.Formatter().parse(word) if name is not None]


def check_family_args(plan_args: list[str], obj: Objective, where: str, findings: Findings) -> None:
    """Words whose `{…}` is not a known value, or asks for one the objective has not (a UDM's mask id)."""
    known = ", ".join("{" + k + "}" for k in PLACEHOLDERS)
    for word in plan_args:
        try:
            names = _fields(word)
        except ValueError as err:
            findings.error(
                "family-args",
                f"family_args word {word!r}: {err}",
                where=where,
                fix=f"write placeholders as {{name}} (one of {known}) and literal braces as {{{{ }}}}",
            )
            continue
        try:  # a conversion (`!z`) or a nested field in a format spec (`{x:{nope}}`) fails only here
            word.format_map(dict.fromkeys(PLACEHOLDERS, 1))
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as err:
            if all(n in PLACEHOLDERS for n in names):
                findings.error(
                    "family-args",
                    f"family_args word {word!r} cannot be filled in ({type(err).__name__}: {err})",
                    where=where,
                    fix=f"write placeholders as plain {{name}} (one of {known}), without conversions "
                    "or format specs",
                )
                continue
        for name in names:
            if name not in PLACEHOLDERS:
                findings.error(
                    "family-args",
                    f"family_args word {word!r} asks for {{{name}}}, which the plan does not define",
                    where=where,
                    fix=f"use one of {known}",
                )
            elif name == "mask_id" and obj.kind != "mdm":
                findings.error(
                    "family-args",
                    f"family_args word {word!r} asks for the [MASK] id, but a "
                    f"{obj.describe()} model has none",
                    where=where,
                    fix='drop the word, or train the masked objective (objective.kind = "mdm")',
                )


def family_values(obj: Objective, vocab: int, rows: tuple[int, int | None]) -> dict[str, int]:
    """The values `family_args` may name, for a stage with `rows` = (input rows, output rows or None)."""
    inp, out = rows[0], rows[1] or rows[0]
    values = {
        "vocab_size": vocab,
        "input_rows": inp,
        "output_rows": out,
        "padded_input": inp - vocab - (1 if obj.kind == "mdm" else 0),
        "padded_output": out - vocab,
    }
    if obj.mask_id is not None:
        values["mask_id"] = obj.mask_id
    return values


def render_family_args(words: list[str], values: dict[str, int]) -> list[str]:
    """`words` with each `{name}` replaced (the plan's check has refused unknown names)."""
    return [w.format_map(values) for w in words]


def trains_objective(entry_script: str, family_args: list[str], obj: Objective) -> bool:
    """Whether the launch can train `obj`: upstream pretrain_gpt.py only the autoregressive loss; a fork's
    entry script (or pretrain_gpt.py of a fork that takes its own flags) the objective it was written for."""
    return obj.kind == "ar" or PurePath(entry_script).name != UPSTREAM_SCRIPT or bool(family_args)


def check_entry_script(entry_script: str, where: str, findings: Findings) -> None:
    """A note when the script lies outside the Megatron-LM checkout (absolute, or climbing out with ..):
    it runs as the launch's code, but nothing of the checkout's version checks speaks for it."""
    p = PurePath(entry_script)
    if p.is_absolute() or ".." in p.parts:
        findings.warning(
            "entry-script-outside",
            f"entry_script {entry_script!r} lies outside the Megatron-LM checkout: every launch runs it, but "
            "the checkout's version (and the preflight of its flags) says nothing about it",
            where=where,
            fix="put the fork's script in its checkout and name it relative to it, or keep it and review it",
        )
