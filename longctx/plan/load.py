"""Read a plan TOML file into a validated `Plan`, turning schema errors into PlanErrors that name the field."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from longctx.errors import PlanError
from longctx.plan.schema import Plan
from longctx.rope.base_bound import BASE_FIX
from longctx.util.shipped import shipped_plan

RUN_DIR_ENV = "LONGCTX_RUN_DIR"


def load_plan(path: str | os.PathLike[str], *, run_dir: str | os.PathLike[str] | None = None) -> Plan:
    """Load and schema-check a plan: a path, or the name of a shipped plan (`baby_9b_dense`) when no such
    file exists. `run_dir` (or $LONGCTX_RUN_DIR) replaces the plan's run_dir."""
    p = Path(path)
    if not p.is_file():
        shipped = shipped_plan(str(path))
        if shipped is None:
            raise PlanError(
                f"plan file not found: {p}",
                where=str(p),
                fix="give the path of a plan TOML, or the name of a shipped plan (`longctx plan list`)",
            )
        p = shipped
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise PlanError(
            f"plan is not UTF-8 text (byte {err.start}: {err.reason})",
            where=str(p),
            fix="save the plan as UTF-8 TOML",
        ) from None
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        detail = str(err) if isinstance(err, tomllib.TOMLDecodeError) else "nested too deeply"
        raise PlanError(
            f"plan is not valid TOML: {detail}", where=str(p), fix="fix the TOML syntax"
        ) from None
    except OSError as err:
        raise PlanError(f"cannot read the plan: {err.strerror}", where=str(p), fix="check the path") from None
    override = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
    if override:
        data["run_dir"] = str(Path(override).resolve())
    return plan_from_dict(data, where=str(p), plan_path=p.resolve())


def plan_from_dict(data: dict[str, Any], *, where: str, plan_path: Path | None = None) -> Plan:
    try:
        plan = Plan.model_validate(data)
    except ValidationError as err:
        raise _plan_error(err, data, where) from None
    return plan.model_copy(update={"plan_path": plan_path})


def _field_name(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    """('stages', 1, 'rope', 'base') → "stages[1] ('16k').rope.base"."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if (
                isinstance(node, list)
                and item < len(node)
                and isinstance(node[item], dict)
                and "name" in node[item]
            ):
                label += f" ({node[item]['name']!r})"
            parts.append(label)
            node = node[item] if isinstance(node, list) and item < len(node) else None
        else:
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts)


def _plan_error(err: ValidationError, data: dict[str, Any], where: str) -> PlanError:
    lines = []
    fixes = []
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-after")))
        field = _field_name(loc, data)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (a typo? unknown keys are refused, not ignored)"
            fixes.append(f"remove or correct `{loc[-1]}`")
        elif e["type"] == "missing":
            msg = "required but missing"
        elif e["type"] == "value_error" and "rotary base " in msg:  # longctx.rope.base_bound's rule
            msg = msg.removeprefix("Value error, ")
            fixes.append(BASE_FIX)
        elif (
            loc
            and loc[-1] in ("seq_length", "tokens", "max_position_embeddings")
            and e["type"].startswith("int")
        ):
            msg = f"must be an integer, got {e.get('input')!r}"
        lines.append(f"{field or '(plan)'}: {msg}")
    what = "invalid plan: " + "; ".join(lines)
    return PlanError(what, where=where, fix="; ".join(fixes) or "see stages/README.md for the plan format")
