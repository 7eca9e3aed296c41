"""The key reference of docs/plans.md, generated from the plan schema: every table's keys with their
defaults and their docstrings, so the page cannot name a key the schema lacks or miss one it has.

`python -m longctx.plan.reference docs/plans.md` rewrites the page's section between the markers;
tests/plan/test_reference.py checks that the page holds what this module generates.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from longctx.plan.schema import (
    BaseCheckpoint,
    ClusterSpec,
    DataSpec,
    EvalSpec,
    LocalSpec,
    LRSpec,
    MegatronSpec,
    Plan,
    RopeSpec,
    StageDefaults,
    StageSpec,
    SweepMethod,
    TierMix,
    TokenizerSpec,
)
from longctx.plan.slurm import PlanSlurm
from longctx.util.fs import atomic_write_text
from longctx.util.wandb_settings import WandbSettings

START = "<!-- plan keys: generated from the schema by longctx.plan.reference; do not edit by hand -->"
END = "<!-- end of plan keys -->"
WIDTH = 120


@dataclasses.dataclass(frozen=True)
class Table:
    """One table of a plan file and the schema model its keys are the fields of."""

    title: str
    model: type[BaseModel]
    skip: tuple[str, ...] = ()  # fields that are not keys, or are documented in another table


TABLES = (
    Table("Top level", Plan, skip=("plan_path",)),
    Table("`[base]`", BaseCheckpoint),
    Table("`[tokenizer]`", TokenizerSpec),
    Table("`[cluster]`", ClusterSpec),
    Table("`[megatron]`", MegatronSpec),
    Table("`[local]`", LocalSpec),
    Table("`[wandb]`", WandbSettings),
    Table("`[eval]`", EvalSpec),
    Table("`[slurm]` (laid on the cluster's Slurm profile)", PlanSlurm),
    Table("`[defaults]`, and any `[[stages]]` entry", StageDefaults),
    Table(
        "`[[stages]]` (besides the keys of `[defaults]`)", StageSpec, skip=tuple(StageDefaults.model_fields)
    ),
    Table("A stage's `rope = { … }`", RopeSpec),
    Table("A sweep candidate `{ method = …, params = {…} }`", SweepMethod),
    Table("`[defaults.lr]`, `[stages.lr]`", LRSpec),
    Table("`[defaults.data]`, `[stages.data]`", DataSpec),
    Table("`[defaults.data.tier_mix]`, `[stages.data.tier_mix]`", TierMix),
)


def keys(table: Table) -> list[str]:
    """The table's keys in the schema's order."""
    return [k for k in table.model.model_fields if k not in table.skip]


def default_text(table: Table, key: str) -> str:
    """The key's default as the page shows it: a TOML value, `required`, `none` (worked out, or absent:
    the description says which), or `its table's defaults`."""
    info = table.model.model_fields[key]
    if info.default_factory is not None:
        return _toml(info.default_factory())
    if info.default is PydanticUndefined:
        return "required"
    return _toml(info.default)


def _toml(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "its table's defaults"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | tuple):
        return "`[" + ", ".join(_toml(v).strip("`") for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def _entry(table: Table, key: str) -> str:
    doc = " ".join((table.model.model_fields[key].description or "").split())
    return textwrap.fill(
        f"- `{key}` = {default_text(table, key)}: {doc}",
        width=WIDTH,
        subsequent_indent="  ",
        break_on_hyphens=False,
    )


def reference() -> str:
    """The section between START and END: one heading per table, one entry per key."""
    parts = [START, ""]
    for table in TABLES:
        parts += [f"### {table.title}", "", *(_entry(table, k) for k in keys(table)), ""]
    return "\n".join([*parts, END])


def replaced(page: str) -> str:
    """`page` with its generated section replaced by `reference()`."""
    head, _, rest = page.partition(START)
    _, _, tail = rest.partition(END)
    return head + reference() + tail


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/plans.md")
    atomic_write_text(target, replaced(target.read_text(encoding="utf-8")))
