"""A run directory whose ledger was damaged: every reader says which line and why, and changes nothing."""

from __future__ import annotations

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
