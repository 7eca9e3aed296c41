"""A schedule edit mid-stage against the real Megatron-LM (`$LONGCTX_MEGATRON_LM`, CPU runner).

Stage `a` is started (a save at iteration K of N, no ledger beside it: the save's own schedule is what
is checked). Doubling the peak LR is refused before launching anything, also with `--force`: Megatron-LM
takes the peak and minimum LR from the optimizer's param groups, restored from the checkpoint, so
`--override-opt_param-scheduler` would leave the old rates in force. A longer warmup is refused
without `--force`; with it the real `pretrain_gpt.py` resumes at K under the override flag (without it
Megatron-LM's OptimizerParamScheduler asserts that the checkpoint's schedule matches), and the learning
rates it logs after the resume are the edited schedule's, computed here with longctx's own scheduler.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.cli.main import app
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage import ledger
from longctx.stage.megatron_args import OVERRIDE_SCHEDULER_FLAG
from longctx.stage.run import local_spec
from longctx.train.schedule import LRScheduler
from tests.fixtures.slurm import copy_save_at, write_chain_plan

# Megatron-LM cannot load its own saves under a Python that pickles enum members by name (3.11.0-3.11.4);
# longctx refuses to launch it there (tests/stage/test_megatron_python.py)
pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)


K, N = 4, 8
MLM = ["--backend", "megatron-lm", "--no-preflight"]


def _plan(root: Path, name: str, artefacts: Path, lr: str = "1e-3", warmup: str = "0.1") -> Path:
    path = write_chain_plan(root / f"{name}.toml", root / name, artefacts, save_interval=K)
    text = path.read_text()
    for old, new in [
        ("tokens = 51_200", f"tokens = {N * 2 * 128}"),
        ("log_interval = 20", "log_interval = 1"),
        ("lr = 1e-3", f"lr = {lr}"),
        ("warmup_fraction = 0.1", f"warmup_fraction = {warmup}"),
    ]:
        assert old in text
        text = text.replace(old, new, 1)
    path.write_text(text)
    return path


def test_forced_schedule_edit_resumes_the_real_engine_with_the_new_schedule(
    megatron_lm: Path, tiny_chain_artefacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(megatron_lm))
    monkeypatch.delenv("LONGCTX_MEGATRON_CPU", raising=False)
    started = _plan(tmp_path, "started", tiny_chain_artefacts)
    r = CliRunner().invoke(app, ["stage", "run", str(started), "--backend", "local"])
    assert r.exit_code == 0, r.output[-3000:]

    # the run directory as it stands after the save at K (its ledger left behind)
    copy_save_at(*(tmp_path / run / "stages" / "a" / "checkpoints" for run in ("started", "edited")), K)

    new_lr = _plan(tmp_path, "edited", tiny_chain_artefacts, lr="2e-3")
    for force in ([], ["--force"]):
        r = CliRunner().invoke(app, ["stage", "run", str(new_lr), *MLM, *force])
        assert r.exit_code == 2, r.output[-3000:]
        assert ("lr (--lr): 0.001 → 0.002" if not force else "param groups") in r.output, r.output

    longer_warmup = _plan(tmp_path, "edited", tiny_chain_artefacts, warmup="0.5")
    r = CliRunner().invoke(app, ["stage", "run", str(longer_warmup), *MLM])
    assert r.exit_code == 2 and "lr_warmup_iters (--lr-warmup-iters): 1 → 4" in r.output, r.output[-3000:]
    assert not [x for x in ledger.read(tmp_path / "edited") if x.event == "launch"]

    r = CliRunner().invoke(app, ["stage", "run", str(longer_warmup), *MLM, "--force"])
    assert r.exit_code == 0, r.output[-4000:]
    launch = [x for x in ledger.read(tmp_path / "edited") if x.event == "launch"][-1]
    assert (launch.action, launch.start_iteration) == ("resume", K)
    assert launch.argv[-1] == OVERRIDE_SCHEDULER_FLAG
    assert launch.schedule_override == {"lr_warmup_iters": [1, 4]}
    log = Path(launch.log).read_text()
    found = re.findall(r"iteration\s+(\d+)/\s*\d+ \|.*?learning rate: ([0-9.E+-]+)", log)
    logged = {int(i): float(lr) for i, lr in found}
    assert sorted(logged) == list(range(K + 1, N + 1)), logged

    rp = resolve_plan(load_plan(longer_warmup))
    spec, _ = local_spec(rp, rp.stage("a"))
    rp_started = resolve_plan(load_plan(started))
    edited = LRScheduler(spec.lr)
    kept = LRScheduler(local_spec(rp_started, rp_started.stage("a"))[0].lr)
    for i in range(K + 1, N + 1):
        # Megatron-LM logs the rate its scheduler set after iteration i's step
        assert logged[i] == pytest.approx(edited.lr_at(i), rel=1e-5), (i, logged, edited.lr_at(i))
    assert any(abs(edited.lr_at(i) - kept.lr_at(i)) > 1e-5 for i in logged)  # the edit shows
