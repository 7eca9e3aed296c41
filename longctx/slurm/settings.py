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

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from longctx.errors import SlurmError
from longctx.plan.derive import ResolvedPlan
from longctx.slurm.profiles import Backend, ContainerSpec, LauncherName, Profile, QosLimits, load_profile
from longctx.slurm.timefmt import SignalSpec, format_seconds, parse_signal, parse_time
from longctx.stage.run import MEGATRON_ENV


class PlanSlurm(BaseModel):
    """What a plan's [slurm] table (and the CLI) may set; everything else comes from the profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    reservation: str | None = None
    time: str | None = None
    signal: str | None = None
    exclude: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    cpus_per_task: int | None = Field(default=None, gt=0)
    extra_sbatch: list[str] | None = None
    save_margin_mins: float | None = Field(default=None, ge=0)
    # an image path, or a table {runtime, image, binds, options}
    container: str | dict[str, Any] | None = None
    binds: list[str] | None = None
    env: dict[str, str] | None = None
    srun_args: list[str] | None = None
    torchrun: str | None = None
    master_port: int | None = Field(default=None, gt=0, lt=65536)
    backend: Backend | None = None
    launcher: LauncherName | None = None
    longctx_command: list[str] | None = None
    megatron_lm: str | None = None
    eval_time: str | None = None
    tokens_per_gpu_second: dict[str, float] | None = None
    job_overhead_mins: float | None = Field(default=None, ge=0)
    job_name: str | None = None
    # megatron-lm backend: each chain job puts its launch through the checkout's Megatron-LM first
    # (`stage run`'s preflight, on the node); false skips it (`slurm submit` checks every stage anyway)
    job_preflight: bool | None = None


PLAN_SLURM_KEYS = tuple(PlanSlurm.model_fields)


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


def parse_plan_slurm(data: dict[str, Any], where: str) -> PlanSlurm:
    unknown = sorted(set(data) - set(PLAN_SLURM_KEYS))
    if unknown:
        raise SlurmError(
            f"unknown key{'s' if len(unknown) > 1 else ''} in the plan's slurm table: {', '.join(unknown)}",
            where=where,
            fix=f"use only: {', '.join(PLAN_SLURM_KEYS)}",
        )
    try:
        return PlanSlurm.model_validate(data)
    except ValidationError as err:
        detail = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors())
        raise SlurmError(
            f"invalid slurm table: {detail}", where=where, fix="see `longctx slurm render --help`"
        ) from None


def _merge(profile: Profile, given: PlanSlurm, where: str) -> tuple[Profile, str | None, str | None]:
    """The profile with `given` applied; also the job name and the Megatron-LM path when given."""
    update: dict[str, Any] = {}
    for key in PLAN_SLURM_KEYS:
        value = getattr(given, key)
        if value is None or key in (
            "container",
            "binds",
            "env",
            "tokens_per_gpu_second",
            "megatron_lm",
            "job_name",
            "job_preflight",
        ):
            continue
        update[key] = value
    if given.env:
        update["env"] = {**profile.env, **given.env}
    if given.tokens_per_gpu_second:
        update["tokens_per_gpu_second"] = {**profile.tokens_per_gpu_second, **given.tokens_per_gpu_second}
    container = profile.container
    if given.container is not None:
        if isinstance(given.container, str):
            container = (container or ContainerSpec()).model_copy(update={"image": given.container})
        else:
            base = (container or ContainerSpec()).model_dump()
            try:
                container = ContainerSpec.model_validate({**base, **given.container})
            except ValidationError as err:
                raise SlurmError(
                    f"invalid slurm.container: {err.errors()[0]['msg']}",
                    where=where,
                    fix="give an image path, or a table with runtime, image, binds, options",
                ) from None
    if given.binds is not None:
        container = (container or ContainerSpec()).model_copy(update={"binds": list(given.binds)})
    update["container"] = container
    try:
        merged = Profile.model_validate({**profile.model_dump(), **update})
    except ValidationError as err:
        raise SlurmError(
            f"invalid Slurm settings: {err.errors()[0]['msg']}",
            where=where,
            fix="check the plan's slurm table and the command-line options",
        ) from None
    return merged, given.job_name, given.megatron_lm


def job_settings(
    rp: ResolvedPlan,
    profile: str | Profile | None = None,
    overrides: dict[str, Any] | None = None,
) -> JobSettings:
    where = rp.where
    base = profile if isinstance(profile, Profile) else load_profile(profile or rp.cluster.profile)
    from_plan = parse_plan_slurm(dict(rp.slurm), f"{where}: slurm")
    eff, job_name, megatron = _merge(base, from_plan, f"{where}: slurm")
    cli = {k: v for k, v in (overrides or {}).items() if v is not None}
    job_preflight = from_plan.job_preflight
    if cli:
        from_cli = parse_plan_slurm(cli, "command line")
        eff, job_name2, megatron2 = _merge(eff, from_cli, "command line")
        job_name, megatron = job_name2 or job_name, megatron2 or megatron
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
            fix=f"set gpus_per_node = {eff.gpus_per_node} in the plan, or use the profile of the cluster it was planned for",
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
            f"the {job} needs {nodes} nodes, but QoS {eff.qos!r} of profile {eff.name!r} allows at most {lim.max_nodes}",
            where=f"{where}: slurm.qos / stage nodes",
            fix=hint,
        )
    if nodes < lim.min_nodes:
        raise SlurmError(
            f"the {job} needs {nodes} nodes, but QoS {eff.qos!r} of profile {eff.name!r} is for {lim.min_nodes} or more",
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
