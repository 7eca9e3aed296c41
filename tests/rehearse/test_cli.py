"""`longctx rehearse` refuses before it writes anything: a tokenizer without its manifest, a run directory
that holds something else than a rehearsal."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from longctx.cli.main import app

REPO = Path(__file__).resolve().parents[2]
PLAN = str(REPO / "stages" / "baby_9b_dense.toml")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_tokenizer_without_its_manifest_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["rehearse", PLAN, "--run-dir", str(run), "--tokenizer", str(tmp_path), "--json"]
    )
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and "needs its manifest" in doc["error"]["what"]
    assert not run.exists()


def test_a_run_dir_that_is_no_rehearsal_is_left_alone(tmp_path: Path) -> None:
    run = tmp_path / "real-run"
    (run / "stages" / "16k").mkdir(parents=True)
    (run / "ledger.jsonl").write_text("{}\n", encoding="utf-8")
    before = _tree(run)
    res = CliRunner().invoke(app, ["rehearse", PLAN, "--run-dir", str(run)])
    assert res.exit_code == 2
    assert "is no rehearsal's run directory" in res.output and "fix:" in res.output
    assert _tree(run) == before
