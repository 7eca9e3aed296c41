"""On a real Slurm (the local one-node cluster): quoting as sbatch reads it, and a chain that heals itself.

The chain test submits a tiny two-stage plan as 3-minute jobs with `--signal=TERM@60` (slurmctld checks
time limits every 30 s and sends the warning signal up to 30 s early, never late: 90–120 s into such a
job, long after a tiny launch ends). It SIGKILLs the training step of one job mid-step; in the next
job, once its trainer logs a step, it pauses the trainer (SIGSTOP) and lowers the job's limit so that
the signal is due at slurmctld's next check, and lets it go on once the signal waits for it: a short
stage outlasts the wait on any machine, and the other jobs finish their stages. It checks
afterwards that every stage reached its target, no stage was restarted from the previous stage after
making progress, at most a save interval of steps was lost at each interruption, the jobs left in the
queue were cancelled by the job that finished the plan, and `slurm status` told the truth throughout.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm import commands
from longctx.slurm.chain import submit, submitted_ids
from longctx.slurm.quote import sbatch_word
from longctx.slurm.script import render
from longctx.slurm.status import chain_status
from longctx.stage import ledger
from longctx.stage.ledger_events import End, Launch
from longctx.stage.state import next_step, plan_state
from tests.fixtures.slurm import (
    SAVE_INTERVAL,
    job_processes,
    lower_time_limit,
    open_launch,
    signal_all,
    signal_pending,
    write_chain_plan,
)

pytestmark = pytest.mark.slurm

# stage a (200 steps) leaves room on a fast machine for a kill mid-step past a save (13+ steps into a job,
# seen by a loop that also asks `slurm status`); stage b only has to finish: it need not outlast a job,
# the paused trainer waits for the signal instead
B_ITERS = 30
TIME_MIN, SIGNAL_LEAD_S = 3, 60

HOSTILE = "a b 'c' \"d\" $(touch {canary}) `touch {canary}` #e \\f %g ;h"


def test_sbatch_reads_quoted_directives_as_bash_would(slurm_cluster: None, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    name = HOSTILE.format(canary=canary)
    out_dir = tmp_path / "out 'x' $(id)"
    out_dir.mkdir()
    script = tmp_path / "q.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --job-name={sbatch_word(name)}\n"
        f"#SBATCH --output={sbatch_word(str(out_dir / 'log-%j.txt'))}\n"
        "#SBATCH --time=1\n"
        "true\n"
    )
    job = commands.parse_parsable(commands.run(["sbatch", "--parsable", "--hold", str(script)]).stdout)
    try:
        shown_name = commands.run(["squeue", "-h", "-j", job, "-o", "%j"]).stdout.rstrip("\n")
        info = commands.parse_key_values(commands.run(["scontrol", "show", "job", "-o", job]).stdout.strip())
    finally:
        commands.scancel([job])
    assert shown_name == name
    assert info["StdOut"] == f"{out_dir}/log-{job}.txt"
    assert not canary.exists()


def _metrics(run_dir: Path, stage: str) -> list[int]:
    path = run_dir / "stages" / stage / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(int(json.loads(line)["iteration"]))
            except (ValueError, KeyError):
                continue  # a line torn by SIGKILL
    return out


def _check_status_during(rp: Any, ids: list[str]) -> dict[str, Any]:
    before = plan_state(rp)
    st = chain_status(rp)
    after = plan_state(rp)
    assert [j.job_id for j in st.jobs] == ids
    assert len(st.running) <= 1, st.running  # afterany: one job of the chain at a time
    if st.running:
        run_pos = ids.index(st.running[0])
        assert all(ids.index(p) > run_pos for p in st.pending), (st.running, st.pending)
    for sp, b, a in zip(st.stages, before, after, strict=True):
        assert b.iteration <= sp.iteration <= a.iteration
        assert sp.target == b.target_iterations
    return {
        "running": st.running,
        "pending": st.pending,
        "stages": [(s.stage, s.iteration) for s in st.stages],
    }


def _pause_trainer(run_dir: Path, job: str) -> list[int]:
    """Stop (SIGSTOP) the trainer of job `job`, which resumes after the killed job, once it has logged a
    step (past its signal handler); the pids, or [] while it has not."""
    launch = open_launch(run_dir, job)
    if launch is None:
        return []
    its = _metrics(run_dir, launch.stage)
    pids = job_processes(job, "longctx.train")
    # the killed launch logged the first step after its save too: a second line of it is this launch's
    if not (pids and its.count(launch.start_iteration + 1) >= 2):
        return []
    signal_all(pids, signal.SIGSTOP)
    return pids


def _signal_waits(paused: list[int]) -> bool:
    """Slurm's time-limit signal waits for the paused trainer (or the job ended without it)."""
    return any(signal_pending(p, signal.SIGTERM) for p in paused) or not any(
        Path(f"/proc/{p}").exists() for p in paused
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_chain_survives_time_limits_and_sigkill(
    slurm_cluster: None, tmp_path: Path, tiny_chain_artefacts: Path
) -> None:
    plan = write_chain_plan(tmp_path / "chain.toml", tmp_path / "run", tiny_chain_artefacts, b_iters=B_ITERS)
    rp = resolve_plan(load_plan(plan))
    run_dir = rp.run_dir
    rendered = render(
        rp,
        overrides={"time": str(TIME_MIN), "signal": f"TERM@{SIGNAL_LEAD_S}"},
        longctx_command=[sys.executable, "-m", "longctx"],
    )
    res = submit(rendered, rp, chain=20)
    ids = res.job_ids
    assert submitted_ids(run_dir, "chain") == ids

    killed: tuple[str, str, int] | None = None
    paused: list[int] = []  # the trainer of the job after the killed one, stopped until its signal waits
    limited: tuple[str, int] | None = None  # that job, and its lowered limit in minutes
    seen_status: list[dict[str, Any]] = []
    deadline = time.monotonic() + 1000
    try:
        while True:
            live = commands.active_jobs(ids)
            if not live:
                break
            assert time.monotonic() < deadline, f"the chain did not finish: {live}"
            running = [j for j, i in live.items() if i.state == "RUNNING"]
            if killed is None and running:
                job = running[0]
                launch = open_launch(run_dir, job)
                if launch is not None:
                    its = _metrics(run_dir, launch.stage)
                    last = its[-1] if its else 0
                    # mid-step: a few steps past this launch's start and past a save
                    if last >= launch.start_iteration + 13 and last % SAVE_INTERVAL not in (
                        0,
                        SAVE_INTERVAL - 1,
                    ):
                        commands.scancel([f"{job}.0"], signal="KILL")
                        killed = (job, launch.stage, last)
            elif killed is not None and limited is None and running and running[0] != killed[0]:
                paused = _pause_trainer(run_dir, running[0])
                limited = (running[0], lower_time_limit(running[0])) if paused else None
            if paused and _signal_waits(paused):
                signal_all(paused, signal.SIGCONT)
                paused = []
            if running and len(seen_status) < 4:
                seen_status.append(_check_status_during(rp, ids))
            time.sleep(0.3)
    finally:
        signal_all(paused, signal.SIGCONT)
        commands.scancel(list(commands.active_jobs(ids)))

    records = ledger.read(run_dir)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("slurm-*.log")))

    # every stage reached its target, from disk
    states = plan_state(rp)
    assert [s.status for s in states] == ["done", "done"], states
    assert [s.iteration for s in states] == [st.train_iters for st in rp.stages]
    assert next_step(rp, states).action == "all-done"

    # a job was SIGKILLed mid-step, and the chain carried on
    assert killed is not None, "no job ran long enough to be killed mid-step"
    kjob = killed[0]
    kend = [r for r in records if r.event == "end" and str(r.job_id) == kjob]
    assert kend and kend[0].exit_code == 137, kend
    assert any(r.event == "launch" and ids.index(str(r.job_id)) > ids.index(kjob) for r in records)

    # jobs hit their time limit: the trainer saved on the time-limit signal and exited 0 mid-stage
    graceful = [r for r in records if r.event == "end" and r.exit_code == 0 and r.status == "in-progress"]
    assert graceful, "no job ended on the time-limit signal"
    assert limited is not None, "no job after the killed one reached its training loop"
    assert limited[0] in {str(r.job_id) for r in graceful}, (limited, graceful)
    info = commands.scontrol_job(limited[0])
    if info is not None:  # the controller still remembers it: it ran under the lowered limit
        assert info.time_limit == f"00:{limited[1]:02d}:00", info
    assert "(signal); relaunch to resume" in logs

    # no stage restarted from the previous stage after making progress
    for st in rp.stages:
        progressed = False
        for r in records:
            if isinstance(r, Launch) and r.stage == st.name:
                if progressed or r.start_iteration > 0:
                    assert r.action == "resume", r
                else:
                    assert r.action == "first-launch", r
            if isinstance(r, End) and r.stage == st.name and r.end_iteration > 0:
                progressed = True

    # steps lost at each interruption ≤ the save interval (iterations logged, then redone)
    for st in rp.stages:
        its = _metrics(run_dir, st.name)
        assert its and its[-1] == st.train_iters
        for prev, nxt in itertools.pairwise(its):
            if nxt <= prev:
                assert prev - (nxt - 1) <= SAVE_INTERVAL, (st.name, prev, nxt)

    # the job that finished the plan cancelled the jobs queued behind it
    cancels = [r for r in records if r.event == "chain-cancel"]
    assert cancels and cancels[0].reason == "the plan is complete"
    finisher = str(cancels[0].job_id)
    behind = ids[ids.index(finisher) + 1 :]
    assert behind, "the chain was too short to leave jobs queued"
    assert sorted(cancels[0].slurm_job_ids, key=int) == behind
    never_ran = {str(r.job_id) for r in records if r.event == "launch"} & set(behind)
    assert not never_ran, f"cancelled jobs ran: {never_ran}"

    # status afterwards
    assert seen_status, "status was never checked while a job ran"
    st = chain_status(rp)
    assert st.next_action == "all-done"
    assert [(s.stage, s.status, s.iteration) for s in st.stages] == [
        (s.name, "done", s.train_iters) for s in rp.stages
    ]
    assert st.eta_seconds == 0
    assert st.running == [] and st.pending == []
    by_id = {j.job_id: j for j in st.jobs}
    assert all(by_id[j].state == "CANCELLED" for j in behind), {j: by_id[j].state for j in behind}
    assert by_id[behind[0]].note == f"cancelled by job {finisher}: the plan is complete"
    assert by_id[kjob].state == "FAILED" and str(by_id[kjob].exit_code).startswith("137"), by_id[kjob]
    fin_end = [r for r in records if r.event == "end" and str(r.job_id) == finisher][-1]
    assert fin_end.status == "done" and fin_end.stage == rp.stages[-1].name
    # COMPLETED — or FAILED with 143 when the time-limit signal caught a worker after its final save
    assert by_id[finisher].state == "COMPLETED" or str(by_id[finisher].exit_code).startswith("143"), by_id[
        finisher
    ]
    assert st.last_failure is not None
    assert not commands.active_jobs(ids)


