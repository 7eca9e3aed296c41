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

from pydantic import ValidationError

from longctx.errors import SlurmError
from longctx.plan.slurm import Backend, ContainerSpec, LauncherName, Profile, QosLimits

PROFILES_ENV = "LONGCTX_SLURM_PROFILES"
# the profile types are the plan's (longctx.plan.slurm): a plan's [slurm] table is typed by them
__all__ = [
    "PROFILES_ENV",
    "Backend",
    "ContainerSpec",
    "LauncherName",
    "Profile",
    "QosLimits",
    "available_profiles",
    "load_profile",
    "packaged_dir",
    "profile_path",
    "search_dirs",
]


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
