"""What `eval summary` shows a reader: each effective length under its own name with its rule (table
headers, legend, JSON keys), and no line wider than the terminal (COLUMNS=100 and 80)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.eval.report_tables import markdown_table, print_report
from longctx.eval.results import CheckpointEval, EvalReport, LengthResult, PasskeyResult
from longctx.eval.score import ItemScore
from longctx.eval.settings import EvalSettings
from tests.fixtures.eval import FAST, S1_LEN, S2_LEN, EvalRun

runner = CliRunner()
DEPTHS = [0.0, 0.5, 1.0]


def _passkey(length: int, hits: list[int], keys: int = 20) -> PasskeyResult:
    fixed = dict(key="12345", needle_start=0, greedy_tokens=[], digit_accuracy=1.0, token_margin=0.5)
    fixed.update(logprob=-1.0, distractor_logprobs=[], loglik=None, loglik_margin=None)
    items = [
        ItemScore(length=length, depth=d, index=i, greedy=i < h, **fixed)
        for d, h in zip(DEPTHS, hits, strict=True)
        for i in range(keys)
    ]
    return PasskeyResult.from_items(length, 0, items, 1.0)


def _report(lengths: list[int]) -> EvalReport:
    """One stage, every depth ≥ 90 % up to the second length, then 17/20 at depth 0.5 of the longer ones:
    95 % over all depths there, so RULER's rule (85.6 % overall) reaches the longest length."""
    results = [
        LengthResult(
            length=n,
            extrapolated=False,
            passkey=_passkey(n, [20, 20 if k < 2 else 17, 20]),
            position=None,
            seconds=0.0,
        )
        for k, n in enumerate(lengths)
    ]
    ce = CheckpointEval(
        label="4k", checkpoint={}, trained_length=max(lengths), rotary_base=10_000, results=results
    )
    settings = EvalSettings(depths=DEPTHS, keys_per_cell=20, distractors=0, tasks=["single", "multikey-2"])
    return EvalReport(
        plan="tiny",
        stage=None,
        settings=settings,
        settings_origin="the [eval] of plan tiny, overridden: keys_per_cell 2 → 20; depths 0,0.25,0.5,0.75,1 → "
        "0,0.5,1; tasks single → single,multikey-2; seed 1234 → 99; key_digits 5 → 6",
        method="",
        lengths=lengths,
        checkpoints=[ce],
        heldout={},
    )


def test_each_effective_length_has_its_own_name_and_rule(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report([256, 1024, 4096])
    doc = report.model_dump(mode="json")
    ce, row = doc["checkpoints"][0], report.table()[0]
    single = next(t for t in doc["task_summary"] if t["task"] == "single")
    # two rules, two numbers, two names: never one "effective_length" holding either
    assert ce["every_depth_effective_length"] == 1024 and row["every_depth_effective_length"] == 1024
    assert single["ruler_effective_length"] == 4096 and doc["every_depth_threshold"] == 0.9
    assert "effective_length" not in ce and "effective_length" not in row
    assert "effective_threshold" not in doc

    print_report(report)
    out = capsys.readouterr().out
    lines = out.splitlines()
    # each column's heading: the name over its rule, the passkey table's and the task table's
    heads = [
        (" ".join(lines[k - 1].split()), " ".join(ln.split()))
        for k, ln in enumerate(lines)
        if "checkpoint" in ln
    ]
    assert ("effective", "checkpoint trained 256 1K 4K all depths ≥90%") in heads, out
    assert ("effective effective", "task checkpoint 256 1K 4K RULER ≥85.6% rel ≥0.85×") in heads, out
    legend = " ".join(out.split())
    assert "effective all depths ≥90% = the every-depth effective length" in legend, legend
    assert "effective RULER = the longest length up to which the task's score over all depths" in legend
    md = markdown_table(report)
    assert "| effective all depths ≥90% |" in md and "| 1K |" in md
    assert "| effective RULER ≥85.6% | effective rel ≥0.85× |" in md
    assert "| single | 4k | 60/60 | 60/60 | 57/60 | 4K | 4K |" in md, md


@pytest.mark.parametrize("columns", [100, 80])
def test_no_line_of_the_report_is_wider_than_the_terminal(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    report = _report([256, 1024, 4096, 16384, 65536])
    report.notes = ["a note naming a path /" + "deep/" * 40 + "report.json that cannot be broken at a space"]
    report.plots = {"niah": "/" + "long/" * 40 + "niah.png"}
    print_report(report)
    out = capsys.readouterr().out
    assert "settings: 20 keys per cell" in out and "niah:" in out and "niah.png" in out
    assert "multikey-2" in out  # folded where it does not fit, not cut short
    wide = [ln for ln in out.splitlines() if len(ln) > columns]
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("columns", [100, 80])
def test_eval_summary_fits_the_terminal(
    columns: int, eval_run_copy: EvalRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    args = ["eval", "summary", str(eval_run_copy.plan), "--lengths", f"{S1_LEN},{S2_LEN}", *FAST]
    res = runner.invoke(app, [*args, "--tasks", "single,multikey-2", "--seed", "7"])
    assert res.exit_code == 0, res.output
    assert "settings: 1 keys per cell × 2 depths" in res.stdout and "overridden:" in res.stdout
    wide = [ln for ln in res.stdout.splitlines() if len(ln) > columns]
    assert not wide, "\n".join(wide)
    # --json is not laid out: one document whatever the width
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert "every_depth_effective_length" in doc["checkpoints"][0]
