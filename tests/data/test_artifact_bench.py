"""`bench index-check` runs small and cleans up; its prefix writer produces megatron-core's exact bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from longctx.bench.index_check import run_index_check_bench, write_prefix
from longctx.cli.main import app
from tests.fixtures.data import write_indexed_dataset


def test_prefix_writer_matches_megatron_builder(tmp_path: Path) -> None:
    docs = [np.arange(5, 5 + n, dtype=np.int32) for n in (3, 70, 1, 12)]
    ref = write_indexed_dataset(tmp_path / "ref", [d.tolist() for d in docs], np.int32)
    sizes = write_prefix(str(tmp_path / "ours"), docs)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == Path(ref + ext).read_bytes()
    assert sizes == ((tmp_path / "ours.bin").stat().st_size, (tmp_path / "ours.idx").stat().st_size)


def test_bench_runs_small_and_cleans_up(tmp_path: Path) -> None:
    r = run_index_check_bench(
        40, lengths=[1024], docs_per_prefix=4, tmp_dir=str(tmp_path), repeats=1, workers=2
    )
    assert r.index_ok and r.full_ok and r.prefixes == 40 and r.documents == 160
    assert r.prefixes_per_second > 0 and r.raw_gbps > 0 and r.full_gbps > 0 and r.ratio > 0
    assert list(tmp_path.iterdir()) == []


def test_bench_cli_json(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "index-check",
            "--prefixes",
            "24",
            "--docs",
            "2",
            "--repeats",
            "1",
            "--tmp-dir",
            str(tmp_path),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["index_ok"] and data["full_ok"] and data["prefixes"] == 24
