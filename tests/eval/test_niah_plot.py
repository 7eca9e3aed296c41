"""The NIAH heatmap is coloured by the headline measure, greedy exact match (what the effective length
is read from); the log-likelihood accuracy is in each cell's text. Checked on the data the plot draws."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from longctx.eval.plots import niah_panel, plot_niah
from longctx.eval.results import CheckpointEval, EvalReport, LengthResult, PasskeyResult
from longctx.eval.score import ItemScore
from longctx.eval.settings import EvalSettings


def _item(depth: float, index: int, *, greedy: bool, loglik: bool) -> ItemScore:
    return ItemScore(
        length=1024,
        depth=depth,
        index=index,
        key="12345",
        needle_start=10,
        greedy=greedy,
        greedy_tokens=[],
        digit_accuracy=1.0,
        token_margin=0.5,
        logprob=-1.0,
        distractor_logprobs=[-2.0, -3.0],
        loglik=loglik,
        loglik_margin=0.7,
    )


def _report() -> EvalReport:
    # depth 0: no greedy key, every key's likelihood beats the distractors (the base's 1K cell at depth
    # 100 % in the demo: log-likelihood green, greedy 0/20); depth 1: the other way round
    items = [_item(0.0, i, greedy=False, loglik=True) for i in range(20)]
    items += [_item(1.0, i, greedy=True, loglik=i < 5) for i in range(20)]
    result = LengthResult(
        length=1024,
        extrapolated=True,
        passkey=PasskeyResult.from_items(1024, 2, items, 1.0),
        position=None,
        seconds=0.0,
    )
    ce = CheckpointEval(label="base", checkpoint={}, trained_length=256, rotary_base=10_000, results=[result])
    return EvalReport(
        plan="tiny",
        stage=None,
        settings=EvalSettings(depths=[0.0, 1.0], keys_per_cell=20),
        method="",
        lengths=[1024],
        checkpoints=[ce],
        heldout={},
    )


def test_the_colour_is_greedy_and_the_text_gives_log_likelihood_too() -> None:
    report = _report()
    panel = niah_panel(report.checkpoints[0], [0.0, 1.0], [1024])
    assert np.array_equal(panel.colour, np.array([[0.0], [1.0]]))  # greedy, not log-likelihood (1.0, 0.25)
    assert panel.text[0][0].startswith("g 0/20") and "ll 100%" in panel.text[0][0]
    assert panel.text[1][0].startswith("g 20/20") and "ll 25%" in panel.text[1][0]
    # hatched where the colour's own interval reaches chance: no key retrieved greedily
    assert panel.hatched == [(0, 0)]
    assert report.checkpoints[0].every_depth_effective_length is None  # the headline agrees with the colour


def test_the_heatmap_is_drawn(tmp_path: Path) -> None:
    path = plot_niah(_report(), tmp_path / "niah.png")
    assert path.stat().st_size > 1000
