"""`SrunLauncher`: the workers of one stage launch as a job step (`srun`) of the current allocation.

Workers must run in a job step: Slurm's `--signal=TERM@S` (without `B:`) reaches job steps only, never
the batch shell or its plain children. `longctx stage run` itself stays in the batch shell, waits for
the step, and records the launch's end in the ledger.

- Megatron-LM (`[python] X.py …`, or `python -m longctx.mcore.run_megatron_lm X.py …` on CPU-only
  nodes, run as `-m …`): one task per node, each running
  `torchrun --nnodes N --nproc-per-node G --node-rank $SLURM_NODEID --rdzv-backend static
  --master-addr HOST --master-port P …` (optionally inside `singularity exec --nv --bind … IMAGE`).
  The node rank is read on each node by a fixed `bash -c` shim; every other word is passed as an
  argument, never re-parsed by a shell.
- The local trainer (`python -m longctx.train …`): one task on one node that starts the worker
  processes with `LocalLauncher` (`python -m longctx.launch.local_step`).

Settings come from $LONGCTX_SRUN_CONFIG (JSON written into the batch script by `slurm render`) and
the SLURM_* variables of the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from longctx.errors import SlurmError
from longctx.launch.local import launch_log, pump_lines
from longctx.launch.stop import spawn, stop_on_signals, wait

SRUN_CONFIG_ENV = "LONGCTX_SRUN_CONFIG"
NODES_ENV = "LONGCTX_NODES"  # a launch may use fewer nodes than the job holds


@dataclasses.dataclass
class SrunLauncher:
    nodes: int
    nodelist: list[str]
    job_id: str
    torchrun: str = "torchrun"
    master_addr: str = "hostname"  # "hostname" or "ip": how the first node is named to torchrun
    master_port: int | None = None
    cpus_per_task: int | None = None
    srun_args: list[str] = dataclasses.field(default_factory=list)
    container: dict[str, Any] | None = None
    echo: bool = True

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> SrunLauncher:
        env = os.environ if environ is None else environ
        job = env.get("SLURM_JOB_ID")
        if not job:
            raise SlurmError(
                "--launcher srun runs inside a Slurm job, but SLURM_JOB_ID is not set",
                fix="submit with `longctx slurm submit`, or use --launcher local outside Slurm",
            )
        nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        nodelist = _hostnames(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
        raw = env.get(SRUN_CONFIG_ENV, "")
        try:
            cfg = json.loads(raw) if raw else {}
        except json.JSONDecodeError as err:
            raise SlurmError(
                f"${SRUN_CONFIG_ENV} is not JSON: {err}", fix="render the batch script again"
            ) from None
        cpus = cfg.get("cpus_per_task") or env.get("SLURM_CPUS_PER_TASK")
        return cls(
            nodes=nodes,
            nodelist=nodelist,
            job_id=job,
            torchrun=cfg.get("torchrun") or "torchrun",
            master_addr=cfg.get("master_addr") or "hostname",
            master_port=cfg.get("master_port"),
            cpus_per_task=int(cpus) if cpus else None,
            srun_args=list(cfg.get("srun_args") or []),
            container=cfg.get("container"),
        )

    # -- commands ---------------------------------------------------------------------------------

    def step_prefix(self, nodes: int) -> list[str]:
        argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
        if self.cpus_per_task:
            # since Slurm 22.05 a step does not inherit the job's --cpus-per-task
            argv.append(f"--cpus-per-task={self.cpus_per_task}")
        return [*argv, *self.srun_args]

    def container_prefix(self) -> list[str]:
        c = self.container
        if not c or not c.get("image"):
            return []
        words = [c.get("runtime") or "singularity", "exec", *(c.get("options") or [])]
        for b in c.get("binds") or []:
            words += ["--bind", b]
        return [*words, c["image"]]

    def master(self) -> tuple[str, int]:
        host = self.nodelist[0] if self.nodelist else socket.gethostname()
        if self.master_addr == "ip":
            with contextlib.suppress(OSError):
                host = socket.gethostbyname(host)
        port = self.master_port or 20000 + int(self.job_id) % 10000
        return host, port

    def torchrun_command(self, argv: Sequence[str], *, nproc: int, nodes: int) -> list[str]:
        host, port = self.master()
        shim = f'exec {shlex.quote(self.torchrun)} --node-rank "$SLURM_NODEID" "$@"'
        return [
            *self.step_prefix(nodes),
            *self.container_prefix(),
            "bash",
            "-c",
            shim,
            "torchrun",
            "--nnodes",
            str(nodes),
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "static",
            "--rdzv-endpoint",
            f"{host}:{port}",
            "--master-addr",
            host,
            "--master-port",
            str(port),
            "--max-restarts",
            "0",
            *argv,
        ]

    def local_command(self, argv: Sequence[str], *, nproc: int, log: Path) -> list[str]:
        return [
            *self.step_prefix(1),
            sys.executable,
            "-m",
            "longctx.launch.local_step",
            "--nproc",
            str(nproc),
            "--log",
            str(log),
            "--",
            *argv,
        ]

    def command(
        self, argv: Sequence[str], *, nproc: int, env: Mapping[str, str], log: Path
    ) -> tuple[list[str], bool]:
        """The srun command line, and whether this process should copy its output to `log`."""
        if is_local_trainer(argv):
            return self.local_command(argv, nproc=nproc, log=log), False
        argv = torchrun_words(argv)
        if not argv or not (str(argv[0]).endswith(".py") or argv[0] == "-m"):
            raise SlurmError(
                f"the srun launcher runs a Python script under torchrun or the local trainer, got {argv[:3]}",
                fix="launch through `longctx stage run`",
            )
        nodes = int(env.get(NODES_ENV) or self.nodes)
        if nodes > self.nodes:
            raise SlurmError(
                f"the launch needs {nodes} nodes, the job holds {self.nodes}",
                fix="render the batch script again (it allocates the plan's largest stage)",
            )
        return self.torchrun_command(argv, nproc=nproc, nodes=nodes), True

    # -- run ----------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, nproc: int, env: dict[str, str], log: Path) -> int:
        cmd, tee = self.command(argv, nproc=nproc, env=env, log=log)
        log.parent.mkdir(parents=True, exist_ok=True)
        # Slurm signals the whole process tree, srun included; passing a signal on would reach srun a
        # second time, and srun turns a repeated signal into SIGKILL for its tasks. So srun is started
        # with forward=False (`longctx.launch.stop`): the signal is recorded, and this process only stays
        # alive to record the launch's end.
        with stop_on_signals():
            proc = spawn(
                cmd,
                env={**os.environ, **env},
                forward=False,
                stdout=subprocess.PIPE if tee else None,
                stderr=subprocess.STDOUT if tee else None,
            )
            if not tee:
                return wait(proc)
            with launch_log(log) as (logf, log_errors):
                sinks = [logf, sys.stdout.buffer] if self.echo else [logf]
                pump = threading.Thread(
                    target=pump_lines, args=(proc.stdout, sinks, b"", log_errors), daemon=True
                )
                pump.start()
                rc = wait(proc)
                pump.join(timeout=10)
            return rc


def torchrun_words(argv: Sequence[str]) -> list[str]:
    """What follows torchrun's options: `python X.py …` → `X.py …` (torchrun starts its own python),
    `python -m M …` → `-m M …` (the CPU runner of a Megatron-LM script, longctx.mcore.run_megatron_lm)."""
    words = list(argv)
    if (
        len(words) >= 2
        and Path(words[0]).name.startswith("python")
        and (words[1] == "-m" or words[1].endswith(".py"))
    ):
        return words[1:]
    return words


def is_local_trainer(argv: Sequence[str]) -> bool:
    return len(argv) >= 3 and list(argv[1:3]) == ["-m", "longctx.train"]


def _hostnames(nodelist: str) -> list[str]:
    if not nodelist:
        return []
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return [h for h in out.split() if h]
    except (OSError, subprocess.SubprocessError):
        return [nodelist] if all(c not in nodelist for c in "[,") else []
