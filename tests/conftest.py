"""Test configuration. Fixture modules under tests/fixtures/ are loaded as plugins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_FIXTURES = Path(__file__).parent / "fixtures"
pytest_plugins = sorted(f"tests.fixtures.{p.stem}" for p in _FIXTURES.glob("*.py") if p.stem != "__init__")

# Progress bars would only clutter captured output.
os.environ.setdefault("LONGCTX_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
