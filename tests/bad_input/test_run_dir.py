"""A run directory whose ledger was damaged: every reader says which line and why, and changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from longctx.stage.ledger import ledger_path
from tests.bad_input.harness import refused
from tests.fixtures.run import write_plan

LEDGERS = {
    "array-line": (
        b'{"event": "launch", "stage": "s1"}\n[1, 2, 3]\n{"event": "end"}\n',
        "a JSON list, not a record",
    ),
    "number-line": (b'7\n{"event": "end"}\n', "a JSON int, not a record"),
    "not-json": (b'{"event": "launch"\n{"event": "end"}\n', "line 1 is not JSON"),
    "latin1": (b'{"event": "launch", "host": "n\xe9ud"}\n', "not UTF-8"),
    "deep-nesting": (b"[" * 100_000 + b"\n" + b'{"event": "end"}\n', "line 1 is not JSON"),
}


@pytest.mark.parametrize("case", sorted(LEDGERS))
@pytest.mark.parametrize("command", [("slurm", "status"), ("stage", "run")])
def test_damaged_ledger_is_named(
    case: str, command: tuple[str, str], fresh_run: Path, tmp_path: Path
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    ledger = ledger_path(fresh_run)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    content, needle = LEDGERS[case]
    ledger.write_bytes(content)
    msg = refused([*command, plan], [fresh_run, tmp_path], needle=needle)
    assert str(ledger) in " ".join(msg.split()) or "ledger" in msg


def _symlink_to(target: Path):
    def make(ledger: Path, tmp_path: Path) -> None:
        ledger.symlink_to(target)

    return make


def _outside(ledger: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text("")
    ledger.symlink_to(outside)


def _fifo(ledger: Path, tmp_path: Path) -> None:
    os.mkfifo(ledger)


def _dir(ledger: Path, tmp_path: Path) -> None:
    ledger.mkdir()


NOT_A_FILE = {
    "symlink-dev-full": (_symlink_to(Path("/dev/full")), "a symbolic link (to /dev/full)"),
    "symlink-outside": (_outside, "a symbolic link"),
    "fifo": (_fifo, "is a FIFO"),
    "directory": (_dir, "is a directory"),
}


@pytest.mark.parametrize("case", sorted(NOT_A_FILE))
@pytest.mark.parametrize("command", [("stage", "run"), ("slurm", "status")])
def test_a_ledger_that_is_not_a_regular_file_is_refused(
    case: str, command: tuple[str, str], fresh_run: Path, tmp_path: Path
) -> None:
    """Nothing is read from or appended to it: no hang on a FIFO, no line written outside the run."""
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    make, needle = NOT_A_FILE[case]
    make(ledger_path(fresh_run), tmp_path)
    msg = " ".join(refused([*command, plan], [fresh_run, tmp_path], needle=needle).split())
    assert "regular file" in msg, msg


def test_a_run_lock_that_is_a_symlink_is_refused(fresh_run: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    (fresh_run / "longctx.lock").symlink_to(tmp_path / "elsewhere.lock")
    refused(["stage", "run", plan], [fresh_run, tmp_path], needle="run lock is a symbolic link")
