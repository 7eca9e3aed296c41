"""`eval run --attention-scale`: the checkpoint evaluated with its attention logits scaled (a diagnostic of
how much sharper attention would retrieve), said in the report's notes, cached apart from the unscaled."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longctx.cli.main import app
from tests.fixtures.eval import MINIMAL, EvalRun


def _run(run: EvalRun, out: Path, *extra: str) -> dict:
    args = [
        *run.eval_run_args("s2"),
        "--lengths",
        "256",
        *MINIMAL,
        "--tasks",
        "single",
        "--out",
        str(out),
        "--json",
        *extra,
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _loss(report: dict) -> list[float]:
    (result,) = report["checkpoints"][0]["results"]
    return result["position"]["loss"]


def test_a_scaled_evaluation_is_its_own(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    plain = _run(eval_run_copy, tmp_path / "plain")
    scaled = _run(eval_run_copy, tmp_path / "scaled", "--attention-scale", "2")
    assert any("attention logits × 2 (--attention-scale)" in n for n in scaled["notes"])
    assert not any("--attention-scale" in n for n in plain["notes"])
    assert _loss(plain) != _loss(scaled)  # measured anew, not the unscaled result from the cache
    assert _loss(_run(eval_run_copy, tmp_path / "again")) == _loss(plain)

    res = CliRunner().invoke(
        app,
        [
            *eval_run_copy.eval_run_args("s2"),
            "--attention-scale",
            "0",
            "--json",
        ],
    )
    assert res.exit_code == 2 and "--attention-scale" in res.output
