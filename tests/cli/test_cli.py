"""One CLI vocabulary: `check` and `fetch` everywhere, benchmarks under `bench`, the plan first; each
command has one name, and `--json` leaves one JSON document on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from tests.fixtures.run import write_plan

runner = CliRunner()

# (noun, verb, earlier name): one name per command
RETIRED = [
    ("tokenizer", "check", "verify"),
    ("ckpt", "check", "verify"),
    ("ckpt", "fetch", "download"),
    ("plan", "check", "validate"),
    ("rope", None, "bench"),  # `bench rope`
]


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _commands(noun: str) -> str:
    res = cli(noun, "--help")
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize(("noun", "verb", "old"), RETIRED)
def test_help_lists_one_name_per_command_and_earlier_names_are_gone(
    noun: str, verb: str | None, old: str
) -> None:
    listed = [line.split()[1] for line in _commands(noun).splitlines() if line.startswith("│ ")]
    assert old not in listed
    if verb is not None:
        assert verb in listed
    res = cli(noun, old, "--json")
    assert res.exit_code == 2, res.output
    err = json.loads(res.stdout)["error"]
    assert "No such command" in err["what"] and "--help" in err["fix"], err


def test_bench_rope_is_listed_under_bench() -> None:
    assert "rope" in [line.split()[1] for line in _commands("bench").splitlines() if line.startswith("│ ")]


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.toml", fresh_run)


def test_stage_run_json_is_one_document(plan: Path, fresh_run: Path) -> None:
    res = cli("stage", "run", plan, "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # the progress lines went to stderr; the plan is in the document
    assert doc["dry_run"] is True and doc["done"] is False
    [step] = doc["launches"]
    assert (step["stage"], step["action"], step["start_iteration"]) == ("s1", "first-launch", 0)
    assert step["nproc"] >= 1 and "longctx.train" in step["command"] and step["repair"] is None
    assert "first-launch s1" in res.stderr
    (fresh_run / "base/checkpoints/latest_checkpointed_iteration.txt").unlink()
    res = cli("stage", "run", plan, "--dry-run", "--json")
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert out["ok"] is False and "cannot launch stage s1" in out["error"]["what"]
