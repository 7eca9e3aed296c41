"""The Slurm client commands longctx runs (sbatch, squeue, scancel, scontrol, sacct), with plain parsers.

Every call goes through `run()`, which turns a missing binary or a failed command into a SlurmError that
says what ran. Parsers are pure functions of the text, so tests can feed them captured output.
Where finished jobs are concerned, information comes from the best source the cluster has: sacct
(accounting), then the controller's memory of recent jobs (`scontrol show job`), then a jobcomp text
file when the cluster writes one; callers fall back to the ledger and logs for the rest.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from longctx.errors import SlurmError
from longctx.plan.derive import ResolvedPlan
from longctx.slurm.profiles import Profile
from longctx.stage.megatron_args import cpu_flags
from longctx.stage.preflight import (
    DEFAULT_TE_VERSION,
    MEGATRON_LAUNCH_ENV,
    DeviceFacts,
    PreflightReport,
    parse_arch,
    preflight_plan,
    require_passed,
    run_preflight,
    stage_job,
)
from longctx.stage.run import megatron_lm_script
from longctx.stage.state import plan_state

ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}  # fmt: skip


def available(binary: str = "sbatch") -> bool:
    return shutil.which(binary) is not None


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"{argv[0]} is not on PATH: this host is not a Slurm client",
            where=" ".join(argv),
            fix="run on a login node of the cluster (or start the local one: scripts/slurm/local-cluster up)",
        )
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"{argv[0]} did not answer within {timeout:.0f} s",
            where=" ".join(argv),
            fix="check that slurmctld is up (sinfo)",
        ) from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(
            f"{argv[0]} failed (exit {proc.returncode}): {msg[-1] if msg else 'no message'}",
            where=" ".join(argv),
            fix="read the message above; `sinfo` and `squeue` show the cluster's state",
        )
    return proc


# -- sbatch / scancel -------------------------------------------------------------------------------


def sbatch_argv(script: str | Path, *, dependency: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    argv = ["sbatch", "--parsable"]
    if dependency:
        argv.append(f"--dependency=afterany:{dependency}")
    return [*argv, *extra, str(script)]


def parse_parsable(text: str) -> str:
    """`sbatch --parsable` prints "JOBID" or "JOBID;CLUSTER"."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    job = line.split(";", 1)[0].strip()
    if not job.isdigit():
        raise SlurmError(
            f"sbatch did not print a job id (got {text.strip()!r})", fix="check the sbatch output above"
        )
    return job


def sbatch(script: str | Path, *, dependency: str | None = None) -> str:
    return parse_parsable(run(sbatch_argv(script, dependency=dependency)).stdout)


def cancel_jobs(job_ids: Iterable[str]) -> None:
    """Cancel queued chain jobs so that none of them starts on the way.

    Cancelling a job satisfies its dependents' `afterany` (scancel works on several jobs at once, in no
    fixed order), so the pending ones are held first: a held job never starts, whatever its dependency.
    """
    ids = list(job_ids)
    if not ids:
        return
    run(["scontrol", "hold", ",".join(ids)], check=False)  # running jobs refuse a hold; they are cancelled
    scancel(ids)


def scancel(job_ids: Iterable[str], *, signal: str | None = None) -> None:
    ids = list(job_ids)
    if not ids:
        return
    argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + ids
    run(argv, check=False)  # jobs that ended meanwhile are not an error


# -- queue ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class JobInfo:
    job_id: str
    state: str
    source: str  # squeue | sacct | scontrol | jobcomp | ledger
    reason: str | None = None
    exit_code: str | None = None
    elapsed: str | None = None
    time_limit: str | None = None
    start: str | None = None
    end: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


SQUEUE_FORMAT = "%i|%T|%M|%l|%r|%S"


def parse_squeue(text: str) -> dict[str, JobInfo]:
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6 or not parts[0]:
            continue
        jid, state, used, limit, reason, start = parts[:6]
        out[jid] = JobInfo(
            jid,
            state.upper(),
            "squeue",
            reason=None if reason in ("None", "") else reason,
            elapsed=used,
            time_limit=limit,
            start=None if start in ("N/A", "") else start,
        )
    return out


