"""A plan's batch-job settings: the profile, overridden by the plan's [slurm] table, overridden by the CLI.

`job_settings(rp, profile=, overrides=)` validates what a chain job needs before anything is written:
QoS node and time limits, the time limit against the stages' `exit_duration_in_mins` plus the save
margin, the signal (never `B:`), GPUs per node against the plan's cluster.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from longctx.errors import SlurmError
from longctx.plan.derive import ResolvedPlan
from longctx.plan.slurm import parse_plan_slurm
from longctx.slurm.profiles import Backend, LauncherName, Profile, QosLimits, load_profile
from longctx.slurm.timefmt import SignalSpec, format_seconds, parse_signal, parse_time
from longctx.stage.run import MEGATRON_ENV


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """Everything a rendered job needs, validated."""

    profile: Profile  # the effective profile: the named one with the plan's and the CLI's values applied
    plan_name: str
    plan_path: Path
    run_dir: Path
    job_name: str
    nodes: int
    gpus_per_node: int
    time_seconds: int
    signal: SignalSpec
    eval_time_seconds: int
    megatron_lm: str | None
    warnings: tuple[str, ...] = ()
    job_preflight: bool = True

    @property
    def backend(self) -> Backend:
        return self.profile.backend

    @property
    def launcher(self) -> LauncherName:
        return self.profile.launcher

    @property
    def time_minutes(self) -> float:
        return self.time_seconds / 60


def job_settings(
    rp: ResolvedPlan,
    profile: str | Profile | None = None,
    overrides: dict[str, Any] | None = None,
) -> JobSettings:
    where = rp.where
    base = profile if isinstance(profile, Profile) else load_profile(profile or rp.cluster.profile)
    from_plan = rp.slurm
    eff = from_plan.on(base, f"{where}: slurm")
    job_name, megatron, job_preflight = from_plan.job_name, from_plan.megatron_lm, from_plan.job_preflight
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    if cli:
        from_cli = parse_plan_slurm(cli, "command line")
        eff = from_cli.on(eff, "command line")
        job_name, megatron = from_cli.job_name or job_name, from_cli.megatron_lm or megatron
        if from_cli.job_preflight is not None:
            job_preflight = from_cli.job_preflight
    if megatron is None and rp.megatron.path is not None:
        megatron = str(rp.megatron.path)
    warnings: list[str] = []

    if eff.backend == "megatron-lm" and not megatron and not os.environ.get(MEGATRON_ENV):
        warnings.append(
            f"no Megatron-LM checkout given (plan megatron.path or slurm.megatron_lm): the jobs need ${MEGATRON_ENV} "
            "exported in the shell that submits them"
        )
    time_s = parse_time(eff.time, f"{where}: time")
    sig = parse_signal(eff.signal, f"{where}: signal")
    eval_s = parse_time(eff.eval_time, f"{where}: eval_time")
    _check_signal(eff, sig, time_s, where)

    nodes_by_stage = {st.name: st.nodes for st in rp.stages}
    nodes = max(nodes_by_stage.values())
    if len(set(nodes_by_stage.values())) > 1:
        warnings.append(
            "stages ask different node counts ("
            + ", ".join(f"{k} {v}" for k, v in nodes_by_stage.items())
            + f"): every chain job allocates {nodes} nodes, the largest"
        )
    gpn = rp.cluster.gpus_per_node
    if eff.gpus_per_node and gpn != eff.gpus_per_node:
        raise SlurmError(
            f"the plan says {gpn} GPUs per node, profile {eff.name!r} has {eff.gpus_per_node}",
            where=f"{where}: cluster.gpus_per_node",
            fix=f"set gpus_per_node = {eff.gpus_per_node} in the plan, or use the profile of the cluster it was "
            "planned for",
        )
    if eff.backend == "local" and nodes > 1:
        raise SlurmError(
            f"the local backend runs on one node; the plan asks {nodes}",
            where=where,
            fix="use the megatron-lm backend (--backend megatron-lm) or nodes = 1",
        )

    _check_exit_duration(rp, eff, time_s, where, warnings)
    _check_qos(eff, nodes, time_s, where, job="chain job")
    if eff.backend == "megatron-lm":
        _check_qos(eff, eff.eval_nodes, eval_s, where, job="eval job")

    return JobSettings(
        profile=eff,
        plan_name=rp.name,
        plan_path=Path(rp.source or where).resolve(),
        run_dir=rp.run_dir,
        job_name=job_name or f"longctx-{rp.name}",
        nodes=nodes,
        gpus_per_node=gpn,
        time_seconds=time_s,
        signal=sig,
        eval_time_seconds=eval_s,
        megatron_lm=megatron,
        warnings=tuple(warnings),
        job_preflight=True if job_preflight is None else job_preflight,
    )


def _check_signal(eff: Profile, sig: SignalSpec, time_s: int, where: str) -> None:
    handled = {"megatron-lm": ("TERM",), "local": ("TERM", "USR1")}[eff.backend]
    if sig.name not in handled:
        raise SlurmError(
            f"--signal={sig.directive()}: the {eff.backend} backend saves on {' or '.join(handled)}, not {sig.name}",
            where=f"{where}: signal",
            fix=f"use {handled[0]}@{sig.seconds}",
        )
    if sig.seconds >= time_s:
        raise SlurmError(
            f"--signal={sig.directive()} comes {sig.seconds} s before the end, but the time limit is only "
            f"{format_seconds(time_s)}",
            where=f"{where}: signal",
            fix="lower the signal's lead time below the time limit",
        )


def _check_exit_duration(
    rp: ResolvedPlan, eff: Profile, time_s: int, where: str, warnings: list[str]
) -> None:
    limit_min = time_s / 60
    durations = {st.name: st.exit_duration_in_mins for st in rp.stages if st.exit_duration_in_mins}
    for name, mins in durations.items():
        need = mins + eff.save_margin_mins
        if limit_min < need:
            raise SlurmError(
                f"time limit {format_seconds(time_s)} ({limit_min:g} min) is shorter than stage {name}'s "
                f"exit_duration_in_mins {mins} + save margin {eff.save_margin_mins:g} = {need:g} min: the job "
                "would be killed before the trainer's own timed save",
                where=f"{where}: slurm.time / stages ({name!r}).exit_duration_in_mins",
                fix=f"raise the time limit to at least {format_seconds(math.ceil(need) * 60)}, or set "
                f"exit_duration_in_mins <= {math.floor(limit_min - eff.save_margin_mins)}",
            )
    if eff.backend == "megatron-lm" and len(durations) < len(rp.stages):
        missing = [st.name for st in rp.stages if not st.exit_duration_in_mins]
        warnings.append(
            f"stages {', '.join(missing)} have no exit_duration_in_mins: only the time-limit signal saves them, and "
            f"torchrun kills workers 30 s after SIGTERM (set exit_duration_in_mins ≈ time limit − "
            f"{eff.save_margin_mins:g} min)"
        )


def _check_qos(eff: Profile, nodes: int, time_s: int, where: str, *, job: str) -> None:
    if eff.qos is None or eff.qos not in eff.qos_limits:
        return
    lim = eff.qos_limits[eff.qos]
    fits = [name for name, q in eff.qos_limits.items() if _qos_fits(q, nodes, time_s)]
    hint = (
        f"QoS that fit {nodes} nodes for {format_seconds(time_s)}: {', '.join(fits)}"
        if fits
        else ("no QoS of the profile fits; lower the node count or the time limit")
    )
    if lim.max_nodes is not None and nodes > lim.max_nodes:
        raise SlurmError(
            f"the {job} needs {nodes} nodes, but QoS {eff.qos!r} of profile {eff.name!r} allows at most "
            f"{lim.max_nodes}",
            where=f"{where}: slurm.qos / stage nodes",
            fix=hint,
        )
    if nodes < lim.min_nodes:
        raise SlurmError(
            f"the {job} needs {nodes} nodes, but QoS {eff.qos!r} of profile {eff.name!r} is for "
            f"{lim.min_nodes} or more",
            where=f"{where}: slurm.qos",
            fix=hint,
        )
    if lim.max_time is not None and time_s > parse_time(lim.max_time):
        raise SlurmError(
            f"the {job}'s time limit {format_seconds(time_s)} exceeds QoS {eff.qos!r}'s maximum {lim.max_time}",
            where=f"{where}: slurm.time",
            fix=hint,
        )


def _qos_fits(q: QosLimits, nodes: int, time_s: int) -> bool:
    if q.max_nodes is not None and nodes > q.max_nodes:
        return False
    if nodes < q.min_nodes:
        return False
    return not (q.max_time is not None and time_s > parse_time(q.max_time))
