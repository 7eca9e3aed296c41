"""A rehearsal's stages: every step of its plan as a `longctx stage run` subprocess, as a chain job runs
it, with one SIGTERM in the longest stage after its first save and the resume that follows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from longctx.checkpoint.save_layout import TRACKER
from longctx.errors import StageError
from longctx.plan.derive import ResolvedPlan, open_plan
from longctx.stage.run import RECORD_METRICS_ENV, LaunchOutcome
from longctx.stage.state import NextStep, stage_state
from longctx.stage.sweep_choice import record_choice
from longctx.stage.until_done import run_until_done

Echo = Callable[[str], None]


class Interruption(BaseModel):
    """The SIGTERM a rehearsal sends: where the stage stopped and whether it ran on from there."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    stopped_at: int
    target: int
    exit_code: int
    finished_first: bool = False


class LaunchRecord(BaseModel):
    """One `stage run` of the chain, as the rehearsal saw it."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    action: str
    exit_code: int
    start_iteration: int
    end_iteration: int
    seconds: float
    job_id: str | None = None  # the Slurm job that ran it (None: a subprocess of the rehearsal)


class SlurmJob(BaseModel):
    """A Slurm job of a rehearsal's chain, as it ended."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = ""
    """Slurm's id, as sbatch printed it."""
    state: str = "UNKNOWN"
    """Its final state (COMPLETED, FAILED, CANCELLED …; UNKNOWN: nothing remembers it)."""
    stage: str | None = None
    """An eval job's stage (None for a chain job)."""


class ChainRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    launches: list[LaunchRecord]
    interruption: Interruption | None = None
    chain: Literal["local", "slurm"] = "local"
    """Where the stages ran: `stage run` subprocesses here, or a chain of Slurm jobs."""
    jobs: list[SlurmJob] = Field(default_factory=list)
    """slurm: the chain's jobs in order (the spares the job that finished the plan cancelled included)."""
    eval_jobs: dict[str, SlurmJob] = Field(default_factory=dict)
    """slurm: stage → the eval job `slurm job-end` submitted when the stage finished."""
    eval_jobs_skipped: str | None = None
    """slurm: why the chain had no eval jobs (a stage's evaluation does not fit the profile's GPU memory)."""


class LocalChain:
    """Runs the plan to its end through `run_until_done`; `interrupt` gets SIGTERM after its first save."""

    def __init__(self, plan: Path, run_dir: Path, *, backend: str, interrupt: str | None, echo: Echo) -> None:
        self.plan, self.run_dir, self.backend, self.interrupt, self.echo = (
            plan,
            run_dir,
            backend,
            interrupt,
            echo,
        )
        self.interruption: Interruption | None = None
        self._stopped: LaunchOutcome | None = None
        self.launches: list[LaunchRecord] = []
        self.env = dict(os.environ, LONGCTX_NO_PROGRESS="1")
        if backend == "megatron-lm":
            # Megatron-LM writes the stage's metrics.jsonl itself (what the checks read, as the local trainer does)
            self.env[RECORD_METRICS_ENV] = "1"

    def resolve(self) -> ResolvedPlan:
        return open_plan(self.plan, self.run_dir)

    def run(self) -> ChainRun:
        result = run_until_done(self.resolve, self.launch, choose=self.choose)
        if result.stop == "failed" and result.outcomes[-1] is self._stopped:
            result = run_until_done(self.resolve, self.launch, choose=self.choose)  # the resume
        if result.stop == "failed":
            last = result.outcomes[-1]
            raise StageError(
                f"stage {last.stage} failed (exit {last.exit_code})",
                where=str(self.resolve().stage(last.stage).stage_dir / "logs"),
                fix="read the launch's log; rerun `longctx rehearse` to resume",
            )
        if not result.done:
            raise StageError(f"the rehearsal's stages did not finish: {result.reason}")
        return ChainRun(launches=self.launches, interruption=self.interruption)

    def choose(self, rp: ResolvedPlan, step: NextStep) -> bool:
        """A RoPE sweep's branches are done: choose from their evidence, as `rope sweep` does."""
        choice = record_choice(rp, rp.stage(step.stage or ""))
        self.echo(f"    {step.stage}: RoPE {choice.reason}")
        return True

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "longctx",
            "stage",
            "run",
            str(self.plan),
            "--run-dir",
            str(self.run_dir),
            "--backend",
            self.backend,
            # megatron-lm: each launch is Megatron-LM itself, which reports the RoPE base it built; the preflight
            # (another Megatron-LM start-up per launch) is what `slurm submit` runs before the cluster chain
            *(["--no-preflight"] if self.backend == "megatron-lm" else []),
        ]

    def launch(self, rp: ResolvedPlan, step: NextStep) -> LaunchOutcome:
        st = rp.stage(step.stage or "")
        stop = self.interrupt == st.name and step.action == "first-launch" and self.interruption is None
        self.echo(f"==> stage {st.name}: {step.action} ({st.seq_length:,} tokens, CP {st.cp})")
        t0 = time.monotonic()
        proc = subprocess.Popen(self._command(), env=self.env)
        if stop:
            self._stop_after_first_save(proc, st.name, st.save_dir / TRACKER)
        code = proc.wait()
        after = stage_state(self.resolve().stage(st.name))
        seconds = time.monotonic() - t0
        outcome = LaunchOutcome(
            st.name, step.action, code, step.start_iteration, after.iteration, after.status, seconds
        )
        self.launches.append(
            LaunchRecord(
                stage=st.name,
                action=step.action,
                exit_code=code,
                start_iteration=step.start_iteration,
                end_iteration=after.iteration,
                seconds=seconds,
            )
        )
        self.echo(
            f"    stage {st.name}: iteration {after.iteration}/{after.target_iterations}, exit {code} "
            f"[{seconds:.1f} s]"
        )
        if stop:
            self._stopped = outcome
            self.interruption = Interruption(
                stage=st.name,
                stopped_at=after.iteration,
                target=after.target_iterations,
                exit_code=code,
                finished_first=after.status == "done",
            )
        return outcome

    def _stop_after_first_save(self, proc: subprocess.Popen[bytes], stage: str, tracker: Path) -> None:
        while proc.poll() is None and not tracker.exists():
            time.sleep(0.05)
        if proc.poll() is None:
            self.echo(f"    SIGTERM to stage {stage} after its first save (it must resume from there)")
            proc.send_signal(signal.SIGTERM)
