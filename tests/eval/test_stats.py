"""Counts, Wilson intervals, chance and effective context length, against hand-computed cases."""

from __future__ import annotations

import json

import pytest

from longctx.eval.accuracy import effective_length, spans, wilson_interval
from longctx.eval.loss_position import PositionLoss
from longctx.eval.plots import plot_niah
from longctx.eval.report_tables import markdown_table
from longctx.eval.results import CheckpointEval, EvalReport, LengthResult, PasskeyResult
from longctx.eval.score import ItemScore
from longctx.eval.settings import EvalSettings


@pytest.mark.parametrize(
    ("hits", "n", "lo", "hi"),
    [
        (0, 20, 0.0, 0.16113),
        (20, 20, 0.83887, 1.0),
        (10, 20, 0.29930, 0.70070),
        (14, 20, 0.48103, 0.85452),
        (1, 2, 0.09453, 0.90547),
        (0, 0, 0.0, 1.0),
    ],
)
def test_wilson_interval(hits: int, n: int, lo: float, hi: float) -> None:
    # hand-computed: (p + z²/2n ± z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n), z = 1.96
    assert wilson_interval(hits, n) == pytest.approx((lo, hi), abs=1e-5)


def test_wilson_interval_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="21 hits out of 20"):
        wilson_interval(21, 20)


def test_chance() -> None:
    # 2 of 2 keys right against 2 distractors (chance 1/3): the interval (0.34, 1) stays above chance;
    # 1 of 2 does not
    assert not spans(wilson_interval(2, 2), 1 / 3)
    assert spans(wilson_interval(1, 2), 1 / 3)


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ({256: [1.0, 1.0, 0.95], 1024: [0.9, 1.0], 4096: [0.5, 1.0]}, 1024),
        ({256: [0.85, 1.0]}, None),
        ({256: [1.0], 1024: [0.2], 4096: [1.0]}, 256),  # the first failure ends it (RULER: stays above)
        ({256: [1.0], 1024: [1.0]}, 1024),
        ({}, None),
    ],
)
def test_effective_length(cells: dict[int, list[float]], expected: int | None) -> None:
    assert effective_length(cells, 0.9) == expected


def _items(length: int, depth: float, greedy: list[bool], loglik: list[bool]) -> list[ItemScore]:
    fixed = dict(
        key="12345",
        needle_start=10,
        greedy_tokens=[],
        digit_accuracy=1.0,
        token_margin=0.5,
        logprob=-1.0,
        distractor_logprobs=[-2.0, -3.0],
        loglik_margin=1.0,
    )
    return [
        ItemScore(length=length, depth=depth, index=i, greedy=g, loglik=ll, **fixed)
        for i, (g, ll) in enumerate(zip(greedy, loglik, strict=True))
    ]


def _length(length: int, per_depth: dict[float, tuple[int, int]], keys: int = 20) -> LengthResult:
    items = []
    for depth, (greedy_hits, loglik_hits) in per_depth.items():
        items += _items(
            length, depth, [i < greedy_hits for i in range(keys)], [i < loglik_hits for i in range(keys)]
        )
    position = PositionLoss(
        length=length,
        docs=1,
        packed=False,
        buckets=[(0, length)],
        loss=[1.0],
        tokens=[length],
        mean_loss=1.0,
        long_loss=1.0,
    )
    return LengthResult(
        length=length,
        extrapolated=False,
        passkey=PasskeyResult.from_items(length, 2, items, 1.0),
        position=position,
        seconds=0.0,
    )


@pytest.fixture
def report() -> EvalReport:
    ce = CheckpointEval(
        label="stage 1k",
        checkpoint={},
        trained_length=1024,
        rotary_base=10000,
        results=[
            _length(256, {0.0: (20, 20), 0.5: (19, 20)}),
            _length(1024, {0.0: (18, 20), 0.5: (20, 20)}),
            _length(4096, {0.0: (3, 9), 0.5: (0, 6)}),
        ],
    )
    settings = EvalSettings(depths=[0.0, 0.5], keys_per_cell=20)
    return EvalReport(
        plan=None,
        stage="1k",
        settings=settings,
        method="",
        lengths=[256, 1024, 4096],
        checkpoints=[ce],
        heldout={},
    )


