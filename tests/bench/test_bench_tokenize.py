"""`longctx bench tokenize`: longctx's `data tokenize` vs the real `tools/preprocess_data.py`.

One real run on a few synthetic documents (most of its time is the Megatron-LM child's imports), and
the missing-checkout error. Nothing about speed is asserted; the figures must be real measurements.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longctx.cli.main import app

runner = CliRunner()


def test_bench_tokenize_measures_both_and_compares_bytes(megatron_lm: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    res = runner.invoke(
        app,
        [
            "bench",
            "tokenize",
            "--documents",
            "6",
            "--repeats",
            "1",
            "--workers",
            "2",
            "--megatron-lm",
            str(megatron_lm),
            "--work-dir",
            str(work),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output + res.stderr
    r = json.loads(res.stdout)
    assert r["identical"] is True and r["documents"] == 6 and r["tokens"] > 1000
    assert r["encoding"].startswith("HuggingFaceTokenizer (transformers")
    assert r["longctx_seconds"] > 0 and r["megatron_seconds"] > 0
    assert r["ratio"] == r["megatron_seconds"] / r["longctx_seconds"]
    assert len(r["longctx_runs"]) == len(r["megatron_runs"]) == 1
    assert (work / "megatron" / "out_text_document.bin").is_file() and (
        work / "longctx" / "out.bin"
    ).is_file()


def test_bench_tokenize_without_a_checkout(tmp_path: Path) -> None:
    res = runner.invoke(app, ["bench", "tokenize", "--megatron-lm", str(tmp_path)])
    assert res.exit_code == 2
    assert "is not a Megatron-LM checkout" in res.stderr
