"""One CLI vocabulary: `check` and `fetch` everywhere, benchmarks under `bench`, the plan first; the old
names stay as hidden aliases that behave identically, and `--json` leaves one JSON document on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from tests.fixtures.run import write_plan

runner = CliRunner()

# (noun, canonical verb, hidden old verb)
ALIASES = [
    ("tokenizer", "check", "verify"),
    ("ckpt", "check", "verify"),
    ("ckpt", "fetch", "download"),
    ("plan", "check", "validate"),
    ("rope", None, "bench"),  # now `bench rope`
]


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _commands(noun: str) -> str:
    res = cli(noun, "--help")
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize(("noun", "verb", "old"), ALIASES)
def test_help_lists_the_canonical_names_only(noun: str, verb: str | None, old: str) -> None:
    listed = [line.split()[1] for line in _commands(noun).splitlines() if line.startswith("│ ")]
    assert old not in listed
    if verb is not None:
        assert verb in listed
    res = cli(noun, old, "--help")  # the alias still answers
    assert res.exit_code == 0, res.output


def test_bench_rope_is_listed_under_bench() -> None:
    assert "rope" in [line.split()[1] for line in _commands("bench").splitlines() if line.startswith("│ ")]


def test_tokenizer_check_and_verify_agree(oellm_like_hf_dir: Path, oellm_like_manifest: Path) -> None:
    new = cli("tokenizer", "check", oellm_like_hf_dir, "-m", oellm_like_manifest, "--json")
    old = cli("tokenizer", "verify", oellm_like_hf_dir, "-m", oellm_like_manifest, "--json")
    assert new.exit_code == old.exit_code == 0, new.output
    assert json.loads(new.stdout) == json.loads(old.stdout)


def test_ckpt_check_and_verify_agree(megatron_checkpoints) -> None:
    ckpt = megatron_checkpoints.save_dir("gqa")
    new, old = cli("ckpt", "check", ckpt, "--json"), cli("ckpt", "verify", ckpt, "--json")
    assert new.exit_code == old.exit_code == 0, new.output
    assert json.loads(new.stdout) == json.loads(old.stdout)


def test_ckpt_fetch_and_download_agree(tmp_path: Path) -> None:
    args = [
        "org/absent",
        "--into",
        tmp_path / "into",
        "--offline",
        "--cache-dir",
        tmp_path / "cache",
        "--json",
    ]
    new, old = cli("ckpt", "fetch", *args), cli("ckpt", "download", *args)
    assert new.exit_code == old.exit_code == 2, new.output
    assert json.loads(new.stdout) == json.loads(old.stdout)
    assert json.loads(new.stdout)["ok"] is False


def test_plan_check_and_validate_agree(repo_root: Path) -> None:
    plan = repo_root / "stages" / "baby_9b_dense.toml"
    new, old = cli("plan", "check", plan, "--json"), cli("plan", "validate", plan, "--json")
    assert new.exit_code == old.exit_code == 0, new.output
    assert json.loads(new.stdout) == json.loads(old.stdout)


def test_bench_rope_and_rope_bench_agree() -> None:
    args = ["--lengths", "1K", "--baseline-length", "512", "--json"]
    new, old = cli("bench", "rope", *args), cli("rope", "bench", *args)
    assert new.exit_code == old.exit_code == 0, new.output
    a, b = json.loads(new.stdout), json.loads(old.stdout)
    assert a["same_answer"] is b["same_answer"] is True and a.keys() == b.keys()


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
