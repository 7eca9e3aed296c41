"""Path fields of a plan: `${VAR}` / `${VAR:-default}` expansion, then relative to the plan's directory.

Built-in variables: `${PLAN_DIR}` (the plan file's directory) and `${RUN_DIR}` (the plan's run_dir,
itself expanded first). Every other name comes from the environment; an unset one without a default
is a PlanError naming it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from longctx.errors import PlanError
from longctx.plan.schema import Plan
from longctx.util.shipped import package_dir, shipped_home

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def plan_dir(plan: Plan) -> Path:
    return plan.plan_path.parent if plan.plan_path else Path.cwd()


def expand(text: str, plan: Plan, *, field: str, builtins: dict[str, str] | None = None) -> str:
    known = {"PLAN_DIR": str(plan_dir(plan))}
    known.update(builtins or {})

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in known:
            return known[name]
        value = os.environ.get(name)
        if value is not None and value != "":
            return value
        if default is not None:
            return default
        raise PlanError(
            f"{field}: environment variable ${{{name}}} is not set",
            where=str(plan.plan_path or plan.name),
            fix=f"export {name}=… or write ${{{name}:-default}} in the plan",
        )

    return _VAR.sub(sub, text)


def run_dir(plan: Plan) -> Path:
    """The plan's run directory: a relative run_dir starts at the plan's directory — for a plan shipped
    inside the package, at the place `longctx plan copy NAME .` would put it (./stages/), so a shipped
    plan runs in the current directory. No run directory lies inside the installed package."""
    p = Path(expand(plan.run_dir, plan, field="run_dir"))
    if not p.is_absolute():
        home = shipped_home(plan.plan_path) if plan.plan_path is not None else None
        p = Path(os.path.normpath(Path.cwd() / home / p)) if home is not None else plan_dir(plan) / p
    _outside_the_package(p, plan)
    return p


def _outside_the_package(p: Path, plan: Plan) -> None:
    pkg = package_dir()
    if p.resolve().is_relative_to(pkg):
        raise PlanError(
            f"the run directory {p} is inside the installed longctx package ({pkg}): a run never writes there",
            where=str(plan.plan_path or plan.name),
            fix="give the run a directory of its own: --run-dir DIR (or $LONGCTX_RUN_DIR), or copy the plan to "
            "edit its run_dir: `longctx plan copy NAME DIR`",
        )


def resolve(text: str, plan: Plan, *, field: str) -> Path:
    """An absolute path for a path field of the plan."""
    p = Path(expand(text, plan, field=field, builtins={"RUN_DIR": str(run_dir(plan))}))
    return p if p.is_absolute() else (plan_dir(plan) / p)


def stage_dir(plan: Plan, stage_name: str) -> Path:
    return run_dir(plan) / "stages" / stage_name


def stage_save_dir(plan: Plan, stage_name: str) -> Path:
    """Megatron's --save/--load directory of a stage."""
    return stage_dir(plan, stage_name) / "checkpoints"
