"""`longctx stage run --backend megatron-lm` with the real Megatron-LM (`$LONGCTX_MEGATRON_LM`) on the CPU.

One chain of real launches over a tiny two-stage plan (2 processes over gloo, through
`python -m longctx.mcore.run_megatron_lm` and the CPU flags): stage a starts from the local trainer's
base checkpoint (`--pretrained-checkpoint`), takes SIGTERM mid-stage (Megatron-LM saves and exits), a
relaunch resumes from that save and finishes the stage, and the next launch starts stage b from a's
save with b's RoPE base and length, as its saved args show. Each launch costs about 8 s of start-up on
an idle 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint import inspect_checkpoint, verify_checkpoint
from longctx.checkpoint.save_layout import read_tracker
from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.cli.main import app
from longctx.stage import ledger
from longctx.stage.megatron_args import cpu_flags
from tests.fixtures.slurm import CHAIN_PLAN

# Megatron-LM cannot load its own saves under a Python that pickles enum members by name (3.11.0-3.11.4);
# longctx refuses to launch it there (tests/stage/test_megatron_python.py)
pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)


A_ITERS, B_ITERS = 12, 2  # global batch 2: tokens = iterations × 2 × seq
# the preflight checks the stage's GPU argv against the plan's cluster profile (the "local" one has no
# TransformerEngine, which the default rope fusion needs); the CPU launch adds --no-rope-fusion itself
RUN = ["--backend", "megatron-lm", "--no-preflight"]


def _plan(path: Path, run_dir: Path, artefacts: Path) -> Path:
    text = CHAIN_PLAN.format(run_dir=run_dir, artefacts=artefacts, save_interval=10)
    for old, new in [
        ("tokens = 51_200", f"tokens = {A_ITERS * 2 * 128}"),
        ("tokens = 512_000", f"tokens = {B_ITERS * 2 * 256}"),
        ("log_interval = 20", "log_interval = 1"),
        ("gpus_per_node = 1", "gpus_per_node = 2"),
    ]:
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _iterations(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"iteration\s+(\d+)/\s*\d+ \|", log)]


def _run_until_sigterm(plan: Path, logs: Path, after_iteration: int, timeout: float = 300) -> tuple[int, str]:
    """`longctx stage run` in its own process, sent SIGTERM once the launch's log shows `after_iteration`
    (the log, not the echo: Megatron-LM logs iterations on the last rank, the launcher echoes rank 0)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "longctx", "stage", "run", str(plan), *RUN],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, COLUMNS="400"),
    )
    lines: list[str] = []
    assert proc.stdout is not None
    drain = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    drain.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        logged = [i for f in logs.glob("*.log") for i in _iterations(f.read_text(errors="replace"))]
        if logged and max(logged) >= after_iteration:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.2)
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    drain.join(timeout=10)
    return rc, "".join(lines)


