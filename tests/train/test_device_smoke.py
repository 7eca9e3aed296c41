"""The GPU smoke test's CPU run: the same checks on the CPU kernels, and the scripts that carry it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_checks_pass_on_cpu_in_order_and_stream_one_line_each(tmp_path: Path) -> None:
    lines = tmp_path / "smoke.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "longctx.train.device_smoke",
            "--device",
            "cpu",
            "--json",
            "--jsonl",
            str(lines),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report
    names = [c["name"] for c in report["checks"]]
    # kernels first (contiguous, then Megatron's strided views), the collective last
    assert sum(n.startswith("kernel cpu_flash") for n in names) == 8
    assert all(n.startswith("kernel") for n in names[:8]) and names[7].endswith("strided")
    assert names[8:] == ["model loss+grads vs math", "bf16 norm dtype", "bf16 train step", "all_reduce"]
    assert all(c["ok"] for c in report["checks"])
    step = next(c for c in report["checks"] if c["name"] == "bf16 train step")
    assert "100.0% of fp32 masters moved" in step["detail"]
    streamed = [json.loads(x) for x in lines.read_text().splitlines()]
    assert [r["name"] for r in streamed] == names


def test_device_scripts_parse() -> None:
    for script in ("device-check", "device-wheels"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)
