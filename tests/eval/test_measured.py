"""docs/measured.md quotes retrieval figures only from results stored in the repository: each
`<!-- card FILE -->` block states the figures of a published base's card, as its --train-base run wrote
them; figures of a run no stored result backs (earlier bases, the demo's stages) are not on the page."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from longctx.util.units import human_length

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "measured.md"
BLOCK = re.compile(r"<!-- (card) (\S+) -->\n(.*?)\n<!-- /\1 -->", re.S)


def _blocks(kind: str) -> list[tuple[str, str]]:
    return [(m[2], m[3]) for m in BLOCK.finditer(PAGE.read_text(encoding="utf-8")) if m[1] == kind]


def rendered_card(path: Path) -> str:
    """A card's figures: tokens, wall time and machine, then greedy exact match per task and length."""
    card = tomllib.loads(path.read_text(encoding="utf-8"))
    family = "AR" if card["family"] == "ar" else card["family"].upper()
    keys = {r["keys"] for r in card["retrieval"]}
    assert len(keys) == 1, keys
    # two lines: a machine's name can be long
    head = (
        f"{family} base: {card['tokens']:,} tokens, {keys.pop()} keys per task and length;\n"
        f"trained in {card['wall_seconds']:,} s on {card['machine']}"
    )
    lengths = sorted({r["length"] for r in card["retrieval"]})
    tasks = list(dict.fromkeys(r["task"] for r in card["retrieval"]))
    exact = {(r["task"], r["length"]): r["exact"] for r in card["retrieval"]}
    rows = [
        f"| {t} | " + " | ".join(f"{exact[t, n]:.0%}".replace("%", " %") for n in lengths) + " |"
        for t in tasks
    ]
    table = [
        "| task | " + " | ".join(human_length(n) for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    return "\n".join([head, "", *table, *rows])


def test_the_page_quotes_stored_results() -> None:
    assert len(_blocks("card")) == 3
    for name, _ in _blocks("card"):
        assert (ROOT / name).is_file(), name


@pytest.mark.parametrize("name,shown", _blocks("card"))
def test_each_base_table_is_its_card(name: str, shown: str) -> None:
    assert shown == rendered_card(ROOT / name)


def test_no_figure_of_an_earlier_base_is_left() -> None:
    """The single-key figures of bases no command builds any more (100 / 0 / 0 %, 95 / 0 / 0 %)."""
    text = PAGE.read_text(encoding="utf-8")
    for stale in ("base 100 / 0 / 0 %", "base 95 / 0 / 0 %", "1.729 (beyond its window)", "80 % already"):
        assert stale not in text
