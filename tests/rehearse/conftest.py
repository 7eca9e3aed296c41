"""The rehearsal tests' inputs: the producer's artifact layout, scaled down (tests/fixtures/artifact.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.artifact import build_artifact

# the producer's tiers scaled 8× down, documents long enough to fill a 16K window; 60 documents per chunk
# so that the plan's 1 % validation part holds one (megatron-core loops forever on an empty part)
TIERS = {"16k_plus": (2048, 20_000, 0.5), "4_16k": (512, 2048, 0.3), "under4k": (16, 512, 0.2)}
LAYOUT = {(lang, tier): [60] for lang in ("en", "de") for tier in TIERS}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rehearsal_inputs")
    build_artifact(root / "artifact", run="lc16k_full_20260507", layout=LAYOUT, tiers=TIERS)
    return root
