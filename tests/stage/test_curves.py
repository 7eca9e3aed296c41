"""`longctx stage curves` over a real two-stage local run: a first launch stopped by SIGTERM, its resume,
and the next stage, drawn as one figure from the trainer's TensorBoard events; then the same run
with broken input (truncated, foreign and missing event files, another run's metrics, an empty ledger).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage.curves import read_plan_curves
from tests.fixtures.slurm import CHAIN_PLAN

A_ITERS, B_ITERS = 8, 2


def _plan(path: Path, run_dir: Path, artefacts: Path) -> Path:
    text = CHAIN_PLAN.format(run_dir=run_dir, artefacts=artefacts, save_interval=4)
    for old, new in [
        ("tokens = 51_200", f"tokens = {A_ITERS * 2 * 128}"),
        ("tokens = 512_000", f"tokens = {B_ITERS * 2 * 256}"),
        ("log_interval = 20", "log_interval = 1"),
    ]:
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _first_launch_sigterm(plan: Path, metrics: Path, after: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "longctx", "stage", "run", str(plan), "--backend", "local", "--no-eval"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= after:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.1)
    assert proc.wait(timeout=300) == 143  # stopped by the SIGTERM (128 + 15), after the trainer's save


@pytest.fixture(scope="module")
def local_run(tiny_chain_artefacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curves")
    plan = _plan(root / "plan.toml", root / "run", tiny_chain_artefacts)
    _first_launch_sigterm(plan, root / "run" / "stages" / "a" / "metrics.jsonl", after=2)
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--until-done", "--no-eval"])
    assert r.exit_code == 0, r.output[-3000:]
    return plan


@pytest.mark.slow  # the module fixture trains three launches (about 25 s)
def test_local_run_is_one_figure(local_run: Path, tmp_path: Path) -> None:
    png = tmp_path / "curves.png"
    r = CliRunner().invoke(app, ["stage", "curves", str(local_run), "--out", str(png), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and doc["png"] == str(png)
    a, b = doc["stages"]
    assert (a["source"], b["source"]) == ("tensorboard", "tensorboard")
    assert [p[0] for p in a["loss"]] == list(range(1, A_ITERS + 1))
    assert [p[0] for p in b["loss"]] == list(range(1, B_ITERS + 1))
    # one x-axis: b's tokens continue from a's planned tokens
    assert b["token_offset"] == A_ITERS * 2 * 128 and b["loss"][0][1] == A_ITERS * 2 * 128 + 2 * 256
    assert (a["seq_length"], a["rotary_base"], b["seq_length"], b["rotary_base"]) == (128, 20000, 256, 40000)
    assert all(p[2] > 0 for p in a["tokens_per_s"]) and len(a["lr"]) == A_ITERS
    launches = [(m["stage"], m["action"], m["ended"]) for m in doc["launches"]]
    assert launches == [
        ("a", "first-launch", "signal"),
        ("a", "resume", "done"),
        ("b", "first-launch", "done"),
    ]
    stopped = doc["launches"][0]["end_iteration"]
    assert 2 <= stopped < A_ITERS and doc["launches"][1]["start_iteration"] == stopped
    assert doc["problems"] == []


@pytest.mark.slow  # the module fixture trains three launches (about 25 s)
def test_bad_input_is_named_and_the_rest_is_drawn(local_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(local_run.parent / "run", run)
    plan = _plan(tmp_path / "plan.toml", run, Path(load_plan(local_run).base.path).parents[1])
    tb_a = run / "stages" / "a" / "tensorboard"
    _first, second = sorted(tb_a.glob("events.out.tfevents.*"))
    second.write_bytes(second.read_bytes()[:-7])  # truncated mid-record: the readable events remain
    (tb_a / "events.out.tfevents.0.foreign").write_bytes(b"not a tensorboard record at all" * 10)
    shutil.rmtree(run / "stages" / "b" / "tensorboard")  # missing: b falls back to metrics.jsonl
    with (run / "stages" / "b" / "metrics.jsonl").open("a") as f:
        f.write(
            json.dumps({"stage": "other", "iteration": 1, "loss": 9.0, "lr": 0.1, "tokens_per_s": 1}) + "\n"
        )
    curves = read_plan_curves(resolve_plan(load_plan(plan)))
    a, b = curves.stages
    assert a.source == "tensorboard" and len(a.loss) >= A_ITERS - 1
    assert b.source == "metrics.jsonl" and [p[0] for p in b.loss] == [1, 2]
    text = "\n".join(curves.problems)
    assert "events.out.tfevents.0.foreign" in text and "records of another stage or run" in text
    assert f"{second}: truncated" in text
    # no events and no metrics: the launch logs the ledger names
    (run / "stages" / "b" / "metrics.jsonl").unlink()
    b = read_plan_curves(resolve_plan(load_plan(plan))).stages[1]
    assert b.source == "logs" and [p[0] for p in b.loss] == [1, 2] and all(p[2] > 0 for p in b.tokens_per_s)

    # nothing readable at all: exit 2, one JSON document naming the run directory
    empty = _plan(
        tmp_path / "empty.toml", tmp_path / "empty-run", Path(load_plan(local_run).base.path).parents[1]
    )
    r = CliRunner().invoke(app, ["stage", "curves", str(empty), "--json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and "no training curves" in doc["error"]["what"]
    assert "ledger.jsonl" in r.stderr and "no launches recorded" in r.stderr


@pytest.mark.slow  # the module fixture trains three launches (about 25 s)
def test_status_shows_the_pace_of_the_last_launch(local_run: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["stage", "status", str(local_run), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rp = resolve_plan(load_plan(local_run))
    curves = read_plan_curves(rp)
    for s, c in zip(doc["stages"], curves.stages, strict=True):
        pace = s["pace"]
        last = [m for m in curves.launches if m.stage == c.stage][-1]
        logged = sorted(p[2] for p in c.tokens_per_s if last.start_iteration < p[0] <= last.end_iteration)
        assert pace["measured"] and logged[0] <= pace["tokens_per_s"] <= logged[-1]
        assert pace["stage_eta_seconds"] == 0 and pace["plan_eta_seconds"] == 0  # done
        assert pace["resume_jumps"] == []  # the resume loaded the right save: the loss continues
    # the table fits 100 columns and shows the pace
    r = CliRunner().invoke(app, ["stage", "status", str(local_run)], env={"COLUMNS": "100"})
    assert r.exit_code == 0 and "tokens/s" in r.output and "ETA plan" in r.output
    assert max(len(line) for line in r.output.splitlines()) <= 100

    # stage b not finished (its saves gone): the time left is its remaining tokens at b's last pace
    run = tmp_path / "run"
    shutil.copytree(local_run.parent / "run", run)
    shutil.rmtree(run / "stages" / "b" / "checkpoints")
    plan = _plan(tmp_path / "plan.toml", run, Path(load_plan(local_run).base.path).parents[1])
    rp = resolve_plan(load_plan(plan))
    from longctx.stage.pace import stage_pace
    from longctx.stage.state import plan_state

    a, b = stage_pace(rp, plan_state(rp))
    assert a.stage_eta_seconds == 0 and b.measured and b.tokens_per_s
    assert b.stage_eta_seconds == pytest.approx(B_ITERS * 2 * 256 / b.tokens_per_s)
    assert b.plan_eta_seconds == pytest.approx(b.stage_eta_seconds)


def test_a_resume_far_above_its_loss_before_is_flagged() -> None:
    from longctx.stage.curves import LaunchMark, PlanCurves, StageCurve
    from longctx.stage.pace import resume_jumps

    def curve(losses: list[float]) -> PlanCurves:
        c = StageCurve("a", 128, 20000, 10, 256, 0, "tensorboard")
        c.loss = [[i, c.tokens_at(i), v] for i, v in enumerate(losses, 1)]
        launches = [
            LaunchMark("a", "first-launch", 0, 5, 0, 1280, "signal", ""),
            LaunchMark("a", "resume", 5, 10, 1280, 2560, "done", ""),
        ]
        return PlanCurves("p", "/run", [c], launches, [])

    right = curve([6.0, 5.0, 4.5, 4.2, 4.0, 3.95, 3.9, 3.85, 3.8, 3.78])
    assert resume_jumps(right.stages[0], right) == []
    # loaded an early save (or the base): the loss is back near its start
    wrong = curve([6.0, 5.0, 4.5, 4.2, 4.0, 5.9, 5.1, 4.6, 4.3, 4.1])
    (jump,) = resume_jumps(wrong.stages[0], wrong)
    assert jump.iteration == 5 and jump.after > jump.before + 1


@pytest.mark.slow  # the module fixture trains three launches (about 25 s)
def test_validation_loss_is_drawn_at_the_stages_length(local_run: Path, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    shutil.copytree(local_run.parent / "run", run)
    plan = _plan(tmp_path / "plan.toml", run, Path(load_plan(local_run).base.path).parents[1])
    # what Megatron-LM's evaluate_and_print_results writes at an --eval-interval, in its own writer
    with SummaryWriter(str(run / "stages" / "b" / "tensorboard")) as w:
        w.add_scalar("lm loss", 4.0, 2)
        w.add_scalar("lm loss validation", 4.25, 2)
    png = tmp_path / "curves.png"
    r = CliRunner().invoke(app, ["stage", "curves", str(plan), "--out", str(png), "--json"])
    assert r.exit_code == 0, r.output
    b = json.loads(r.stdout)["stages"][1]
    assert b["validation"] == [[2, A_ITERS * 2 * 128 + 2 * 2 * 256, 4.25]] and png.is_file()


@pytest.mark.slow  # the module fixture trains three launches (about 25 s)
def test_local_events_open_with_tensorboards_reader(local_run: Path) -> None:
    """The local trainer's events, read by TensorBoard's EventAccumulator over the stage's directory:
    Megatron-LM's tags against the iteration and against consumed samples, one file per launch, the
    metrics file's numbers."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from longctx.train import event_tags as tags

    stage = local_run.parent / "run" / "stages" / "a"
    assert len(list((stage / "tensorboard").glob("events.out.tfevents.*"))) == 2  # SIGTERMed launch, resume
    records = [json.loads(x) for x in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(1, A_ITERS + 1))
    acc = EventAccumulator(str(stage / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    megatron = {tags.LOSS, tags.LEARNING_RATE, tags.GRAD_NORM, tags.BATCH_SIZE}
    assert megatron | {t + tags.VS_SAMPLES for t in megatron} | {tags.ITERATION_TIME} <= set(
        acc.Tags()["scalars"]
    )
    loss = acc.Scalars(tags.LOSS)
    assert [e.step for e in loss] == list(range(1, A_ITERS + 1))
    assert all(abs(e.value - r["loss"]) < 1e-5 for r, e in zip(records, loss, strict=True))
    assert [e.step for e in acc.Scalars(tags.LOSS + tags.VS_SAMPLES)] == [
        2 * i for i in range(1, A_ITERS + 1)
    ]
    lr = acc.Scalars(tags.LEARNING_RATE)
    assert all(abs(e.value - r["lr"]) < 1e-9 for r, e in zip(records, lr, strict=True))
    assert all(e.value > 0 for e in acc.Scalars(tags.TOKENS_PER_SECOND))
