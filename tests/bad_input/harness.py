"""The contract every refusal keeps: exit 2, a message naming what/where/fix, no traceback, one JSON
document with --json, and no file changed anywhere under the watched roots."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from typer.testing import CliRunner

from longctx.cli.main import app

runner = CliRunner()
_HASHED_BYTES = 64 << 20  # larger files are compared by size and mtime


def tree_state(*roots: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under `roots` (links not followed): kind, mode and content hash / link target."""
    out: dict[str, tuple[str, int, str]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in [*dirnames, *filenames]:
                p = Path(dirpath) / name
                st = p.lstat()
                if p.is_symlink():
                    out[str(p)] = ("link", st.st_mode, os.readlink(p))
                elif p.is_file() and st.st_size > _HASHED_BYTES:  # a planted sparse file of GiBs
                    out[str(p)] = ("file", st.st_mode, f"{st.st_size} bytes, mtime {st.st_mtime_ns}")
                elif p.is_file():
                    out[str(p)] = ("file", st.st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
                else:
                    out[str(p)] = ("other" if not p.is_dir() else "dir", st.st_mode, "")
    return out


def refused(args: Sequence[object], watch: Sequence[Path], *, needle: str) -> str:
    """Run the CLI (plain and --json); assert the refusal contract; return the plain message."""
    before = tree_state(*watch)
    plain = runner.invoke(app, [str(a) for a in args])
    assert plain.exit_code == 2, (plain.exit_code, plain.output)
    text = plain.output
    assert "Traceback" not in text, text
    assert needle in text, text
    assert "fix:" in text, text
    after = tree_state(*watch)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"a refused command changed files: {changed}"
    as_json = runner.invoke(app, [*map(str, args), "--json"])
    assert as_json.exit_code == 2, as_json.output
    doc = json.loads(as_json.stdout)  # exactly one document on stdout
    if "error" in doc:  # a refusal
        assert doc["error"].get("what") and doc["error"].get("fix"), doc
    else:  # a check report whose findings (at any depth) hold the error
        assert doc.get("ok") is False, doc
        errors = [f for f in _findings(doc) if f.get("level") == "error"]
        assert errors and all(f.get("message") and f.get("fix") for f in errors), doc
    assert tree_state(*watch) == before, "a refused --json command changed files"
    return text


def _findings(doc: object) -> list[dict]:
    if isinstance(doc, dict):
        own = [f for f in doc.get("findings", []) if isinstance(f, dict)] if "findings" in doc else []
        return own + [f for v in doc.values() for f in _findings(v)]
    if isinstance(doc, list):
        return [f for v in doc for f in _findings(v)]
    return []
