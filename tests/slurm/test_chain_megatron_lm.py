"""On a real Slurm (the local one-node cluster), the real Megatron-LM ($LONGCTX_MEGATRON_LM) as a chain.

`longctx slurm submit` queues a tiny two-stage plan whose [slurm] table picks the megatron-lm backend,
rendered into every job as `stage run --backend megatron-lm --launcher srun`: srun + torchrun, two
processes over gloo through the CPU runner. The jobs are 5-minute jobs with `--signal=TERM@60`.

1. Time limit: once the first job's trainer logs an iteration, the test lowers that job's limit so that
   the signal is due at slurmctld's next limit check (every 30 s; the limit itself comes 30 s or more
   later) and pauses the trainer (SIGSTOP) until torchrun reports the signal, so a short stage outlasts
   the wait on any machine. Slurm signals every process of the job step; Megatron-LM saves at the
   iteration it reached (--exit-signal-handler) and exits.
2. SIGKILL: the next job resumes from that save and is killed mid-step (`scancel --signal=KILL JOB.0`)
   after its first interval save.
3. The next job resumes from that interval save and finishes stage a; the next starts stage b from a's
   final save (--pretrained-checkpoint), finishes the plan and cancels the spare job.

The eval job each finished stage submits is checked and cancelled (it would only slow the chain).
A launch costs 15-45 s of start-up on 2 cores.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longctx.checkpoint.save_layout import read_tracker
from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.errors import SlurmError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm import commands
from longctx.slurm.chain import submitted, submitted_ids
from longctx.slurm.script import render
from longctx.slurm.status import chain_status
from longctx.stage import ledger
from longctx.stage.state import next_step, plan_state
from tests.fixtures.slurm import CHAIN_PLAN, job_processes, lower_time_limit, open_launch, signal_all

# Megatron-LM cannot load its own saves under a Python that pickles enum members by name (3.11.0-3.11.4);
# longctx refuses to launch it there (tests/stage/test_megatron_python.py)
pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)


A_ITERS, B_ITERS, SAVE = 60, 10, 20  # global batch 2
TIME_MIN, SIGNAL_LEAD_S = 5, 60
WORK = 4  # jobs that train: time limit, kill, end of a, b
CHAIN = WORK + 1  # one spare, which the job that ends b cancels
SIGNAL_NOTED = "Received 15 death signal"  # torchrun, on the step's SIGTERM


def _plan(path: Path, run_dir: Path, artefacts: Path) -> Path:
    text = CHAIN_PLAN.format(run_dir=run_dir, artefacts=artefacts, save_interval=SAVE)
    for old, new in [
        ("tokens = 51_200", f"tokens = {A_ITERS * 2 * 128}"),
        ("tokens = 512_000", f"tokens = {B_ITERS * 2 * 256}"),
        ("log_interval = 20", "log_interval = 1"),
        ("gpus_per_node = 1", "gpus_per_node = 2"),
    ]:
        assert old in text
        text = text.replace(old, new)
    torchrun = Path(sys.executable).with_name("torchrun")  # the jobs' PATH need not hold the venv
    text += f"""
