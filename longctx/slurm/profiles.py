"""Cluster profiles: what a cluster's batch jobs look like, as data (TOML), so a new cluster is a new file.

Packaged profiles live in `longctx/resources/slurm/profiles/` (leonardo, generic, local); a directory
listed in $LONGCTX_SLURM_PROFILES (':'-separated) adds site profiles, and a path to a `.toml` file works
anywhere a profile name does. Unknown keys are errors, as in plans.
"""

from __future__ import annotations

import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from longctx.errors import SlurmError

PROFILES_ENV = "LONGCTX_SLURM_PROFILES"
Backend = Literal["local", "megatron-lm"]
LauncherName = Literal["local", "srun"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QosLimits(_Strict):
    """A QoS's limits per job (what the site's QoS table says)."""

    min_nodes: int = Field(default=1, gt=0)
    max_nodes: int | None = Field(default=None, gt=0)
    max_time: str | None = None
    note: str = ""


class ContainerSpec(_Strict):
    """Run the trainer inside `RUNTIME exec OPTIONS --bind B … IMAGE` on every node."""

    runtime: str = "singularity"
    image: str | None = None
    binds: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=lambda: ["--nv"])


class Profile(_Strict):
    name: str
    description: str = ""
    # directives
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    reservation: str | None = None
    time: str = "24:00:00"
    signal: str = "TERM@240"
    exclude: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    gpus_per_node: int = Field(default=0, ge=0)
    # "gres" → --gres=gpu:G, "gpus-per-node" → --gpus-per-node=G, "both", or "none"
    gpu_directives: Literal["gres", "gpus-per-node", "both", "none"] = "both"
    cpus_per_task: int | None = Field(default=None, gt=0)
    # the nodes' devices as Megatron-LM's checks ask for them (the preflight on a login node, which has no
    # GPU): compute capability ("8.0" A100, "9.0" H100; unset: "8.0" when gpus_per_node > 0, else no GPU),
    # and whether the nodes' environment has TransformerEngine (true, false, or its version "2.8.0")
    gpu_arch: str | None = None
    gpu_name: str | None = None
    transformer_engine: bool | str = True
    extra_sbatch: list[str] = Field(default_factory=list)
    # the time limit must exceed exit_duration_in_mins by this much: the final save and shutdown
    save_margin_mins: float = Field(default=10, ge=0)
    # launch
    backend: Backend = "megatron-lm"
    launcher: LauncherName = "srun"
    torchrun: str = "torchrun"
    master_port: int | None = Field(default=None, gt=0, lt=65536)
    master_addr: Literal["hostname", "ip"] = "hostname"
    srun_args: list[str] = Field(default_factory=list)
    container: ContainerSpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # the longctx command on the batch host (default: the interpreter that renders, `-m longctx`)
    longctx_command: list[str] | None = None
    # eval job after each stage (megatron-lm backend)
    eval_time: str = "02:00:00"
    eval_nodes: int = Field(default=1, gt=0)
    # chain estimate: training tokens per second per GPU by sequence length, and what a job spends
    # outside training (start, load, data index, final save)
    tokens_per_gpu_second: dict[str, float] = Field(default_factory=dict)
    job_overhead_mins: float = Field(default=10, ge=0)
    qos_limits: dict[str, QosLimits] = Field(default_factory=dict)

    @field_validator("tokens_per_gpu_second")
    @classmethod
    def _lengths(cls, v: dict[str, float]) -> dict[str, float]:
        for k, tps in v.items():
            if not str(k).isdigit():
                raise ValueError(f"tokens_per_gpu_second key {k!r} must be a sequence length (digits)")
            if not tps > 0:
                raise ValueError(f"tokens_per_gpu_second[{k}] must be positive")
        return v


def packaged_dir() -> Path:
    return Path(str(resources.files("longctx") / "resources" / "slurm" / "profiles"))


def search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(PROFILES_ENV, "").split(os.pathsep) if p]
    return [*extra, packaged_dir()]


def available_profiles() -> list[str]:
    names: set[str] = set()
    for d in search_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml"))
    return sorted(names)


def profile_path(name: str) -> Path:
    if name.endswith(".toml") or os.sep in name:
        p = Path(name)
        if not p.is_file():
            raise SlurmError(f"profile file not found: {name}", where=name, fix="give an existing .toml path")
        return p
    for d in search_dirs():
        p = d / f"{name}.toml"
        if p.is_file():
            return p
    raise SlurmError(
        f"unknown Slurm profile {name!r}",
        where=", ".join(str(d) for d in search_dirs()),
        fix=f"use one of: {', '.join(available_profiles())}; or a path to a profile .toml; or add a directory "
        f"with NAME.toml to ${PROFILES_ENV}",
    )


def load_profile(name: str) -> Profile:
    path = profile_path(name)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise SlurmError(
            f"profile is not valid TOML: {err}",
            where=str(path),
            fix="fix the TOML syntax (and save it as UTF-8)",
        ) from None
    data.setdefault("name", path.stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise SlurmError(
            f"invalid profile: {_describe(err)}",
            where=str(path),
            fix="see longctx/resources/slurm/profiles/generic.toml for every key",
        ) from None


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = "unknown key (a typo? unknown keys are refused)" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
