"""`longctx bench attention`: figures come out (not asserted), bad input exits 2 with the numbers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from longctx.bench.attention import AttentionBenchSpec, flop_balance, validate_spec
from longctx.cli.main import app
from longctx.errors import AttentionError

runner = CliRunner()


def test_flop_balance_zigzag_is_even_and_contiguous_is_not():
    spec = AttentionBenchSpec(cp=2, heads=8, head_dim=64)
    zig, cont = flop_balance(spec, 8192)
    assert zig[0] == zig[1]
    # one full causal pass is 4·h·d·S(S+1)/2 FLOPs, split exactly
    assert sum(zig) == sum(cont) == 4 * 8 * 64 * 8192 * 8193 // 2
    assert max(cont) / min(cont) == pytest.approx(3.0, rel=1e-2)
    zig4, _ = flop_balance(AttentionBenchSpec(cp=4), 16384)
    assert len(set(zig4)) == 1


def test_spec_errors_name_the_numbers():
    with pytest.raises(
        AttentionError, match=r"sequence length 1000 is not divisible by 2·CP = 16 \(CP = 8\)"
    ):
        validate_spec(AttentionBenchSpec(seq_lens=(1000,), cp=8))
    with pytest.raises(AttentionError, match=r"KV heads \(3\) do not divide query heads \(8\)"):
        validate_spec(AttentionBenchSpec(kv_heads=3))


def test_cli_runs_and_reports_json():
    result = runner.invoke(
        app,
        ["bench", "attention", "--seq-lens", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
         "--repeats", "1", "--warmup", "0", "--threads", "1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (case,) = report["cases"]
    assert case["seq_len"] == 256
    assert case["piece"] == 256  # the rule's CPU floor (L = 128 fits in one piece)
    assert case["t_full_s"] > 0 and case["t_cp_s"] > 0 and case["efficiency"] > 0
    assert case["cpu_efficiency"] > 0 and case["held_cp_bytes"] > 0
    assert case["mem_full_bytes"] > 0 and case["mem_cp_bytes"] > 0
    assert case["balance_zigzag"] == 1.0 and case["balance_contiguous"] > 2.9
    assert len(case["ranks"]) == 2
    assert report["memory_method"]


def test_cli_bad_sequence_length_exits_2():
    result = runner.invoke(app, ["bench", "attention", "--seq-lens", "250", "--cp", "2"])
    assert result.exit_code == 2
    assert "sequence length 250 is not divisible by 2·CP = 4" in result.output


def test_piece_is_reported_and_flops_count_the_executed_pieces():
    from longctx.bench.attention import executed_blocks, ring_piece_for

    spec = AttentionBenchSpec(cp=2, heads=8, head_dim=64)
    assert ring_piece_for(spec, 8192) == 256 and ring_piece_for(spec, 16384) == 512
    assert ring_piece_for(AttentionBenchSpec(variant="allgather"), 8192) is None
    streamed = AttentionBenchSpec(cp=2, heads=8, head_dim=64, piece=96)
    assert ring_piece_for(streamed, 8192) == 96
    # pieces change how the work is cut, not how much of it there is
    assert flop_balance(streamed, 8192) == flop_balance(spec, 8192)
    assert len(executed_blocks(streamed, 8192, 0)) == 1 + 2 * -(-2048 // 96)


def test_bad_piece_size_is_refused_by_name():
    with pytest.raises(AttentionError, match="ring piece size must be a positive number of keys, got 0"):
        validate_spec(AttentionBenchSpec(piece=0))
