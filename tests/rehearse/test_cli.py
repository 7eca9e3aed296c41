"""`longctx rehearse` refuses before it writes anything: a tokenizer without its manifest, a run directory
that holds something else than a rehearsal or a rehearsal on the other backend, an unknown backend, the
megatron-lm backend without a Megatron-LM checkout (none given, or one without pretrain_gpt.py), --slurm on
a host without sbatch, --slurm-time without --slurm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.plan.derive import open_plan
from longctx.stage.run import MEGATRON_ENV
from tests.bad_input.harness import refused

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


def _where(args: list[str]) -> str:
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    return str(doc["error"]["where"])


def test_megatron_lm_without_a_checkout_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MEGATRON_ENV, raising=False)
    run = tmp_path / "run"
    args = ["rehearse", PLAN, "--run-dir", str(run), "--backend", "megatron-lm"]
    text = refused(args, [tmp_path], needle="the megatron-lm backend needs a Megatron-LM checkout")
    assert f"export {MEGATRON_ENV}=" in text
    assert MEGATRON_ENV in _where(args) and "[megatron].path" in _where(args)
    assert not run.exists()


def test_megatron_lm_with_a_checkout_without_pretrain_gpt_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "Megatron-LM"
    (checkout / "megatron").mkdir(parents=True)
    monkeypatch.setenv(MEGATRON_ENV, str(checkout))
    run = tmp_path / "run"
    args = ["rehearse", PLAN, "--run-dir", str(run), "--backend", "megatron-lm"]
    refused(args, [tmp_path], needle="no entry script pretrain_gpt.py")
    assert _where(args) == str(checkout / "pretrain_gpt.py")
    assert not run.exists()


def test_an_unknown_backend_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["rehearse", PLAN, "--run-dir", str(run), "--backend", "nemo"]
    text = refused(args, [tmp_path], needle="unknown backend 'nemo'")
    assert "local, megatron-lm" in text and _where(args) == "--backend"
    assert not run.exists()


def test_a_rehearsal_on_the_other_backend_is_left_alone(tmp_path: Path) -> None:
    """A rerun resumes a rehearsal on its own backend only: the stages the megatron-lm one finished would
    otherwise be reported as the local trainer's."""
    run = tmp_path / "run"
    run.mkdir()
    source = str(open_plan(Path(PLAN)).plan.plan_path)
    mark = {"source": source, "rehearsal": True, "backend": "megatron-lm", "reductions": []}
    (run / "rehearsal.json").write_text(json.dumps(mark), encoding="utf-8")
    text = refused(["rehearse", PLAN, "--run-dir", str(run)], [tmp_path], needle="on the megatron-lm backend")
    assert "this one runs on local" in text and "--backend megatron-lm" in text


def test_slurm_without_sbatch_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no Slurm client on this "host"
    run = tmp_path / "run"
    args = ["rehearse", PLAN, "--run-dir", str(run), "--slurm"]
    text = refused(args, [tmp_path], needle="sbatch is not on PATH")
    assert "scripts/slurm/local-cluster up" in text and "leave out --slurm" in text
    assert _where(args) == "PATH"
    assert not run.exists()


def test_a_slurm_time_without_slurm_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["rehearse", PLAN, "--run-dir", str(run), "--slurm-time", "20"]
    refused(args, [tmp_path], needle="--slurm is not given")
    assert not run.exists()
