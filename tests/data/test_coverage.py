"""Which distances a stage's windows show the model, from document lengths alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from longctx.data.blend import Blend, BlendEntry
from longctx.data.coverage import distance_coverage
from tests.fixtures.data import write_indexed_dataset

S = 1024


def test_documents_longer_than_the_window_cover_it_as_concatenation_does() -> None:
    long = np.full(200, 50 * S)  # almost every window lies inside one document
    cov = distance_coverage([long], [1.0], S, packing="documents", causal=True)
    concat = distance_coverage([long], [1.0], S, packing="concat", causal=True)
    assert cov.longest_piece == S
    for d in (0, S // 2, cov.top_edge):
        assert cov.share_at(d) == pytest.approx(concat.share_at(d), abs=0.01)
    assert concat.share_at(S // 2) == pytest.approx(0.5, abs=1e-3)


def test_short_documents_never_show_the_top_of_the_window() -> None:
    short = np.random.default_rng(0).integers(50, 300, size=5000)
    cov = distance_coverage([short], [1.0], S, packing="documents", causal=True)
    assert cov.longest_piece < 300 <= cov.top_edge and cov.top_share == 0.0
    assert cov.share_at(0) == pytest.approx(1.0)
    # the share falls with distance, and a bidirectional token sees at least what a causal one does
    bi = distance_coverage([short], [1.0], S, packing="documents", causal=False)
    assert all(a >= b for a, b in zip(cov.share, cov.share[1:], strict=False))
    assert all(b >= c - 1e-12 for b, c in zip(bi.share, cov.share, strict=True))


def test_causal_share_counts_offsets_exactly() -> None:
    """One document of exactly one window per window: a causal token at offset o sees distance o."""
    exact = np.full(64, S)
    cov = distance_coverage([exact], [1.0], S, packing="documents", causal=True)
    # windows are S tokens starting at multiples of S: each holds one whole document
    assert cov.share_at(96) == pytest.approx((S - 96) / S)  # 96: a bucket edge (S/64 apart)
    assert cov.top_share == pytest.approx(S / 32 / S)


def test_a_blend_mixes_by_weight() -> None:
    long, short = np.full(50, 8 * S), np.full(5000, 100)
    mixed = distance_coverage([long, short], [0.25, 0.75], S, packing="documents", causal=True)
    alone = distance_coverage([long], [1.0], S, packing="documents", causal=True)
    assert mixed.share_at(S // 2) == pytest.approx(0.25 * alone.share_at(S // 2), rel=0.05)


def test_plan_check_warns_when_no_window_reaches_the_top(tmp_path: Path) -> None:
    from longctx.plan.coverage_check import coverage_findings

    prefix = write_indexed_dataset(tmp_path / "short", [[5] * 200] * 400)
    blend = Blend([BlendEntry(prefix, None)], False, "test")

    class _Stage:
        name, seq_length, tokens_realized = "4k", 4096, 4_000_000
        data = type("D", (), {"packing": "documents"})()

    rp = type("RP", (), {"objective": type("O", (), {"causal": True})()})()
    found = coverage_findings(rp, _Stage(), blend)  # type: ignore[arg-type]
    assert [f.code for f in found.warnings] == ["distance-coverage"]
    assert "no training window shows the model the distances" in found.warnings[0].message
    assert "up to 200" in (found.warnings[0].fix or "")


def test_plan_check_warns_when_too_few_tokens_see_the_top(tmp_path: Path) -> None:
    from longctx.plan.coverage_check import coverage_findings

    # a few documents of two windows among 2,000 short ones: the top of a 4K window is seen by a few only
    prefix = write_indexed_dataset(tmp_path / "mixed", [[5] * 8200] * 20 + [[5] * 200] * 2000)
    blend = Blend([BlendEntry(prefix, None)], False, "test")
    rp = type("RP", (), {"objective": type("O", (), {"causal": True})()})()

    def stage(tokens: int):
        return type(
            "S",
            (),
            {
                "name": "4k",
                "seq_length": 4096,
                "tokens_realized": tokens,
                "data": type("D", (), {"packing": "documents"})(),
            },
        )()

    few = coverage_findings(rp, stage(100_000), blend)  # type: ignore[arg-type]
    assert [f.code for f in few.warnings] == ["distance-coverage"], few
    assert "less than one window holds" in few.warnings[0].message
    many = coverage_findings(rp, stage(10**12), blend)  # type: ignore[arg-type]
    assert [f.code for f in many.warnings] == ["distance-coverage"], many
    assert "of what whole windows would give" in many.warnings[0].message  # plenty of tokens, still sparse
    # documents far longer than the window: most windows lie inside one, as concatenation trains them
    long = write_indexed_dataset(tmp_path / "long", [[5] * 40_000] * 30)
    fine = coverage_findings(rp, stage(10**9), Blend([BlendEntry(long, None)], False, "test"))  # type: ignore[arg-type]
    assert not fine.warnings and "of the stage's tokens see them" in fine[0].message
