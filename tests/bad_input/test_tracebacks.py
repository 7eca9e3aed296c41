"""Inputs that ended in a traceback: each is now a message with what/where/fix, exit 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.bad_input.harness import refused
from tests.fixtures.run import write_plan


@pytest.mark.parametrize("word", ["{vocab_size!z}", "{vocab_size:{nope}}", "{vocab_size:q}"])
def test_family_args_that_cannot_be_filled_in(word: str, fresh_run: Path, tmp_path: Path) -> None:
    extra = f'[megatron]\nentry_script = "pretrain_gpt.py"\nfamily_args = ["--target-length", "{word}"]\n'
    plan = write_plan(tmp_path / "plan.toml", fresh_run, extra=extra)
    for command in (["plan", "check", plan], ["stage", "args", plan, "s1"]):
        refused(command, [fresh_run, tmp_path], needle="family_args")


LINES = {
    "lone-surrogate": (b'{"text": "half \\ud800 a pair"}\n', "lone surrogate"),
    "deep-nesting": (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1"),
    "huge-integer": (b'{"text": "x", "n": ' + b"9" * 5000 + b"}\n", "line 1 is not valid JSON"),
}


@pytest.fixture
def tok(oellm_like_hf_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "tok"
    shutil.copytree(oellm_like_hf_dir, d)
    return d


@pytest.mark.parametrize("case", sorted(LINES))
def test_tokenize_lines_that_are_not_text(case: str, tok: Path, tmp_path: Path) -> None:
    content, needle = LINES[case]
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'{"text": "fine"}\n' * 3 + content.replace(b"line 1", b""))
    msg = refused(
        ["data", "tokenize", p, "-t", tok, "-o", tmp_path / "out" / "ds"],
        [tmp_path],
        needle=needle.replace("line 1", "line 4"),
    )
    assert "in.jsonl:4" in "".join(msg.split())


@pytest.mark.parametrize("size", ["9" * 400, "1e400", "99999999999999999999TB"])
def test_export_a_shard_size_beyond_any_file(size: str, tmp_path: Path) -> None:
    refused(
        ["export", "hf", tmp_path, "--plan", "p.toml", "--max-shard-size", size, "--out", tmp_path / "o"],
        [tmp_path],
        needle="--max-shard-size",
    )


@pytest.mark.parametrize("knob", ["t_min = 0.9", "eps = 0.99"])
def test_an_absurd_diffusion_schedule_is_refused(knob: str, fresh_run: Path, tmp_path: Path) -> None:
    extra = f'[objective]\nkind = "udm"\nschedule = "log-linear"\n{knob}\n'
    plan = write_plan(tmp_path / "plan.toml", fresh_run, extra=extra)
    msg = refused(["plan", "check", plan], [fresh_run, tmp_path], needle="objective.")
    assert knob.split()[0] in msg


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_eval_run_with_a_world_size_that_is_not_a_rank_count(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", value)
    refused(
        ["eval", "run", tmp_path / "ckpt", "--plan", tmp_path / "p.toml"], [tmp_path], needle="WORLD_SIZE"
    )
