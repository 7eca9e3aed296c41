"""scripts/device-check sized to one device command: its step timeouts, and its dry run on CPU (rows
written per step and per smoke check, a step past its limit recorded as a row, few files)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-check"


def test_the_gpu_steps_fit_the_budget() -> None:
    text = SCRIPT.read_text()
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    gpu = text.split("\nelse\n  step tests", 1)[1]
    limits = [int(m) for m in re.findall(r"^\s*step \S+ (\d+) ", "  step tests" + gpu, re.M)]
    limits += [int(m) for m in re.findall(r"^\s*step (?:install|imports|smoke) (\d+) ", text, re.M)]
    assert len(limits) == 7 and sum(limits) <= 410, limits
    assert sum(limits) + 5 * len(limits) <= 450  # the worst case, every step killed 5 s after its limit
    assert "timeout -k 5" in text and "CP 2" not in text.split("step memory")[1]


@pytest.mark.slow
def test_dry_run_on_cpu_records_every_step_as_a_row(tmp_path: Path) -> None:
    env = dict(
        os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1", PYTHON=str(ROOT / ".venv" / "bin" / "python")
    )
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "check" not in r]
    assert steps == ["imports", "smoke", "tests", "dry-timeout", "total"], steps
    by_step = {r["step"]: r for r in rows if "check" not in r}
    assert all(by_step[s]["ok"] for s in ("imports", "smoke", "tests", "total"))
    assert by_step["dry-timeout"]["timed_out"] and by_step["dry-timeout"]["seconds"] < 10
    checks = [r["check"]["name"] for r in rows if r["step"] == "smoke" and "check" in r]
    assert checks[0].startswith("kernel") and checks[-1] == "all_reduce"
    assert len(list(tmp_path.iterdir())) <= 7
    assert "step timeouts:" in proc.stdout
