"""The shipped Ermine diffusion plans resolve as documented: objective, vocabulary rows, bidirectional
RoPE bases (both windows read as 2·L), and the cluster engine refusing what it cannot train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError, StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.rope import choose_base
from longctx.stage.megatron_args import argv, launch_notes, stage_flags

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "kind", "rows", "experts"),
    [("ermine_mdm", "mdm", (50258, 50257), None), ("ermine_udm_moe", "udm", (50257, None), 8)],
)
def test_ermine_diffusion_plans(
    name: str, kind: str, rows: tuple[int, int | None], experts: int | None
) -> None:
    rp = resolve_plan(load_plan(REPO / "stages" / f"{name}.toml"))
    assert rp.objective.kind == kind and not rp.objective.causal
    assert rp.objective.mask_id == (50257 if kind == "mdm" else None)
    assert rp.arch.num_experts == experts
    assert [s.seq_length for s in rp.stages] == [8192, 32768]
    for st in rp.stages:
        assert (st.padded_vocab_size, st.output_vocab_size) == rows
        bidirectional = choose_base(
            "men-safe",
            rotary_dim=64,
            pretrain_base=10000,
            pretrain_length=4096,
            target_length=2 * st.seq_length,
            source="exact",
        ).base
        assert st.rotary_base == bidirectional
        assert "2·L" in st.rope_explanation
    if kind == "udm":  # no fork named: the cluster engine cannot train it
        with pytest.raises(StageError, match="autoregressive objective") as err:
            stage_flags(rp, rp.stages[0])
        assert "entry_script" in (err.value.fix or "") and "--backend local" in (err.value.fix or "")
        return
    # the masked-diffusion fork's entry script, its flags filled from the rows the planner checked
    words = argv(rp, rp.stages[0])
    assert words[0] == "pretrain_mask_diff.py"
    i = words.index("--padded-input")
    assert words[i : i + 6] == ["--padded-input", "0", "--padded-output", "0", "--target-length", "1"]
    assert words[words.index("--rotary-base") + 1] == str(rp.stages[0].rotary_base)


def _plan(tmp_path: Path, megatron: str, objective: str = 'kind = "mdm"') -> Path:
    text = (REPO / "stages" / "ermine_mdm.toml").read_text()
    head, _, rest = text.partition("[megatron]\n")
    rest = rest[rest.index("\n[defaults]") :]
    head = head.replace('[objective]\nkind = "mdm"', f"[objective]\n{objective}")
    p = tmp_path / "plan.toml"
    p.write_text(head.replace('manifest = "../', f'manifest = "{REPO}/') + "[megatron]\n" + megatron + rest)
    return p


def test_family_args_take_the_plans_rows(tmp_path: Path) -> None:
    """A size whose output is padded (`--padded-output 1` from 413M up) and a mask id given by the plan."""
    p = _plan(
        tmp_path,
        'entry_script = "/opt/fork/pretrain_mask_diff.py"\n'
        'family_args = ["--padded-output={padded_output}", "--mask-token", "{mask_id}", '
        '"--vocab", "{vocab_size}", "{input_rows}x{output_rows}", "{{literal}}"]\n',
        'kind = "mdm"\noutput_rows = 50258',
    )
    rp = resolve_plan(load_plan(p))
    words = argv(rp, rp.stages[1])
    assert words[0] == "/opt/fork/pretrain_mask_diff.py"
    i = words.index("--padded-output=1")
    assert words[i + 1 : i + 6] == ["--mask-token", "50257", "--vocab", "50257", "50258x50258"]
    assert words[i + 6] == "{literal}"


@pytest.mark.parametrize(
    ("megatron", "objective", "wanted"),
    [
        ('family_args = ["--rows", "{rows}"]\n', 'kind = "mdm"', "asks for {rows}"),
        ('family_args = ["--bad", "{padded_input"]\n', 'kind = "mdm"', "family_args word '{padded_input'"),
        (
            'entry_script = "pretrain_udm.py"\nfamily_args = ["--mask", "{mask_id}"]\n',
            'kind = "udm"',
            "asks for the [MASK] id",
        ),
    ],
)
def test_family_args_refused(tmp_path: Path, megatron: str, objective: str, wanted: str) -> None:
    with pytest.raises(PlanError, match="family_args") as err:
        resolve_plan(load_plan(_plan(tmp_path, megatron, objective)))
    assert wanted in err.value.what and err.value.fix
    assert "megatron.family_args" in (err.value.where or "")


def test_diffusion_plan_without_a_fork_is_refused_by_the_cluster_engine(tmp_path: Path) -> None:
    rp = resolve_plan(load_plan(_plan(tmp_path, "")))
    with pytest.raises(StageError, match=r"pretrain_gpt\.py trains the autoregressive objective"):
        argv(rp, rp.stages[0])


def test_stage_args_of_a_fork(tmp_path: Path) -> None:
    """`stage args` names the fork's entry script and, for a stage with CP > 1, what only the fork can get
    right (noise drawn before the CP split); --json is the argv with the script first."""
    p = _plan(tmp_path, 'entry_script = "pretrain_mask_diff.py"\nfamily_args = ["--target-length", "1"]\n')
    p.write_text(p.read_text().replace('context_parallel = "auto"', "context_parallel = 2"))
    rp = resolve_plan(load_plan(p))
    notes = launch_notes(rp, rp.stages[1])
    assert "entry script pretrain_mask_diff.py" in notes[0]
    assert "context parallel 2" in notes[1] and "before the CP split" in notes[1]
    r = CliRunner().invoke(app, ["stage", "args", str(p), "32k", "--json"])
    assert r.exit_code == 0, r.output
    words = json.loads(r.stdout)
    assert words[0] == "pretrain_mask_diff.py" and words[words.index("--target-length") + 1] == "1"
    assert words[words.index("--context-parallel-size") + 1] == "2"
    assert "before the CP split" in r.stderr
    ar = resolve_plan(load_plan(REPO / "stages" / "ermine_arm.toml"))
    assert launch_notes(ar, ar.stages[0]) == []
