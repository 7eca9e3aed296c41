"""SrunLauncher: the exact srun / container / torchrun command, and the node-rank shim run by bash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.errors import SlurmError
from longctx.launch.srun import SrunLauncher, is_local_trainer

CONTAINER = {
    "runtime": "singularity",
    "image": "/img/nemo.sif",
    "binds": ["/scratch", "/work dir"],
    "options": ["--nv"],
}
ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "nodea",
    "LONGCTX_SRUN_CONFIG": json.dumps(
        {
            "container": CONTAINER,
            "cpus_per_task": 32,
            "master_addr": "hostname",
            "master_port": 20074,
            "srun_args": ["--kill-on-bad-exit=1"],
            "torchrun": "torchrun",
        }
    ),
}


def test_from_environment() -> None:
    ln = SrunLauncher.from_environment(ENV)
    assert (ln.nodes, ln.job_id, ln.master_port, ln.cpus_per_task) == (2, "4242", 20074, 32)
    assert ln.container == CONTAINER and ln.srun_args == ["--kill-on-bad-exit=1"]
    with pytest.raises(SlurmError, match="SLURM_JOB_ID is not set"):
        SrunLauncher.from_environment({})


def test_megatron_command() -> None:
    ln = SrunLauncher.from_environment(ENV)
    ln.nodelist = ["nodea", "nodeb"]
    cmd, tee = ln.command(["/m/pretrain_gpt.py", "--seq-length", "16384"], nproc=4, env={}, log=Path("/l"))
    assert tee
    shim = 'exec torchrun --node-rank "$SLURM_NODEID" "$@"'
    assert cmd == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=32",
        "--kill-on-bad-exit=1",
        "singularity",
        "exec",
        "--nv",
        "--bind",
        "/scratch",
        "--bind",
        "/work dir",
        "/img/nemo.sif",
        "bash",
        "-c",
        shim,
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        "nodea:20074",
        "--master-addr",
        "nodea",
        "--master-port",
        "20074",
        "--max-restarts",
        "0",
        "/m/pretrain_gpt.py",
        "--seq-length",
        "16384",
    ]
    # a launch may ask for fewer nodes than the job holds, never more
    cmd, _ = ln.command(["/m/pretrain_gpt.py"], nproc=4, env={"LONGCTX_NODES": "1"}, log=Path("/l"))
    assert "--nodes=1" in cmd and cmd[cmd.index("--nnodes") + 1] == "1"
    with pytest.raises(SlurmError, match="needs 3 nodes, the job holds 2"):
        ln.command(["/m/pretrain_gpt.py"], nproc=4, env={"LONGCTX_NODES": "3"}, log=Path("/l"))


def test_local_trainer_command() -> None:
    ln = SrunLauncher.from_environment({**ENV, "LONGCTX_SRUN_CONFIG": "{}", "SLURM_JOB_NUM_NODES": "1"})
    argv = [sys.executable, "-m", "longctx.train", "--spec", "/r/spec.json"]
    assert is_local_trainer(argv)
    cmd, tee = ln.command(argv, nproc=2, env={}, log=Path("/r/log"))
    assert not tee  # the local step writes the log itself
    assert cmd == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        sys.executable,
        "-m",
        "longctx.launch.local_step",
        "--nproc",
        "2",
        "--log",
        "/r/log",
        "--",
        *argv,
    ]
    with pytest.raises(SlurmError, match="runs a Python script under torchrun"):
        ln.command(["/bin/true"], nproc=1, env={}, log=Path("/l"))


def test_node_rank_shim_passes_every_word_unchanged(tmp_path: Path) -> None:
    """The bash shim inserts $SLURM_NODEID and hands every other word to torchrun as it was."""
    fake_dir = tmp_path / "bin 'x' $(y)"
    fake_dir.mkdir()
    fake = fake_dir / "torch run"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    ln = SrunLauncher.from_environment({**ENV, "LONGCTX_SRUN_CONFIG": json.dumps({"torchrun": str(fake)})})
    ln.nodelist = ["nodea"]
    words = ["/m/pretrain_gpt.py", "--data-path", "1.0 /d/a b'c $(touch x) `y` \\z"]
    cmd = ln.torchrun_command(words, nproc=4, nodes=2)
    step = cmd[cmd.index("bash") :]  # what srun runs on each node
    out = subprocess.run(
        step,
        capture_output=True,
        text=True,
        check=True,
        env={"SLURM_NODEID": "1", "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    got = json.loads(out.stdout)
    assert got[:2] == ["--node-rank", "1"]
    assert got[-3:] == words
    assert not (tmp_path / "x").exists()