def squeue(job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """Jobs among `job_ids` the controller still knows (queued, running, or recently ended)."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    proc = run(["squeue", "-h", "--states=all", "-o", SQUEUE_FORMAT])
    return {k: v for k, v in parse_squeue(proc.stdout).items() if k in wanted}


def active_jobs(job_ids: Iterable[str]) -> dict[str, JobInfo]:
    return {k: v for k, v in squeue(job_ids).items() if v.active}


# -- finished jobs ----------------------------------------------------------------------------------

SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,Start,End"


def parse_sacct(text: str) -> dict[str, JobInfo]:
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6 or not parts[0] or "." in parts[0]:
            continue
        jid, state, code, elapsed, start, end = parts[:6]
        # "CANCELLED by 0" → CANCELLED
        out[jid] = JobInfo(
            jid,
            state.split()[0].upper(),
            "sacct",
            exit_code=code,
            elapsed=elapsed,
            start=None if start in ("Unknown", "None") else start,
            end=None if end in ("Unknown", "None") else end,
        )
    return out


def sacct(job_ids: Iterable[str]) -> dict[str, JobInfo] | None:
    """Final states from accounting; None when the cluster keeps no accounting."""
    ids = sorted(set(job_ids), key=int)
    if not available("sacct"):
        return None
    if not ids:
        return {}
    proc = run(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", SACCT_FIELDS], check=False)
    if proc.returncode != 0 or "accounting storage is disabled" in (proc.stderr + proc.stdout).lower():
        return None
    return parse_sacct(proc.stdout)


_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """`JobId=1 Name=a b JobState=TIMEOUT …` → dict (values may hold spaces, as job names do)."""
    matches = list(_KV.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def scontrol_job(job_id: str) -> JobInfo | None:
    proc = run(["scontrol", "show", "job", "-o", job_id], check=False)
    if proc.returncode != 0 or "JobId=" not in proc.stdout:
        return None
    kv = parse_key_values(proc.stdout.strip().splitlines()[0])
    return JobInfo(
        job_id,
        kv.get("JobState", "UNKNOWN").upper(),
        "scontrol",
        reason=None if kv.get("Reason") in (None, "None") else kv.get("Reason"),
        exit_code=kv.get("ExitCode"),
        elapsed=kv.get("RunTime"),
        time_limit=kv.get("TimeLimit"),
        start=kv.get("StartTime"),
        end=kv.get("EndTime"),
    )


def config() -> dict[str, str]:
    """`scontrol show config` as a dict ("JobCompType" → "jobcomp/filetxt", …)."""
    proc = run(["scontrol", "show", "config"], check=False)
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            out[k.strip()] = v.strip()
    return out


def parse_jobcomp(text: str, job_ids: Iterable[str]) -> dict[str, JobInfo]:
    wanted = set(job_ids)
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        kv = parse_key_values(line)
        jid = kv.get("JobId", "")
        if jid in wanted:
            out[jid] = JobInfo(
                jid,
                kv.get("JobState", "UNKNOWN").upper(),
                "jobcomp",
                exit_code=kv.get("ExitCode"),
                time_limit=kv.get("TimeLimit"),
                start=kv.get("StartTime"),
                end=kv.get("EndTime"),
            )
    return out


def jobcomp(job_ids: Iterable[str], cfg: dict[str, str] | None = None) -> dict[str, JobInfo]:
    """Final states from a jobcomp/filetxt file, when the cluster writes one this host can read."""
    cfg = cfg if cfg is not None else config()
    if cfg.get("JobCompType") != "jobcomp/filetxt":
        return {}
    path = Path(cfg.get("JobCompLoc", ""))
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    return parse_jobcomp(text, job_ids)


def job_states(job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """Each job's state from the best source that knows it (missing ids: nobody remembers them)."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    out = squeue(ids)
    finished = [j for j in ids if j not in out or not out[j].active]
    if not finished:
        return out
    acct = sacct(finished)
    if acct is not None:
        for j, info in acct.items():
            out[j] = info
        return out
    for j in finished:
        if j in out:  # the controller still remembers it: scontrol adds the exit code
            detail = scontrol_job(j)
            if detail is not None:
                out[j] = detail
    missing = [j for j in ids if j not in out]
    if missing:
        out.update(jobcomp(missing))
    return out


# -- the Megatron-LM preflight of a chain -----------------------------------------------------------


def preflight_facts(
    profile: Profile, *, gpu_memory_gib: float | None = None, environ: Mapping[str, str] | None = None
) -> DeviceFacts:
    """The device facts of a profile's nodes, for `longctx.stage.preflight` on a login node.

    The launch environment is what a chain job's workers get: the submitting shell's (sbatch exports it),
    the profile's `env`, then what longctx's megatron-lm launch adds (CUDA_DEVICE_MAX_CONNECTIONS)."""
    env = {**(os.environ if environ is None else environ), **profile.env, **MEGATRON_LAUNCH_ENV}
    source = f"profile {profile.name}"
    if profile.gpus_per_node == 0 and not profile.gpu_arch:
        return DeviceFacts.cpu(source + " (no GPU)", env=env)
    te = profile.transformer_engine
    te_version = None if te is False else (DEFAULT_TE_VERSION if te is True else str(te))
    return DeviceFacts(
        source,
        gpu_arch=parse_arch(profile.gpu_arch or "8.0"),
        gpu_name=profile.gpu_name,
        gpu_memory_gib=gpu_memory_gib,
        transformer_engine=te_version,
        env=env,
    )


def preflight_chain(
    rp: ResolvedPlan, profile: Profile, *, environ: Mapping[str, str] | None = None, rotary: bool = True
) -> PreflightReport | None:
    """Every stage a chain may still launch (not done on disk) through the checkout's Megatron-LM with the
    profile's device facts (a profile without GPUs: the launch of the CPU runner, the only one its nodes
    run); None when nothing is left. Raises PreflightError when Megatron-LM refuses one."""
    pending = [s.name for s in plan_state(rp) if s.status != "done"]
    if not pending:
        return None
    facts = preflight_facts(profile, gpu_memory_gib=rp.cluster.gpu_memory_gib, environ=environ)
    if facts.gpu_arch is not None:
        report = preflight_plan(rp, facts, stages=pending, rotary=rotary)
    else:
        # nodes without a GPU run Megatron-LM only through the CPU runner: `stage run` there appends the CPU
        # flags and the runner stands in an A100-class device without TE, so that is the launch to check
        facts = DeviceFacts(
            f"{facts.source}: Megatron-LM on the CPU (the CPU runner's A100-class device)",
            gpu_arch=(8, 0),
            transformer_engine=None,
            env=facts.env,
        )
        jobs = []
        for st in rp.launchable(pending):
            job = stage_job(rp, st, rotary=rotary)
            jobs.append(dataclasses.replace(job, argv=[*job.argv, *cpu_flags(st.cp, st.seq_length)]))
        report = run_preflight(megatron_lm_script(rp), jobs, facts)
    return require_passed(report, where=str(rp.source))
