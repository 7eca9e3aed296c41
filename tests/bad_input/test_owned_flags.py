"""A flag the planner owns is refused in every user-supplied flag list, naming the plan field to set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longctx.cli.main import app
from longctx.plan.flags import OWNED_FLAGS
from tests.bad_input.harness import _findings, refused, runner
from tests.fixtures.run import write_plan

LISTS = {
    "family_args": '[megatron]\nentry_script = "pretrain_gpt.py"\nfamily_args = [{words}]\n',
    "performance_args": "[megatron]\nperformance_args = [{words}]\n",
    "defaults-extra_args": "",  # written into [defaults] below
}
WORDS = {
    "--rotary-base": ('"--rotary-base", "1"', "rope"),
    "--seq-length": ('"--seq-length=7"', "seq_length"),
    "--save": ('"--save", "elsewhere"', "run_dir"),
    "--tensor-model-parallel-size": ('"--tensor-model-parallel-size", "2"', "tensor_parallel"),
    "--data-path": ('"--data-path", "x"', "[data]"),
    "--tokenizer-model": ('"--tokenizer-model", "x"', "[tokenizer]"),
    "--lr": ('"--lr", "1"', "lr"),
    "--pretrained-checkpoint": ('"--pretrained-checkpoint", "x"', "run_dir"),
}


def _plan(tmp_path: Path, run: Path, where: str, words: str) -> Path:
    if where == "defaults-extra_args":
        plan = write_plan(tmp_path / "plan.toml", run)
        text = plan.read_text().replace("[defaults]\n", f"[defaults]\nextra_args = [{words}]\n", 1)
        plan.write_text(text)
        return plan
    return write_plan(tmp_path / "plan.toml", run, extra=LISTS[where].format(words=words))


# each flag in one list, the lists taken in turn: every list and every group of flags is covered
CASES = [(where, flag) for flag, where in zip(sorted(WORDS), sorted(LISTS) * len(WORDS), strict=False)]


@pytest.mark.parametrize(("where", "flag"), CASES)
def test_owned_flag_is_refused_in_every_list(where: str, flag: str, fresh_run: Path, tmp_path: Path) -> None:
    words, field = WORDS[flag]
    plan = _plan(tmp_path, fresh_run, where, words)
    msg = " ".join(refused(["plan", "check", plan], [fresh_run, tmp_path], needle=flag).split())
    assert "which the planner derives" in msg, msg
    assert field in msg, msg
    assert where.split("-")[-1] in msg, msg


def test_every_owned_flag_names_a_field() -> None:
    assert all(OWNED_FLAGS.values())
    for flag in (
        "--rotary-base",
        "--seq-length",
        "--save",
        "--load",
        "--context-parallel-size",
        "--data-path",
        "--tokenizer-type",
        "--train-iters",
        "--max-position-embeddings",
    ):
        assert flag in OWNED_FLAGS


@pytest.mark.parametrize("script", ["/tmp/anything.py", "../elsewhere/pretrain_gpt.py"])
def test_an_entry_script_outside_the_checkout_gets_a_note(
    script: str, fresh_run: Path, tmp_path: Path
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run, extra=f'[megatron]\nentry_script = "{script}"\n')
    res = runner.invoke(app, ["plan", "check", str(plan), "--json"])
    doc = json.loads(res.stdout)
    notes = [
        f for f in _findings(doc) if f.get("check") == "entry-script-outside" or "entry-script" in str(f)
    ]
    assert notes and "outside the Megatron-LM checkout" in str(notes[0]), doc
