"""`slurm status`: where a plan's chain stands — per stage progress and ETA, and every job it submitted.

Progress comes from disk (the stage state machine), timing from the tokens/s the trainer logged over the
stage's last launch (`longctx.stage.pace`), else the ledger (wall seconds per iteration of finished
launches, start-up included), else the trainer's metrics, else the profile's throughput figure. Job states
come from squeue for queued and running jobs, and for finished ones from sacct when the cluster keeps
accounting, else the controller's memory and a jobcomp file, else the ledger and the logs.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import math
import re
from pathlib import Path

from longctx.checkpoint.save_layout import iter_dir_name
from longctx.errors import LongctxError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.slurm import commands
from longctx.slurm.chain import job_id_of, stage_tokens_per_second
from longctx.slurm.script import log_dir
from longctx.slurm.settings import job_settings
from longctx.stage import ledger
from longctx.stage.curves import read_plan_curves
from longctx.stage.ledger_events import Cancel, ChainCancel, End, JobEnd, Launch, LedgerEvent, Submit
from longctx.stage.pace import MAX_ETA_SECONDS, plan_pace
from longctx.stage.run_files import METRICS_BYTES, run_file_lines
from longctx.stage.state import StageState, next_step, plan_state
from longctx.util import bounded_json

FAILED_STATES = {
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "CANCELLED",
}
_ERROR_LINE = re.compile(
    r"(Traceback|Error|error:|Killed|out of memory|NCCL WARN|CANCELLED|TIME LIMIT)", re.I
)
METRICS_WINDOW = 20


@dataclasses.dataclass
class StageProgress:
    stage: str
    status: str
    iteration: int
    target: int
    tokens_done: int
    tokens_target: int
    last_checkpoint_iteration: int | None
    last_checkpoint_time: str | None
    seconds_per_iteration: float | None
    rate_source: str | None  # pace (tokens/s of the last launch) | ledger | metrics | profile
    eta_seconds: float | None  # until this stage is done, counting the stages before it
    tokens_per_s: float | None = None  # over the stage's last launch (longctx.stage.pace)
    stage_eta_seconds: float | None = None  # until this stage is done
    resume_jump: str | None = None  # a resume after which the loss is far above its value before


@dataclasses.dataclass
class JobRow:
    job_id: str
    kind: str  # chain | eval
    position: int | None
    state: str
    source: str
    exit_code: str | None = None
    reason: str | None = None
    elapsed: str | None = None
    start: str | None = None
    end: str | None = None
    stage: str | None = None
    iterations: str | None = None  # "120 → 180" from the ledger
    note: str | None = None


@dataclasses.dataclass
class ChainStatus:
    plan: str
    run_dir: str
    next_action: str
    next_stage: str | None
    next_reason: str
    stages: list[StageProgress]
    jobs: list[JobRow]
    running: list[str]
    pending: list[str]
    eta_seconds: float | None
    last_failure: str | None
    job_source: str  # where finished jobs' states came from
    slurm: bool  # whether Slurm was reachable


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


def _last_checkpoint(s: StageState) -> tuple[int | None, str | None]:
    it = s.latest_complete
    if it is None:
        return None, None
    d = s.save_dir / iter_dir_name(it)
    try:
        return it, _iso(max(p.stat().st_mtime for p in [d, *d.iterdir()]))
    except (OSError, ValueError):
        return it, None


def _ledger_rate(records: list[LedgerEvent], stage: str) -> float | None:
    secs = 0.0
    iters = 0
    for r in records:
        if isinstance(r, End) and r.stage == stage and r.gained > 0:
            secs += r.seconds or 0.0
            iters += r.gained
    return secs / iters if iters else None


def _metrics_rate(rp: ResolvedPlan, st: ResolvedStage) -> float | None:
    path = st.stage_dir / "metrics.jsonl"
    lines = collections.deque(
        (line for _, line in run_file_lines(path, rp.run_dir, "metrics file", max_bytes=METRICS_BYTES)),
        maxlen=METRICS_WINDOW,
    )
    rates = []
    for line in lines:
        try:
            rec = bounded_json.loads(line or "")
        except bounded_json.BadJSON:
            continue
        tps = rec.get("tokens_per_s") if isinstance(rec, dict) else None
        if isinstance(tps, int | float) and not isinstance(tps, bool) and tps > 0:
            rates.append(st.tokens_per_iteration / tps)
    rate = sum(rates) / len(rates) if rates else None
    return rate if rate is not None and math.isfinite(rate) else None


def _profile_rate(rp: ResolvedPlan, st: ResolvedStage, profile: str | None) -> float | None:
    try:
        tps = stage_tokens_per_second(job_settings(rp, profile), st)
    except LongctxError:
        return None
    return st.tokens_per_iteration / tps if tps else None


def stage_progress(
    rp: ResolvedPlan, states: list[StageState], records: list[LedgerEvent], profile: str | None = None
) -> list[StageProgress]:
    out: list[StageProgress] = []
    eta: float | None = 0.0
    paces = plan_pace(rp, states, read_plan_curves(rp), records)
    for st, s, pace in zip(rp.stages, states, paces, strict=True):
        if pace.measured and pace.tokens_per_s:
            rate, source = st.tokens_per_iteration / pace.tokens_per_s, "pace"
        else:
            rate, source = _ledger_rate(records, st.name), "ledger"
        if rate is None:
            rate, source = _metrics_rate(rp, st), "metrics"
        if rate is None:
            rate, source = _profile_rate(rp, st, profile), "profile"
        remaining = 0 if s.status == "done" else max(0, st.train_iters - s.iteration)
        stage_eta = None if (remaining and rate is None) else remaining * (rate or 0.0)
        stage_eta = stage_eta if stage_eta is None or stage_eta <= MAX_ETA_SECONDS else None
        eta = None if eta is None or stage_eta is None else eta + stage_eta
        ck_it, ck_time = _last_checkpoint(s)
        out.append(
            StageProgress(
                stage=st.name,
                status=s.status,
                iteration=s.iteration,
                target=st.train_iters,
                tokens_done=s.iteration * st.tokens_per_iteration,
                tokens_target=st.tokens_realized,
                last_checkpoint_iteration=ck_it,
                last_checkpoint_time=ck_time,
                seconds_per_iteration=rate,
                rate_source=source if rate is not None else None,
                eta_seconds=eta,
                tokens_per_s=st.tokens_per_iteration / rate if rate else None,
                stage_eta_seconds=stage_eta,
                resume_jump=pace.flag() or None,
            )
        )
    return out


def _jobs_from_ledger(records: list[LedgerEvent]) -> tuple[list[JobRow], dict[str, str]]:
    """Rows for every submitted job as the ledger knows them; and the jobs longctx cancelled, with why."""
    rows: dict[str, JobRow] = {}
    cancelled_by_us: dict[str, str] = {}
    for r in records:
        if isinstance(r, Submit):
            jid = job_id_of(r)
            if jid is not None:
                rows[jid] = JobRow(
                    jid, str(r.kind or "chain"), r.position, "SUBMITTED", "ledger", stage=r.stage
                )
        elif isinstance(r, ChainCancel | Cancel):
            why = (
                f"cancelled by job {r.job_id}: {r.reason}"
                if isinstance(r, ChainCancel)
                else "cancelled by `slurm cancel`"
            )
            cancelled_by_us.update((str(j), why) for j in r.slurm_job_ids or [])
    for r in records:
        row = rows.get(str(r.job_id)) if r.job_id is not None else None
        if row is None:
            continue
        if isinstance(r, Launch):
            row.stage = r.stage
            row.iterations = f"{r.start_iteration} → ?"
            row.state, row.note = "LAUNCHED", f"{r.action} {r.stage}"
        elif isinstance(r, End):
            row.iterations = f"{r.start_iteration} → {r.end_iteration}"
            row.exit_code = str(r.exit_code)
            row.state = "ENDED"
        elif isinstance(r, JobEnd):
            row.state = "COMPLETED" if (r.exit_code or 0) == 0 else "FAILED"
            row.exit_code = str(r.exit_code)
    return list(rows.values()), cancelled_by_us


def _error_line(path: Path) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-400:]
    except OSError:
        return None
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line.strip()[:300]
    return None


def _last_failure(
    rows: list[JobRow], records: list[LedgerEvent], run_dir: Path, cancelled: dict[str, str]
) -> str | None:
    logs = {str(r.job_id): r.log for r in records if isinstance(r, Launch)}
    for row in sorted(rows, key=lambda r: int(r.job_id), reverse=True):
        bad_state = row.state in FAILED_STATES and not (row.state == "CANCELLED" and row.job_id in cancelled)
        bad_exit = row.exit_code not in (None, "0", "0:0")
        killed = row.state == "LAUNCHED" and row.source == "ledger"
        if not (bad_state or bad_exit or killed):
            continue
        what = f"job {row.job_id}: {row.state}"
        if row.exit_code not in (None, "0", "0:0"):
            what += f" (exit {row.exit_code})"
        if row.stage:
            what += f", stage {row.stage}" + (f" {row.iterations}" if row.iterations else "")
        detail = None
        for log in (logs.get(row.job_id), str(log_dir(run_dir) / f"slurm-{row.job_id}.log")):
            if log:
                detail = _error_line(Path(log))
                if detail:
                    break
        return what + (f" — {detail}" if detail else "")
    return None


def chain_status(rp: ResolvedPlan, *, profile: str | None = None, query_slurm: bool = True) -> ChainStatus:
    run_dir = rp.run_dir
    states = plan_state(rp)
    step = next_step(rp, states)
    records = ledger.read(run_dir)
    stages = stage_progress(rp, states, records, profile)
    rows, cancelled = _jobs_from_ledger(records)
    slurm_ok = query_slurm and commands.available("squeue")
    source = "ledger"
    if slurm_ok:
        try:
            info = commands.job_states([r.job_id for r in rows])
        except LongctxError:
            info, slurm_ok = {}, False
        sources = {i.source for i in info.values() if not i.active}
        source = "sacct" if "sacct" in sources else (", ".join(sorted(sources)) or "squeue")
        for row in rows:
            i = info.get(row.job_id)
            if i is None:
                continue
            row.state, row.source = i.state, i.source
            row.exit_code = i.exit_code if i.exit_code is not None else row.exit_code
            row.reason, row.elapsed, row.start, row.end = i.reason, i.elapsed, i.start, i.end
    current = {st.name: s.iteration for st, s in zip(rp.stages, states, strict=True)}
    for row in rows:
        if row.job_id in cancelled and row.state in ("CANCELLED", "SUBMITTED"):
            row.state, row.note = "CANCELLED", cancelled[row.job_id]
        elif row.state == "LAUNCHED":  # the ledger saw the launch, nobody saw the end
            row.note = (row.note or "") + " — no end record (killed, or Slurm not reachable)"
        elif row.state in ("RUNNING", "COMPLETING") and row.iterations and row.iterations.endswith("?"):
            row.iterations = row.iterations[:-1] + f"{current.get(row.stage or '', '?')} (running)"
    running = [r.job_id for r in rows if r.state in ("RUNNING", "COMPLETING", "CONFIGURING")]
    pending = [r.job_id for r in rows if r.state == "PENDING"]
    eta = stages[-1].eta_seconds if stages else None
    return ChainStatus(
        plan=rp.name,
        run_dir=str(run_dir),
        next_action=step.action,
        next_stage=step.stage,
        next_reason=step.reason,
        stages=stages,
        jobs=rows,
        running=running,
        pending=pending,
        eta_seconds=eta,
        last_failure=_last_failure(rows, records, run_dir, cancelled),
        job_source=source,
        slurm=slurm_ok,
    )
