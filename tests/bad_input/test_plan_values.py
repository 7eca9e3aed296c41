"""Values a plan and its run dir hold that the checks once let through: a RoPE base beyond the bound (as a
sweep candidate, in the choice on disk), a sweep costing several times its stage, a base truncated to an
integer, [eval] settings `eval run` refuses, a damaged choice.json. Each is refused by `plan check`,
`plan show` and `stage status` alike (and where they enter as options, by the command taking them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.bad_input.harness import refused
from tests.fixtures.eval import EvalRun

BIG = 2**63 - 1
COMMANDS = [["plan", "check"], ["plan", "show"], ["stage", "status"]]
IDS = ["plan-check", "plan-show", "stage-status"]
SWEEP = "sweep = [100_000, 200_000], tokens = 2_048"


def _plan(
    tmp_path: Path, manifest: Path, *, s2_rope: str = SWEEP, base: str = "10000", extra: str = ""
) -> Path:
    plan = tmp_path / "plan.toml"
    plan.write_text(
        textwrap.dedent(f"""\
        name = "values"
        run_dir = "{tmp_path / "run"}"
        [base]
        path = "{tmp_path / "base"}"
        seq_length = 64
        rotary_base = {base}
        [tokenizer]
        path = "{tmp_path / "tok"}"
        manifest = "{manifest}"
        [model]
        num_layers = 2
        hidden_size = 64
        ffn_hidden_size = 128
        num_attention_heads = 4
        num_query_groups = 2
        kv_channels = 16
        [cluster]
        profile = "local"
        gpus_per_node = 1
        gpu_memory_gib = 8
        [defaults]
        nodes = 1
        [defaults.data]
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
        ["rope", "plot", "--bases", f"5000000,{BIG}", "--rotary-dim", "128", "--lengths", "4096",
         "--out", "{tmp}/c.png"],
        ["rope", "suggest", "--rotary-dim", "128", "--base", "1e300", "--from-length", "4096", "--lengths", "16K"],
    ],
    ids=["check", "plot", "suggest"],
)  # fmt: skip
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
