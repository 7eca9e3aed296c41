"""The GPU smoke test's CPU run: the same checks on the CPU kernels, and the scripts that carry it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_checks_pass_on_cpu_and_print_one_json_document() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "longctx.train.device_smoke", "--device", "cpu", "--json"],
        capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report
    names = [c["name"] for c in report["checks"]]
    assert names[0] == "all_reduce" and "bf16 train step" in names and "bf16 norm dtype" in names
    assert sum(n.startswith("kernel cpu_flash") for n in names) == 4
    assert all(c["ok"] for c in report["checks"])
    step = next(c for c in report["checks"] if c["name"] == "bf16 train step")
    assert "100.0% of fp32 masters moved" in step["detail"]


def test_device_scripts_parse() -> None:
    for script in ("device-check", "device-wheels"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)
