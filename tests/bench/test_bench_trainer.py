"""`longctx bench trainer`: the local backend vs the real Megatron-LM on one tiny stage, on the CPU.

One real run of the command (the default model, 3 iterations of each backend, one of them warm-up:
about a minute on 2 cores, most of it the two launches' start-up), and the missing-checkout error.
Nothing about speed is asserted; the figures must be real measurements of both launches.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.cli.main import app
from longctx.plan.load import load_plan

ITERATIONS, WARMUP = 3, 1


def _bench(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "longctx", "bench", "trainer", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )


@pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)
def test_bench_trainer_measures_both_backends(megatron_lm: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = dict(os.environ, LONGCTX_MEGATRON_LM=str(megatron_lm))
    proc = _bench("--iterations", str(ITERATIONS), "--warmup", str(WARMUP), "--work-dir", str(work), env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert doc["ok"] is True

    for key, backend in (("local", "local"), ("megatron_lm", "megatron-lm")):
        run = doc[key]
        assert run["backend"] == backend
        per_iter = run["iteration_tokens_per_s"]
        assert len(per_iter) == ITERATIONS and all(v > 0 for v in per_iter)
        assert run["measured_iterations"] == ITERATIONS - WARMUP
        assert run["tokens_per_s"] > 0
        assert run["tokens_per_s"] == statistics.median(per_iter[WARMUP:])
        assert run["launch_seconds"] > run["seconds_per_iteration"] * ITERATIONS
        assert run["command"][3:6] == ["stage", "run", str(work / "plan.toml")]
        assert backend in run["command"]
        assert Path(run["log"]).is_file()
    assert doc["ratio"] == doc["local"]["tokens_per_s"] / doc["megatron_lm"]["tokens_per_s"]

    # the figures are the launches' own: the metrics file and Megatron-LM's log say the same
    metrics = work / "run-local" / "stages" / "bench" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["tokens_per_s"] for r in rows] == doc["local"]["iteration_tokens_per_s"]
    mlm_log = Path(doc["megatron_lm"]["log"]).read_text()
    assert "Megatron-LM runs on the CPU with shims" in mlm_log
    assert mlm_log.count("elapsed time per iteration (ms)") == ITERATIONS
    tokens = doc["settings"]["tokens_per_iteration"]
    assert tokens == doc["settings"]["global_batch_size"] * doc["settings"]["seq_length"]

    # one plan for both, with the settings the document reports
    plan = load_plan(work / "plan.toml")
    (stage,) = plan.stages
    assert stage.seq_length == doc["settings"]["seq_length"] and stage.tokens == ITERATIONS * tokens
    assert plan.cluster.gpus_per_node == doc["settings"]["processes"] == doc["machine"]["processes"]
    assert plan.local.threads_per_process == doc["settings"]["threads"]
    assert doc["machine"]["cpu_model"] and doc["machine"]["cpus"] >= 1
    assert any("shims" in d for d in doc["differences"])


def test_bench_trainer_without_a_checkout_exits_2_with_one_json_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # in this process: the command refuses before it launches anything (the real run above is a subprocess
    # because its launches write to the same stdout)
    monkeypatch.delenv("LONGCTX_MEGATRON_LM", raising=False)
    res = CliRunner().invoke(app, ["bench", "trainer", "--json"])
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and "LONGCTX_MEGATRON_LM is not set" in doc["error"]["what"]
    assert "--megatron-lm" in doc["error"]["fix"]

    res = CliRunner().invoke(app, ["bench", "trainer", "--megatron-lm", str(tmp_path), "--json"])
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert "is not a Megatron-LM checkout" in doc["error"]["what"] and doc["error"]["where"] == str(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing built before the check
