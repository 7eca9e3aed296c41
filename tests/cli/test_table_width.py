"""Every table the plan, demo and evaluation reports print fits a 100-column terminal at its natural
width, for the shipped plans and for an evaluation the size of baby_9b_dense's (five checkpoints,
four lengths, worst-case cells)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from longctx.cli.demo import stages_table
from longctx.cli.plan import memory_table, plan_table
from longctx.eval.loss_position import PackedLoss, PositionLoss
from longctx.eval.report_tables import legend_lines, report_tables
from longctx.eval.results import CheckpointEval, EvalReport, LengthResult, PasskeyResult
from longctx.eval.score import ItemScore
from longctx.eval.settings import EvalSettings
from longctx.eval.short_context import ShortLoss
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.util.table import TERMINAL_COLUMNS, natural_width

STAGES = Path(__file__).resolve().parents[2] / "stages"
# the plans whose tokenizer manifest ships with the repository (the tiny ones build theirs in a run)
SHIPPED = ["baby_9b_dense.toml", "ermine_arm.toml", "ermine_mdm.toml", "ermine_udm_moe.toml"]


@pytest.mark.parametrize("name", SHIPPED)
def test_plan_show_tables_fit(name: str) -> None:
    rp = resolve_plan(load_plan(STAGES / name))
    assert natural_width(plan_table(rp)) <= TERMINAL_COLUMNS
    assert natural_width(memory_table(rp)) <= TERMINAL_COLUMNS


def test_demo_stages_table_fits() -> None:
    row = dict(
        stage="4k",
        seq_length=4096,
        rotary_base=31_000_000,
        cp=2,
        iterations="1200/1200",
        launches=["first-launch", "resume", "resume"],
        first_loss=10.123,
        final_loss=3.456,
        tokens_per_s=123_456.0,
    )
    assert natural_width(stages_table([row, {**row, "stage": "128k"}])) <= TERMINAL_COLUMNS


def _length_result(length: int, keys: int, extrapolated: bool) -> LengthResult:
    items = [
        ItemScore(
            length=length,
            depth=d,
            index=i,
            greedy=i % 3 == 0,
            loglik=i % 3 == 0,
            key="12345",
            needle_start=10,
            greedy_tokens=[],
            digit_accuracy=1.0,
            token_margin=0.5,
            logprob=-1.0,
            distractor_logprobs=[-2.0, -3.0],
            loglik_margin=-12.34,
        )
        for d in (0.0, 0.25, 0.5, 0.75, 1.0)
        for i in range(keys)
    ]
    position = PositionLoss(
        length=length,
        docs=1,
        packed=False,
        buckets=[(0, length)],
        loss=[12.345],
        tokens=[length],
        mean_loss=12.345,
        long_loss=12.345,
    )
    packed = PackedLoss(
        length=length,
        windows=4,
        documents=12,
        buckets=[(0, length)],
        plain=[12.345],
        within=[12.345],
        tokens=[length],
        plain_loss=12.345,
        within_loss=12.345,
        later_tokens=9,
        plain_later_loss=12.345,
        within_later_loss=12.345,
    )
    return LengthResult(
        length=length,
        extrapolated=extrapolated,
        passkey=PasskeyResult.from_items(length, 2, items, 1.0),
        position=position,
        packed=packed,
        seconds=0.0,
    )


def baby_sized_report() -> EvalReport:
    lengths = [4096, 16384, 65536, 131072]
    checkpoints = [
        CheckpointEval(
            label=label,
            checkpoint={},
            trained_length=trained,
            rotary_base=31_000_000,
            results=[_length_result(n, 100, n > trained) for n in lengths],
            short=ShortLoss(length=4096, docs=64, tokens=200_000, loss=12.345),
            short_delta_vs_base=-10.123,
            short_delta_interval=(-10.123, -10.001),
        )
        for label, trained in (
            ("base", 4096),
            ("16k", 16384),
            ("64k", 65536),
            ("128k", 131072),
            ("128k-r2", 131072),
        )
    ]
    settings = EvalSettings(depths=[0.0, 0.25, 0.5, 0.75, 1.0], keys_per_cell=100)
    return EvalReport(
        plan="baby_9b_dense",
        stage="128k",
        settings=settings,
        method="",
        lengths=lengths,
        checkpoints=checkpoints,
        heldout={},
    )


def test_evaluation_tables_fit_and_keep_what_a_user_decides_from() -> None:
    report = baby_sized_report()
    tables = report_tables(report)
    assert [natural_width(t) <= TERMINAL_COLUMNS for t in tables] == [True] * len(tables)
    assert all(len(line) <= TERMINAL_COLUMNS for line in legend_lines(report))
    con = Console(width=TERMINAL_COLUMNS, record=True)
    for t in tables:
        con.print(t)
    text = con.export_text()
    # greedy hits / keys, chance and beyond-window marks, effective length, the short loss's interval
    assert "~170/500" in text and "*" in text
    assert "[-10.123, -10.001]" in text
    assert "effective" in text


def test_the_needle_task_table_fits() -> None:
    from longctx.eval.task_results import TaskResult
    from longctx.eval.task_score import TaskItemScore

    report = baby_sized_report()
    tasks = ["multikey-16", "multivalue-16", "multiquery-16", "absent-16"]
    settings = report.settings.model_copy(update={"tasks": ["single", *tasks]})
    for ce in report.checkpoints:
        for r in ce.results:
            for task in tasks:
                control = task.startswith("absent")
                items = [
                    TaskItemScore(
                        task=task,
                        length=r.length,
                        depth=d,
                        index=i,
                        asked=["kalo"],
                        expected=[],
                        present=["12345"],
                        needle_starts=[0],
                        output="12345",
                        output_tokens=[],
                        found=[],
                        hit=not control,
                        present_key="12345" if control else None,
                    )
                    for d in settings.depths
                    for i in range(100)
                ]
                r.tasks.append(TaskResult.from_items(task, r.length, items, 1.0, control=control))
    report = report.model_copy(update={"settings": settings})
    tables = report_tables(report)
    assert [natural_width(t) <= TERMINAL_COLUMNS for t in tables] == [True] * len(tables)
    assert all(len(line) <= TERMINAL_COLUMNS for line in legend_lines(report))
    con = Console(width=TERMINAL_COLUMNS, record=True)
    for t in tables:
        con.print(t)
    text = con.export_text()
    assert "multiquery-16" in text and "500/500*" in text and "p 500/500" in text and "control" in text