[slurm]
backend = "megatron-lm"
time = "{TIME_MIN}"
signal = "TERM@{SIGNAL_LEAD_S}"
torchrun = "{torchrun}"
# `slurm submit` checks every stage before queueing; the jobs skip the check (15-40 s each on 2 cores)
job_preflight = false
"""
    path.write_text(text)
    return path


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _iterations(log: Path) -> list[int]:
    """The iterations Megatron-LM logged (last rank), in order."""
    return [int(m) for m in re.findall(r"iteration\s+(\d+)/\s*\d+ \|", _text(log))]


def _live(ids: list[str]) -> dict[str, commands.JobInfo]:
    """The active jobs among `ids`; a busy controller may drop a query now and then."""
    for attempt in range(3):
        try:
            return commands.active_jobs(ids)
        except SlurmError:
            if attempt == 2:
                raise
            time.sleep(1)
    return {}


def test_chain_jobs_skip_their_preflight_only_when_told(baby_plan: Path) -> None:
    rp = resolve_plan(load_plan(baby_plan))
    launch = "--backend megatron-lm --launcher srun"

    def line(**over: object) -> str:
        text = render(rp, profile="leonardo", overrides=over, longctx_command=["longctx"]).chain.text
        return next(x for x in text.splitlines() if " stage run " in x)

    assert line().endswith(launch)  # by default every job checks its launch first
    assert line(job_preflight=False).endswith(f"{launch} --no-preflight")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_megatron_lm_chain_survives_time_limit_and_sigkill(
    slurm_cluster: None, megatron_lm: Path, tiny_chain_artefacts: Path, tmp_path: Path, monkeypatch
) -> None:
    t0 = time.monotonic()
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(megatron_lm))  # sbatch hands the jobs this environment
    monkeypatch.delenv("LONGCTX_MEGATRON_CPU", raising=False)
    run_dir = tmp_path / "run"
    plan = _plan(tmp_path / "chain.toml", run_dir, tiny_chain_artefacts)
    rp = resolve_plan(load_plan(plan))
    save_a, save_b = (st.save_dir for st in rp.stages)

    # the CLI a user runs: the plan's [slurm] table picks the backend; submit's preflight checks the
    # stages as the CPU-only nodes run them (with the CPU runner's flags), then queues the chain
    proc = subprocess.run(
        [sys.executable, "-m", "longctx", "slurm", "submit", str(plan), "--chain", str(CHAIN), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "preflight: Megatron-LM accepts a, b" in proc.stderr, proc.stderr[-4000:]
    ids = [str(j) for j in json.loads(proc.stdout)["job_ids"]]
    assert submitted_ids(run_dir, "chain") == ids and len(ids) == CHAIN
    script = (run_dir / "slurm" / "chain.sbatch").read_text()
    assert "--backend megatron-lm --launcher srun --no-preflight\n" in script
    assert f"#SBATCH --signal=TERM@{SIGNAL_LEAD_S}\n" in script and f"#SBATCH --time={TIME_MIN}\n" in script

    limited: tuple[str, int, float] | None = None  # (job, new limit in minutes, seconds to the signal)
    paused: list[int] = []
    paused_at = 0.0
    killed: tuple[str, int] | None = None  # (job, last iteration logged before the kill)
    evals_seen: set[str] = set()
    deadline = time.monotonic() + 780
    try:
        while live := _live(ids + submitted_ids(run_dir, "eval")):
            assert time.monotonic() < deadline, f"the chain did not finish: {live}"
            for job in (j for j in live if j not in ids):  # an eval job: seen, then cancelled
                evals_seen.add(job)
                commands.scancel([job])
            for job in (j for j, i in live.items() if j in ids and i.state == "RUNNING"):
                launch = open_launch(run_dir, job)
                if launch is None or launch.stage != "a":
                    continue
                log = Path(launch.log)
                if limited is None and _iterations(log):  # in the loop, past Megatron-LM's signal handler
                    paused, paused_at = job_processes(job, "longctx.mcore.run_megatron_lm"), time.monotonic()
                    assert len(paused) >= 2, paused  # two workers (and their checkpoint writer)
                    signal_all(paused, signal.SIGSTOP)
                    limited = (job, lower_time_limit(job), 0.0)
                elif paused and job == limited[0] and SIGNAL_NOTED in _text(log):  # type: ignore[index]
                    signal_all(paused, signal.SIGCONT)
                    paused, limited = [], (job, limited[1], time.monotonic() - paused_at)  # type: ignore[index]
                elif paused:
                    assert time.monotonic() - paused_at < 90, "Slurm's time-limit signal did not come"
                elif (
                    limited is not None and killed is None and job != limited[0] and (its := _iterations(log))
                ):
                    tracker = read_tracker(save_a)
                    # mid-step, a few steps past a save this launch made: those steps are lost
                    if tracker and launch.start_iteration < tracker.iteration <= its[-1] - 3:
                        commands.scancel([f"{job}.0"], signal="KILL")
                        killed = (job, its[-1])
            time.sleep(0.3)
    finally:
        signal_all(paused, signal.SIGCONT)
        commands.scancel(list(_live(ids + submitted_ids(run_dir, "eval"))))
    seconds = time.monotonic() - t0

    records = ledger.read(run_dir)
    launches = [r for r in records if r.event == "launch"]
    ends = [r for r in records if r.event == "end"]
    assert limited is not None, "no job's trainer reached its loop"
    assert killed is not None, "no resumed job ran long enough to be killed mid-step"
    assert len(launches) == len(ends) == WORK, [(r.event, r.job_id) for r in launches + ends]
    tl, kill, fin_a, first_b = launches
    tl_end, kill_end, fin_a_end, b_end = ends
    assert [str(r.job_id) for r in launches] == ids[:WORK]  # one launch per job, in chain order
    assert all(
        r.backend == "megatron-lm" and r.cpu["runner"] == "longctx.mcore.run_megatron_lm" for r in launches
    )

    # 1. the time limit: stage a's first launch (from the base) got Slurm's signal during training,
    # saved at the iteration it had reached and exited; no step was lost
    assert str(tl.job_id) == limited[0] and limited[2] < 45, limited
    assert (tl.stage, tl.action, tl.start_iteration) == ("a", "first-launch", 0)
    base = tiny_chain_artefacts / "base" / "checkpoints"
    assert tl.argv[tl.argv.index("--pretrained-checkpoint") + 1] == str(base)
    tl_log = _text(Path(tl.log))
    assert f"attempting to finetune with checkpoint in {base}" in tl_log
    assert "exiting program after receiving SIGTERM" in tl_log, tl_log[-4000:]
    tl_its = _iterations(Path(tl.log))
    assert tl_its[0] == 1 and 0 < tl_end.end_iteration == tl_its[-1] < SAVE, (tl_its, tl_end)
    assert tl_end.new_saves == [tl_its[-1]]
    info = commands.scontrol_job(limited[0])
    if info is not None:  # the controller still remembers it: it ran under the lowered limit
        assert info.time_limit == f"00:{limited[1]:02d}:00", info

    # 2. the SIGKILL: the relaunch resumed from that save and died mid-step after an interval save
    assert str(kill.job_id) == killed[0]
    assert (kill.stage, kill.action, kill.start_iteration) == (
        "a",
        "resume",
        tl_end.end_iteration,
    )
    kill_log = _text(Path(kill.log))
    assert "attempting to finetune" not in kill_log and "exiting program" not in kill_log
    kill_its = _iterations(Path(kill.log))
    assert kill_its[0] == kill.start_iteration + 1, kill_its[:3]
    saved = kill_end.end_iteration  # the last complete save, which the tracker names
    assert kill_end.exit_code == 137 and saved % SAVE == 0, kill_end
    assert kill.start_iteration < saved < killed[1] <= kill_its[-1] < saved + SAVE, (
        saved,
        killed,
        kill_its[-3:],
    )

    # 3. the next job resumed from that interval save (fewer than SAVE steps lost) and finished stage a
    assert (fin_a.stage, fin_a.action, fin_a.start_iteration) == ("a", "resume", saved)
    fin_its = _iterations(Path(fin_a.log))
    assert fin_its == list(range(saved + 1, A_ITERS + 1)), fin_its[:3]
    assert (fin_a_end.exit_code, fin_a_end.status, fin_a_end.end_iteration) == (0, "done", A_ITERS)

    # 4. stage b started from a's final save and finished the plan
    assert (first_b.stage, first_b.action, first_b.start_iteration) == ("b", "first-launch", 0)
    assert first_b.argv[first_b.argv.index("--pretrained-checkpoint") + 1] == str(save_a)
    assert f"attempting to finetune with checkpoint in {save_a}" in _text(Path(first_b.log))
    assert _iterations(Path(first_b.log)) == list(range(1, B_ITERS + 1))
    assert (b_end.exit_code, b_end.status, b_end.end_iteration) == (0, "done", B_ITERS)

    # every stage at its target on disk; the trackers say so
    for st, save in zip(rp.stages, (save_a, save_b), strict=True):
        tracker = read_tracker(save)
        assert tracker is not None and tracker.iteration == st.train_iters, (st.name, tracker)
    states = plan_state(rp)
    assert [(s.status, s.iteration) for s in states] == [("done", A_ITERS), ("done", B_ITERS)]
    assert next_step(rp, states).action == "all-done"

    # each finished stage's job submitted its eval job once; the job that finished b cancelled the spare
    evals = submitted(run_dir, "eval")
    assert [(r.stage, str(r.job_id)) for r in evals] == [("a", ids[2]), ("b", ids[3])], evals
    assert {str(r.slurm_job_id) for r in evals} == evals_seen
    cancels = [r for r in records if r.event == "chain-cancel"]
    assert len(cancels) == 1 and cancels[0].reason == "the plan is complete"
    assert str(cancels[0].job_id) == ids[WORK - 1] and cancels[0].slurm_job_ids == ids[WORK:]
    st = chain_status(rp)
    assert st.next_action == "all-done" and st.running == [] and st.pending == []
    by_id = {j.job_id: j for j in st.jobs}
    assert all(by_id[j].state == "CANCELLED" for j in ids[WORK:]), {j: by_id[j].state for j in ids[WORK:]}
    assert by_id[killed[0]].state == "FAILED" and str(by_id[killed[0]].exit_code).startswith("137")
    assert by_id[ids[WORK - 1]].state == "COMPLETED", by_id[ids[WORK - 1]]
    print(
        f"\n{WORK} Megatron-LM launches as a Slurm chain: {seconds:.0f} s "
        f"(the time-limit signal came {limited[2]:.0f} s after the limit was lowered)"
    )
