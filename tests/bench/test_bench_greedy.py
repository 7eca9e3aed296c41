"""`longctx bench greedy` on a real tiny checkpoint: both modes timed, the same answers, fewer full
forwards with the prefix cache; one JSON document, and a clear refusal of the single task."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from longctx.cli.main import app
from tests.fixtures.eval import S2_LEN, EvalRun


def test_bench_greedy_json(eval_run: EvalRun) -> None:
    args = ["bench", "greedy", str(eval_run.stage("s2")), "--tokenizer", str(eval_run.tokenizer)]
    res = CliRunner().invoke(app, [*args, "--length", str(S2_LEN), "--items", "1", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["items"] == 5 and r["same_answers"] is True and r["misses"] >= 1
    assert r["cached_full_forwards"] == 2 < r["full_forwards"]  # five items in batches of four
    assert r["speedup"] > 0 and len(r["full_seconds"]) == len(r["cached_seconds"]) == 1

    res = CliRunner().invoke(app, [*args, "--length", str(S2_LEN), "--task", "single", "--json"])
    assert res.exit_code == 2
    err = json.loads(res.stdout)
    assert "generation" in json.dumps(err) and "multikey-2" in json.dumps(err)
