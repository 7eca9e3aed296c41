"""`longctx rehearse` on stages/baby_9b_dense.toml scaled 16× down (1K → 4K → 16K, CP 1 → 2 → 4) against
the artifact fixture: every stage trains, stops and resumes, is evaluated at its length and the last is
exported with its logits equal to longctx's at 16K; then a length bug planted in the trainer (position ids
that wrap at 8,192, as a 13-bit counter would) is caught at the one stage whose length reaches it."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from longctx.errors import PlanError
from longctx.plan.derive import open_plan
from longctx.plan.rehearsal import rehearsal_plan
from longctx.plan.schema import StageSpec
from longctx.rehearse.run import RehearsalReport, rehearse
from tests.fixtures.rehearsal import options, scaled_plan

WRAP = 8192
PLANTED = f"""
import sys

if "--spec" in sys.argv:  # the trainer's workers only
    import longctx.train.loop as loop

    original = loop.micro_batch

    def micro_batch(*args, **kwargs):
        batch = original(*args, **kwargs)
        batch.position_ids = batch.position_ids % {WRAP}
        return batch

    loop.micro_batch = micro_batch
"""


@pytest.fixture(scope="module")
def rehearsed(
    inputs: Path, oellm_like_hf_dir: Path, oellm_like_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RehearsalReport, Path, Path]:
    mp = pytest.MonkeyPatch()
    mp.setenv("OELLM_LONGCTX_DATA", str(inputs / "artifact"))
    tmp = tmp_path_factory.mktemp("rehearse")
    plan = scaled_plan(tmp)
    report = rehearse(open_plan(plan), tmp / "run", options(oellm_like_hf_dir, oellm_like_manifest))
    yield report, plan, tmp / "run"
    mp.undo()


def test_the_rehearsal_plan_keeps_what_length_failures_depend_on(
    inputs: Path,
    oellm_like_hf_dir: Path,
    oellm_like_manifest: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(inputs / "artifact"))
    source = open_plan(scaled_plan(tmp_path))
    derived = rehearsal_plan(source, tmp_path / "run", options(oellm_like_hf_dir, oellm_like_manifest))
    plan = derived.plan
    model = plan["model"]
    assert model["num_attention_heads"] // model["num_query_groups"] == 4  # 32 heads over 8 groups
    assert model["qk_layernorm"] and model["rotary_percent"] == 1.0 and model["num_layers"] == 1
    for got, real in zip(plan["stages"], source.stages, strict=True):
        assert got["seq_length"] == real.seq_length and got["rope"] == {"base": real.rotary_base}
        assert got["context_parallel"] == real.cp and got["tokens"] == 3 * real.seq_length
        StageSpec.model_validate(got)
    assert plan["stages"][1]["data"]["tier_mix"]["tiers"] == {
        "16k_plus": 0.85,
        "4_16k": 0.10,
        "under4k": 0.05,
    }
    said = " | ".join(r.what for r in derived.reductions)
    assert "query heads 32 → 4" in said and "head dim 128 → 16" in said and "TP 4 → 1" in said


def test_every_stage_runs_at_its_length_and_the_export_matches(
    rehearsed: tuple[RehearsalReport, Path, Path],
) -> None:
    report, _, run = rehearsed
    assert report.ok, [(s.stage, c) for s in report.stages for c in s.checks if not c.ok]
    assert [s.seq_length for s in report.stages] == [1024, 4096, 16384]
    assert [s.cp for s in report.stages] == [1, 2, 4]
    for s in report.stages:
        assert s.longest_distance == s.seq_length - 1
        assert s.rotary_base_built == pytest.approx(s.rotary_base_plan, rel=1e-5)
        assert s.evaluation[-1].length == s.seq_length and s.seconds_per_iteration > 0
        assert s.peak_memory_gib is not None and s.peak_memory_gib > 0
    assert report.interruption is not None and report.interruption["stage"] == "16k"
    assert report.export is not None and report.export.length == 16384 and report.export.ok
    assert (run / "rehearsal.json").exists() and (run / "report.json").exists()


def test_a_real_plan_never_resolves_into_a_rehearsal(rehearsed: tuple[RehearsalReport, Path, Path]) -> None:
    _, plan, run = rehearsed
    with pytest.raises(PlanError, match="holds a rehearsal"):
        open_plan(plan, run)


def test_a_length_bug_planted_in_the_trainer_fails_the_stage_that_reaches_it(
    rehearsed: tuple[RehearsalReport, Path, Path],
    oellm_like_hf_dir: Path,
    oellm_like_manifest: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clean run's base and shorter stages are kept; the 16K stage reruns with the bug planted, once:
    the SIGTERM, the resume and the export at 16K are the clean run's to prove (the bug is in neither)."""
    _, plan, run = rehearsed
    again = tmp_path / "run"
    shutil.copytree(run, again, ignore=shutil.ignore_patterns("16k", "export", "report.json"))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(PLANTED), encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    opts = options(oellm_like_hf_dir, oellm_like_manifest)
    report = rehearse(open_plan(plan), again, opts, interrupt=False, export=False)
    assert not report.ok and report.interruption is None and report.export is None
    failed = {s.stage: [c.name for c in s.checks if not c.ok] for s in report.stages}
    assert failed == {"1k": [], "4k": [], "16k": ["distance"]}
    assert report.stages[-1].longest_distance == WRAP - 1
