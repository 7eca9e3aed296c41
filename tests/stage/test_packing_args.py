"""The cluster argv for packed documents: what Megatron-LM honours, refused where it cannot."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from longctx.errors import StageError
from longctx.plan.schema import DataSpec
from longctx.stage.megatron_args import stage_flags
from tests.stage.test_megatron_args import baby  # noqa: F401  (the fixture)


def _documents(rp, stage: str, version: str, reset: bool = True):
    st = rp.stage(stage)
    data = st.data.model_copy(update={"packing": "documents", "reset_position_ids": reset})
    st = type(st)(**{**st.__dict__, "data": data})
    plan = rp.plan.model_copy(update={"megatron": rp.plan.megatron.model_copy(update={"version": version})})
    return type(rp)(plan, rp.arch, rp.vocab_size, rp.make_vocab_size_divisible_by, rp.stages, rp.findings), st


def test_documents_are_refused_where_megatron_lm_has_no_boundaries(baby) -> None:  # noqa: F811
    rp, st = _documents(baby[0], "128k", "0.16.1")
    with pytest.raises(
        StageError, match=r'packing = "documents" cannot run on Megatron-LM at megatron-core 0\.16\.1'
    ):
        stage_flags(rp, st)
    try:
        stage_flags(rp, st)
    except StageError as err:
        assert err.fix and "--backend local" in err.fix and "0.19.0" in err.fix
        assert "--sft" in str(err) and "--reset-attention-mask" in str(err)


def test_documents_from_019_use_inter_document_masking(baby) -> None:  # noqa: F811
    rp, st = _documents(baby[0], "128k", "0.19.0")
    names = [f.name for f in stage_flags(rp, st)]
    assert "--dataloader-inter-document-masking" in names and "--reset-position-ids" in names
    assert "--reset-attention-mask" not in names  # the dense-mask path stays off
    rp, st = _documents(baby[0], "128k", "0.19.0", reset=False)
    # Megatron-LM restarts positions at every document under inter-document masking: no way to keep them
    with pytest.raises(StageError, match="reset_position_ids = false cannot run on Megatron-LM") as err:
        stage_flags(rp, st)
    assert err.value.fix and "reset_position_ids = true" in err.value.fix


def test_concat_adds_nothing(baby) -> None:  # noqa: F811
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
