"""`longctx bench throughput`: tokens/s and MFU of the local backend at CP 1 and 2 (nothing timed)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from longctx.bench.steps import StepCase
from longctx.bench.throughput import MODELS, datasheet_peak, flops_per_token, matmul_params
from longctx.cli.main import app


def test_model_flops_by_hand() -> None:
    c = StepCase("x", 1024, layers=2, hidden=64, heads=4, groups=2, ffn=128, vocab=256)
    # per layer: qkv 64·(4+4)·16, proj 64·64, fc1 64·256 (SwiGLU), fc2 128·64; output layer 256·64
    layer = 64 * 8 * 16 + 64 * 64 + 64 * 256 + 128 * 64
    assert matmul_params(c) == 2 * layer + 256 * 64
    assert flops_per_token(c) == 6 * matmul_params(c) + 6 * 2 * 1024 * 4 * 16
    assert MODELS["125m"].arch().param_count(MODELS["125m"].vocab) == pytest.approx(125.8e6, rel=0.01)


def test_datasheet_peaks_are_matched_by_name() -> None:
    assert datasheet_peak("NVIDIA H200") == 989.4e12
    assert datasheet_peak("NVIDIA A100-SXM-64GB") == 312e12
    assert datasheet_peak("AMD EPYC") is None and datasheet_peak(None) is None


def test_demo_model_at_cp1_and_cp2_prints_one_json_document() -> None:
    args = ["bench", "throughput", "--models", "demo", "--seq-lens", "512", "--cp", "1,2", "--iterations", "3",
            "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [(r["cp"], len(r["ranks"])) for r in rows] == [(1, 1), (2, 2)]
    for r in rows:
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1.5 and r["mfu_datasheet"] is None
        assert all(m["gemm_flops_per_s"] > 0 for m in r["ranks"])
    # CP 2 trains the same steps as CP 1 on the same batches
    assert rows[1]["ranks"][0]["losses"] == pytest.approx(rows[0]["ranks"][0]["losses"], rel=1e-5)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "gpt4"], "unknown model"),
        (["--seq-lens", "1K", "--cp", "3"], "multiple of 2 × CP"),
    ],
)
def test_refusals(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["bench", "throughput", *args, "--json"])
    assert result.exit_code == 2
    assert says in json.loads(result.stdout)["error"]["what"]
