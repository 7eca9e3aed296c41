"""Ring and all-gather attention on gloo (world sizes 1–4) against a float64 full-sequence reference."""

from __future__ import annotations

import pytest
import torch

from longctx.attention import zigzag_gather
from tests.attention import cases
from tests.fixtures.attention import reference_attention

F32_REL = 1e-5  # float32: max abs error relative to the reference's scale
BF16_TOL = 2.5e-2  # bfloat16: atol = rtol


def _reference(shape, causal, seed=0, cast=None):
    b, s, hq, hkv, d = shape
    full = cases.make_inputs(seed, b, s, hq, hkv, d)
    q, k, v = (full[n] if cast is None else full[n].to(cast).double() for n in ("q", "k", "v"))
    dout = full["dout"] if cast is None else full["dout"].to(cast).double()
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = reference_attention(q, k, v, causal)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _gather(per_rank, variant):
    names = ("out", "dq", "dk", "dv")
    return {n: zigzag_gather([r[variant][n] for r in per_rank], seq_dim=1) for n in names}


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got - ref).abs().max() / ref.abs().max()).item()


# (batch, seq, q heads, kv heads, head dim) — sequence lengths 2·CP·c with c odd (not powers of two)
CASES = [
    pytest.param(1, True, (2, 14, 8, 2, 64), id="cp1-causal-gqa-d64"),
    pytest.param(1, False, (2, 15, 8, 2, 64), id="cp1-full-gqa-d64-oddlen"),
    pytest.param(2, True, (2, 20, 8, 2, 64), id="cp2-causal-gqa-d64"),
    pytest.param(2, False, (2, 20, 8, 2, 64), id="cp2-full-gqa-d64"),
    pytest.param(2, True, (1, 28, 4, 4, 128), id="cp2-causal-mha-d128"),
    pytest.param(3, True, (2, 30, 8, 2, 64), id="cp3-causal-gqa-d64"),
    pytest.param(3, False, (2, 18, 8, 2, 128), id="cp3-full-gqa-d128"),
    pytest.param(3, True, (1, 42, 4, 1, 128), id="cp3-causal-mqa-d128"),
    pytest.param(4, True, (2, 40, 8, 2, 64), id="cp4-causal-gqa-d64"),
    pytest.param(4, False, (2, 24, 8, 2, 64), id="cp4-full-gqa-d64"),
    pytest.param(4, True, (1, 56, 4, 4, 128), id="cp4-causal-mha-d128"),
]


@pytest.mark.parametrize(("world", "causal", "shape"), CASES)
def test_float32_matches_float64_reference(cp_pool, world, causal, shape):
    per_rank = cp_pool.run(
        cases.attention_case,
        world,
        variants=["ring", "allgather"],
        causal=causal,
        shape=shape,
        dtype="float32",
    )
    ref = _reference(shape, causal)
    ring, gathered = _gather(per_rank, "ring"), _gather(per_rank, "allgather")
    for name in ("out", "dq", "dk", "dv"):
        assert _rel_err(ring[name], ref[name]) <= F32_REL, f"ring {name}"
        assert _rel_err(gathered[name], ref[name]) <= F32_REL, f"allgather {name}"
        # the two variants run different block schedules; they agree to float32 rounding
        assert _rel_err(ring[name], gathered[name]) <= F32_REL, f"ring vs allgather {name}"


@pytest.mark.parametrize(
    ("world", "causal", "shape"),
    [
        pytest.param(2, True, (2, 36, 8, 2, 64), id="cp2-causal"),
        pytest.param(4, True, (1, 56, 8, 2, 128), id="cp4-causal-d128"),
        pytest.param(3, False, (2, 30, 8, 2, 64), id="cp3-full"),
    ],
)
def test_bfloat16_within_tolerance(cp_pool, world, causal, shape):
    per_rank = cp_pool.run(
        cases.attention_case,
        world,
        variants=["ring", "allgather"],
        causal=causal,
        shape=shape,
        dtype="bfloat16",
    )
    ref = _reference(shape, causal, cast=torch.bfloat16)
    for variant in ("ring", "allgather"):
        got = _gather(per_rank, variant)
        for name in ("out", "dq", "dk", "dv"):
            torch.testing.assert_close(
                got[name],
                ref[name],
                atol=BF16_TOL,
                rtol=BF16_TOL,
                msg=lambda m, v=variant, n=name: f"{v} {n}: {m}",
            )


