"""Distance coverage of shipped plans' stages from real indexes: stages/baby_9b_dense.toml against the
test artifact (its tiers scaled down 16×, so no document reaches a 16K window), as `plan check
--check-data` reports it, and the same plan packed by document, where the top of every window is untrained."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.stage_data import check_plan_data, require_startable
from tests.fixtures.artifact import ARTIFACT_RUN

REPO = Path(__file__).resolve().parents[2]


def _coverage(plan: Path) -> dict[str, list]:
    reports = check_plan_data(resolve_plan(load_plan(plan)), scan=False)
    return {name: [f for f in r.findings if f.code == "distance-coverage"] for name, r in reports.items()}


def _baby(tmp_path: Path, *, documents: bool) -> Path:
    """stages/baby_9b_dense.toml reading the test artifact's run (and packed by document if asked)."""
    text = (REPO / "stages" / "baby_9b_dense.toml").read_text().replace("lc16k_full_20260507", ARTIFACT_RUN)
    if documents:
        for table in ("defaults.data", "stages.data"):
            text = text.replace(
                f"[{table}.tier_mix]", f'[{table}]\npacking = "documents"\n\n[{table}.tier_mix]'
            )
    plan = tmp_path / "stages" / "baby.toml"
    plan.parent.mkdir(exist_ok=True)
    if not (tmp_path / "tokenization").exists():
        (tmp_path / "tokenization").symlink_to((REPO / "tokenization").resolve(), target_is_directory=True)
    plan.write_text(text)
    return plan


def test_baby_9b_dense_stages_against_the_artifact(
    oellm_artifact: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(oellm_artifact))
    found = _coverage(_baby(tmp_path, documents=False))
    assert sorted(found) == ["128k", "16k", "64k"], found
    for name, fs in found.items():
        # concatenated windows: every distance is trained, stitched from whatever documents there are
        assert len(fs) == 1 and fs[0].level == "info" and "attention across documents" in fs[0].message, (
            name,
            fs,
        )


def test_baby_9b_dense_packed_by_document_warns_every_stage(
    oellm_artifact: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(oellm_artifact))
    found = _coverage(_baby(tmp_path, documents=True))
    assert len(found) == 3
    for name, fs in found.items():
        assert len(fs) == 1 and fs[0].level == "warning", (name, fs)
        assert "no training window shows the model the distances" in fs[0].message
        assert "longer than the window" in (fs[0].fix or "")


def test_an_artifact_chunk_too_small_for_a_split_part_is_refused_before_a_launch(
    oellm_artifact: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fixture's chunks hold 2–30 documents: the plan's 1 % validation part of each rounds to none, and
    megatron-core would loop forever building it. Both the data check and the launch's guard see it."""
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(oellm_artifact))
    rp = resolve_plan(load_plan(_baby(tmp_path, documents=False)))
    reports = check_plan_data(rp, scan=False)
    for name, report in reports.items():
        empty = [f for f in report.findings.errors if f.code == "split-empty-part"]
        assert empty and "loop forever" in empty[0].message, name
    with pytest.raises(StageError, match="loop forever"):
        require_startable(rp, rp.stages[0], "local")
