"""RULER's needle tasks: names, item construction in a real SentencePiece tokenizer (exact lengths, the
asked needle at its depth, the others elsewhere), scoring by generation and by infilling with oracles
whose answers are known, effective lengths by both rules, and the report's task table and heatmap."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from longctx.eval.accuracy import relative_effective_length, ruler_effective_length
from longctx.eval.grid import PasskeyGrid, needle_start, segment_tokens
from longctx.eval.needles import TaskGrid, TaskItem, place_others
from longctx.eval.plots import niah_figure, task_panel
from longctx.eval.report_tables import markdown_table, report_tables
from longctx.eval.results import CheckpointEval, EvalReport, LengthResult, PasskeyResult
from longctx.eval.score import ItemScore, TokenScores
from longctx.eval.settings import EvalSettings
from longctx.eval.task_infill import corrupted_positions, score_task_infill
from longctx.eval.task_results import TaskResult
from longctx.eval.task_score import TaskItemScore, greedy_answers, returned, score_tasks
from longctx.plan.eval_tasks import check_tasks, parse_task

TASKS = ["multikey-2", "multikey-4", "multivalue-3", "multiquery-3", "absent-2"]
DEPTHS = [0.0, 0.3, 1.0]


def _occurrences(seq: list[int], sub: list[int]) -> list[int]:
    return [i for i in range(len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub]


# -- names -----------------------------------------------------------------------------------------


def test_task_names() -> None:
    assert parse_task("multikey").name == "multikey-4" and parse_task("multivalue-2").count == 2
    assert parse_task("absent-1").control and not parse_task("multiquery").control
    assert check_tasks(["multivalue", "multikey-2"]) == ["single", "multivalue-4", "multikey-2"]
    for bad, msg in [("multikey-1", "2–16"), ("single-2", "one needle"), ("haystack", "unknown needle task")]:
        with pytest.raises(ValueError, match=msg):
            parse_task(bad)
    with pytest.raises(ValueError, match="repeat: multikey-4"):
        check_tasks(["multikey", "multikey-4"])
    with pytest.raises(ValidationError, match="unknown needle task"):
        EvalSettings(tasks=["nope"])


def test_defaults_measure_what_they_measured_before() -> None:
    """Left at their defaults, the new fields are not part of the measured settings (so fingerprints and
    cached results of existing plans stay); set, they are."""
    plain = EvalSettings()
    assert plain.tasks == ["single"] and not plain.any_digit_keys
    assert not {"tasks", "any_digit_keys", "ruler_threshold", "relative_threshold"} & set(plain.measured())
    assert "tasks" not in plain.describe()
    other = EvalSettings(tasks=["multikey-2"], any_digit_keys=True)
    assert other.measured()["tasks"] == ["single", "multikey-2"] and other.measured()["any_digit_keys"]
    assert other.fingerprint() != plain.fingerprint()
    assert (
        EvalSettings(ruler_threshold=0.5).fingerprint() == plain.fingerprint()
    )  # a reading, not a measurement
    assert other.changes_from(plain) == ["tasks single → single,multikey-2", "any_digit_keys False → True"]


# -- items -----------------------------------------------------------------------------------------


def _check(tok: Any, it: TaskItem) -> None:
    assert len(it.tokens) == it.length
    names = [n.name for n in it.needles]
    if it.spec.kind == "multivalue":
        assert len(set(names)) == 1 and len({n.key for n in it.needles}) == it.spec.count
    else:
        assert len(set(names)) == len(names) == it.spec.count  # distinct names
    if it.spec.control:
        assert it.asked[0] not in names and it.expected == []
    assert len(set(it.present)) == len(it.present)  # distinct keys …
    assert len({len(segment_tokens(tok, k)) for k in it.present}) == 1  # … of one width
    spans = sorted((n.start, n.start + len(n.tokens)) for n in it.needles)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "needles overlap"
    for n in it.needles:
        assert it.tokens[n.start : n.start + len(n.tokens)] == n.tokens
        # once in the haystack (a closed item's restatement repeats it after the haystack)
        assert _occurrences(it.tokens[: it.haystack], n.tokens) == [n.start]
        assert tok.decode(n.tokens).strip() == f"the pass key of {n.name} is {n.key} ."
    assert spans[-1][1] <= it.haystack  # every needle in the haystack, before the tail


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("closed", [False, True])
def test_items_of_every_task(demo_tokenizer: Any, task: str, closed: bool) -> None:
    spec = parse_task(task)
    grid = TaskGrid(PasskeyGrid(demo_tokenizer, any_digit_keys=True))
    for length in (320, 1000):
        for depth in DEPTHS:
            for index in range(3):
                it = grid.item(spec, length, depth, index, closed=closed)
                _check(demo_tokenizer, it)
                # the asked needle sits at the cell's depth of the haystack (what precedes the tail)
                size = len(it.needles[0].tokens)
                assert it.needles[0].start == round(depth * (it.haystack - size))
                assert it.needles[0].start == needle_start(it.length, depth, it.length - it.haystack, 0, size)
                if not closed:
                    assert it.haystack == it.answer_start - _question_len(demo_tokenizer, it)
                _check_tail(demo_tokenizer, it)
    assert grid.item(spec, 320, 0.3, 1, closed=closed) == grid.item(spec, 320, 0.3, 1, closed=closed)


def _question_len(tok: Any, it: TaskItem) -> int:
    if it.spec.kind in ("multikey", "absent"):
        return len(segment_tokens(tok, f"the pass key of {it.asked[0]} is"))
    return len(segment_tokens(tok, f"the pass keys of {' and '.join(it.asked)} are"))


def _check_tail(tok: Any, it: TaskItem) -> None:
    if not it.closed:
        q = _question_len(tok, it)
        question = tok.decode(it.tokens[it.answer_start - q : it.answer_start]).strip()
        assert question.startswith("the pass key")
        assert all(name in question for name in it.asked)
        ref = tok.decode(it.reference).strip()
        if it.spec.kind in ("multivalue", "multiquery"):
            assert ref == " and ".join(it.expected) + " ."
        assert it.answer_start + len(it.reference) == it.length
        return
    want = {"multivalue": it.spec.count, "multiquery": it.spec.count}.get(it.spec.kind, 1)
    assert len(it.slots) == want
    for slot in it.slots:
        digits = "".join(tok.decode([it.tokens[p]]).strip() for p in slot.positions)
        assert digits == slot.key and slot.name in it.asked
    assert sorted(s.key for s in it.slots if not it.spec.control) == sorted(it.expected)
    assert it.slots[-1].positions[-1] < it.length - 1  # the restatement closes after its key


def test_other_needles_sit_elsewhere_and_keys_may_repeat_digits(demo_tokenizer: Any) -> None:
    grid = TaskGrid(PasskeyGrid(demo_tokenizer, any_digit_keys=True))
    items = [grid.item(parse_task("multikey-4"), 1000, d, i) for d in DEPTHS for i in range(5)]
    # the distractor needles go to both sides over the items, never onto the asked one
    before = sum(n.start < it.needles[0].start for it in items for n in it.needles[1:])
    after = sum(n.start > it.needles[0].start for it in items for n in it.needles[1:])
    assert before > 0 and after > 0 and before + after == 3 * len(items)
    keys = [n.key for it in items for n in it.needles]
    assert any(len(set(k)) < len(k) for k in keys), "any-digit keys repeat digits sometimes"
    distinct = TaskGrid(PasskeyGrid(demo_tokenizer))
    plain = [n.key for d in DEPTHS for n in distinct.item(parse_task("multikey-4"), 1000, d).needles]
    assert all(len(set(k)) == len(k) for k in plain)
    # the single task takes the option too (its default draw is unchanged)
    single = PasskeyGrid(demo_tokenizer, any_digit_keys=True).grid([256], DEPTHS, keys=8)
    assert any(len(set(it.key)) < len(it.key) for it in single)


def test_placement_never_overlaps() -> None:
    rng = random.Random(0)
    for _ in range(500):
        haystack, size = rng.randint(60, 400), rng.randint(5, 15)
        start = rng.randint(0, haystack - size)
        others = [rng.randint(5, 15) for _ in range(rng.randint(1, 3))]
        if sum(others) > haystack - size:
            continue
        spans = sorted(
            [(start, start + size)]
            + [
                (s, s + n)
                for s, n in zip(place_others(haystack, start, size, others, rng), others, strict=True)
            ]
        )
        assert spans[0][0] >= 0 and spans[-1][1] <= haystack
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


# -- scoring: generation -----------------------------------------------------------------------------


def _constant_oracle(items: list[TaskItem], answers: list[list[int]]):
    """A ScoreFn whose greedy continuation of item i is `answers[i]`, whatever the guess after it."""

    def score(tokens: torch.Tensor) -> TokenScores:
        argmax = np.zeros((tokens.shape[0], tokens.shape[1] - 1), dtype=np.int64)
        for row, seq in enumerate(tokens.tolist()):
            i = next(
                k for k, it in enumerate(items) if it.tokens[: it.answer_start] == seq[: it.answer_start]
            )
            a0 = items[i].answer_start
            argmax[row, a0 - 1 : a0 - 1 + len(answers[i])] = answers[i]
        zeros = np.zeros(argmax.shape)
        return TokenScores(logprob=zeros, argmax=argmax, margin=zeros)

    return score


def _answer(tok: Any, text: str) -> list[int]:
    return segment_tokens(tok, text)


def test_generation_scores_every_task(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    grid = TaskGrid(PasskeyGrid(tok))
    mv, mv2 = (grid.item(parse_task("multivalue-3"), 320, 0.5, i) for i in range(2))
    mq, mq2 = (grid.item(parse_task("multiquery-2"), 320, 0.5, i) for i in range(2))
    mk, mk2 = (grid.item(parse_task("multikey-2"), 320, 0.5, i) for i in range(2))
    ab = grid.item(parse_task("absent-2"), 320, 0.5)
    v, w = mv.expected, mv2.expected
    cases = [  # (item, the model's answer, hit); one item per case (the oracle knows items by their prompt)
        (mv, f"{v[2]} and {v[0]} and {v[1]} .", True),  # every value, another order
        (mv2, f"{w[2]} and {w[0]} and {w[0]} .", False),  # one value missing: all or nothing
        (mq, f"{mq.expected[1]} and {mq.expected[0]} .", True),
        (mq2, f"{mq2.expected[0]} and 11111 .", False),
        (mk, mk.expected[0], True),
        (mk2, mk2.present[1], False),  # the distractor needle's key
        (ab, ab.present[1], False),  # the control returns a present key: reported, never a hit
    ]
    items = [c[0] for c in cases]
    answers = []
    for it, text, _ in cases:
        a = _answer(tok, text)
        answers.append((a + [a[-1]] * len(it.reference))[: len(it.reference)])
    scores = score_tasks(items, _constant_oracle(items, answers), tok.decode, batch_size=3)
    assert [s.hit for s in scores] == [c[2] for c in cases]
    assert scores[1].found == [True, False, True]  # the second value is missing
    assert scores[3].found == [True, False]
    assert scores[6].present_key == ab.present[1] and scores[6].expected == [] and not scores[6].hit
    assert scores[4].present_key is None and scores[0].output_tokens == answers[0]


def test_jacobi_generation_equals_token_by_token_greedy(demo_tokenizer: Any) -> None:
    """A causal oracle whose next token depends on the prefix: the generation is the greedy decoding."""
    grid = TaskGrid(PasskeyGrid(demo_tokenizer))
    items = [grid.item(parse_task("multivalue-2"), 256, d, i) for d in (0.0, 1.0) for i in range(3)]

    def next_token(prefix: list[int]) -> int:
        return (prefix[-1] * 7 + len(prefix) + (prefix[-2] if len(prefix) > 1 else 0)) % 400

    def score(tokens: torch.Tensor) -> TokenScores:
        rows = tokens.tolist()
        argmax = np.array([[next_token(r[: t + 1]) for t in range(len(r) - 1)] for r in rows], dtype=np.int64)
        zeros = np.zeros(argmax.shape)
        return TokenScores(logprob=zeros, argmax=argmax, margin=zeros)

    got = greedy_answers(items, score, batch_size=4)
    for it, g in zip(items, got, strict=True):
        seq = it.tokens[: it.answer_start]
        while len(seq) < it.length:
            seq.append(next_token(seq))
        assert g == seq[it.answer_start :] and len(g) == len(it.reference)


def test_a_key_is_returned_as_a_whole_number() -> None:
    assert returned("keys 123 and 45", "123") and not returned("1234", "123") and not returned("0123", "123")
    assert returned("3 3 3 3 3 .", "3 3 3 3 3")


# -- scoring: infilling ------------------------------------------------------------------------------


def test_infilling_masks_every_slot_and_scores_in_the_task_s_order(demo_tokenizer: Any) -> None:
    tok = demo_tokenizer
    grid = TaskGrid(PasskeyGrid(tok))
    mv = grid.item(parse_task("multivalue-3"), 320, 0.5, closed=True)
    mq = grid.item(parse_task("multiquery-2"), 320, 0.5, closed=True)
    mask, vocab = 450, tok.vocab_size
    seen: list[torch.Tensor] = []

    def oracle(perm: dict[int, list[int]]):
        def infill(tokens: torch.Tensor, positions: list[torch.Tensor]) -> list[torch.Tensor]:
            seen.append(tokens)
            out = []
            for row, want in zip(tokens.tolist(), positions, strict=True):
                it = mv if row[: mv.haystack] == mv.tokens[: mv.haystack] else mq
                order = perm[id(it)]
                fill = [
                    it.tokens[p] for k in order for p in it.slots[k].positions
                ]  # the slots' keys, permuted
                lp = torch.full((len(want), vocab), -20.0)
                lp[torch.arange(len(want)), torch.tensor(fill)] = 0.0
                out.append(lp)
            return out

        return infill

    swapped = {id(mv): [2, 0, 1], id(mq): [1, 0]}
    scores = score_task_infill(
        [mv, mq],
        oracle(swapped),
        tok.decode,
        kind="mdm",
        mask_id=mask,
        vocab_size=vocab,
        seed=0,
        threshold=0.9,
    )
    assert scores[0].hit, "multi-value: the values in any order"
    assert not scores[1].hit, "multi-query: each name's key in its own restatement"
    same = {id(mv): [0, 1, 2], id(mq): [0, 1]}
    assert all(
        s.hit
        for s in score_task_infill(
            [mv, mq],
            oracle(same),
            tok.decode,
            kind="mdm",
            mask_id=mask,
            vocab_size=vocab,
            seed=0,
            threshold=0.9,
        )
    )
    row = seen[0][0].tolist()
    where = corrupted_positions(mv)
    assert [row[p] for p in where] == [mask] * len(where)
    assert [row[p] for p in range(len(row)) if p not in where] == [
        t for p, t in enumerate(mv.tokens) if p not in where
    ]


# -- effective lengths -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "ruler", "relative"),
    [
        ({1024: 1.0, 2048: 0.9, 4096: 0.853, 8192: 0.84}, 2048, 4096),  # relative: ≥ 0.85 of 1.0
        ({1024: 0.6, 2048: 0.52, 4096: 0.5, 8192: 0.9}, None, 2048),  # ≥ 0.51, up to the first drop
        ({1024: 0.9, 2048: 0.5, 4096: 0.9}, 1024, 1024),
        ({1024: 0.0, 2048: 0.0}, None, None),  # nothing to keep a fraction of
        ({}, None, None),
    ],
)
def test_effective_lengths_by_both_rules(
    scores: dict[int, float], ruler: int | None, relative: int | None
) -> None:
    assert ruler_effective_length(scores, 0.856) == ruler
    assert relative_effective_length(scores, 0.85) == relative


def test_thresholds_are_settings() -> None:
    scores = {1024: 0.8, 2048: 0.7}
    assert ruler_effective_length(scores, 0.75) == 1024 and ruler_effective_length(scores, 0.7) == 2048
    assert relative_effective_length(scores, 0.9) == 1024 and relative_effective_length(scores, 0.85) == 2048


# -- the report ---------------------------------------------------------------------------------------


def _task_result(
    task: str, length: int, hits_per_depth: list[int], n: int, *, control: bool = False
) -> TaskResult:
    items = []
    for d, hits in zip([0.0, 1.0], hits_per_depth, strict=True):
        for i in range(n):
            ok = i < hits
            items.append(
                TaskItemScore(
                    task=task,
                    length=length,
                    depth=d,
                    index=i,
                    asked=["kalo"],
                    expected=[] if control else ["12345"],
                    present=["12345", "67890"],
                    needle_starts=[0],
                    output="12345" if ok else "0",
                    output_tokens=[],
                    found=[] if control else [ok],
                    hit=ok and not control,
                    present_key="12345" if ok and control else None,
                )
            )
    return TaskResult.from_items(task, length, items, 1.0, control=control)


def _single(length: int, hits: int, n: int) -> PasskeyResult:
    items = [
        ItemScore(
            length=length,
            depth=d,
            index=i,
            key="12345",
            needle_start=0,
            greedy=i < hits,
            greedy_tokens=[],
            digit_accuracy=1.0,
            token_margin=0.0,
            logprob=0.0,
            distractor_logprobs=[],
            loglik=None,
            loglik_margin=None,
        )
        for d in (0.0, 1.0)
        for i in range(n)
    ]
    return PasskeyResult.from_items(length, 0, items, 1.0)


def _task_report() -> EvalReport:
    settings = EvalSettings(
        depths=[0.0, 1.0], keys_per_cell=10, distractors=0, tasks=["multikey-2", "multivalue-2", "absent-2"]
    )
    results = []
    for length, single, mk, mv, ab in [
        (1024, 10, [10, 9], [9, 8], [3, 4]),
        (4096, 9, [8, 7], [4, 2], [6, 7]),
    ]:
        results.append(
            LengthResult(
                length=length,
                extrapolated=length > 2048,
                passkey=_single(length, single, 10),
                position=None,
                seconds=0.0,
                tasks=[
                    _task_result("multikey-2", length, mk, 10),
                    _task_result("multivalue-2", length, mv, 10),
                    _task_result("absent-2", length, ab, 10, control=True),
                ],
            )
        )
    ce = CheckpointEval(label="4k", checkpoint={}, trained_length=2048, rotary_base=10_000, results=results)
    return EvalReport(
        plan="tiny",
        stage=None,
        settings=settings,
        method="",
        lengths=[1024, 4096],
        checkpoints=[ce],
        heldout={},
    )


def test_summary_has_a_row_group_per_task_and_both_effective_lengths() -> None:
    report = _task_report()
    by = {t.task: t for t in report.task_summary}
    assert list(by) == ["single", "multikey-2", "multivalue-2", "absent-2"]
    assert [x.hits for x in by["single"].lengths] == [20, 18]
    assert (by["single"].ruler_effective_length, by["single"].relative_effective_length) == (4096, 4096)
    assert [x.accuracy for x in by["multikey-2"].lengths] == [0.95, 0.75]
    assert (by["multikey-2"].ruler_effective_length, by["multikey-2"].relative_effective_length) == (
        1024,
        1024,
    )
    assert by["multivalue-2"].ruler_effective_length is None  # 85 % < 85.6 %
    assert by["multivalue-2"].relative_effective_length == 1024
    ctrl = by["absent-2"]
    assert ctrl.control and ctrl.ruler_effective_length is None and ctrl.relative_effective_length is None
    assert [x.present for x in ctrl.lengths] == [7, 13] and [x.hits for x in ctrl.lengths] == [0, 0]
    md = markdown_table(report)
    for row in (
        "| single | 4k | 20/20 | 18/20* | 4K | 4K |",
        "| multikey-2 | 4k | 19/20 | 15/20* | 1K | 1K |",
        "| multivalue-2 | 4k | 17/20 | 6/20* | — | 1K |",
        "| absent-2 | 4k | p 7/20 | p 13/20* | control | control |",
    ):
        assert row in md, md
    assert "RULER ≥85.6%" in md and "rel ≥0.85×" in md
    titles = [t.title for t in report_tables(report)]
    assert any("needle tasks" in str(t) for t in titles)
    doc = report.model_dump(mode="json")
    assert doc["task_summary"][1]["ruler_effective_length"] == 1024
    assert doc["checkpoints"][0]["results"][0]["tasks"][0]["interval"][1] <= 1.0
    assert EvalReport.model_validate(doc).checkpoints == report.checkpoints


def test_heatmap_has_a_panel_per_task(tmp_path: Path) -> None:
    report = _task_report()
    fig = niah_figure(report)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 4  # single, multikey-2, multivalue-2, absent-2 for the one checkpoint
    assert [ax.get_title().split(" — ")[0] for ax in panels] == [
        "single",
        "multikey-2",
        "multivalue-2",
        "absent-2",
    ]
    panel = task_panel(report.checkpoints[0], "absent-2", [0.0, 1.0], [1024, 4096])
    assert np.allclose(panel.colour, [[0.3, 0.6], [0.4, 0.7]]) and panel.text[0][0] == "p 3/10"
    from longctx.eval.plots import _save

    assert _save(fig, tmp_path / "niah.png").stat().st_size > 1000


def test_a_single_task_report_draws_as_before() -> None:
    report = _task_report()
    plain = report.model_copy(
        update={"settings": EvalSettings(depths=[0.0, 1.0], keys_per_cell=10, distractors=0)}
    )
    fig = niah_figure(plain)
    assert len([ax for ax in fig.axes if ax.get_title()]) == 1
    assert "needle tasks" not in markdown_table(plain)


def test_length_chunks_batch_equal_lengths_in_first_seen_order() -> None:
    from longctx.eval.score import length_chunks

    assert list(length_chunks([3, 5, 3, 3, 5], 2)) == [[0, 2], [3], [1, 4]]
    assert list(length_chunks([7, 7], 0)) == [[0], [1]]  # a batch size below 1 still makes progress
    assert list(length_chunks([], 4)) == []
