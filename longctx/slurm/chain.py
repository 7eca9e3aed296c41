"""Chains of identical jobs: estimate their number, submit them, end each job, cancel them.

    estimate_chain(rp, settings)                 how many jobs the remaining tokens need
    submit(rendered, rp, chain=, dry_run=)       N × `sbatch --parsable --dependency=afterany:PREV`
    job_end(rp, exit_code, scripts_dir=)         after `stage run` in every job: record, submit the
                                                 eval job of a finished stage, cancel the jobs queued
                                                 behind when the plan is done (or cannot go on: see
                                                 chain_stop_reason)
    cancel(rp)                                   scancel the plan's queued and running jobs

Estimate: a stage's remaining tokens / (tokens per GPU-second at its length × its GPUs) is its training
time; a job trains for `exit_duration_in_mins` (or the time limit less the signal lead) minus the
profile's `job_overhead_mins` (start, load, data index, final save). Jobs per stage are rounded up
(a job runs one stage: the next stage starts in the next job), and max(1, 10 %) spare jobs absorb
failures; spares cost nothing when the plan ends early, as the last job cancels them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
import uuid
from pathlib import Path

from longctx.errors import SlurmError, StageError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.slurm import commands
from longctx.slurm.records import job_id_of, submitted, submitted_ids
from longctx.slurm.script import Rendered, eval_script_name, log_dir
from longctx.slurm.settings import JobSettings
from longctx.slurm.sweep_jobs import SweepJobs, submit_sweep
from longctx.stage import ledger
from longctx.stage.ledger_events import Cancel, ChainCancel, End, Launch, LedgerEvent, Submit, SubmitFailed
from longctx.stage.ledger_events import JobEnd as JobEndRecord
from longctx.stage.lock import Holder, read_holder, stale_reason
from longctx.stage.state import NextStep, StageState, next_step, plan_state

SPARE_FRACTION = 0.10
FAILURE_STREAK = 3  # consecutive jobs that failed without progress before the chain is stopped
REFUSED = 2  # the exit status of a longctx check that refused (what/where/fix), as every command uses
# beyond any stage's need, and far past what sites let one user queue (MaxSubmitJobs)
MAX_CHAIN_JOBS = 1000

# -- estimate -------------------------------------------------------------------------------------


def tokens_per_gpu_second(table: dict[str, float], seq_length: int) -> float | None:
    """Interpolated in log-log between measured lengths; past the longest, cost ∝ length (attention-bound)."""
    points = sorted((int(k), float(v)) for k, v in table.items())
    if not points:
        return None
    exact = dict(points)
    if seq_length in exact:
        return exact[seq_length]
    if seq_length <= points[0][0]:
        return points[0][1]
    if seq_length >= points[-1][0]:
        length, tps = points[-1]
        return tps * length / seq_length
    for (l0, t0), (l1, t1) in itertools.pairwise(points):
        if l0 <= seq_length <= l1:
            f = math.log(seq_length / l0) / math.log(l1 / l0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None  # unreachable


@dataclasses.dataclass
class StageEstimate:
    stage: str
    remaining_iterations: int
    remaining_tokens: int
    tokens_per_second: float  # the whole job's
    train_hours: float
    jobs: int


@dataclasses.dataclass
class ChainEstimate:
    stages: list[StageEstimate]
    train_minutes_per_job: float
    spare: int

    @property
    def jobs(self) -> int:
        return sum(s.jobs for s in self.stages) + self.spare


def train_minutes_per_job(rp: ResolvedPlan, settings: JobSettings) -> float:
    eff = settings.profile
    limit = settings.time_minutes - settings.signal.seconds / 60
    durations = [st.exit_duration_in_mins for st in rp.stages if st.exit_duration_in_mins]
    if durations:
        limit = min(limit, float(min(durations)))
    return limit - eff.job_overhead_mins


def estimate_chain(
    rp: ResolvedPlan, settings: JobSettings, states: list[StageState] | None = None
) -> ChainEstimate:
    states = states if states is not None else plan_state(rp)
    per_job = train_minutes_per_job(rp, settings)
    if per_job <= 0:
        raise SlurmError(
            f"a job of {settings.profile.time} leaves no training time after the "
            f"{settings.profile.job_overhead_mins:g} "
            "min per-job overhead",
            where=str(settings.plan_path),
            fix="raise the time limit (or exit_duration_in_mins), or lower job_overhead_mins",
        )
    out: list[StageEstimate] = []
    for st, s in zip(rp.stages, states, strict=True):
        remaining = 0 if s.status == "done" else max(0, st.train_iters - s.iteration)
        tokens = remaining * st.tokens_per_iteration
        tps = stage_tokens_per_second(settings, st)
        if tps is None:
            if remaining == 0:
                out.append(StageEstimate(st.name, 0, 0, 0.0, 0.0, 0))
                continue
            raise SlurmError(
                f"no throughput figure for stage {st.name} (seq {st.seq_length}) to estimate the chain length",
                where=f"profile {settings.profile.name!r}",
                fix="give --chain N, or set slurm.tokens_per_gpu_second in the plan (e.g. 16384 = 2000)",
            )
        hours = tokens / tps / 3600
        jobs = math.ceil(hours * 60 / per_job) if remaining else 0
        out.append(StageEstimate(st.name, remaining, tokens, tps, hours, jobs))
    total = sum(s.jobs for s in out)
    spare = max(1, math.ceil(SPARE_FRACTION * total)) if total else 0
    return ChainEstimate(out, per_job, spare)


def stage_tokens_per_second(settings: JobSettings, st: ResolvedStage) -> float | None:
    per = tokens_per_gpu_second(settings.profile.tokens_per_gpu_second, st.seq_length)
    return None if per is None else per * st.world


# -- ledger view ----------------------------------------------------------------------------------


# -- submit ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class SubmitResult:
    chain_id: str
    commands: list[list[str]]
    job_ids: list[str]
    estimate: ChainEstimate | None
    dry_run: bool
    scripts: list[Path]


def submit(
    rendered: Rendered,
    rp: ResolvedPlan,
    *,
    chain: int | None = None,
    dry_run: bool = False,
    force: bool = False,
) -> SubmitResult:
    settings = rendered.settings
    run_dir = settings.run_dir
    estimate = None
    if chain is None:
        estimate = estimate_chain(rp, settings)
        chain = estimate.jobs
        if chain == 0:
            raise SlurmError(
                "every stage of the plan is done: nothing to submit",
                where=str(run_dir),
                fix="`longctx slurm status` shows the stages",
            )
    if chain < 1:
        raise SlurmError(f"--chain {chain}: a chain has at least one job", fix="give --chain 1 or more")
    if chain > MAX_CHAIN_JOBS:
        raise SlurmError(
            f"--chain {chain:,}: more than {MAX_CHAIN_JOBS:,} jobs in one chain",
            where="--chain",
            fix=f"queue at most {MAX_CHAIN_JOBS:,} (sites cap queued jobs per user far lower); the chain is "
            "resumable, so submit another when it runs low",
        )
    script = rendered.path(rendered.chain)
    chain_id = uuid.uuid4().hex[:12]
    if dry_run:
        cmds = [
            commands.sbatch_argv(script, dependency=None if i == 0 else f"<job {i}>") for i in range(chain)
        ]
        return SubmitResult(chain_id, cmds, [], estimate, True, [rendered.path(s) for s in rendered.scripts])
    if not force:
        live = commands.active_jobs(submitted_ids(run_dir))
        if live:
            raise SlurmError(
                f"jobs of this plan are still queued or running: {', '.join(sorted(live, key=int))}",
                where=str(ledger.ledger_path(run_dir)),
                fix="wait, or `longctx slurm cancel PLAN` first (or --force to queue a second chain anyway)",
            )
    paths = rendered.write()
    cmds: list[list[str]] = []
    ids: list[str] = []
    prev: str | None = None
    for i in range(chain):
        argv = commands.sbatch_argv(script, dependency=prev)
        cmds.append(argv)
        try:
            job = commands.parse_parsable(commands.run(argv).stdout)
        except SlurmError as err:
            if ids:
                raise SlurmError(
                    f"{err.what} after {len(ids)} of {chain} jobs were queued ({', '.join(ids)})",
                    where=err.where,
                    fix="the queued jobs form a valid shorter chain; submit again later to extend it",
                ) from None
            raise
        ledger.append(
            run_dir,
            Submit(
                kind="chain",
                slurm_job_id=job,
                chain_id=chain_id,
                position=i + 1,
                chain_length=chain,
                dependency=prev,
                script=str(script),
                profile=settings.profile.name,
                backend=settings.backend,
            ),
        )
        ids.append(job)
        prev = job
    return SubmitResult(chain_id, cmds, ids, estimate, False, paths)


# -- the end of every chain job -------------------------------------------------------------------


@dataclasses.dataclass
class JobEnd:
    job_id: str | None
    exit_code: int
    progress: int
    next_action: str
    next_stage: str | None
    reason: str
    cancelled: list[str]
    eval_jobs: dict[str, str]
    sweep: SweepJobs | None = None  # a RoPE sweep's job array and choose job this job queued


def job_end(rp: ResolvedPlan, exit_code: int, *, scripts_dir: Path | None = None) -> JobEnd:
    """Record this job's end; submit eval jobs of stages it finished; stop the chain when it should stop."""
    run_dir = rp.run_dir
    job = os.environ.get("SLURM_JOB_ID")
    states = plan_state(rp)
    step = next_step(rp, states)
    ends = _ends_of(job, ledger.read(run_dir))
    progress = sum(max(0, r.gained) for r in ends)
    finished = [str(r.stage) for r in ends if r.status == "done"]
    ledger.append(
        run_dir,
        JobEndRecord(
            exit_code=exit_code,
            progress=progress,
            next_action=step.action,
            next_stage=step.stage,
            reason=step.reason,
            finished_stages=finished,
        ),
    )

    evals: dict[str, str] = {}
    if scripts_dir is not None:
        done_before = {r.stage for r in submitted(run_dir, "eval")}
        for stage in finished:
            script = Path(scripts_dir) / eval_script_name(stage)
            if stage in done_before or not script.is_file():
                continue
            try:
                jid = commands.sbatch(script)
            except SlurmError as err:
                ledger.append(run_dir, SubmitFailed(kind="eval", stage=stage, error=err.what))
                continue
            ledger.append(run_dir, Submit(kind="eval", slurm_job_id=jid, stage=stage, script=str(script)))
            evals[stage] = jid

    sweep = _sweep_jobs(rp, step, scripts_dir, job)
    why = chain_stop_reason(
        step.action,
        step.reason,
        ledger.read(run_dir),
        job=job,
        exit_code=exit_code,
        lock_holder=_live_holder(run_dir, job),
    )
    cancelled = cancel_behind(rp, reason=why) if why else []
    return JobEnd(job, exit_code, progress, step.action, step.stage, step.reason, cancelled, evals, sweep)


