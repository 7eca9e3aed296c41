"""Every stage default stands on its StageDefaults field, and a stage merges over [defaults] by type: the
fields each one set, the stage winning, the fields' own defaults for the rest."""

from __future__ import annotations

from longctx.plan.schema import LRSpec, StageDefaults, StageSpec


def _stage(**given: object) -> StageSpec:
    return StageSpec.model_validate(
        {"name": "s", "seq_length": 8, "rope": {"base": 10_000}, "tokens": 8, **given}
    )


def test_a_stage_over_defaults_merges_by_what_each_set() -> None:
    defaults = StageDefaults(tensor_parallel=2, seed=7, lr=LRSpec(lr=1e-4))
    merged = _stage(seed=9, log_interval=5).merged_over(defaults)
    assert (merged.tensor_parallel, merged.seed, merged.log_interval, merged.lr.lr) == (2, 9, 5, 1e-4)
    # the rest are the fields' own defaults, and the merge knows what the plan set
    assert (merged.micro_batch_size, merged.recompute, merged.eval_iters, merged.extra_args) == (
        1,
        "none",
        0,
        [],
    )
    assert merged.model_fields_set == {"tensor_parallel", "seed", "lr", "log_interval"}
    # a default given explicitly still counts as set (a stage can put back what [defaults] changed)
    assert _stage(tensor_parallel=1).merged_over(defaults).tensor_parallel == 1
    assert _stage().merged_over(StageDefaults()).model_fields_set == set()


def test_an_explicit_none_is_not_a_setting() -> None:
    # a plan built in code may pass None (TOML cannot): it leaves [defaults]' value in place
    merged = _stage(nodes=None, data=None).merged_over(StageDefaults(nodes=2))
    assert merged.nodes == 2 and merged.data is None and merged.model_fields_set == {"nodes"}


def test_every_default_has_a_docstring_naming_it() -> None:
    """A default of None is worked out by a rule the docstring names; any other is stated in it."""
    for name, field in StageDefaults.model_fields.items():
        assert field.description, name
        if field.default is None:
            assert "default" in field.description or "no default" in field.description, name
