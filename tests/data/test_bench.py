from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longctx.bench.data_check import TARGET_RATIO, run_data_check_bench
from longctx.cli.main import app


def test_bench_runs_small_and_cleans_up(tmp_path: Path) -> None:
    r = run_data_check_bench(0.02, tmp_dir=str(tmp_path), repeats=1, workers=2)
    assert r.check_ok
    assert r.bin_bytes == int(0.02 * 2**30) // 4 * 4
    assert r.raw_gbps > 0 and r.check_gbps > 0 and r.ratio == r.check_gbps / r.raw_gbps
    assert r.target_ratio == TARGET_RATIO
    assert list(tmp_path.iterdir()) == []


def test_bench_cli_json(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        ["bench", "data-check", "--size-gib", "0.02", "--repeats", "1", "--tmp-dir", str(tmp_path), "--json"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["check_ok"] is True and data["ratio"] > 0
