"""A save without psutil is refused before it starts: megatron-core's writer processes call psutil
outside their error handling, so each one dies without a result and the save waits forever."""

from __future__ import annotations

import importlib.util

import pytest

from longctx.errors import CheckpointError
from longctx.mcore import checkpoint


def test_save_refuses_without_psutil(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "psutil" else real(name, *a)
    )
    with pytest.raises(CheckpointError, match="psutil") as err:
        checkpoint.save_checkpoint(tmp_path / "save", 1, model=None, args=None)  # type: ignore[arg-type]
    assert "scripts/setup" in (err.value.fix or "")
    assert not (tmp_path / "save").exists()  # refused before anything was written


def test_psutil_is_there() -> None:
    checkpoint.require_psutil()