@pytest.mark.parametrize("variant", ["ring", "allgather"])
def test_stacked_layers_error_does_not_grow(cp_pool, variant):
    world, layers, hidden, heads, b, s = 3, 8, 32, (4, 2, 16), 2, 30
    per_rank = cp_pool.run(
        cases.stacked_case,
        world,
        variant=variant,
        causal=True,
        layers=layers,
        hidden=hidden,
        heads=heads,
        b=b,
        s=s,
    )
    full = cases.make_stack(0, layers, hidden, *heads, b, s)
    x = full["x"].clone().requires_grad_()
    weights = [{n: t.clone().requires_grad_() for n, t in w.items()} for w in full["weights"]]
    outs = cases.stack_forward(x, weights, lambda q, k, v: reference_attention(q, k, v, True), *heads)
    outs[-1].backward(full["g"])

    errs = []
    for i, ref in enumerate(outs):
        got = zigzag_gather([r["outs"][i] for r in per_rank], seq_dim=1)
        errs.append(_rel_err(got, ref.detach()))
    assert max(errs) <= F32_REL, errs
    # no compounding: the last layer is not much worse than the first
    assert errs[-1] <= max(10 * errs[0], 1e-6), errs
    dx = zigzag_gather([r["dx"] for r in per_rank], seq_dim=1)
    assert _rel_err(dx, x.grad) <= F32_REL
    for i in (0, layers - 1):
        for n, t in weights[i].items():
            assert _rel_err(per_rank[0]["wgrads"][i][n], t.grad) <= F32_REL, (i, n)


@pytest.mark.parametrize("variant", ["ring", "allgather"])
def test_odd_local_length_is_rejected_with_shapes(cp_pool, variant):
    messages = cp_pool.run(cases.odd_local_len_case, 2, variant=variant)
    for msg in messages:
        assert "local sequence length 5 (global 10 at CP = 2)" in msg
        assert "2·CP = 4" in msg
        assert "q [1, 5, 2, 8]" in msg


# Streamed K/V: pieces that divide the chunk and pieces that do not (the last piece is shorter, or
# slots outnumber rows and some are empty), and backward kernel calls over several query tiles
# (even and uneven). (world, causal, shape, piece, query tile); local lengths L = S / world, causal
# slots cover half chunks h = L / 2 of queries.
PIECE_CASES = [
    pytest.param(2, True, (2, 36, 8, 2, 16), 3, 3, id="cp2-causal-gqa-h9-p3-divides-q3"),
    pytest.param(2, True, (2, 36, 8, 2, 16), 4, 4, id="cp2-causal-gqa-h9-p4-uneven-q4"),
    pytest.param(2, False, (1, 36, 4, 4, 16), 5, 7, id="cp2-full-mha-L18-p5-uneven-q7"),
    pytest.param(3, True, (1, 42, 4, 1, 16), 1, 2, id="cp3-causal-mqa-p1-single-rows-q2"),
    pytest.param(3, False, (2, 30, 8, 2, 16), 2, 5, id="cp3-full-gqa-L10-p2-divides-q5"),
    pytest.param(4, True, (1, 56, 4, 4, 16), 5, 3, id="cp4-causal-mha-h7-p5-uneven-q3"),
    pytest.param(4, True, (2, 40, 8, 2, 16), 8, 100, id="cp4-causal-gqa-h5-p8-above-half-one-tile"),
    pytest.param(4, False, (1, 24, 4, 2, 16), 4, 4, id="cp4-full-gqa-L6-p4-uneven-q4"),
]


@pytest.mark.parametrize(("world", "causal", "shape", "piece", "tile"), PIECE_CASES)
def test_streamed_pieces_match_reference_and_allgather(cp_pool, world, causal, shape, piece, tile):
    per_rank = cp_pool.run(
        cases.attention_case,
        world,
        variants=["ring", "allgather"],
        causal=causal,
        shape=shape,
        dtype="float32",
        piece=piece,
        query_tile=tile,
    )
    ref = _reference(shape, causal)
    ring, gathered = _gather(per_rank, "ring"), _gather(per_rank, "allgather")
    for name in ("out", "dq", "dk", "dv"):
        assert _rel_err(ring[name], ref[name]) <= F32_REL, f"ring {name}"
        assert _rel_err(ring[name], gathered[name]) <= F32_REL, f"ring vs allgather {name}"


def test_piece_size_does_not_change_the_result(cp_pool):
    """Whole chunks in one piece vs small uneven pieces: float32 rounding apart, the same numbers."""
    shape = (1, 40, 8, 2, 16)
    runs = [
        _gather(
            cp_pool.run(
                cases.attention_case,
                2,
                variants=["ring"],
                causal=True,
                shape=shape,
                dtype="float32",
                piece=piece,
                query_tile=2,
            ),
            "ring",
        )
        for piece in (1000, 3)
    ]
    for name in ("out", "dq", "dk", "dv"):
        assert _rel_err(runs[1][name], runs[0][name]) <= F32_REL, name


def test_bfloat16_streamed_pieces_within_tolerance(cp_pool):
    shape = (2, 36, 8, 2, 64)
    per_rank = cp_pool.run(
        cases.attention_case,
        3,
        variants=["ring"],
        causal=True,
        shape=shape,
        dtype="bfloat16",
        piece=2,
        query_tile=5,
    )
    ref = _reference(shape, True, cast=torch.bfloat16)
    got = _gather(per_rank, "ring")
    for name in ("out", "dq", "dk", "dv"):
        torch.testing.assert_close(
            got[name], ref[name], atol=BF16_TOL, rtol=BF16_TOL, msg=lambda m, n=name: f"{n}: {m}"
        )
