"""A rehearsal's stages as the chain of Slurm jobs a real run submits (`longctx slurm submit`): the
rehearsal plan's scripts rendered with its profile, N identical chain jobs, each running `stage run` then
`slurm job-end`; the SIGTERM in the longest stage goes to its job's steps, as a time limit's signal does,
and the next job resumes from the save it made. The rehearsal waits for the chain and for the eval jobs
`job-end` submits, then reads what happened from the ledger."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from longctx.checkpoint.save_layout import read_tracker
from longctx.errors import Interrupted, PlanError, SlurmError, StageError
from longctx.plan.derive import ResolvedPlan, open_plan
from longctx.rehearse.chain import ChainRun, Echo, Interruption, LaunchRecord, SlurmJob
from longctx.slurm import commands
from longctx.slurm.chain import submit
from longctx.slurm.records import submitted, submitted_ids
from longctx.slurm.script import Rendered, log_dir, render
from longctx.slurm.status import chain_status
from longctx.stage import ledger
from longctx.stage.ledger_events import End, Launch, LedgerEvent
from longctx.stage.state import plan_state, stage_state

TRACKER_POLL_S = 0.05  # how often the interrupted stage's tracker is read while its job trains
# how long the tracker is watched without a look at the queue between: the signal must land before the
# trainer's last step, and a queue query costs tenths of a second on busy cores
ARMED_WATCH_S = 5.0


class SlurmRehearsal(BaseModel):
    """How `longctx rehearse --slurm` runs the stages on a Slurm cluster."""

    model_config = ConfigDict(extra="forbid")

    time_minutes: int | None = Field(default=None, ge=2)
    """Each chain job's time limit in minutes; None: the profile's (`local`: 30)."""
    signal: str | None = None
    """The time-limit signal, e.g. `TERM@60`; None: the profile's."""
    spare_jobs: int = Field(default=2, ge=1, le=100)
    """Chain jobs queued beyond one per stage not done (and one per RoPE sweep not chosen): the resume
    after the SIGTERM and a failed job's retry; the job that finishes the plan cancels those left."""
    deadline_seconds: float = Field(default=6 * 3600.0, gt=0)
    """How long the rehearsal waits for its jobs; past it, it cancels them and fails."""
    poll_seconds: float = Field(default=0.5, gt=0)
    """How often the queue is read (and the progress echoed when it changed)."""


class LongWait(StageError):
    """The rehearsal's jobs outlived its deadline."""


def require_slurm(run_dir: Path) -> None:
    """Refuse, before anything is written, a host without sbatch, or a run dir whose jobs are queued."""
    if not commands.available("sbatch"):
        raise SlurmError(
            "`rehearse --slurm` submits the stages as Slurm jobs, but sbatch is not on PATH",
            where="PATH",
            fix="run it on a Slurm login node (or start the local cluster: scripts/slurm/local-cluster up), "
            "or leave out --slurm to run the stages here",
        )
    live = commands.active_jobs(submitted_ids(run_dir))
    if live:
        raise SlurmError(
            f"jobs of this rehearsal are still queued or running: {', '.join(sorted(live, key=int))}",
            where=str(ledger.ledger_path(run_dir)),
            fix=f"wait for them, or `longctx slurm cancel {run_dir / 'plan.toml'} --run-dir {run_dir}` first",
        )


def chain_length(rp: ResolvedPlan, spare: int) -> int:
    """One job per stage not done, one more per RoPE sweep not yet chosen (the job that reaches it queues
    the branches and stops), and `spare`."""
    states = plan_state(rp)
    pending = [st for st, s in zip(rp.stages, states, strict=True) if s.status != "done"]
    return len(pending) + sum(1 for st in pending if st.sweep is not None) + spare


