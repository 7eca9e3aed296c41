"""Fixtures the stage tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from tests.fixtures.artifact import build_artifact

REPO = Path(__file__).resolve().parents[2]
RUN = "lc16k_full_20260507"


@pytest.fixture
def baby(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, Path]:
    """The shipped baby_9b_dense plan on a manifests-only artifact of its layout, and the test's tmp dir."""
    art = build_artifact(tmp_path / "artifact", run=RUN)
    for f in list(art.rglob("*.bin")) + list(art.rglob("*.idx")):
        f.unlink()  # a manifests-only download
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(art))
    monkeypatch.setenv("LONGCTX_BABY_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("BABY_9B_CHECKPOINTS", raising=False)
    monkeypatch.delenv("OELLM_TOKENIZER", raising=False)
    return resolve_plan(load_plan(REPO / "stages" / "baby_9b_dense.toml")), tmp_path
