"""The evaluation's memory per GPU (forward only) and the CP size of each stage's eval job."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.arch import ModelArch
from longctx.errors import PlanError
from longctx.plan.derive import resolve_plan
from longctx.plan.eval_memory import eval_cp, eval_memory
from longctx.plan.load import load_plan
from longctx.plan.memory import OVERHEAD_BYTES, GiB
from longctx.slurm.script import eval_launch

REPO = Path(__file__).resolve().parents[2]
ARCH = ModelArch(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=128,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=16,
)


def test_terms_against_hand_computed_values() -> None:
    v, s = 512, 4096
    est = eval_memory(ARCH, v, s, 2, batch=3, gpu_memory_gib=1.0, margin=0.1)
    tokens = 3 * s / 2
    # one layer's tensors (bytes per token): the two norms' inputs and outputs 2·(2·2·64), Q/K/V 2·(4+2·2)·16 and
    # their pre-QK-norm copies 2·(4+2)·16, attention output 2·64, core attention 4·4 (the fp32 LSE),
    # SwiGLU 2·3·128; plus the residual stream 2·2·64
    layer = 2 * (2 * 2 * 64) + 2 * 8 * 16 + 2 * 6 * 16 + 2 * 64 + 4 * 4 + 2 * 3 * 128 + 2 * 2 * 64
    assert est.activations == pytest.approx(tokens * layer)
    assert est.logits == pytest.approx(tokens * v * 2 + min(tokens, 2048 * 3) * v * 12)
    assert est.weights == pytest.approx(2 * ARCH.param_count(v))
    assert est.overhead == OVERHEAD_BYTES
    assert est.total == pytest.approx(est.weights + est.activations + est.logits + est.overhead)
    assert est.budget == pytest.approx(0.9 * GiB)


def test_baby_stages_get_the_smallest_cp_that_fits() -> None:
    rp = resolve_plan(load_plan(REPO / "stages" / "baby_9b_dense.toml"))
    got = {}
    for st in rp.stages:
        est, batch = eval_cp(
            rp.arch, st.padded_vocab_size, st.seq_length, max_cp=4, gpu_memory_gib=64, margin=0.1
        )
        got[st.name] = (est.cp, batch)
        assert est.fits
        if est.cp > 1:  # half the CP would not have fitted, even one sequence at a time
            smaller = eval_memory(
                rp.arch,
                st.padded_vocab_size,
                st.seq_length,
                est.cp // 2,
                batch=1,
                gpu_memory_gib=64,
                margin=0.1,
            )
            assert not smaller.fits
    # the 262K-vocabulary logits dominate: 128K × 262,144 × 2 B = 64 GiB at CP 1
    assert got == {"16k": (1, 2), "64k": (2, 1), "128k": (4, 1)}


def test_a_length_no_node_can_evaluate_is_refused() -> None:
    rp = resolve_plan(load_plan(REPO / "stages" / "baby_9b_dense.toml"))
    st = rp.stage("128k")
    with pytest.raises(
        PlanError, match=r"evaluating 131,072 tokens one sequence at a time does not fit"
    ) as err:
        eval_cp(
            rp.arch,
            st.padded_vocab_size,
            st.seq_length,
            max_cp=2,
            gpu_memory_gib=40,
            margin=0.1,
            where="plan",
        )
    assert "CP 1:" in err.value.what and "CP 2:" in err.value.what and err.value.fix


def test_eval_launch_words() -> None:
    py = ["/venv/bin/python", "-m", "longctx"]
    assert eval_launch(py, 1) == (py, None)
    words, note = eval_launch(py, 4)
    assert (
        words
        == [
            "/venv/bin/python",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=4",
            "-m",
            "longctx",
        ]
        and note is None
    )
    words, note = eval_launch(["/opt/bin/longctx-wrapper"], 2)
    assert words == [
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        "--no-python",
        "/opt/bin/longctx-wrapper",
    ]
    assert note and "torchrun --no-python" in note
