"""`python -m longctx.launch.local_step --nproc N --log L -- ARGV…`: the local trainer's workers, started
inside a job step by `SrunLauncher` so that the time-limit signal reaches them.

Exit status: the workers' worst, with death by signal S reported as 128 + S (as a shell does).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from longctx.launch.local import LocalLauncher


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longctx.launch.local_step")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        p.error("no command after --")

    # Slurm signals every process of the step; the launcher passes signals on to the workers while they
    # run. Before and after that, a signal must not kill this process: its exit status is the workers'.
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    rc = LocalLauncher(echo=True).run(command, nproc=ns.nproc, env={}, log=Path(ns.log))
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
