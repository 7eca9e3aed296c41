"""Quoting for generated batch scripts, and the template filler.

Two readers see a script: bash (the body) and sbatch (the `#SBATCH` lines, parsed by sbatch itself).
`sh(v)` is `shlex.quote`. `sbatch_word(v)` must mean the same to both readers: sbatch's directive parser
understands single and double quotes like a shell, but also takes a backslash as an escape *inside*
quotes, where bash keeps it. So backslashes are written outside quotes as `\\` (one literal backslash to
both), and every other piece is `shlex.quote`d. Control characters (a newline would end the comment
line and start a command) are refused everywhere.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from longctx.errors import SlurmError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*)\s*\}\}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_text(value: object, what: str) -> str:
    text = str(value)
    bad = _CONTROL.search(text)
    if bad:
        raise SlurmError(
            f"{what} contains a control character ({bad.group()!r}): it could end a script line",
            where=repr(text),
            fix="remove newlines, tabs and other control characters from the value",
        )
    return text


def sh(value: object, what: str = "value") -> str:
    """One shell word, whatever the value holds."""
    return shlex.quote(check_text(value, what))


def sh_words(words: list[str], what: str = "command") -> str:
    return " ".join(sh(w, what) for w in words)


def sbatch_word(value: object, what: str = "value") -> str:
    """One word that sbatch's `#SBATCH` parser and bash both read as exactly `value`."""
    text = check_text(value, what)
    if text == "":
        return "''"
    return "\\\\".join(shlex.quote(piece) if piece else "" for piece in text.split("\\"))


def slurm_filename(path: str, what: str = "output path") -> str:
    """A literal path inside a Slurm filename pattern (`%` is a pattern character; `%%` is a literal %)."""
    if "\\" in path:
        raise SlurmError(
            f"{what} contains a backslash, which switches off Slurm's filename patterns",
            where=path,
            fix="use a run directory without backslashes",
        )
    return path.replace("%", "%%")


def env_name(name: str, where: str) -> str:
    if not ENV_NAME.match(name):
        raise SlurmError(
            f"environment variable name {name!r} is not a valid shell name",
            where=where,
            fix="use letters, digits and '_' (not starting with a digit)",
        )
    return name


def fill(template: str, values: Mapping[str, str], *, where: str) -> str:
    """Replace each `{{ name }}`; a placeholder without a value or a value without a placeholder is an error."""
    used: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise SlurmError(
                f"template placeholder {{{{ {name} }}}} has no value",
                where=where,
                fix=f"placeholders this renderer fills: {', '.join(sorted(values))}",
            )
        used.add(name)
        return values[name]

    out = _PLACEHOLDER.sub(sub, template)
    unused = sorted(set(values) - used)
    if unused:
        raise SlurmError(
            f"template has no placeholder for {', '.join(unused)}",
            where=where,
            fix="add the placeholders to the template (or use the packaged one)",
        )
    return out
