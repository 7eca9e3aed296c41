"""Evaluation inputs that must be refused before any model is scored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bad_input.harness import refused
from tests.fixtures.eval import EvalRun

CASES = [
    (["--lengths", "0"], "length"),
    (["--lengths", "1152921504606846976"], "beyond what longctx evaluates"),
    (["--depths", "1.5"], "depth"),
    (["--depths", "-0.1"], "depth"),
    (["--depths", "nan"], "depth"),
    (["--keys", "0"], "keys"),
    (["--key-digits", "0"], "digits"),
    (["--cp", "0"], "context-parallel"),
    (["--cp", "3"], "3"),
    (["--lengths", "256"], "above the checkpoint's max position"),
    (["--stage", "no-such-stage"], "no-such-stage"),
    (["--lengths", "100", "--cp", "2"], "2 process"),
    (["--batch-size", "0"], "batch"),
    (["--rotary-base", "0"], "rotary-base"),
    (["--rotary-base", "-5"], "rotary-base"),
    (["--threads", "0"], "threads"),
    (["--keys", "1000000000"], "keys_per_cell"),
    (["--distractors", "1000000000"], "distractors"),
    (["--tasks", "haystack"], "unknown needle task"),
    (["--tasks", "multikey-1"], "multikey takes 2–16 needles"),
]


@pytest.mark.parametrize(("extra", "needle"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_eval_run_refuses(eval_run_copy: EvalRun, tmp_path: Path, extra: list[str], needle: str) -> None:
    run = eval_run_copy
    args = ["eval", "run", run.stage("s1"), "--plan", run.plan, "--out", tmp_path / "out", *extra]
    refused(args, [run.root, tmp_path], needle=needle)
    assert not (tmp_path / "out").exists()


def test_eval_run_of_a_missing_checkpoint(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    run = eval_run_copy
    args = ["eval", "run", tmp_path / "nowhere", "--plan", run.plan, "--out", tmp_path / "out"]
    refused(args, [run.root, tmp_path], needle="nowhere")


def test_eval_output_inside_the_checkpoint(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    run = eval_run_copy
    ck = run.stage("s1")
    refused(
        ["eval", "run", ck, "--plan", run.plan, "--out", ck / "eval"],
        [run.root, tmp_path],
        needle="inside the input",
    )