def test_summary_json_carries_counts_intervals_and_effective_length(report: EvalReport) -> None:
    doc = json.loads(report.model_dump_json())
    ce = doc["checkpoints"][0]
    assert ce["every_depth_effective_length"] == 1024  # 90 %+ at every depth through 1K, 15 % / 0 % at 4K
    at4k = ce["results"][2]["passkey"]
    assert at4k["keys"] == 40 and at4k["greedy_hits"] == 3
    assert at4k["greedy_interval"] == pytest.approx(list(wilson_interval(3, 40)))
    cell = at4k["cells"][0]
    assert (cell["greedy_hits"], cell["keys"], cell["loglik_hits"]) == (3, 20, 9)
    assert cell["loglik_interval"] == pytest.approx(list(wilson_interval(9, 20)))
    # log-likelihood chance with 2 distractors is 1/3: 9/20 and 6/20 both reach it, 20/20 does not
    assert at4k["depths_at_chance"] == [0.0, 0.5]
    assert ce["results"][0]["passkey"]["depths_at_chance"] == []
    assert doc["every_depth_threshold"] == 0.9
    row = report.table()[0]
    assert row["every_depth_effective_length"] == 1024 and row["4096"]["greedy_hits"] == 3


def test_table_and_heatmap_mark_cells_at_chance(report: EvalReport, tmp_path) -> None:
    md = markdown_table(report)
    assert "effective all depths ≥90%" in md and "| 1K |" in md
    assert "~" in md.split("\n")[4]  # the 4K cell reaches chance
    assert plot_niah(report, tmp_path / "niah.png").stat().st_size > 0


def test_paired_delta_interval_against_exact_cases() -> None:
    from longctx.eval.accuracy import paired_delta_interval

    tokens = [10, 20, 30, 40]
    base = [12.0, 30.0, 33.0, 60.0]
    # the same losses: no difference in any resample
    assert paired_delta_interval(base, base, tokens) == pytest.approx((0.0, 0.0))
    # every token 0.05 nats worse: the token-weighted difference is 0.05 in every resample
    worse = [b + 0.05 * n for b, n in zip(base, tokens, strict=True)]
    assert paired_delta_interval(worse, base, tokens) == pytest.approx((0.05, 0.05))
    # one document much worse: the interval holds the point estimate and spans 0 (3 of 4 unchanged)
    mixed = [base[0] + 10.0, *base[1:]]
    lo, hi = paired_delta_interval(mixed, base, tokens)
    assert lo <= 10.0 / 100 <= hi and lo == pytest.approx(0.0)
    assert paired_delta_interval([1.0], [1.0], [5]) is None  # one document: no interval


def test_short_loss_keeps_per_document_sums() -> None:
    import numpy as np

    from longctx.eval.score import TokenScores
    from longctx.eval.short_context import short_context_loss

    def score(batch):  # each token of document d costs d + 1 nats
        b, s = batch.shape
        lp = -(batch[:, :1].numpy().astype(float) + 1.0) * np.ones((b, s - 1))
        return TokenScores(logprob=lp, argmax=np.zeros((b, s - 1), np.int64), margin=lp)

    docs = [np.full(9, d) for d in range(3)] + [np.full(5, 3)]
    out = short_context_loss(score, docs, length=9, batch_size=2)
    assert out.doc_tokens == [8, 8, 8, 4] and out.doc_nll == [8.0, 16.0, 24.0, 16.0]
    assert out.loss == pytest.approx(64.0 / 28) and out.tokens == 28 and out.docs == 4


def test_loss_by_position_plot_has_the_difference_panel(report: EvalReport, tmp_path) -> None:
    from longctx.eval.plots import plot_loss_by_position

    second = report.checkpoints[0].model_copy(update={"label": "stage 4k"})
    two = report.model_copy(update={"checkpoints": [report.checkpoints[0], second]})
    assert plot_loss_by_position(two, tmp_path / "loss.png").stat().st_size > 0