def _sweep_jobs(
    rp: ResolvedPlan, step: NextStep, scripts_dir: Path | None, job: str | None
) -> SweepJobs | None:
    """The next step is a sweep branch: queue the sweep's job array and choose job (once)."""
    if scripts_dir is None or step.stage is None or step.action not in ("first-launch", "resume"):
        return None
    st = rp.stage(step.stage)
    if st.branch_of is None:
        return None
    try:
        return submit_sweep(rp, rp.stage(st.branch_of), scripts_dir, job=job)
    except SlurmError as err:
        ledger.append(rp.run_dir, SubmitFailed(kind="sweep", stage=st.branch_of, error=err.what))
        return None


def _live_holder(run_dir: Path, job: str | None) -> Holder | None:
    """Another launch that holds the run directory's lock now (None: unlocked, stale, or this job)."""
    try:
        holder = read_holder(run_dir)
    except StageError:
        return None  # a damaged lock: the next `stage run` names it
    if holder is None or stale_reason(holder) is not None or (job is not None and holder.job_id == job):
        return None
    return holder


def chain_stop_reason(
    action: str,
    reason: str,
    records: list[LedgerEvent],
    *,
    job: str | None,
    exit_code: int,
    lock_holder: Holder | None = None,
) -> str | None:
    """Why the chain's queued jobs must be cancelled after this job (None: let the next job run).

    - the plan is complete, or blocked;
    - this job's last launch exited 0 without progress (no iteration, no new save: Megatron-LM's
      "Unable to load rng state", --exit-on-missing-checkpoint, …): the next job would decide the same
      step from the same disk and repeat it, so it is stopped at once;
    - this job launched nothing and exited REFUSED (2): a check refused the launch (an edited schedule,
      a preflight, a changed tokenizer …), which the next job would refuse the same way — unless another
      launch holds the run directory's lock (`lock_holder`: a second chain, a manual run): that one is
      training, so this job ends and neither it nor the jobs queued behind are cancelled;
    - FAILURE_STREAK jobs in a row failed without progress (a failure that may be transient — a node, the
      file system — gets retried that often)."""
    if action == "all-done":
        return "the plan is complete"
    if action == "blocked":
        return f"the plan cannot go on: {reason}"
    ends = _ends_of(job, records)
    last = ends[-1] if ends else None
    if last is not None and last.exit_code == 0 and last.no_progress:
        return f"stage {last.stage}'s launch made no progress and the next job would repeat it: {last.no_progress}"
    launched = any(isinstance(r, Launch) and job is not None and str(r.job_id) == job for r in records)
    if job is not None and exit_code == REFUSED and not launched and lock_holder is None:
        return "the stage's launch was refused before it started (see this job's log) and every next job would be"
    streak = _failure_streak(records)
    if streak >= FAILURE_STREAK:
        return f"{streak} jobs in a row failed without progress (last exit {exit_code})"
    return None


