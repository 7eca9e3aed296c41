"""The README stays a five-minute read and the docs stay true to the code: short lines, links that
lead somewhere, a walk-through plan the schema accepts, and commands and flags the CLI has."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer.main

from longctx.cli.main import app
from longctx.plan.load import plan_from_dict

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
LINE_MAX = 120
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _fenced(text: str, lang: str) -> list[str]:
    """The bodies of the ```LANG blocks of a Markdown text."""
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_line_is_longer_than_the_limit(page: Path) -> None:
    long = [
        f"{_rel(page)}:{i}: {len(line)} characters"
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > LINE_MAX
    ]
    assert not long, "wrap these lines:\n" + "\n".join(long)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_names_a_file(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for block in _fenced(text, r"\w*"):
        text = text.replace(block, "")
    missing = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        if not (page.parent / target.split("#", 1)[0]).exists():
            missing.append(target)
    assert not missing, f"{_rel(page)} links to files that do not exist: {missing}"


def test_the_walk_through_plan_is_one_the_schema_accepts() -> None:
    (block,) = _fenced(README.read_text(encoding="utf-8"), "toml")
    plan = plan_from_dict(tomllib.loads(block), where="README.md")
    assert [s.name for s in plan.stages] == ["8k", "32k"]


def _commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in _fenced(page.read_text(encoding="utf-8"), "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #", 1)[0].strip()
                if line.startswith("longctx "):
                    found.append((_rel(page), line))
    return found


@pytest.mark.parametrize(("page", "line"), _commands())
def test_every_documented_command_and_flag_exists(page: str, line: str) -> None:
    words = shlex.split(line)[1:]
    cmd = typer.main.get_command(app)
    path = ["longctx"]
    while getattr(cmd, "commands", None) is not None and words and not words[0].startswith("-"):
        sub = cmd.commands.get(words[0])
        assert sub is not None, f"{page}: `{' '.join(path)}` has no command {words[0]!r}: {line}"
        cmd, path = sub, [*path, words.pop(0)]
    assert getattr(cmd, "commands", None) is None, f"{page}: `{' '.join(path)}` needs a command: {line}"
    options = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    unknown = [w.split("=", 1)[0] for w in words if w.startswith("-") and w.split("=", 1)[0] not in options]
    assert not unknown, f"{page}: `{' '.join(path)}` has no option {unknown}: {line}"
