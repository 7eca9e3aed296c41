"""Values a plan and its run dir hold that the checks once let through: a RoPE base beyond the bound (as a
sweep candidate, in the choice on disk), a sweep costing several times its stage, a base truncated to an
integer, [eval] settings `eval run` refuses, a damaged choice.json. Each is refused by `plan check`,
`plan show` and `stage status` alike (and where they enter as options, by the command taking them)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError
from longctx.plan.derive import open_plan
from longctx.plan.rope_sweep import CHOICE_FILE, RULE
from tests.bad_input.harness import refused
from tests.fixtures.eval import EvalRun
from tests.fixtures.plan_toml import tiny_plan_head

BIG = 2**63 - 1
COMMANDS = [["plan", "check"], ["plan", "show"], ["stage", "status"]]
IDS = ["plan-check", "plan-show", "stage-status"]
SWEEP = "sweep = [100_000, 200_000], tokens = 2_048"


def _plan(
    tmp_path: Path, manifest: Path, *, s2_rope: str = SWEEP, base: str = "10000", extra: str = ""
) -> Path:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        tiny_plan_head("values", tmp_path, manifest, base=base)
        + textwrap.dedent(f"""\
        prefixes = ["{tmp_path / "data"}"]
        [[stages]]
        name = "s1"
        seq_length = 128
        tokens = 4096
        global_batch_size = 4
        rope = {{ base = 100_000 }}
        [[stages]]
        name = "s2"
        seq_length = 256
        tokens = 4096
        global_batch_size = 2
        rope = {{ {s2_rope} }}
        """)
        + extra
    )
    (tmp_path / "run").mkdir(exist_ok=True)
    return plan


# -- RoPE bases: one bound wherever a base enters ------------------------------------------------------

BASES = {
    "sweep-candidate-2^63-1": ({"s2_rope": f"sweep = [{BIG}, 100_000], tokens = 1_024"}, "at most 10^15"),
    "sweep-candidate-float": (
        {"s2_rope": "sweep = [20000.9, 100_000], tokens = 1_024"},
        "must be an integer",
    ),
    "sweep-candidate-1": ({"s2_rope": "sweep = [1, 100_000], tokens = 1_024"}, "greater than 1"),
    "stage-base-2^63-1": ({"s2_rope": f"base = {BIG}"}, "at most 10^15"),
    "pretraining-base-2^63-1": ({"base": str(BIG)}, "at most 10^15"),
    "fixed-method-base-float": (
        {"s2_rope": 'method = "fixed", params = { base = 20000.9 }'},
        "must be an integer",
    ),
}


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
@pytest.mark.parametrize("case", sorted(BASES))
def test_a_base_out_of_bounds_is_refused(
    case: str, command: list[str], oellm_like_manifest: Path, tmp_path: Path
) -> None:
    kwargs, needle = BASES[case]
    plan = _plan(tmp_path, oellm_like_manifest, **kwargs)
    msg = refused([*command, plan], [tmp_path], needle=needle)
    assert "9223372036854775807" not in msg  # named by its size, not printed in full


@pytest.mark.parametrize(
    "args",
    [
        ["rope", "check", "--base", str(BIG), "--rotary-dim", "128", "--length", "4096"],
        [
            "rope",
            "plot",
            "--bases",
            f"5000000,{BIG}",
            "--rotary-dim",
            "128",
            "--lengths",
            "4096",
            "--out",
            "{tmp}/c.png",
        ],
        [
            "rope",
            "suggest",
            "--rotary-dim",
            "128",
            "--base",
            "1e300",
            "--from-length",
            "4096",
            "--lengths",
            "16K",
        ],
    ],
    ids=["check", "plot", "suggest"],
)
def test_rope_options_hold_a_base_to_the_same_bound(args: list[str], tmp_path: Path) -> None:
    refused([a.replace("{tmp}", str(tmp_path)) for a in args], [tmp_path], needle="at most 10^15")


def test_eval_rotary_base_is_held_to_the_same_bound(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    run = eval_run_copy
    args = [
        "eval",
        "run",
        run.stage("s1"),
        "--plan",
        run.plan,
        "--out",
        tmp_path / "out",
        "--rotary-base",
        BIG,
    ]
    refused(args, [run.root, tmp_path], needle="at most 10^15")


# -- a sweep's cost --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_sweep_costing_four_times_its_stage_is_refused(
    command: list[str], oellm_like_manifest: Path, tmp_path: Path
) -> None:
    rope = "sweep = [100_000, 200_000, 400_000, 800_000], tokens = 4_096"
    plan = _plan(tmp_path, oellm_like_manifest, s2_rope=rope)
    msg = " ".join(refused([*command, plan], [tmp_path], needle="400%").split())
    assert "4 branches × 4,096 tokens = 16,384 tokens cost 400% of the stage's 4,096" in msg
    assert "at most 1,024 tokens" in msg


def test_a_sweep_costing_its_whole_stage_is_allowed(oellm_like_manifest: Path, tmp_path: Path) -> None:
    rope = "sweep = [100_000, 200_000, 400_000, 800_000], tokens = 1_024"
    st = open_plan(_plan(tmp_path, oellm_like_manifest, s2_rope=rope)).stage("s2")
    assert st.sweep is not None and st.sweep.summary()["share_of_stage"] == 1.0


# -- the sweep's choice on disk --------------------------------------------------------------------------


def _choice(**changes: object) -> dict:
    evidence = [
        {
            "branch": f"s2.rope-{b}",
            "base": b,
            "from": [f"explicit base {b:,}"],
            "tokens": 2048,
            "length": 256,
            "depths": [0.0, 1.0],
            "greedy_hits": [1, 1],
            "keys": 1,
            "far_loss": 5.5,
        }
        for b in (100_000, 200_000)
    ]
    doc = {
        "base": 200_000,
        "rule": RULE,
        "reason": "base 200,000: test",
        "candidates": [100_000, 200_000],
        "branch_tokens": 2048,
        "evidence": evidence,
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


DAMAGED: dict[str, tuple[object, str]] = {
    "not-json": ('{"base": 200000, ', "not JSON"),
    "a-list": ([1, 2, 3], "Input should be a valid dictionary"),
    "missing-key": (_choice(rule=None), "rule: Field required"),
    "base-a-word": (_choice(base="many"), "base: rotary base must be an integer"),
    "base-truncated": (_choice(base=200_000.9), "is an int), got 200000.9"),
    "base-integral-float": (_choice(base=200_000.0), "base: rotary base must be an integer"),
    "base-not-a-candidate": (_choice(base=300_000), "300,000 is not one of its candidates"),
    "candidate-2^63-1": (_choice(candidates=[100_000, BIG]), "at most 10^15"),
    "evidence-not-a-list": (_choice(evidence={"a": 1}), "evidence: Input should be a valid list"),
    "evidence-missing-hits": (
        _choice(evidence=[{"base": 100_000, "length": 256, "keys": 1}]),
        "evidence.0.greedy_hits: Field required",
    ),
    "evidence-of-another-base": (
        _choice(evidence=[{"base": 300_000, "length": 256, "keys": 1, "greedy_hits": [1]}]),
        "evidence for base 300,000",
    ),
}


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_choice_is_named_with_the_way_out(
    case: str, command: list[str], oellm_like_manifest: Path, tmp_path: Path
) -> None:
    plan = _plan(tmp_path, oellm_like_manifest)
    path = tmp_path / "run" / "stages" / "s2" / "sweep" / CHOICE_FILE
    path.parent.mkdir(parents=True)
    content, needle = DAMAGED[case]
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    msg = " ".join(refused([*command, plan], [tmp_path], needle="the RoPE sweep choice is damaged").split())
    assert needle in msg and str(path) in msg
    assert "delete it" in msg and "longctx rope sweep PLAN --stage s2" in msg
    with pytest.raises(PlanError, match="choice is damaged"):
        open_plan(plan)


def test_a_sound_choice_is_taken_as_written(oellm_like_manifest: Path, tmp_path: Path) -> None:
    plan = _plan(tmp_path, oellm_like_manifest)
    path = tmp_path / "run" / "stages" / "s2" / "sweep" / CHOICE_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_choice()))
    st = open_plan(plan).stage("s2")
    assert st.rotary_base == 200_000 and st.sweep is not None and not st.sweep.pending
    for command in COMMANDS:
        res = CliRunner().invoke(app, [*command, str(plan)])
        assert res.exit_code == 0 and "Traceback" not in res.output, (command, res.output)


# -- [eval]: plan check refuses what eval run would ------------------------------------------------------

EVAL = {
    "distractors-beyond-the-keys": ("key_digits = 1\ndistractors = 20\n", "fewer than the 21 distinct keys"),
    "needles-beyond-the-keys": (
        'key_digits = 1\ntasks = ["multikey-16"]\n',
        "fewer than the 16 distinct keys",
    ),
}


@pytest.mark.parametrize("case", sorted(EVAL))
def test_eval_settings_are_refused_by_plan_check_as_by_eval_run(
    case: str, eval_run_copy: EvalRun, tmp_path: Path
) -> None:
    run = eval_run_copy
    table, needle = EVAL[case]
    run.plan.write_text(run.plan.read_text() + "\n[eval]\n" + table)
    checked = refused(["plan", "check", run.plan], [run.root, tmp_path], needle=needle)
    evaluated = refused(
        ["eval", "run", run.stage("s1"), "--plan", run.plan, "--out", tmp_path / "out"],
        [run.root, tmp_path],
        needle=needle,
    )
    assert "distinct keys an item needs" in checked and "distinct keys an item needs" in evaluated


def test_eval_options_are_held_to_the_same_rule(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    run = eval_run_copy
    args = [
        "eval",
        "run",
        run.stage("s1"),
        "--plan",
        run.plan,
        "--out",
        tmp_path / "out",
        "--key-digits",
        "1",
        "--distractors",
        "30",
    ]
    refused(args, [run.root, tmp_path], needle="fewer than the 31 distinct keys")
