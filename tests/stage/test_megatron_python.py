"""Megatron-LM is not launched under a Python whose enum pickles its own checkpoint loader refuses."""

from __future__ import annotations

import pickle
import signal
import sys

import pytest

from longctx.checkpoint import unpickle
from longctx.errors import StageError
from longctx.stage import run


def test_this_interpreter_is_classified_by_what_it_writes() -> None:
    by_name = b"Signals" not in pickle.dumps(signal.SIGTERM, protocol=2)
    assert unpickle.enums_pickled_by_name() is by_name
    # early 3.11 releases write the member by name; 3.11.5+ and 3.12+ by value
    if sys.version_info >= (3, 12) or sys.version_info[:3] >= (3, 11, 5):
        assert not by_name


def test_megatron_launch_refused_where_enums_pickle_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "enums_pickled_by_name", lambda: True)
    with pytest.raises(StageError, match="Megatron-LM cannot run under this Python") as err:
        run.refuse_python_megatron_cannot_resume()
    assert err.value.fix and "3.11.5" in err.value.fix and "local backend" in err.value.fix
    monkeypatch.setattr(run, "enums_pickled_by_name", lambda: False)
    run.refuse_python_megatron_cannot_resume()


def test_stage_run_refuses_it_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch, tiny_chain_plan, tmp_path
) -> None:
    from tests.bad_input.harness import refused

    monkeypatch.setattr(run, "enums_pickled_by_name", lambda: True)
    refused(
        ["stage", "run", tiny_chain_plan, "--backend", "megatron-lm", "--no-preflight"],
        [tmp_path],
        needle="pickles enum members by name",
    )
