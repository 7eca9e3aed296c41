"""`longctx rehearse --backend megatron-lm` with the real Megatron-LM ($LONGCTX_MEGATRON_LM) on the CPU.

stages/baby_9b_dense.toml cut to its first two stages and scaled down (512 at CP 1 → 1K at CP 2, one
layer) runs through `stage run --backend megatron-lm`: Megatron-LM's pretrain_gpt.py trains every stage,
takes the SIGTERM in the 1K stage after its first save and resumes from it (three Megatron-LM launches);
then longctx's evaluation and `export hf` read Megatron-LM's torch_dist saves. The report's figures are
Megatron-LM's own (its process wrote the metrics through longctx's runner): the RoPE base read back from
the model it built, the last position its rotary embedding gave the attention, its loss and step times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.plan.derive import open_plan
from longctx.rehearse.run import RehearsalReport, rehearse
from longctx.stage import ledger
from tests.fixtures.rehearsal import options, scaled_plan

# Megatron-LM cannot load its own saves under a Python that pickles enum members by name (3.11.0-3.11.4);
# longctx refuses to launch it there (tests/stage/test_megatron_python.py)
pytestmark = pytest.mark.skipif(
    enums_pickled_by_name(),
    reason="this Python pickles enum members by name: longctx refuses Megatron-LM launches",
)

TWO_STAGES = {"16k": ("512", 512, 1), "64k": ("1k", 1024, 2)}


@pytest.fixture(scope="module")
def rehearsed(
    megatron_lm: Path,
    inputs: Path,
    oellm_like_hf_dir: Path,
    oellm_like_manifest: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[RehearsalReport, Path]:
    mp = pytest.MonkeyPatch()
    mp.setenv("OELLM_LONGCTX_DATA", str(inputs / "artifact"))
    tmp = tmp_path_factory.mktemp("rehearse_megatron_lm")
    plan = scaled_plan(tmp, TWO_STAGES)
    opts = options(oellm_like_hf_dir, oellm_like_manifest).model_copy(update={"backend": "megatron-lm"})
    report = rehearse(open_plan(plan), tmp / "run", opts)
    yield report, tmp / "run"
    mp.undo()


def test_every_stage_trains_through_megatron_lm_and_its_figures_are_megatrons(
    rehearsed: tuple[RehearsalReport, Path],
) -> None:
    report, run = rehearsed
    assert report.ok, [(s.stage, c) for s in report.stages for c in s.checks if not c.ok]
    assert report.backend == "megatron-lm"
    # every stage's argv went through the checkout's parser once, before the chain (as `slurm submit` does)
    assert report.preflight is not None and report.preflight.startswith("2 stages accepted by")
    assert any(r.what.startswith("Megatron-LM on this machine's CPU") for r in report.reductions)
    assert [(s.seq_length, s.cp) for s in report.stages] == [(512, 1), (1024, 2)]
    for s in report.stages:
        assert s.rotary_base_built == pytest.approx(s.rotary_base_plan, rel=1e-5)
        assert s.longest_distance == s.seq_length - 1
        assert s.losses and all(math.isfinite(x) for x in s.losses)
        assert s.seconds_per_iteration is not None and s.seconds_per_iteration > 0
        assert s.peak_memory_gib is not None and s.peak_memory_gib > 0
        assert s.evaluation[-1].length == s.seq_length
        # the metrics came from the Megatron-LM process: every launch of the stage ran pretrain_gpt.py
        launches = list(ledger.launches(run, s.stage))
        assert launches and all(r.backend == "megatron-lm" and r.cpu is not None for r in launches)
        assert all(r.argv and Path(r.argv[0]).name == "pretrain_gpt.py" for r in launches)
    metrics = [json.loads(x) for x in (run / "stages" / "1k" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2, 3]
    assert {m["stage"] for m in metrics} == {"1k"}


def test_the_sigterm_stops_megatron_lm_and_the_resume_is_exact(
    rehearsed: tuple[RehearsalReport, Path],
) -> None:
    report, _ = rehearsed
    stop = report.interruption
    assert stop is not None and stop["stage"] == "1k" and not stop["finished_first"]
    resume = next(c for c in report.stages[-1].checks if c.name == "resume")
    assert resume.ok and f"resumed from {stop['stopped_at']}" in resume.detail
    assert report.stages[-1].launches == 2


def test_the_export_of_megatron_lms_save_matches_longctx_at_full_length(
    rehearsed: tuple[RehearsalReport, Path],
) -> None:
    report, run = rehearsed
    assert report.export is not None and report.export.ok and report.export.length == 1024
    saved = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert saved["backend"] == "megatron-lm" and saved["ok"] is True
    plan = (run / "plan.toml").read_text(encoding="utf-8")
    assert 'backend = "megatron-lm"' in plan
