"""Test configuration. Fixture modules under tests/fixtures/ are loaded as plugins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_FIXTURES = Path(__file__).parent / "fixtures"
# `processes` (the inner loop's collection hook and guard) and `shared_builds` first: the other fixture
# modules import them, and pytest rewrites the asserts of a plugin only when it imports the plugin itself.
_FIRST = ("processes", "shared_builds")
_OTHERS = sorted(p.stem for p in _FIXTURES.glob("*.py") if p.stem not in ("__init__", *_FIRST))
pytest_plugins = [*(f"tests.fixtures.{stem}" for stem in (*_FIRST, *_OTHERS))]

# Progress bars would only clutter captured output.
os.environ.setdefault("LONGCTX_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
