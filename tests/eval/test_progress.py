"""Progress of an evaluation: a line on stderr per measured cell (checkpoint, length, done/total, time
left), nothing on stdout (so `--json` stays one document), silenced by LONGCTX_NO_PROGRESS=1."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.eval.progress import Cell, EvalProgress, length_cells
from longctx.eval.settings import EvalSettings
from tests.fixtures.eval import FAST, S1_LEN, S2_LEN, EvalRun

runner = CliRunner()
LINE = re.compile(r"^\[longctx eval\] (\d+)/(\d+) (\S+) @ (\S+) (.+): .* elapsed, (about .* left|done)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_estimate_spreads_the_time_so_far_over_the_weight_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LONGCTX_NO_PROGRESS", raising=False)
    lines: list[str] = []
    clock = FakeClock()
    cells = [
        Cell("base", 256, "passkey", 1.0),
        Cell("base", 1024, "passkey", 4.0),
        Cell("4k", 4096, "x", 5.0),
    ]
    progress = EvalProgress(cells, cached=2, write=lines.append, clock=clock)
    assert lines == ["[longctx eval] 3 cells to measure, 2 from the cache"]
    clock.now = 10.0  # 10 s for weight 1 → 9 left take 90 s
    progress.finished("base", 256, "passkey")
    assert lines[-1] == "[longctx eval] 1/3 base @ 256 passkey: 10 s elapsed, about 1 min 30 s left"
    clock.now = 50.0  # 50 s for weight 5 → 5 left take 50 s
    progress.finished("base", 1024, "passkey")
    assert lines[-1] == "[longctx eval] 2/3 base @ 1K passkey: 50 s elapsed, about 50 s left"
    clock.now = 7300.0
    progress.finished("4k", 4096, "x")
    assert lines[-1] == "[longctx eval] 3/3 4k @ 4K x: 2 h 01 min elapsed, done"


def test_quiet_where_the_other_progress_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGCTX_NO_PROGRESS", "1")
    lines: list[str] = []
    progress = EvalProgress([Cell("base", 256, "passkey", 1.0)], write=lines.append)
    progress.finished("base", 256, "passkey")
    assert lines == [] and progress.done == 1


def test_a_length_has_a_cell_per_measurement() -> None:
    s = EvalSettings(tasks=["single", "multikey-2", "absent-2"], packed_windows=2)
    causal = [c.what for c in length_cells("s1", 1024, s, causal=True, packed=True)]
    assert causal == ["passkey", "loss by position", "packed windows", "multikey-2", "absent-2"]
    diffusion = [c.what for c in length_cells("s1", 1024, s, causal=False, packed=False)]
    assert diffusion == ["passkey", "elbo by context", "multikey-2", "absent-2"]


def test_eval_run_prints_progress_on_stderr_and_one_json_document(
    eval_run_copy: EvalRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LONGCTX_NO_PROGRESS", raising=False)
    lengths = f"{S1_LEN},{S2_LEN}"
    plan, s2 = str(eval_run_copy.plan), str(eval_run_copy.stage("s2"))
    tasks = ["--tasks", "single,multikey-2", "--packed-windows", "0"]
    args = ["eval", "run", s2, "--plan", plan, "--lengths", lengths, *FAST, *tasks, "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # stdout is exactly the report
    assert doc["lengths"] == [S1_LEN, S2_LEN]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("[longctx eval]")]
    assert lines[0] == "[longctx eval] 8 cells to measure", lines
    cells = [LINE.match(ln) for ln in lines[1:]]
    assert all(cells), lines
    # the base's short loss (the reference); s2 at each length: passkey, loss by position, the task; its short loss
    assert [m.groups()[:5] for m in cells if m] == [
        ("1", "8", "base", "64", "short-context loss"),
        ("2", "8", "s2", "128", "passkey"),
        ("3", "8", "s2", "128", "loss by position"),
        ("4", "8", "s2", "128", "multikey-2"),
        ("5", "8", "s2", "256", "passkey"),
        ("6", "8", "s2", "256", "loss by position"),
        ("7", "8", "s2", "256", "multikey-2"),
        ("8", "8", "s2", "64", "short-context loss"),
    ]
    assert all("left" in ln for ln in lines[1:-1]) and lines[-1].endswith("done")

    # the same again: everything from the cache, said once; with progress off, nothing at all
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and json.loads(again.stdout)["lengths"] == [S1_LEN, S2_LEN]
    assert [ln for ln in again.stderr.splitlines() if ln.startswith("[longctx eval]")] == [
        "[longctx eval] nothing to measure, 4 from the cache"
    ]
    monkeypatch.setenv("LONGCTX_NO_PROGRESS", "1")
    quiet = runner.invoke(app, [*args, "--no-cache"])
    assert quiet.exit_code == 0 and json.loads(quiet.stdout)
    assert "[longctx eval]" not in quiet.stderr
