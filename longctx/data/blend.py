"""Parse Megatron data blends: `--data-path` words and `--data-args-path` files.

Megatron reads a blend as whitespace-separated words (a data-args file is `read().split()`):
`W1 P1 W2 P2 …` (weights and prefixes) or `P1 P2 …` (prefixes only, weighted by size). It silently
treats an odd word count as a list of prefixes — dropping every weight — so here an odd count is an
error, as are zero, negative or non-finite weights, comments (Megatron would take `#` as a prefix),
and prefixes that do not exist.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from longctx.errors import DatasetError
from longctx.report import Findings


@dataclasses.dataclass
class BlendEntry:
    prefix: str
    weight: float | None  # None: size-weighted (plain list of prefixes)


@dataclasses.dataclass
class Blend:
    """A parsed blend; `findings` holds every problem found while parsing (errors make it unusable)."""

    entries: list[BlendEntry]
    weighted: bool
    source: str
    findings: Findings = dataclasses.field(default_factory=Findings)

    @property
    def prefixes(self) -> list[str]:
        return [e.prefix for e in self.entries]

    @property
    def ok(self) -> bool:
        return self.findings.ok

    def normalized_weights(self, sizes: list[int] | None = None) -> list[float]:
        """Weights summing to 1; size-weighted blends need the datasets' token counts."""
        if self.weighted:
            raw = [e.weight or 0.0 for e in self.entries]
        else:
            if sizes is None:
                raise ValueError("a size-weighted blend needs the dataset sizes")
            raw = [float(s) for s in sizes]
        total = sum(raw)
        return [w / total if total > 0 else 0.0 for w in raw]

    def raise_for_errors(self) -> None:
        if not self.ok:
            first = self.findings.errors[0]
            raise DatasetError(first.message, where=first.where or self.source, fix=first.fix)


def _as_number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def parse_blend(words: str | list[str], *, source: str = "--data-path", check_exists: bool = True) -> Blend:
    """Parse blend words the way Megatron's `get_blend_from_list` does, but report what it would hide."""
    tokens = words.split() if isinstance(words, str) else [w for part in words for w in part.split()]
    f = Findings()
    if not tokens:
        f.error("blend", "the blend is empty", where=source, fix="give at least one dataset prefix")
        return Blend([], False, source, f)
    if any(t.startswith("#") for t in tokens):
        f.error(
            "blend-comment",
            "the blend contains '#': Megatron has no comments in data-args files and would read the words as prefixes",
            where=source,
            fix="remove the comment from the file",
        )
    numeric = [_as_number(t) is not None for t in tokens]
    if not any(numeric):
        entries = [BlendEntry(t, None) for t in tokens]
        blend = Blend(entries, False, source, f)
    else:
        if len(tokens) % 2:
            f.error(
                "blend-odd",
                f"odd number of words ({len(tokens)}) in a weighted blend: Megatron would take all {len(tokens)} "
                "words as prefixes and silently drop every weight",
                where=source,
                fix="write the blend as pairs 'WEIGHT PREFIX WEIGHT PREFIX …'",
            )
        entries = []
        for i in range(0, len(tokens) - 1, 2):
            w_word, prefix = tokens[i], tokens[i + 1]
            weight = _as_number(w_word)
            pair = i // 2 + 1
            if weight is None:
                f.error(
                    "blend-weight",
                    f"pair {pair}: {w_word!r} is not a number (expected 'WEIGHT PREFIX')",
                    where=source,
                    fix="write the blend as pairs 'WEIGHT PREFIX …'",
                )
                continue
            if _as_number(prefix) is not None:
                f.error(
                    "blend-prefix",
                    f"pair {pair}: {prefix!r} is a number where a prefix belongs",
                    where=source,
                    fix="write the blend as pairs 'WEIGHT PREFIX …'",
                )
                continue
            if not math.isfinite(weight) or weight <= 0:
                kind = "zero" if weight == 0 else ("negative" if weight < 0 else "non-finite")
                f.error(
                    "blend-weight",
                    f"pair {pair}: {kind} weight {w_word} for {prefix}",
                    where=source,
                    fix="give every dataset a positive weight, or drop it from the blend",
                )
            entries.append(BlendEntry(prefix, weight))
        blend = Blend(entries, True, source, f)
    seen: set[str] = set()
    for e in blend.entries:
        if e.prefix in seen:
            f.warning("blend-duplicate", f"prefix listed twice: {e.prefix}", where=source)
        seen.add(e.prefix)
        if check_exists:
            _check_prefix_exists(e.prefix, source, f)
    return blend


def _check_prefix_exists(prefix: str, source: str, f: Findings) -> None:
    missing = [ext for ext in (".idx", ".bin") if not os.path.isfile(prefix + ext)]
    if not missing:
        return
    hint = ""
    if prefix.endswith((".bin", ".idx")) and os.path.isfile(prefix):
        hint = " — drop the .bin/.idx suffix"
    f.error(
        "missing-prefix",
        f"missing prefix: {prefix} ({' and '.join(prefix + m for m in missing)} not found){hint}",
        where=source,
        fix="check the path (Megatron resolves relative prefixes from the working directory)",
    )


def read_data_args(path: str | os.PathLike[str], *, check_exists: bool = True) -> Blend:
    """Parse a `--data-args-path` file (whitespace-separated words, as Megatron reads it)."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(
            f"data-args file not found: {p}", where=str(p), fix="check the --data-args-path value"
        )
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(
            f"data-args file is not UTF-8 text (byte {err.start})",
            where=str(p),
            fix="write the blend as UTF-8 text: weight prefix weight prefix …",
        ) from None
    except OSError as err:
        raise DatasetError(
            f"cannot read the data-args file: {err.strerror}",
            where=str(p),
            fix="check the --data-args-path value",
        ) from None
    return parse_blend(text, source=str(p), check_exists=check_exists)


def blend_from_prefixes(prefixes: list[str | os.PathLike[str]], *, check_exists: bool = True) -> Blend:
    """A size-weighted blend from a plain list of prefixes (the positional arguments of `data check`)."""
    f = Findings()
    entries = [BlendEntry(os.fspath(p), None) for p in prefixes]
    blend = Blend(entries, False, "prefixes", f)
    if check_exists:
        for e in entries:
            _check_prefix_exists(e.prefix, e.prefix, f)
    return blend
