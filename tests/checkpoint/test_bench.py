"""`longctx bench ckpt` runs and reports its proof figures (timings are printed, never asserted)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from longctx.cli.main import app


def test_bench_ckpt_small() -> None:
    res = CliRunner().invoke(app, ["bench", "ckpt", "--files", "16", "--dp", "4", "--repeats", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["files"] == 16 and data["shard_opens"] == 0 and data["verify_ok"] is True
    assert data["inferred"]["num_layers"] == 36 and data["inferred"]["iteration"] == 76800
    assert data["logical_bytes"] > 100 * 2**30 > data["disk_bytes"]
    assert {"baseline_unpickle_s", "inspect_s", "verify_s", "verify_cold_s", "total_s"} <= set(data)