def test_real_megatron_lm_chain_sigterm_resume_next_stage(
    megatron_lm: Path, tiny_chain_artefacts: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(megatron_lm))
    monkeypatch.delenv("LONGCTX_MEGATRON_CPU", raising=False)
    run_dir = tmp_path / "run"
    plan = _plan(tmp_path / "plan.toml", run_dir, tiny_chain_artefacts)
    save_a, save_b = run_dir / "stages" / "a" / "checkpoints", run_dir / "stages" / "b" / "checkpoints"

    # 1. stage a from the base checkpoint; SIGTERM mid-stage: Megatron-LM saves, then exits
    t0 = time.monotonic()
    rc, out = _run_until_sigterm(plan, run_dir / "stages" / "a" / "logs", after_iteration=3)
    first_seconds = time.monotonic() - t0
    assert rc == 143, out[-4000:]  # `stage run` stopped by the SIGTERM (128 + 15), once Megatron-LM saved
    assert "stopped by SIGTERM: stage a at iteration" in out
    assert "Megatron-LM runs on the CPU with shims" in out
    assert "attempting to finetune with checkpoint in" in out  # --pretrained-checkpoint: the base
    assert "a: exit 0, iteration 0 → " in out
    launch = next(x for x in ledger.read(run_dir) if x.event == "launch")
    log_a = Path(launch.log).read_text()
    assert "exiting program after receiving SIGTERM" in log_a, log_a[-4000:]
    its = _iterations(log_a)
    assert its[0] == 1
    stopped = read_tracker(save_a)
    assert stopped is not None and 3 <= stopped.iteration < A_ITERS
    assert stopped.iteration == its[-1]
    # the ledger keeps the stage's argv (the same as on a GPU) and how this machine ran it
    assert (
        launch.argv[0] == str(megatron_lm / "pretrain_gpt.py") and "--distributed-backend" not in launch.argv
    )
    assert launch.cpu == {"runner": "longctx.mcore.run_megatron_lm", "flags": cpu_flags()}
    end = [x for x in ledger.read(run_dir) if x.event == "end"][-1]
    assert end.end_iteration == stopped.iteration and end.status != "done"

    # 2. the relaunch resumes from that save (not from iteration 0) and finishes stage a
    r = CliRunner().invoke(app, ["stage", "run", str(plan), *RUN])
    assert r.exit_code == 0, r.output[-4000:]
    launch = [x for x in ledger.read(run_dir) if x.event == "launch"][-1]
    assert (launch.stage, launch.action, launch.start_iteration) == (
        "a",
        "resume",
        stopped.iteration,
    )
    log = Path(launch.log).read_text()
    assert "attempting to finetune" not in log
    resumed = _iterations(log)
    assert resumed[0] == stopped.iteration + 1 and resumed[-1] == A_ITERS, resumed
    tracker = read_tracker(save_a)
    assert tracker is not None and tracker.iteration == A_ITERS

    # a real save passes the deep check; its args carry stage a's base and length
    report = verify_checkpoint(save_a, deep=True)
    assert report.ok and report.deep is not None, report.findings
    info = inspect_checkpoint(save_a)
    assert info.ok and info.iteration == A_ITERS, info.findings
    assert (info.args["rotary_base"], info.args["seq_length"]) == (20000, 128)

    # 3. the next launch starts stage b from a's save, with b's RoPE base and length
    r = CliRunner().invoke(app, ["stage", "run", str(plan), *RUN])
    assert r.exit_code == 0, r.output[-4000:]
    launch = [x for x in ledger.read(run_dir) if x.event == "launch"][-1]
    assert (launch.stage, launch.action) == ("b", "first-launch")
    log_b = Path(launch.log).read_text()
    assert f"attempting to finetune with checkpoint in {save_a}" in log_b
    assert _iterations(log_b)[0] == 1
    info = inspect_checkpoint(save_b)
    assert info.ok and info.iteration == B_ITERS, info.findings
    assert (info.args["rotary_base"], info.args["seq_length"]) == (40000, 256)
    print(f"first launch (start-up + {stopped.iteration} iterations): {first_seconds:.1f} s")

    # 4. the whole chain is one figure, read from Megatron-LM's own TensorBoard events
    _curves_of_megatron_lm(plan, tmp_path / "curves.png", stopped.iteration)


def _curves_of_megatron_lm(plan: Path, png: Path, stopped: int) -> None:
    r = CliRunner().invoke(app, ["stage", "curves", str(plan), "--out", str(png), "--json"])
    assert r.exit_code == 0, r.output[-4000:]
    doc = json.loads(r.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    a, b = doc["stages"]
    assert (a["source"], b["source"]) == ("tensorboard", "tensorboard"), doc["problems"]
    # Megatron-LM logs from the first iteration of each launch: a's two launches cover every iteration
    assert sorted({p[0] for p in a["loss"]}) == list(range(1, A_ITERS + 1))
    assert [p[0] for p in b["loss"]] == list(range(1, B_ITERS + 1))
    assert b["loss"][0][1] == A_ITERS * 2 * 128 + 2 * 256  # one token axis across the stages
    assert len(a["lr"]) == len(a["loss"]) and a["tokens_per_s"]  # tokens/s from the events' wall times
    launches = [(m["stage"], m["action"], m["ended"], m["start_iteration"]) for m in doc["launches"]]
    assert launches == [
        ("a", "first-launch", "signal", 0),
        ("a", "resume", "done", stopped),
        ("b", "first-launch", "done", 0),
    ]


def test_cpu_runner_refuses_without_a_script() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "longctx.mcore.run_megatron_lm"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.parametrize("told, on_cpu", [("0", False), ("1", True)])
def test_cpu_mode_can_be_told(told: str, on_cpu: bool, monkeypatch) -> None:
    from longctx.stage.run import megatron_on_cpu

    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", told)
    assert megatron_on_cpu() is on_cpu


def test_shims_never_apply_with_cuda(monkeypatch) -> None:
    import torch

    from longctx.mcore import megatron_lm_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda_method, current_device = torch.Tensor.cuda, torch.cuda.current_device
    assert megatron_lm_cpu.apply_shims() == []
    assert torch.Tensor.cuda is cuda_method and torch.cuda.current_device is current_device
    with pytest.raises(RuntimeError, match="never"):
        megatron_lm_cpu._refuse_on_cuda()