@pytest.mark.slow
def test_submit_refuses_a_second_chain_and_cancel_stops_everything(
    slurm_cluster: None, tiny_chain_plan: Path
) -> None:
    from longctx.errors import SlurmError
    from longctx.slurm.chain import cancel

    rp = resolve_plan(load_plan(tiny_chain_plan))
    rendered = render(rp, overrides={"time": "5"}, longctx_command=[sys.executable, "-m", "longctx"])
    ids = submit(rendered, rp, chain=3).job_ids
    try:
        with pytest.raises(SlurmError, match="still queued or running") as err:
            submit(rendered, rp, chain=2)
        assert "longctx slurm cancel" in (err.value.fix or "")
        victims = cancel(rp)
        assert sorted(victims, key=int) == sorted(set(ids) & set(victims), key=int) and ids[-1] in victims
    finally:
        commands.scancel(ids)
    deadline = time.monotonic() + 60
    while commands.active_jobs(ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    st = chain_status(rp)
    assert st.running == [] and st.pending == []
    by_id = {j.job_id: j for j in st.jobs}
    for j in victims:
        assert by_id[j].state == "CANCELLED" and by_id[j].note == "cancelled by `slurm cancel`", by_id[j]


@pytest.mark.slow
def test_job_end_submits_the_eval_job_of_a_finished_stage_once(
    slurm_cluster: None, tiny_chain_plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from longctx.slurm.chain import job_end, submitted

    rp = resolve_plan(load_plan(tiny_chain_plan))
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "eval-a.sbatch").write_text(
        f"#!/bin/bash\n#SBATCH --time=1\n#SBATCH --output={tmp_path}/eval-%j.log\ntrue\n"
    )
    monkeypatch.setenv("SLURM_JOB_ID", "999999")  # as if inside chain job 999999, which finished stage a
    ledger.append(
        rp.run_dir,
        End(stage="a", exit_code=0, start_iteration=150, end_iteration=200, status="done", seconds=10.0),
    )
    first = job_end(rp, 0, scripts_dir=scripts)
    second = job_end(rp, 0, scripts_dir=scripts)
    assert list(first.eval_jobs) == ["a"] and second.eval_jobs == {}
    evals = submitted(rp.run_dir, "eval")
    assert [(r.stage, r.slurm_job_id) for r in evals] == [("a", first.eval_jobs["a"])]
    assert first.progress == 50 and first.next_action == "first-launch" and first.cancelled == []


def test_srun_launcher_runs_torchrun_on_every_node(slurm_cluster: None, tmp_path: Path) -> None:
    """Megatron-LM's path on a real srun, with a stand-in torchrun that reports what it was given."""
    fake = tmp_path / "fake torchrun"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print('ARGS ' + json.dumps({'argv': sys.argv[1:], 'node': os.environ.get('SLURM_NODEID'), "
        "'x': os.environ.get('LONGCTX_TEST_X')}))\n"
    )
    fake.chmod(0o755)
    log = tmp_path / "logs" / "launch.log"
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, sys\nfrom pathlib import Path\nfrom longctx.launch.srun import SrunLauncher\n"
        f"rc = SrunLauncher.from_environment().run(['/m/pretrain_gpt.py', '--data-path', 'a b $(c)'], nproc=2, "
        f"env={{'LONGCTX_TEST_X': 'y z'}}, log=Path({str(log)!r}))\nsys.exit(rc)\n"
    )
    cfg = json.dumps({"torchrun": str(fake), "master_port": 23456, "srun_args": ["--kill-on-bad-exit=1"]})
    script = tmp_path / "job.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --time=1\n#SBATCH --output={sbatch_word(str(tmp_path / 'out-%j.log'))}\n"
        f"export LONGCTX_SRUN_CONFIG={sbatch_word(cfg)}\nexec {sys.executable} {driver}\n"
    )
    job = commands.sbatch(script)
    deadline = time.monotonic() + 90
    while commands.active_jobs([job]) and time.monotonic() < deadline:
        time.sleep(0.5)
    out = (tmp_path / f"out-{job}.log").read_text()
    line = next(x for x in log.read_text().splitlines() if x.startswith("ARGS "))
    got = json.loads(line[5:])
    host = commands.run(["hostname"]).stdout.strip()
    assert got["node"] == "0" and got["x"] == "y z", out
    assert got["argv"] == [
        "--node-rank",
        "0",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        f"{host}:23456",
        "--master-addr",
        host,
        "--master-port",
        "23456",
        "--max-restarts",
        "0",
        "/m/pretrain_gpt.py",
        "--data-path",
        "a b $(c)",
    ]
    assert line in out  # echoed to the job's output as well
