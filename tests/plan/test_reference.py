"""Every default stands on its schema field with a docstring, and docs/plans.md's key reference is the one
the schema generates: each key with its default, and no key the schema lacks."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from longctx.arch import ModelArch
from longctx.objective import Objective
from longctx.plan.reference import END, START, TABLES, default_text, keys, reference
from longctx.plan.schema import Plan
from longctx.plan.slurm import PLAN_SLURM_KEYS, PlanSlurm, Profile

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plans.md"
# tables the schema takes from elsewhere, documented by their own modules
ELSEWHERE = {ModelArch, Objective}
_HEADING = re.compile(r"^### (.+)$", re.M)
_KEY = re.compile(r"^- `(\w+)` = (.+?): ", re.M)


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    assert START in text and END in text, f"{PAGE} lost its generated key reference"
    return text[text.index(START) : text.index(END) + len(END)]


def _documented() -> dict[str, dict[str, str]]:
    """Heading → {key: default} as the page shows them."""
    out: dict[str, dict[str, str]] = {}
    parts = _HEADING.split(_section())
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        out[title] = dict(_KEY.findall(body))
    return out


def test_the_page_holds_the_generated_reference() -> None:
    assert _section() == reference(), "run `python -m longctx.plan.reference docs/plans.md`"


def test_every_schema_key_is_on_the_page_with_its_default_and_no_other() -> None:
    page = _documented()
    assert list(page) == [t.title for t in TABLES]
    for table in TABLES:
        want = {k: default_text(table, k) for k in keys(table)}
        assert page[table.title] == want, table.title


def _models(annotation: object) -> set[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return set().union(*(_models(a) for a in typing.get_args(annotation)))
    return set()


def test_every_table_of_the_schema_is_in_the_reference() -> None:
    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [Plan]
    while todo:
        model = todo.pop()
        if model in seen or model in ELSEWHERE:
            continue
        seen.add(model)
        todo += [m for f in model.model_fields.values() for m in _models(f.annotation)]
    assert seen - {t.model for t in TABLES} == set()


def test_every_field_has_a_docstring() -> None:
    missing = [
        f"{t.model.__name__}.{k}" for t in TABLES for k in keys(t) if not t.model.model_fields[k].description
    ]
    missing += [k for k, f in Profile.model_fields.items() if not f.description]
    assert not missing


def test_plan_slurm_is_derived_from_the_profile() -> None:
    """A [slurm] key that is a profile's field has that field's constraints and description."""
    assert tuple(PlanSlurm.model_fields) == PLAN_SLURM_KEYS
    for key in set(PLAN_SLURM_KEYS) & set(Profile.model_fields) - {"container"}:
        mine, theirs = PlanSlurm.model_fields[key], Profile.model_fields[key]
        assert mine.default is None and mine.description == theirs.description, key
    for key, value in {
        "cpus_per_task": 0,
        "master_port": 70000,
        "save_margin_mins": -1,
        "backend": "x",
    }.items():
        with pytest.raises(ValidationError, match=key):
            PlanSlurm.model_validate({key: value})
