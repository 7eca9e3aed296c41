"""Usage errors (unknown options, bad values, missing arguments) under --json: click's message on stderr,
exit 2, and on stdout exactly one JSON document whose error names what, where and the fix."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app

runner = CliRunner()

CASES = {
    "unknown-option": (["ckpt", "check", "x", "--bogus"], "No such option: --bogus", "longctx ckpt check"),
    "missing-argument": (["stage", "run"], "Missing argument", "longctx stage run"),
    "bad-number": (["rope", "suggest", "--lengths", "abc"], "abc", "longctx rope suggest"),
    "bad-int": (["eval", "run", "ck", "--plan", "p.toml", "--cp", "two"], "--cp", "longctx eval run"),
    "extra-argument": (
        ["plan", "show", "a.toml", "b.toml"],
        "unexpected extra argument",
        "longctx plan show",
    ),
    "unknown-command": (["slurm", "launch-everything"], "No such command", "longctx slurm"),
    "root-option": (["--bogus"], "No such option: --bogus", "longctx"),
    "zero-bench-length": (
        ["bench", "attention", "--seq-lens", "0"],
        "lengths must be positive",
        "longctx bench attention",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_usage_error_under_json_is_one_document(case: str) -> None:
    args, what, where = CASES[case]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    doc = json.loads(r.stdout)  # exactly one document
    assert doc["ok"] is False
    err = doc["error"]
    assert what.lower() in err["what"].lower(), err
    assert err["where"] == where and "--help" in err["fix"], err


def test_usage_error_without_json_prints_no_document() -> None:
    r = runner.invoke(app, ["ckpt", "check", "x", "--bogus"])
    assert r.exit_code == 2
    assert r.stdout.strip() == "" and "No such option" in r.stderr
