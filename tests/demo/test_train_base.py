"""`longctx demo --train-base` on a tiny recipe: the published layout it writes is what the demo adopts,
and a second run with more iterations resumes from the last save instead of starting over."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longctx.checkpoint.layout import read_tracker
from longctx.demo.published import install_published, verify_published
from longctx.demo.train_base import BaseRecipe, train_base


@pytest.mark.slow
def test_train_base_publishes_then_resumes(tmp_path: Path) -> None:
    recipe = BaseRecipe(train_docs=60, heldout_docs=40, iterations=4, save_interval=2, global_batch=4,
                        warmup=1, eval_keys=1)  # fmt: skip
    work, out = tmp_path / "work", tmp_path / "published"
    lines: list[str] = []
    card = train_base(work, out, recipe=recipe, echo=lines.append)
    assert card.iteration == 4 and card.tokens == 4 * 4 * 256 and card.wall_seconds > 0
    assert [r.length for r in card.retrieval] == [256, 1024, 4096]
    assert all(r.keys == 5 for r in card.retrieval)  # one key at each of five depths
    assert verify_published(out) == card
    tok, save = tmp_path / "run" / "tokenizer", tmp_path / "run" / "base" / "checkpoints"
    install_published(out, tok, save)
    assert read_tracker(save).iteration == 4

    more = dataclasses.replace(recipe, iterations=6)
    again = train_base(work, out, recipe=more, echo=lines.append)
    assert again.iteration == 6 and again.wall_seconds > card.wall_seconds  # the two launches add up
    metrics = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2, 3, 4, 5, 6]  # resumed at 4, not restarted
    assert any("(kept)" in line for line in lines)  # the tokenizer and data were not rebuilt
