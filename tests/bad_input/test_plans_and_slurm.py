"""Plan files and Slurm rendering: unreadable plans, hostile values and outputs that cannot be written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bad_input.harness import refused
from tests.fixtures.run import write_plan

PLAN_BYTES = {
    "not-utf8": (b'name = "p\xff\xfe"\n', "UTF-8"),
    "binary": (bytes(range(256)) * 4, "TOML"),
    "not-toml": (b"name = [unclosed\n", "TOML"),
    "empty": (b"", "name"),
    "deep-nesting": (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "TOML"),
}


@pytest.mark.parametrize("case", sorted(PLAN_BYTES))
def test_unreadable_plan_is_refused(case: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    content, needle = PLAN_BYTES[case]
    plan.write_bytes(content)
    refused(["plan", "check", plan], [tmp_path], needle=needle)


def test_plan_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").mkdir()
    refused(["plan", "check", tmp_path / "plan.toml"], [tmp_path], needle="plan.toml")


def test_missing_plan(tmp_path: Path) -> None:
    refused(["plan", "check", tmp_path / "absent.toml"], [tmp_path], needle="absent.toml")


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.toml", fresh_run)


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("--time", "forever", "time"),
        ("--time", "-5", "time"),
        ("--signal", "B:TERM@240", "B:"),
        ("--signal", "KILL@x", "signal"),
        ("--profile", "no-such-cluster", "no-such-cluster"),
        ("--backend", "tensorflow", "backend"),
    ],
)
def test_slurm_render_refuses_bad_options(
    plan: Path, fresh_run: Path, tmp_path: Path, option: str, value: str, needle: str
) -> None:
    msg = refused(
        ["slurm", "render", plan, option, value, "--out", tmp_path / "out"],
        [fresh_run, tmp_path],
        needle=needle,
    )
    assert not (tmp_path / "out").exists(), msg


def test_slurm_render_below_a_file(plan: Path, fresh_run: Path, tmp_path: Path) -> None:
    # mkdir fails with ENOTDIR (as it would with EROFS or EACCES): a message, no traceback
    (tmp_path / "blocker").write_text("x\n")
    refused(
        ["slurm", "render", plan, "--out", tmp_path / "blocker" / "out"],
        [fresh_run, tmp_path],
        needle="cannot write",
    )


def test_slurm_render_out_is_a_file(plan: Path, fresh_run: Path, tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file where the scripts directory should be\n")
    refused(["slurm", "render", plan, "--out", tmp_path / "out"], [fresh_run, tmp_path], needle="out")


def test_slurm_render_into_the_tokenizer(plan: Path, fresh_run: Path, tmp_path: Path) -> None:
    refused(
        ["slurm", "render", plan, "--out", fresh_run / "tokenizer"],
        [fresh_run, tmp_path],
        needle="inside the input",
    )


@pytest.mark.parametrize("extra", [["--dry-run"], []], ids=["dry-run", "submit"])
def test_slurm_submit_chain_beyond_the_maximum(
    plan: Path, fresh_run: Path, tmp_path: Path, extra: list[str]
) -> None:
    refused(["slurm", "submit", plan, "--chain", "1000000", *extra], [fresh_run, tmp_path], needle="1,000")


def test_slurm_render_unbalanced_longctx_cmd(plan: Path, fresh_run: Path, tmp_path: Path) -> None:
    args = ["slurm", "render", plan, "--longctx-cmd", "'/opt/venv/bin/longctx", "--out", tmp_path / "out"]
    refused(args, [fresh_run, tmp_path], needle="--longctx-cmd")


def test_slurm_profile_not_utf8(plan: Path, fresh_run: Path, tmp_path: Path) -> None:
    prof = tmp_path / "latin.toml"
    prof.write_bytes(b'name = "n\xe9ud"\n')
    args = ["slurm", "render", plan, "--profile", prof, "--out", tmp_path / "out"]
    refused(args, [fresh_run, tmp_path], needle="latin.toml")


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('qoss = "x"', "unknown key in the plan's slurm table: qoss"),
        ("master_port = 70000", "master_port"),
        ('cpus_per_task = "many"', "cpus_per_task"),
        ('backend = "tensorflow"', "backend"),
    ],
    ids=["unknown-key", "port", "cpus", "backend"],
)
@pytest.mark.parametrize("command", [["plan", "check"], ["slurm", "render"]], ids=" ".join)
def test_a_bad_slurm_table_is_refused_when_the_plan_is_resolved(
    fresh_run: Path, tmp_path: Path, table: str, needle: str, command: list[str]
) -> None:
    # the [slurm] table is typed with the rest of the plan: every command refuses it, not Slurm's alone
    plan = write_plan(tmp_path / "plan.toml", fresh_run, extra=f"\n[slurm]\n{table}\n")
    msg = refused([*command, plan], [fresh_run, tmp_path], needle=needle)
    assert "plan.toml: slurm" in msg
