"""A plan's `[objective]` against real megatron-core saves of each diffusion layout: what it resolves
to, and every contradiction refused with what/where/fix before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.errors import PlanError, StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage.megatron_args import stage_flags
from tests.fixtures.diffusion import VOCAB, diffusion_plan
from tests.fixtures.run import write_plan


def test_a_masked_diffusion_plan_resolves_from_its_checkpoint(
    tiny_run: Path, diffusion_checkpoints: Path, tmp_path: Path
) -> None:
    rp = resolve_plan(
        load_plan(diffusion_plan(tmp_path, tiny_run, diffusion_checkpoints / "mdm", 'kind = "mdm"'))
    )
    assert rp.objective.kind == "mdm" and rp.objective.mask_id == VOCAB
    assert [(s.padded_vocab_size, s.output_vocab_size) for s in rp.stages] == [(VOCAB + 1, VOCAB)] * 2
    assert rp.arch.untie_embeddings_and_output_weights
    # the cluster engine's pretrain_gpt.py trains the autoregressive loss only
    with pytest.raises(StageError, match=r"pretrain_gpt\.py trains the autoregressive objective") as err:
        stage_flags(rp, rp.stages[0])
    assert err.value.where.endswith("[megatron].entry_script") and "--backend local" in (err.value.fix or "")


@pytest.mark.parametrize(
    ("base", "objective", "needle", "fix"),
    [
        ("arm_unpadded", 'kind = "mdm"', "has no [MASK] row", "masked-diffusion (MDM) base"),
        (
            "mdm",
            'kind = "mdm"\nmask_id = 7',
            f"mask id 7 is not the base checkpoint's {VOCAB}",
            f"mask_id = {VOCAB}",
        ),
        (
            "mdm",
            'kind = "udm"',
            "uniform-state diffusion objective but the base checkpoint is a MDM",
            'kind = "mdm"',
        ),
        ("udm_time", 'kind = "udm"', "time-conditioning tensors", "the fork that built it"),
        (
            "mdm",
            'kind = "mdm"\ninput_rows = 600',
            f"the plan builds 600 input / {VOCAB} output",
            f"input_rows = {VOCAB + 1}",
        ),
        ("mdm_moe", 'kind = "mdm"', "stores its experts per expert", "stacked expert layout"),
        ("mdm", 'kind = "ar"', "autoregressive objective", 'kind = "mdm"'),
    ],
)
def test_contradicting_objectives_are_refused(
    tiny_run: Path,
    diffusion_checkpoints: Path,
    tmp_path: Path,
    base: str,
    objective: str,
    needle: str,
    fix: str,
) -> None:
    plan = diffusion_plan(tmp_path, tiny_run, diffusion_checkpoints / base, objective)
    with pytest.raises(PlanError) as err:
        resolve_plan(load_plan(plan))
    assert needle in err.value.what, err.value.what
    assert fix in (err.value.fix or ""), err.value.fix
    assert err.value.where.startswith(str(plan))


def test_objective_table_typos_and_contradictions_are_schema_errors(tiny_run: Path, tmp_path: Path) -> None:
    for i, bad in enumerate(('kind = "mdm"\nmaskid = 3', 'kind = "udm"\nmask_id = 3', 'kind = "gpt"')):
        plan = write_plan(tmp_path / f"bad{i}.toml", tiny_run, extra=f"\n[objective]\n{bad}\n")
        with pytest.raises(PlanError):
            load_plan(plan)
