"""`longctx bench attention`: figures come out (not asserted), bad input exits 2 with the numbers."""

from __future__ import annotations

import json
import threading
import time

import pytest
from typer.testing import CliRunner

from longctx.bench import kernel_cost
from longctx.bench.attention import AttentionBenchSpec, _Turns, flop_balance, validate_spec
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
        [
            "bench",
            "attention",
            "--seq-lens",
            "256",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "16",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (case,) = report["cases"]
    assert case["seq_len"] == 256
    assert case["piece"] == 256  # the rule's CPU floor (L = 128 fits in one piece)
    assert case["t_full_s"] > 0 and case["t_cp_s"] > 0 and case["efficiency"] > 0
    assert case["cpu_efficiency"] > 0 and case["held_cp_bytes"] > 0
    assert case["mem_full_bytes"] > 0 and case["mem_cp_bytes"] > 0
    assert case["balance_zigzag"] == 1.0 and case["balance_contiguous"] > 2.9
    assert len(case["ranks"]) == 2 and len(case["full_times_s"]) == 1
    assert report["memory_method"]
    assert case["spread_full"] >= 0 and case["spread_cp"] >= 0


def test_cli_non_causal_balances_every_split():
    result = runner.invoke(
        app,
        [
            "bench",
            "attention",
            "--seq-lens",
            "256",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--non-causal",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spec"]["causal"] is False
    (case,) = report["cases"]
    # without a mask every rank scores all its queries against every key, whatever the split
    assert case["balance_zigzag"] == case["balance_contiguous"] == 1.0
    assert all(len(r["times_s"]) == 2 for r in case["ranks"])


def test_a_failing_worker_stops_the_others_and_exits_2(monkeypatch):
    # every spawned process (full run and CP ranks, waiting on each other's turns) fails in warm-up
    monkeypatch.setenv("LONGCTX_ATTN_KERNEL", "flash_attn")
    result = runner.invoke(
        app,
        [
            "bench",
            "attention",
            "--seq-lens",
            "256",
            "--heads",
            "2",
            "--head-dim",
            "16",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert "attention kernel 'flash_attn' needs CUDA tensors" in report["error"]["what"]
    assert "Traceback" not in report["error"]["what"]


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


def test_document_bench_counts_against_hand_computed_cases():
    from longctx.bench.attention import document_lengths, run_document_bench

    lengths = document_lengths(4096, 0.25, 512)
    assert sum(lengths) == 4096 and sum(n for n in lengths if n < 512) >= 1024
    (case,) = run_document_bench(
        (4096,),
        cp=2,
        short_fraction=0.25,
        short_max=512,
        heads=2,
        kv_heads=1,
        head_dim=8,
        repeats=1,
        time_max_len=0,
    )
    # dense causal over the window: 4·h·d·S(S+1)/2; within documents: the same sum per document
    assert case.flops_dense == 4 * 2 * 8 * 4096 * 4097 // 2
    for f in (case.zigzag, case.balanced):
        assert f.flops == 4 * 2 * 8 * sum(n * (n + 1) // 2 for n in lengths)
        assert 1.0 <= f.slowest_mean <= f.busiest_idlest and f.t_slowest_s is None
    assert case.t_dense_s is None


def _document_case(*options: str) -> dict:
    """The one case `bench attention --documents 10%<1K OPTIONS --json` prints (its output one JSON document)."""
    r = runner.invoke(app, ["bench", "attention", "--documents", "10%<1K", *options, "--json"])
    assert r.exit_code == 0, r.output
    (case,) = json.loads(r.stdout)["cases"]
    return case


def test_document_bench_json_is_one_document():
    case = _document_case("--seq-lens", "8K", "--cp", "4", "--time-max-len", "1")
    assert case["balanced"]["slowest_mean"] <= case["zigzag"]["slowest_mean"]


def test_turns_alternate_and_the_full_run_outlasts_the_last_cp_turn():
    # the protocol of the timed phase, with threads for processes and a barrier for the CP group's
    turns = _Turns(2, threading.Semaphore(0), threading.Semaphore(1), threading.Semaphore(0), 10.0)
    group = threading.Barrier(2)
    log: list[str] = []

    def full() -> None:
        turns.warmed_up(True)
        for _ in range(3):
            turns.begin(True)
            log.append("full")
            turns.end(True, 2)
        turns.finished(True)
        log.append("exit")

    def cp(rank: int) -> None:
        turns.warmed_up(False)
        for _ in range(3):
            turns.begin(False)
            time.sleep(0.05)  # a fwd+bwd: an exiting full run would log its exit meanwhile
            log.append("cp")
            group.wait()  # every rank is done before the full run starts
            turns.end(False, rank)
        turns.finished(False)

    threads = [threading.Thread(target=full)] + [threading.Thread(target=cp, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    # full, both ranks, full, both ranks, …, and the full run's exit only after the ranks' last turn
    assert log == ["full", "cp", "cp"] * 3 + ["exit"]


@pytest.mark.parametrize("mix", ["10%<4K", "long-tail"])
def test_balanced_split_evens_document_work_at_cp8(mix):
    """FLOPs counted from the blocks each rank executes: within 5 % of the mean, busiest/idlest ≤ 1.1."""
    from longctx.bench.attention import parse_document_mix, run_document_bench

    fraction, short_max = parse_document_mix(mix)
    cases = run_document_bench(
        (16384, 65536, 131072),
        cp=8,
        short_fraction=fraction,
        short_max=short_max,
        heads=8,
        kv_heads=8,
        head_dim=64,
        repeats=1,
        time_max_len=0,
    )
    for c in cases:
        assert c.balanced.slowest_mean <= 1.05 and c.balanced.busiest_idlest <= 1.1, c
        assert c.balanced.flops == c.zigzag.flops  # the same pairs, only placed differently


def test_documents_from_data_read_the_index_only(oellm_artifact, tmp_path):
    """`--documents from:DIR*16`: the document lengths of every .idx under DIR (the artifact's chunks,
    their .bin files left behind: only the index is read), scaled back up 16 ×; each window is packed
    from documents of those lengths, and the balanced split evens the work at CP 8."""
    import shutil

    import numpy as np

    from longctx.bench.attention import read_data_mix
    from longctx.data.indexed import read_index

    prefixes = sorted(p.with_suffix("") for p in oellm_artifact.rglob("*.idx"))
    idx_only = tmp_path / "idx"
    idx_only.mkdir()
    for p in prefixes:
        shutil.copy(f"{p}.idx", idx_only / f"{p.name}.idx")
    mix = read_data_mix(f"from:{idx_only}*16")
    assert len(mix.prefixes) == len(prefixes) == 11 and mix.scale == 16
    lengths = np.concatenate([read_index(p).document_lengths() for p in prefixes])
    assert sorted(mix.lengths.tolist()) == sorted((16 * lengths).tolist())
    for seq_len in (16384, 65536):
        window = mix.window(seq_len, seed=3)
        assert sum(window) == seq_len and all(0 < n <= 16 * lengths.max() for n in window)
    # one prefix alone is one data set's lengths, unscaled
    one = read_data_mix(f"from:{prefixes[0]}")
    assert one.lengths.tolist() == read_index(prefixes[0]).document_lengths().tolist()

    r = runner.invoke(
        app,
        [
            "bench",
            "attention",
            "--documents",
            f"from:{idx_only}*16",
            "--seq-lens",
            "16K,64K",
            "--cp",
            "8",
            "--time-max-len",
            "1",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["data"]["documents"] == len(lengths) and out["data"]["scale"] == 16
    assert sum(out["data"]["token_shares"].values()) == pytest.approx(1.0)
    for case in out["cases"]:
        assert case["documents"] > 1
        assert case["balanced"]["slowest_mean"] <= min(1.05, case["zigzag"]["slowest_mean"])


def test_documents_from_a_missing_data_set_exit_2(tmp_path):
    r = runner.invoke(
        app, ["bench", "attention", "--documents", f"from:{tmp_path}/none", "--seq-lens", "16K"]
    )
    assert r.exit_code == 2 and "no indexed dataset" in r.output
    r = runner.invoke(app, ["bench", "attention", "--documents", f"from:{tmp_path}*0", "--seq-lens", "16K"])
    assert r.exit_code == 2 and "positive integer" in r.output


def test_document_processes_time_both_splits_in_real_ranks():
    """`--processes`: ring attention within documents in CP spawned processes, both splits of the same
    window alternating; every rank's times come back, and the ratio is of the slowest ranks."""
    r = runner.invoke(
        app,
        [
            "bench",
            "attention",
            "--documents",
            "25%<256",
            "--seq-lens",
            "1K",
            "--cp",
            "2",
            "--processes",
            "--threads",
            "1",
            "--heads",
            "1",
            "--head-dim",
            "8",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    (case,) = json.loads(r.stdout)["cases"]
    p = case["processes"]
    assert (p["cp"], p["threads"], p["heads"], p["head_dim"]) == (2, 1, 1, 8)
    for split in ("zigzag", "balanced"):
        assert [len(t) for t in p[split]["rank_times_s"]] == [2, 2]
        assert p[split]["slowest_s"] == max(p[split]["rank_medians_s"]) > 0
    assert p["ratio"] == pytest.approx(p["balanced"]["slowest_s"] / p["zigzag"]["slowest_s"])


def test_document_bench_times_both_splits_and_names_the_chosen_one():
    """Timed: the slowest ranks of both splits and dense attention, interleaved; the model's seconds and
    the trainer's choice beside them."""
    case = _document_case("--seq-lens", "2K", "--cp", "2", "--heads", "2", "--repeats", "1")
    assert case["chosen"] in ("zigzag", "balanced")
    for split in ("zigzag", "balanced"):
        assert case[split]["t_slowest_s"] > 0 and case[split]["modelled_s"] > 0
    assert case["t_dense_s"] > 0


def test_kernel_cost_fits_the_model_and_prints_one_json_document(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(kernel_cost, "DIAGONALS", (16, 128, 512))
    monkeypatch.setattr(kernel_cost, "QUERIES", (32, 256, 768))
    monkeypatch.setattr(kernel_cost, "KEYS", (32, 141, 512))
    r = runner.invoke(app, ["bench", "kernel-cost", "--repeats", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert len(out["timings"]) == 3 + 9
    for name in ("forward", "backward"):
        fitted = out["fitted"][name]
        assert fitted["full_pair_s"] > 0 and fitted["diagonal_pair_s"] > 0
        assert 0 <= out["median_error"][name] <= out["max_error"][name]
