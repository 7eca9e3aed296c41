"""The shipped Ermine diffusion plans resolve as documented: objective, vocabulary rows, bidirectional
RoPE bases (both windows read as 2·L), and the cluster engine refusing what it cannot train."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.rope import choose_base
from longctx.stage.megatron_args import stage_flags

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "kind", "rows", "experts"),
    [("ermine_mdm", "mdm", (50258, 50257), None), ("ermine_udm_moe", "udm", (50257, None), 8)],
)
def test_ermine_diffusion_plans(
    name: str, kind: str, rows: tuple[int, int | None], experts: int | None
) -> None:
    rp = resolve_plan(load_plan(REPO / "stages" / f"{name}.toml"))
    assert rp.objective.kind == kind and not rp.objective.causal
    assert rp.objective.mask_id == (50257 if kind == "mdm" else None)
    assert rp.arch.num_experts == experts
    assert [s.seq_length for s in rp.stages] == [8192, 32768]
    for st in rp.stages:
        assert (st.padded_vocab_size, st.output_vocab_size) == rows
        bidirectional = choose_base("men-safe", rotary_dim=64, pretrain_base=10000, pretrain_length=4096,
                                    target_length=2 * st.seq_length, source="exact").base  # fmt: skip
        assert st.rotary_base == bidirectional
        assert "2·L" in st.rope_explanation
    with pytest.raises(StageError, match="autoregressive objective"):
        stage_flags(rp, rp.stages[0])
