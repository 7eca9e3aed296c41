"""A plan's batch-job settings as types: the cluster profile (`Profile`), what a plan's [slurm] table (and
the CLI) may lay on it (`PlanSlurm`, derived from `Profile`'s fields so the two cannot drift), and the
laying on (`PlanSlurm.on`). Loading profiles from disk and checking jobs is longctx.slurm's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from longctx.errors import SlurmError

Backend = Literal["local", "megatron-lm"]
LauncherName = Literal["local", "srun"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class QosLimits(_Strict):
    """A QoS's limits per job (what the site's QoS table says)."""

    min_nodes: int = Field(default=1, gt=0)
    """The fewest nodes a job of this QoS may ask; 1."""

    max_nodes: int | None = Field(default=None, gt=0)
    """The most nodes a job of this QoS may ask; default: no limit."""

    max_time: str | None = None
    """The longest time limit of this QoS (Slurm's time format); default: no limit."""

    note: str = ""
    """What the site says of the QoS (shown, not checked)."""


class ContainerSpec(_Strict):
    """Run the trainer inside `RUNTIME exec OPTIONS --bind B … IMAGE` on every node."""

    runtime: str = "singularity"
    """The container runtime's command; "singularity"."""

    image: str | None = None
    """The image to run (default: none, no container)."""

    binds: list[str] = Field(default_factory=list)
    """Directories bound into the container (`--bind`); default: none."""

    options: list[str] = Field(default_factory=lambda: ["--nv"])
    """The runtime's exec options; ["--nv"], the host's GPUs inside."""


class Profile(_Strict):
    """A cluster's batch jobs as data: sbatch directives, the launch, the eval job and the chain estimate."""

    name: str
    """The profile's name (default: its file's name)."""

    description: str = ""
    """One line on the cluster."""

    account: str | None = None
    """--account (default: the site's)."""

    partition: str | None = None
    """--partition (default: the site's)."""

    qos: str | None = None
    """--qos, checked against `qos_limits` (default: the site's)."""

    reservation: str | None = None
    """--reservation (default: none)."""

    time: str = "24:00:00"
    """The chain job's time limit (--time); "24:00:00"."""

    signal: str = "TERM@240"
    """--signal: what the job gets before its time limit, to save; "TERM@240" (never "B:")."""

    exclude: str | None = None
    """--exclude: nodes to avoid (default: none)."""

    constraint: str | None = None
    """--constraint: node features (default: none)."""

    exclusive: bool = False
    """--exclusive: whole nodes; false."""

    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per node, checked against the plan's cluster (0: no GPU)."""

    gpu_directives: Literal["gres", "gpus-per-node", "both", "none"] = "both"
    """How GPUs are asked: "gres" → --gres=gpu:G, "gpus-per-node" → --gpus-per-node=G, "both" (default) or
    "none"."""

    cpus_per_task: int | None = Field(default=None, gt=0)
    """--cpus-per-task (default: the site's)."""

    gpu_arch: str | None = None
    """The nodes' compute capability as Megatron-LM's checks ask for it on the login node ("8.0" A100,
    "9.0" H100); default: "8.0" when gpus_per_node > 0, else no GPU."""

    gpu_name: str | None = None
    """The nodes' GPU name for the same checks (default: none)."""

    transformer_engine: bool | str = True
    """Whether the nodes' environment has TransformerEngine (true, false, or its version "2.8.0"); true."""

    extra_sbatch: list[str] = Field(default_factory=list)
    """Further sbatch directives (default: none)."""

    save_margin_mins: float = Field(default=10, ge=0)
    """Minutes the time limit must exceed exit_duration_in_mins by: the final save and shutdown; 10."""

    backend: Backend = "megatron-lm"
    """What trains the stages: "megatron-lm" (default) or "local"."""

    launcher: LauncherName = "srun"
    """How workers start: "srun" (default) or "local"."""

    torchrun: str = "torchrun"
    """The torchrun command on the nodes; "torchrun"."""

    master_port: int | None = Field(default=None, gt=0, lt=65536)
    """The rendezvous port; default: 20000 + job id % 10000."""

    master_addr: Literal["hostname", "ip"] = "hostname"
    """The rendezvous address: the first node's "hostname" (default) or "ip"."""

    srun_args: list[str] = Field(default_factory=list)
    """Further srun options (default: none)."""

    container: ContainerSpec | None = None
    """A container to run the trainer in (default: none)."""

    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables exported in the job (default: none)."""

    longctx_command: list[str] | None = None
    """The longctx command on the batch host; default: the interpreter that renders, `-m longctx`."""

    eval_time: str = "02:00:00"
    """The eval job's time limit after each stage (megatron-lm backend); "02:00:00"."""

    eval_nodes: int = Field(default=1, gt=0)
    """Nodes of the eval job; 1."""

    tokens_per_gpu_second: dict[str, float] = Field(default_factory=dict)
    """Chain estimate: training tokens per second per GPU by sequence length ("4096" = 3000.0)."""

    job_overhead_mins: float = Field(default=10, ge=0)
    """Chain estimate: minutes a job spends outside training (start, load, data index, final save); 10."""

    qos_limits: dict[str, QosLimits] = Field(default_factory=dict)
    """The site's QoS table: name → limits (default: none, nothing checked)."""

    @field_validator("tokens_per_gpu_second")
    @classmethod
    def _lengths(cls, v: dict[str, float]) -> dict[str, float]:
        for k, tps in v.items():
            if not str(k).isdigit():
                raise ValueError(f"tokens_per_gpu_second key {k!r} must be a sequence length (digits)")
            if not tps > 0:
                raise ValueError(f"tokens_per_gpu_second[{k}] must be positive")
        return v


class _PlanOnly(_Strict):
    """What a plan's [slurm] table says beyond a profile's fields."""

    container: str | dict[str, Any] | None = None
    """An image path, or a table {runtime, image, binds, options} laid on the profile's container."""

    binds: list[str] | None = None
    """The container's binds, replacing the profile's."""

    megatron_lm: str | None = None
    """The Megatron-LM checkout on the nodes (default: the plan's megatron.path, else $LONGCTX_MEGATRON_LM)."""

    job_name: str | None = None
    """The chain job's name; default: `longctx-<plan>`."""

    job_preflight: bool | None = None
    """megatron-lm backend: each chain job puts its launch through the checkout's Megatron-LM first (`stage
    run`'s preflight, on the node); false skips it (`slurm submit` checks every stage anyway); true."""


# the [slurm] keys in their documented order: a profile field (optional there) or a plan-only one
PLAN_SLURM_KEYS = (
    "account",
    "partition",
    "qos",
    "reservation",
    "time",
    "signal",
    "exclude",
    "constraint",
    "exclusive",
    "cpus_per_task",
    "extra_sbatch",
    "save_margin_mins",
    "container",
    "binds",
    "env",
    "srun_args",
    "torchrun",
    "master_port",
    "backend",
    "launcher",
    "longctx_command",
    "megatron_lm",
    "eval_time",
    "tokens_per_gpu_second",
    "job_overhead_mins",
    "job_name",
    "job_preflight",
)
# laid on the profile by `PlanSlurm.on` themselves, not by replacing the profile's field
_LAID_ON_BY_HAND = ("container", "binds", "env", "tokens_per_gpu_second")


def _optional(name: str) -> tuple[Any, Any]:
    """A field of `_PlanOnly`, else `Profile`'s field `name` with its constraints, None meaning "the
    profile's value"."""
    if name in _PlanOnly.model_fields:
        info = _PlanOnly.model_fields[name]
        return info.annotation, Field(default=None, description=info.description)
    info = Profile.model_fields[name]
    typ = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return typ | None, Field(default=None, description=info.description)


class _PlanSlurmBase(_Strict):
    def on(self, profile: Profile, where: str) -> Profile:
        """`profile` with these settings laid on it: each one given replaces the profile's, `env` and
        `tokens_per_gpu_second` add to the profile's, `container` and `binds` change its container."""
        given = {k: getattr(self, k) for k in self.model_fields_set if getattr(self, k) is not None}
        update = {k: v for k, v in given.items() if k in Profile.model_fields and k not in _LAID_ON_BY_HAND}
        if "env" in given:
            update["env"] = {**profile.env, **given["env"]}
        if "tokens_per_gpu_second" in given:
            update["tokens_per_gpu_second"] = {
                **profile.tokens_per_gpu_second,
                **given["tokens_per_gpu_second"],
            }
        update["container"] = self._container(profile.container, where)
        try:
            return Profile.model_validate({**profile.model_dump(), **update})
        except ValidationError as err:
            raise SlurmError(
                f"invalid Slurm settings: {err.errors()[0]['msg']}",
                where=where,
                fix="check the plan's slurm table and the command-line options",
            ) from None

    def _container(self, container: ContainerSpec | None, where: str) -> ContainerSpec | None:
        given: str | dict[str, Any] | None = self.container
        if isinstance(given, str):
            container = (container or ContainerSpec()).model_copy(update={"image": given})
        elif given is not None:
            base = (container or ContainerSpec()).model_dump()
            try:
                container = ContainerSpec.model_validate({**base, **given})
            except ValidationError as err:
                raise SlurmError(
                    f"invalid slurm.container: {err.errors()[0]['msg']}",
                    where=where,
                    fix="give an image path, or a table with runtime, image, binds, options",
                ) from None
        binds: list[str] | None = self.binds
        if binds is not None:
            container = (container or ContainerSpec()).model_copy(update={"binds": list(binds)})
        return container


PlanSlurm = create_model(
    "PlanSlurm",
    __base__=_PlanSlurmBase,
    __doc__="What a plan's [slurm] table (and the CLI) may set; everything else comes from the profile.",
    **{name: _optional(name) for name in PLAN_SLURM_KEYS},
)


def parse_plan_slurm(data: dict[str, Any], where: str) -> _PlanSlurmBase:
    """A [slurm] table (or the CLI's options) as `PlanSlurm`; unknown keys and bad values are refused."""
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