def _ends_of(job: str | None, records: list[LedgerEvent]) -> list[End]:
    """The `end` records of the launches Slurm job `job` ran (none outside a Slurm job)."""
    return [r for r in records if isinstance(r, End) and job is not None and str(r.job_id) == job]


def _failure_streak(records: list[LedgerEvent]) -> int:
    n = 0
    for r in reversed([r for r in records if isinstance(r, JobEndRecord)]):
        if (r.exit_code or 0) != 0 and (r.progress or 0) == 0:
            n += 1
        else:
            break
    return n


def cancel_behind(rp: ResolvedPlan, *, reason: str) -> list[str]:
    """Cancel the chain jobs of this plan still queued or running, except the calling job."""
    me = os.environ.get("SLURM_JOB_ID")
    ids = [j for j in submitted_ids(rp.run_dir, "chain") if j != me]
    live = commands.active_jobs(ids)
    victims = [j for j in reversed(ids) if j in live]
    if victims:
        commands.cancel_jobs(victims)
    ledger.append(rp.run_dir, ChainCancel(slurm_job_ids=list(victims), reason=reason))
    return victims


def cancel(rp: ResolvedPlan) -> list[str]:
    """`slurm cancel`: every job this plan submitted that is still queued or running."""
    ids = submitted_ids(rp.run_dir)
    live = commands.active_jobs(ids)
    victims = [j for j in reversed(ids) if j in live]
    if victims:
        commands.cancel_jobs(victims)
    ledger.append(rp.run_dir, Cancel(slurm_job_ids=list(victims), reason="slurm cancel"))
    return victims


def wait_until_gone(job_ids: list[str], timeout: float = 60) -> bool:
    """Poll squeue until none of `job_ids` is active (tests and `cancel --wait`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not commands.active_jobs(job_ids):
            return True
        time.sleep(1)
    return False


__all__ = [
    "ChainEstimate",
    "JobEnd",
    "StageEstimate",
    "SubmitResult",
    "cancel",
    "cancel_behind",
    "chain_stop_reason",
    "estimate_chain",
    "job_end",
    "job_id_of",
    "log_dir",
    "submit",
    "submitted",
    "submitted_ids",
    "tokens_per_gpu_second",
]
