"""The megatron-lm backend launches the exact argv of `stage args` against a Megatron-LM checkout.

A stand-in checkout whose pretrain_gpt.py records what it was given: fast, and independent of the
machine. It runs as on a GPU host (LONGCTX_MEGATRON_CPU=0: the script itself, no CPU runner or flags);
the real Megatron-LM checkout ($LONGCTX_MEGATRON_LM) trains, saves, takes SIGTERM and resumes on the
CPU in test_megatron_lm_real.py. The argv itself is proved flag by flag in test_megatron_args.py.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.cli.main import app
from longctx.stage import ledger
from tests.fixtures.run import write_plan

# Megatron-LM cannot load its own saves under a Python that pickles enum members by name (3.11.0-3.11.4);
# longctx refuses to launch it there (tests/stage/test_megatron_python.py)
pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)


def test_stage_run_megatron_lm_backend(fresh_run: Path, tmp_path: Path, monkeypatch) -> None:
    mlm = tmp_path / "Megatron-LM"
    mlm.mkdir()
    record = tmp_path / "calls.jsonl"
    (mlm / "pretrain_gpt.py").write_text(
        textwrap.dedent(f"""\
        import json, os, sys
        with open({str(record)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "rank": os.environ["RANK"],
                                "world": os.environ["WORLD_SIZE"],
                                "cuda_max_conn": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                                "nvte": [os.environ.get(k) for k in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN",
                                                                     "NVTE_UNFUSED_ATTN")]}}) + "\\n")
        """)
    )
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(mlm))
    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", "0")
    # left over from a model built earlier in this process (megatron-core's "auto" sets all three to 1)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1")

    r = CliRunner().invoke(app, ["stage", "args", str(plan), "s1", "--json"])
    assert r.exit_code == 0, r.output
    expected = json.loads(r.output)[1:]

    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--backend", "megatron-lm", "--no-preflight"])
    # the stand-in trains nothing: a launch that exits 0 without progress is a failure, said as such
    assert r.exit_code == 1, r.output
    assert "stage s1 made no progress" in r.output
    calls = [json.loads(x) for x in record.read_text().splitlines()]
    assert sorted(c["rank"] for c in calls) == ["0", "1"] and {c["world"] for c in calls} == {"2"}
    assert all(c["argv"] == expected for c in calls)
    assert {c["cuda_max_conn"] for c in calls} == {"1"}
    assert all(c["nvte"] == ["1", "0", "0"] for c in calls)  # what --attention-backend flash expects
    launch = next(x for x in ledger.read(fresh_run) if x.event == "launch")
    assert launch.backend == "megatron-lm" and launch.argv == [str(mlm / "pretrain_gpt.py"), *expected]
    assert launch.cpu is None
    # the stage is still pending, decided from disk, not from the exit code; the ledger says it failed
    end = next(x for x in ledger.read(fresh_run) if x.event == "end")
    assert (end.exit_code, end.status, end.outcome) == (0, "pending", "failed")
    assert "made no progress" in end.no_progress


def test_megatron_lm_backend_needs_a_checkout(fresh_run: Path, tmp_path: Path, monkeypatch) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    monkeypatch.delenv("LONGCTX_MEGATRON_LM", raising=False)
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--backend", "megatron-lm"])
    assert r.exit_code == 2 and "LONGCTX_MEGATRON_LM is not set" in r.output
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(tmp_path))
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--backend", "megatron-lm"])
    assert r.exit_code == 2 and "no pretrain_gpt.py" in r.output


def test_megatron_lm_backend_on_cpu_runs_the_runner(fresh_run: Path, tmp_path: Path, monkeypatch) -> None:
    """Without CUDA the same argv runs through the CPU runner, with the CPU flags after it (dry run)."""
    from longctx.stage.megatron_args import cpu_flags

    mlm = tmp_path / "Megatron-LM"
    mlm.mkdir()
    (mlm / "pretrain_gpt.py").write_text("")
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(mlm))
    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", "1")
    r = CliRunner().invoke(app, ["stage", "args", str(plan), "s1", "--json"])
    stage_argv = json.loads(r.output)[1:]
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--backend", "megatron-lm", "--dry-run"])
    assert r.exit_code == 0, r.output
    shown = " ".join(r.output.split())
    words = ["-m", "longctx.mcore.run_megatron_lm", str(mlm / "pretrain_gpt.py"), *stage_argv, *cpu_flags()]
    assert " ".join(words) in shown


def test_cpu_launch_of_a_cp_stage_takes_longctx_attention_through_spec(
    fresh_run: Path, tmp_path: Path, monkeypatch
) -> None:
    """On the CPU there is no TransformerEngine, and Megatron-LM's local attention refuses CP > 1: the CPU
    launch of a CP 2 stage adds `--spec longctx.mcore.megatron_lm_spec layer_spec`; a CP 1 stage does not."""
    from longctx.plan.derive import resolve_plan
    from longctx.plan.load import load_plan
    from longctx.stage.megatron_args import CP_SPEC_FLAGS
    from longctx.stage.run import launch_plan
    from longctx.stage.state import NextStep

    mlm = tmp_path / "Megatron-LM"
    mlm.mkdir()
    (mlm / "pretrain_gpt.py").write_text("")
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(mlm))
    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", "1")
    rp = resolve_plan(load_plan(write_plan(tmp_path / "plan.toml", fresh_run, s2_cp=2)))
    spec = " ".join(CP_SPEC_FLAGS)
    for st in rp.stages:
        step = NextStep(action="first-launch", stage=st.name, start_iteration=0, reason="test")
        command = " ".join(launch_plan(rp, step, "megatron-lm").command)
        assert (spec in command) is (st.cp > 1), (st.name, st.cp)
    assert {st.cp for st in rp.stages} == {1, 2}


def test_a_cpu_launch_past_the_local_attentions_length_takes_longctx_attention_at_cp_1() -> None:
    """Megatron-LM's local attention holds each head's s × s scores: rehearsed at 16,384 tokens on CP 1 it
    peaked at 12.4 GiB per rank against 0.19 GiB modelled (0.25 GiB through the spec). Past 8,192 tokens a CP 1
    launch on the CPU takes longctx's attention too; shorter ones keep Megatron-LM's own."""
    from longctx.stage.megatron_args import CP_SPEC_FLAGS, LOCAL_ATTENTION_MAX_TOKENS, cpu_flags

    spec = " ".join(CP_SPEC_FLAGS)
    assert LOCAL_ATTENTION_MAX_TOKENS == 8192
    assert spec not in " ".join(cpu_flags(1, 8192)) and spec not in " ".join(cpu_flags())
    assert spec in " ".join(cpu_flags(1, 16384)) and spec in " ".join(cpu_flags(2, 1024))


def test_a_launch_asked_for_metrics_runs_the_runner_on_a_gpu_host_too(
    fresh_run: Path, tmp_path: Path, monkeypatch
) -> None:
    """`longctx rehearse` asks ($LONGCTX_RECORD_METRICS=1): the launch goes through longctx's runner, which
    writes Megatron-LM's measurements to the stage's metrics.jsonl; on a GPU host without the CPU flags. Not
    asked, a GPU launch is the script itself and nothing is recorded."""
    from longctx.plan.derive import resolve_plan
    from longctx.plan.load import load_plan
    from longctx.stage.run import METRICS_FILE_ENV, METRICS_STAGE_ENV, RECORD_METRICS_ENV, launch_plan
    from longctx.stage.state import NextStep

    mlm = tmp_path / "Megatron-LM"
    mlm.mkdir()
    (mlm / "pretrain_gpt.py").write_text("")
    monkeypatch.setenv("LONGCTX_MEGATRON_LM", str(mlm))
    monkeypatch.setenv("LONGCTX_MEGATRON_CPU", "0")
    rp = resolve_plan(load_plan(write_plan(tmp_path / "plan.toml", fresh_run)))
    st = rp.stages[0]
    step = NextStep(action="first-launch", stage=st.name, start_iteration=0, reason="test")
    monkeypatch.delenv(RECORD_METRICS_ENV, raising=False)
    plain = launch_plan(rp, step, "megatron-lm")
    assert plain.command == plain.argv and METRICS_FILE_ENV not in plain.env
    monkeypatch.setenv(RECORD_METRICS_ENV, "1")
    asked = launch_plan(rp, step, "megatron-lm")
    # the runner, and no CPU flag after the stage's argv
    assert asked.command == [asked.argv[0], "-m", "longctx.mcore.run_megatron_lm", *asked.argv[1:]]
    assert asked.env[METRICS_FILE_ENV] == str(st.stage_dir / "metrics.jsonl")
    assert asked.env[METRICS_STAGE_ENV] == st.name
