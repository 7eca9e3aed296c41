"""Text from files, made safe to print: a host name, a job id or a log line read from a run may hold
terminal escape sequences (ESC [ … recolours, moves the cursor, rewrites the window title; CR overwrites
the line before it). Every such string passes through `printable` before it reaches a terminal; JSON
output needs nothing, since the encoder escapes control characters itself."""

from __future__ import annotations

import unicodedata

_KEEP = frozenset("\n\t")
# invisible characters that reorder or hide what follows (bidirectional overrides and isolates)
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escaped(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object, *, newlines: bool = True) -> str:
    """`text` with every control character (C0, DEL, C1, bidirectional overrides) written as a visible
    escape (`\\x1b`); newline and tab are kept when `newlines`, else escaped too (one-line fields)."""
    s = str(text)
    if s.isprintable() and not any(c in _BIDI for c in s):
        return s
    out = []
    for ch in s:
        if newlines and ch in _KEEP:
            out.append(ch)
        elif ch in _BIDI or (
            unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") and not ch.isprintable()
        ):
            out.append(_escaped(ch))
        else:
            out.append(ch)
    return "".join(out)


def one_line(text: object) -> str:
    """`printable` for a field that is one line (a host, a job id): newline and tab escaped too."""
    return printable(text, newlines=False)
