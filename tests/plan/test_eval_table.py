"""A plan's `[eval]` table: what every evaluation of the plan measures, parsed and validated with the
plan (a bad value is refused naming its field), resolved into `ResolvedPlan.eval`; the shipped demo
plans carry the settings their demos use."""

from __future__ import annotations

import tomllib

import pytest

from longctx.errors import PlanError
from longctx.plan.derive import validate_plan
from longctx.plan.load import load_plan, plan_from_dict
from longctx.plan.schema import EvalSpec
from longctx.util.shipped import plans_dir


def _tiny(**eval_table: object) -> dict:
    data = tomllib.loads((plans_dir() / "tiny.toml").read_text(encoding="utf-8"))
    data["eval"] = eval_table
    return data


def test_the_eval_table_is_parsed_and_resolved() -> None:
    plan = plan_from_dict(
        _tiny(keys_per_cell=7, depths=[0, 0.5, 1], distractors=0, seed=9, filler="heldout"),
        where="t.toml",
        plan_path=plans_dir() / "tiny.toml",
    )
    assert (
        plan.eval.keys_per_cell == 7 and plan.eval.depths == [0.0, 0.5, 1.0] and plan.eval.filler == "heldout"
    )
    assert plan.eval.loss_docs == EvalSpec().loss_docs  # fields not given keep the defaults
    rp = validate_plan(plan)
    assert rp.eval == plan.eval
    # a plan without [eval] measures the defaults
    data = _tiny()
    del data["eval"]
    assert plan_from_dict(data, where="t.toml").eval == EvalSpec()


@pytest.mark.parametrize(
    ("table", "field", "says"),
    [
        ({"keys_per_cell": 0}, "eval.keys_per_cell", "greater than or equal to 1"),
        ({"keys_per_cell": 2.5}, "eval.keys_per_cell", "integer"),
        ({"keys_per_cell": 1_000_000}, "eval.keys_per_cell", "less than or equal to 10000"),
        ({"depths": [0, 1.5]}, "eval.depths", "fractions in [0, 1]"),
        ({"depths": []}, "eval.depths", "at least 1"),
        ({"depths": [0.5, 0.5]}, "eval.depths", "repeat"),
        ({"distractors": -1}, "eval.distractors", "greater than or equal to 0"),
        ({"filler": "lorem"}, "eval.filler", "'synthetic' or 'heldout'"),
        ({"elbo_levels": [0.0]}, "eval.elbo_levels", "(0, 1]"),
        ({"keys": 20}, "eval.keys", "unknown key"),
    ],
)
def test_bad_eval_values_are_refused_naming_the_field(table: dict, field: str, says: str) -> None:
    with pytest.raises(PlanError) as err:
        plan_from_dict(_tiny(**table), where="t.toml")
    assert f"{field}:" in err.value.what and says in err.value.what, err.value.what


def test_the_demo_plans_carry_their_demos_eval_settings() -> None:
    """The demo's numbers come from its plan: 20 keys per cell for the published bases' demos, 2 for the
    smoke plan (which pretrains its own base)."""
    keys = {"tiny": 20, "tiny_16k": 20, "tiny_mdm": 20, "tiny_udm": 20, "tiny_smoke": 2}
    for name, n in keys.items():
        raw = tomllib.loads((plans_dir() / f"{name}.toml").read_text(encoding="utf-8"))
        assert raw["eval"]["keys_per_cell"] == n, name
        assert load_plan(name, run_dir="/tmp/unused").eval.keys_per_cell == n
    # the published bases' demos ask by name (RULER's multi-key needles), with keys of any digits
    for name in ("tiny", "tiny_16k", "tiny_mdm", "tiny_udm"):
        ev = load_plan(name, run_dir="/tmp/unused").eval
        assert ev.tasks == ["single", "multikey-2", "multikey-4", "absent-2"] and ev.any_digit_keys, name


def test_changes_and_description() -> None:
    plan, given = EvalSpec(keys_per_cell=20), EvalSpec(keys_per_cell=2, depths=[0.0, 1.0])
    assert given.changes_from(plan) == ["depths 0,0.25,0.5,0.75,1 → 0,1", "keys_per_cell 20 → 2"]
    assert EvalSpec(batch_size=1).changes_from(EvalSpec()) == []  # memory only: the numbers are the same
    assert plan.describe().startswith("20 keys per cell × 5 depths (0%, 25%, 50%, 75%, 100%), 2 distractors")
