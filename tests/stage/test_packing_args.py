"""The cluster argv for packed documents: what Megatron-LM honours, refused where it cannot."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from longctx.errors import StageError
from longctx.plan.derive import validate_plan
from longctx.plan.schema import DataSpec
from longctx.stage.megatron_args import stage_flags


def _documents(rp, stage: str, version: str, reset: bool = True):
    st = rp.stage(stage)
    data = dataclasses.replace(st.data, packing="documents", reset_position_ids=reset)
    st = dataclasses.replace(st, data=data)
    plan = rp.plan.model_copy(update={"megatron": rp.plan.megatron.model_copy(update={"version": version})})
    return validate_plan(plan), st


def test_documents_are_refused_where_megatron_lm_has_no_boundaries(baby) -> None:
    rp, st = _documents(baby[0], "16k", "0.16.1")
    with pytest.raises(
        StageError, match=r'packing = "documents" cannot run on Megatron-LM as planned'
    ) as err:
        stage_flags(rp, st)
    assert "Megatron-LM 0.16.1 cannot mask attention" in str(err.value)
    assert "--sft" in str(err.value) and "--reset-attention-mask" in str(err.value)
    assert err.value.fix and "local backend" in err.value.fix and "0.19" in err.value.fix


def test_documents_from_019_use_inter_document_masking_at_cp1(baby) -> None:
    rp, st = _documents(baby[0], "16k", "0.19.0")
    assert st.cp == 1
    names = [f.name for f in stage_flags(rp, st)]
    assert "--dataloader-inter-document-masking" in names and "--reset-position-ids" in names
    assert "--reset-attention-mask" not in names  # the dense-mask path stays off
    rp, st = _documents(baby[0], "16k", "0.19.0", reset=False)
    # Megatron-LM restarts positions at every document under inter-document masking: no way to keep them
    with pytest.raises(StageError, match="restarts the positions at every document") as err:
        stage_flags(rp, st)
    assert err.value.fix and "reset_position_ids = true" in err.value.fix


def test_documents_at_cp_above_1_are_refused_on_019(baby) -> None:
    """0.19 splits each packed row as a whole over the CP ranks while its THD attention reads per-document
    chunks: the stage would train other pairs of tokens than its documents."""
    rp, st = _documents(baby[0], "128k", "0.19.0")
    assert st.cp == 8
    with pytest.raises(StageError, match=r"correctly at CP 1 only: at CP 8 it cuts each packed row") as err:
        stage_flags(rp, st)
    assert "6156" in str(err.value) and err.value.fix and "cp = 1" in err.value.fix


def test_plan_check_says_what_megatron_does_with_documents(baby) -> None:
    """The verdict reaches `plan check`: a warning in a plan meant for the cluster (it names [megatron])."""
    from longctx.plan.derive import validate_plan

    rp = baby[0]
    documents = {"packing": "documents", "reset_position_ids": True}
    stages = [
        s.model_copy(update={"data": (s.data or rp.plan.defaults.data).model_copy(update=documents)})
        for s in rp.plan.stages
    ]
    for version, codes in (
        ("0.16.1", {"16k": "warning", "64k": "warning", "128k": "warning"}),
        ("0.19.0", {"16k": "info", "64k": "warning", "128k": "warning"}),
    ):
        plan = rp.plan.model_copy(
            update={"stages": stages, "megatron": rp.plan.megatron.model_copy(update={"version": version})}
        )
        got = {
            f.where.split("'")[1]: f.level
            for f in validate_plan(plan).findings
            if f.code == "megatron-documents"
        }
        assert got == codes, (version, got)


def test_concat_adds_nothing(baby) -> None:
    rp = baby[0]
    names = {f.name for f in stage_flags(rp, rp.stage("64k"))}
    assert not names & {
        "--dataloader-inter-document-masking",
        "--reset-position-ids",
        "--reset-attention-mask",
    }


def test_reset_positions_without_documents_is_a_plan_error() -> None:
    with pytest.raises(ValidationError, match=r'reset_position_ids = true needs packing = "documents"'):
        DataSpec(prefixes=["x"], reset_position_ids=True)
    assert DataSpec(prefixes=["x"], packing="documents", reset_position_ids=True).packing == "documents"
