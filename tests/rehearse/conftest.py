"""The rehearsal tests' inputs: the producer's artifact layout, scaled down (tests/fixtures/rehearsal.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.rehearsal import build_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_inputs(tmp_path_factory.mktemp("rehearsal_inputs"))