class SlurmChain:
    """Submits the rehearsal plan's chain and waits for it; `interrupt` gets SIGTERM after its first save."""

    def __init__(
        self, plan: Path, run_dir: Path, *, interrupt: str | None, echo: Echo, options: SlurmRehearsal
    ) -> None:
        self.plan, self.run_dir, self.interrupt, self.echo, self.options = (
            plan,
            run_dir,
            interrupt,
            echo,
            options,
        )
        self.chain_ids: list[str] = []
        self.before: set[str] = set()  # jobs an earlier rehearsal in this run dir submitted
        self.start = 0  # the ledger's length before this chain was submitted
        self.signalled: Launch | None = None  # the first launch of `interrupt`, once SIGTERM went to its job
        self.missed: Launch | None = None  # that launch, when it ended before its first save was seen
        self.eval_jobs_skipped: str | None = None  # why the chain has no eval jobs
        self._shown: str | None = None

    def resolve(self) -> ResolvedPlan:
        return open_plan(self.plan, self.run_dir)

    def run(self) -> ChainRun:
        rp = self.resolve()
        require_slurm(self.run_dir)
        self.before = set(submitted_ids(self.run_dir))
        self.start = len(ledger.read(self.run_dir))
        rendered = self._render(rp)
        result = submit(rendered, rp, chain=chain_length(rp, self.options.spare_jobs))
        self.chain_ids = result.job_ids
        self.echo(
            f"==> Slurm chain of {len(self.chain_ids)} jobs ({', '.join(self.chain_ids)}), scripts in "
            f"{rendered.out_dir}, logs in {log_dir(self.run_dir)}"
        )
        try:
            self._wait(rp)
        except (Interrupted, KeyboardInterrupt, LongWait):
            self._cancel_ours()
            raise
        return self._result()

    def _render(self, rp: ResolvedPlan) -> Rendered:
        """The chain's scripts, with an eval job per stage as a megatron-lm chain has (the local backend's
        `stage run` would evaluate inside the job, which the rehearsal plan turns off). When one stage's
        evaluation does not fit the rehearsal's per-GPU memory (a full vocabulary at 128K), the chain has
        no eval jobs, and the report says why."""
        overrides = {
            "time": None if self.options.time_minutes is None else str(self.options.time_minutes),
            "signal": self.options.signal,
        }
        command = [sys.executable, "-m", "longctx"]
        try:
            return render(rp, overrides=overrides, longctx_command=command, eval_jobs=True)
        except PlanError as err:
            self.eval_jobs_skipped = err.what
            self.echo(f"    no eval jobs: {err.what}")
            return render(rp, overrides=overrides, longctx_command=command)

    # -- waiting ----------------------------------------------------------------------------------

    def ours(self) -> list[str]:
        """Every job this chain submitted or its jobs did (eval jobs, a sweep's array and choose job)."""
        return [j for j in submitted_ids(self.run_dir) if j not in self.before]

    def _wait(self, rp: ResolvedPlan) -> None:
        """Until none of our jobs is queued or running. The ledger is read again after the queue: a job
        that ended between the two has written every job it submitted before it ended."""
        deadline = time.monotonic() + self.options.deadline_seconds
        while True:
            ids = self.ours()
            live = commands.active_jobs(ids)
            if not live and self.ours() == ids:
                return
            if time.monotonic() > deadline:
                raise LongWait(
                    f"the rehearsal's Slurm jobs did not end within {self.options.deadline_seconds:.0f} s",
                    where=str(log_dir(self.run_dir)),
                    fix="read the jobs' logs there; rerun with a later deadline, or without --slurm",
                )
            records = self._records()
            self._progress(rp, live, records)
            self._watch_interrupt(rp, live, records)

    def _records(self) -> list[LedgerEvent]:
        """The ledger's records since this chain was submitted, written inside a Slurm job."""
        return [r for r in ledger.read(self.run_dir)[self.start :] if r.job_id is not None]

    def _open_launches(self, records: list[LedgerEvent]) -> dict[str, Launch]:
        """Job id → its launch that has not ended yet."""
        out: dict[str, Launch] = {}
        for r in records:
            job = str(r.job_id)
            if isinstance(r, Launch):
                out[job] = r
            elif isinstance(r, End) and job in out and out[job].stage == r.stage:
                del out[job]
        return out

    def _progress(
        self, rp: ResolvedPlan, live: dict[str, commands.JobInfo], records: list[LedgerEvent]
    ) -> None:
        """Echo which job runs which stage at which iteration, when that changed."""
        running = self._open_launches(records)
        known = {b.name: b for st in rp.stages for b in (st, *st.branches)}
        parts = []
        for job, info in sorted(live.items(), key=lambda kv: int(kv[0])):
            if info.state != "RUNNING":
                continue
            where = f"job {job} ({self._role(job)})"
            launch = running.get(job)
            if launch is not None and launch.stage in known:
                s = stage_state(known[launch.stage])
                where += (
                    f": stage {launch.stage} {launch.action}, iteration {s.iteration}/{s.target_iterations}"
                )
            parts.append(where)
        pending = sum(1 for info in live.values() if info.state == "PENDING")
        line = "    " + ("; ".join(parts) or "no job running") + f"; {pending} pending"
        if line != self._shown:
            self.echo(line)
            self._shown = line

    def _role(self, job: str) -> str:
        if job in self.chain_ids:
            return f"chain {self.chain_ids.index(job) + 1}/{len(self.chain_ids)}"
        kinds = {str(r.slurm_job_id): f"{r.kind} {r.stage or ''}".strip() for r in submitted(self.run_dir)}
        return kinds.get(job, "job")

    def _watch_interrupt(
        self, rp: ResolvedPlan, live: dict[str, commands.JobInfo], records: list[LedgerEvent]
    ) -> None:
        """SIGTERM, once, to the steps of the job that runs the first launch of `interrupt` when its first
        save is on disk (scancel without --batch signals the steps, as the profile's time-limit signal
        does); while that job trains, its tracker is read every TRACKER_POLL_S for up to ARMED_WATCH_S."""
        until = time.monotonic() + self.options.poll_seconds
        launch = self._first_launch(records)
        if launch is not None and self.signalled is None and self.missed is None:
            job = str(launch.job_id)
            if job not in self._open_launches(records):
                self.missed = launch  # it ended before a save was seen: it finished first
            elif job in live and live[job].state == "RUNNING":
                self._signal_after_save(rp, launch, job, until)
        time.sleep(max(0.0, until - time.monotonic()))

    def _signal_after_save(self, rp: ResolvedPlan, launch: Launch, job: str, until: float) -> None:
        save_dir = rp.stage(self.interrupt or "").save_dir
        until = max(until, time.monotonic() + ARMED_WATCH_S)
        while time.monotonic() < until:
            tracker = read_tracker(save_dir)
            if tracker is not None and tracker.iteration > (launch.start_iteration or 0):
                self.echo(
                    f"    SIGTERM to job {job}'s steps: stage {self.interrupt} saved iteration "
                    f"{tracker.iteration} (the next job must resume from there)"
                )
                commands.scancel([job], signal="TERM")
                self.signalled = launch
                return
            time.sleep(TRACKER_POLL_S)

    def _first_launch(self, records: list[LedgerEvent]) -> Launch | None:
        """The first launch of the stage to interrupt in this chain, if it is a first launch."""
        if self.interrupt is None:
            return None
        for r in records:
            if isinstance(r, Launch) and r.stage == self.interrupt and str(r.job_id) in self.chain_ids:
                return r if r.action == "first-launch" else None
        return None

    def _cancel_ours(self) -> None:
        """The rehearsal stops: its jobs would otherwise train on (and a rerun refuses a busy run dir)."""
        try:
            live = commands.active_jobs(self.ours())
            commands.cancel_jobs(sorted(live, key=int, reverse=True))
        except SlurmError as err:
            self.echo(f"    could not cancel the rehearsal's jobs: {err}")
            return
        if live:
            self.echo(f"    cancelled the rehearsal's jobs {', '.join(sorted(live, key=int))}")

    # -- after the chain --------------------------------------------------------------------------

    def _result(self) -> ChainRun:
        records = self._records()
        rp = self.resolve()
        states = plan_state(rp)
        if any(s.status != "done" for s in states):
            where = ", ".join(f"{s.name} at {s.iteration}/{s.target_iterations}" for s in states)
            failure = chain_status(rp).last_failure or "no job failed, yet the chain ended"
            raise StageError(
                f"the rehearsal's Slurm chain ended before the plan was done ({where}); last failure: {failure}",
                where=str(log_dir(self.run_dir)),
                fix="read the jobs' logs there; rerun `longctx rehearse --slurm` to resume",
            )
        finals = commands.job_states(self.ours())
        evals = {
            str(r.stage): _job(str(r.slurm_job_id), finals, r.stage)
            for r in submitted(self.run_dir, "eval")
            if str(r.slurm_job_id) not in self.before
        }
        return ChainRun(
            launches=self._launches(records),
            interruption=self._interruption(rp, records),
            chain="slurm",
            jobs=[_job(j, finals) for j in self.chain_ids],
            eval_jobs=evals,
            eval_jobs_skipped=self.eval_jobs_skipped,
        )

    def _launches(self, records: list[LedgerEvent]) -> list[LaunchRecord]:
        """Each launch our jobs ran, with the end its job recorded (exit -1: the job died without one)."""
        out: list[LaunchRecord] = []
        open_: dict[tuple[str, str | None], tuple[Launch, int]] = {}
        for r in records:
            job = str(r.job_id)
            if isinstance(r, Launch):
                start = r.start_iteration or 0
                out.append(_record(r, job, code=-1, end=start, seconds=0.0))
                open_[(job, r.stage)] = (r, len(out) - 1)
            elif isinstance(r, End) and (job, r.stage) in open_:
                launch, i = open_.pop((job, r.stage))
                end = r.end_iteration if r.end_iteration is not None else launch.start_iteration or 0
                out[i] = _record(launch, job, code=r.exit_code or 0, end=end, seconds=r.seconds or 0.0)
        return out

    def _interruption(self, rp: ResolvedPlan, records: list[LedgerEvent]) -> Interruption | None:
        launch = self.signalled or self.missed
        if launch is None or self.interrupt is None:
            return None
        job = str(launch.job_id)
        end = next(
            (r for r in records if isinstance(r, End) and str(r.job_id) == job and r.stage == self.interrupt),
            None,
        )
        state = stage_state(rp.stage(self.interrupt))
        return Interruption(
            stage=self.interrupt,
            stopped_at=state.iteration if end is None or end.end_iteration is None else end.end_iteration,
            target=launch.target_iterations or state.target_iterations,
            exit_code=-1 if end is None or end.exit_code is None else end.exit_code,
            finished_first=self.signalled is None or (end is not None and end.status == "done"),
        )


def _job(job: str, finals: dict[str, commands.JobInfo], stage: str | None = None) -> SlurmJob:
    info = finals.get(job)
    return SlurmJob(job_id=job, state="UNKNOWN" if info is None else info.state, stage=stage)


def _record(launch: Launch, job: str, *, code: int, end: int, seconds: float) -> LaunchRecord:
    return LaunchRecord(
        stage=launch.stage or "",
        action=launch.action or "",
        exit_code=code,
        start_iteration=launch.start_iteration or 0,
        end_iteration=end,
        seconds=seconds,
        job_id=job,
    )


__all__ = ["SlurmChain", "SlurmRehearsal", "chain_length", "require_slurm"]
