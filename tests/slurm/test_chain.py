"""Chain estimate, dry-run submission, and the parsers of Slurm's outputs (no cluster needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import SlurmError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm import commands
from longctx.slurm.chain import _failure_streak, estimate_chain, submit, tokens_per_gpu_second
from longctx.slurm.script import render
from longctx.slurm.settings import job_settings
from longctx.stage.ledger_events import JobEnd, Launch

runner = CliRunner()


def test_throughput_interpolation() -> None:
    table = {"4096": 2800, "16384": 1880, "131072": 565}
    assert tokens_per_gpu_second(table, 16384) == 1880
    assert tokens_per_gpu_second(table, 1024) == 2800  # below the shortest: its figure
    assert tokens_per_gpu_second(table, 262144) == pytest.approx(565 / 2)  # past the longest: cost ∝ length
    mid = tokens_per_gpu_second(table, 8192)  # halfway in log-length between 4K and 16K: geometric mean
    assert mid == pytest.approx(math.sqrt(2800 * 1880))
    assert tokens_per_gpu_second({}, 4096) is None


def test_baby_estimate(baby_plan: Path, tmp_path: Path) -> None:
    rp = resolve_plan(load_plan(baby_plan, run_dir=tmp_path))
    s = job_settings(rp)
    est = estimate_chain(rp, s)
    assert est.train_minutes_per_job == 1410 - 15  # exit duration (under 24 h − 240 s) − job overhead
    st16 = next(x for x in est.stages if x.stage == "16k")
    stage = rp.stage("16k")
    assert st16.remaining_iterations == stage.train_iters
    assert st16.tokens_per_second == 1880 * stage.world
    assert st16.jobs == math.ceil(
        stage.train_iters * stage.tokens_per_iteration / (1880 * stage.world) / 60 / 1395
    )
    assert est.jobs == sum(x.jobs for x in est.stages) + est.spare and est.spare >= 1


def test_estimate_needs_a_throughput_figure(repo_root: Path, baby_plan: Path, tmp_path: Path) -> None:
    prof = tmp_path / "plain.toml"
    prof.write_text('name = "plain"\ngpus_per_node = 4\n')
    rp = resolve_plan(load_plan(baby_plan, run_dir=tmp_path / "run"))
    rendered = render(rp, profile=str(prof), longctx_command=["longctx"])
    with pytest.raises(SlurmError, match="no throughput figure for stage 16k") as err:
        submit(rendered, rp, dry_run=True)
    assert "--chain N" in (err.value.fix or "")
    assert len(submit(rendered, rp, chain=3, dry_run=True).commands) == 3


def test_dry_run_prints_the_afterany_chain(baby_plan: Path, tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "slurm",
            "submit",
            str(baby_plan),
            "--run-dir",
            str(tmp_path),
            "--chain",
            "3",
            "--dry-run",
            "--longctx-cmd",
            "longctx",
        ],
    )
    assert res.exit_code == 0, res.output
    script = tmp_path / "slurm" / "chain.sbatch"
    lines = [x for x in res.stdout.splitlines() if x.startswith("sbatch")]
    assert lines == [
        f"sbatch --parsable {script}",
        f"sbatch --parsable '--dependency=afterany:<job 1>' {script}",
        f"sbatch --parsable '--dependency=afterany:<job 2>' {script}",
    ]
    assert not script.exists()  # a dry run writes nothing


def test_failure_streak() -> None:
    ok = JobEnd(exit_code=0, progress=0)
    bad = JobEnd(exit_code=1, progress=0)
    bad_but_progress = JobEnd(exit_code=137, progress=40)
    assert _failure_streak([bad, bad, ok]) == 0
    assert _failure_streak([ok, bad, Launch(), bad, bad]) == 3
    assert _failure_streak([bad, bad_but_progress, bad]) == 1


def test_status_cli_on_a_plan_without_jobs(baby_plan: Path, tmp_path: Path) -> None:
    import json

    res = runner.invoke(app, ["slurm", "status", str(baby_plan), "--run-dir", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["next_action"] == "blocked"  # no base checkpoint under this run dir's plan paths
    assert [s["stage"] for s in data["stages"]] == ["16k", "64k", "128k"]
    assert all(s["iteration"] == 0 and s["rate_source"] == "profile" for s in data["stages"])
    assert data["jobs"] == [] and data["last_failure"] is None and data["eta_seconds"] > 0


# -- parsers --------------------------------------------------------------------------------------


def test_parse_parsable() -> None:
    assert commands.parse_parsable("1234\n") == "1234"
    assert commands.parse_parsable("1234;leonardo\n") == "1234"
    with pytest.raises(SlurmError, match="did not print a job id"):
        commands.parse_parsable("sbatch: error: Batch job submission failed\n")


def test_parse_squeue_sacct_jobcomp_scontrol() -> None:
    q = commands.parse_squeue(
        "12|RUNNING|0:20|1:00|None|2026-11-30T13:58:05\n13|PENDING|0:00|1:00|Dependency|N/A\n"
    )
    assert (
        q["12"].active and q["12"].reason is None and q["13"].reason == "Dependency" and q["13"].start is None
    )
    a = commands.parse_sacct(
        "12|COMPLETED|0:0|00:00:37|2026-11-30T13:58:05|2026-11-30T13:58:42\n"
        "12.batch|COMPLETED|0:0|00:00:37|x|y\n13|CANCELLED by 0|0:0|00:00:00|None|2026\n"
    )
    assert set(a) == {"12", "13"} and a["13"].state == "CANCELLED" and not a["13"].active
    line = (
        "JobId=5 UserId=root(0) GroupId=root(0) Name=longctx chain 'x' JobState=TIMEOUT Partition=debug "
        "TimeLimit=1 StartTime=2026-11-30T13:43:02 EndTime=2026-11-30T13:44:29 NodeList=vm ExitCode=0:15 "
    )
    j = commands.parse_jobcomp(line + "\nJobId=6 JobState=COMPLETED\n", ["5"])
    assert list(j) == ["5"] and j["5"].state == "TIMEOUT" and j["5"].exit_code == "0:15"
    kv = commands.parse_key_values(
        "JobId=4 JobName=a b AllocNode:Sid=localhost:340 CPUs/Task=1 StdOut=/x y/z"
    )
    assert kv["JobName"] == "a b" and kv["AllocNode:Sid"] == "localhost:340" and kv["StdOut"] == "/x y/z"
