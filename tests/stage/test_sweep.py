"""A RoPE sweep in a plan: the branches it resolves to, the order the chain takes them in (branches, then
the choice, then the stage with the chosen base), the selection rule, the record on disk, and the
refusals. Training is laid out as a trainer would leave it (copies of the base's save); the choice's
evaluation runs on those real checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import PlanError, StageError
from longctx.plan.derive import ResolvedPlan, resolve_plan
from longctx.plan.load import load_plan
from longctx.plan.rope_sweep import CHOICE_FILE, RULE, SweepChoice
from longctx.stage.run import LaunchOutcome
from longctx.stage.run_policy import sweep_until
from longctx.stage.state import NextStep, branch_step, next_step, stage_state
from longctx.stage.sweep_choice import BranchEvidence, choose, record_choice, sweep_stage
from longctx.stage.until_done import run_until_done
from longctx.util.fs import atomic_write_json
from tests.fixtures.run import copy_base_save, write_plan
from tests.fixtures.steps import Heard, never

SWEEP = 'sweep = ["men-safe", 100_000, 400_000, { method = "abf", params = { base = 1_600_000 } }], tokens = 1_024'
EVAL = "\n[eval]\nkeys_per_cell = 1\ndepths = [0.0, 1.0]\ndistractors = 1\n"


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    # four branches of 1,024 tokens: the whole stage's 4,096 (a sweep may cost up to the stage)
    return write_plan(tmp_path / "plan.toml", fresh_run, s2_tokens=4 * 1_024, s2_base=SWEEP, extra=EVAL)


def _rp(plan: Path) -> ResolvedPlan:
    return resolve_plan(load_plan(plan))


def _save(rp: ResolvedPlan, stage: str, iteration: int) -> None:
    """`test_until_done`'s stand-in save, as the stage's trainer saves it: its length and base in the args."""
    copy_base_save(rp, stage, iteration)
    st = rp.stage(stage)
    common_pt = st.save_dir / f"iter_{iteration:07d}" / "common.pt"
    common = torch.load(common_pt, weights_only=False)
    common["args"].seq_length = common["args"].max_position_embeddings = st.seq_length
    common["args"].rotary_base = st.rotary_base
    torch.save(common, common_pt)


class Trainer:
    """Launches that lay out a finished save for whatever step they are given (a stage or a branch)."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, str, int]] = []

    def __call__(self, rp: ResolvedPlan, step: NextStep) -> LaunchOutcome:
        st = rp.stage(step.stage or "")
        self.launched.append((st.name, step.action, st.rotary_base))
        _save(rp, st.name, st.train_iters)
        after = stage_state(st)
        return LaunchOutcome(
            st.name, step.action, 0, step.start_iteration, after.iteration, after.status, 0.0
        )


def _fake_choice(base: int):
    def choose_step(rp: ResolvedPlan, step: NextStep) -> bool:
        st = rp.stage(step.stage or "")
        assert st.sweep is not None
        atomic_write_json(
            st.sweep.choice_path,
            SweepChoice(
                base=base,
                rule=RULE,
                reason=f"base {base:,}: test",
                candidates=st.sweep.bases,
                branch_tokens=st.sweep.branch_tokens,
                evidence=(),
            ).to_json(),
        )
        return True

    return choose_step


def test_a_sweep_resolves_to_one_branch_per_distinct_base(plan: Path) -> None:
    rp = _rp(plan)
    s1, s2 = rp.stages
    assert s2.sweep is not None and s2.sweep.pending and s2.rope_method == "sweep (pending)"
    bases = s2.sweep.bases
    assert bases == tuple(sorted(bases)) and 100_000 in bases and 400_000 in bases and len(bases) == 4
    assert s2.rotary_base == bases[0]  # the smallest while pending
    for b, base in zip(s2.branches, bases, strict=True):
        assert b.name == f"s2.rope-{base}" and b.rotary_base == base and b.branch_of == "s2"
        assert b.save_dir == s2.stage_dir / "sweep" / f"rope-{base}" / "checkpoints"
        assert b.load_from == s1.save_dir == s2.load_from  # what the stage would load
        assert b.train_iters == math.ceil(1_024 / (2 * 256)) and b.seq_length == s2.seq_length
        assert b.cp == s2.cp and b.sweep is None and b.wandb is None
        assert rp.stage(b.name) is b
    assert s2.sweep.summary()["total_tokens"] == 4 * 1_024


def test_the_chain_runs_the_branches_then_the_choice_then_the_stage(plan: Path) -> None:
    trainer = Trainer()
    result = run_until_done(lambda: _rp(plan), trainer, choose=_fake_choice(400_000))
    assert result.done, result.reason
    names = [n for n, _, _ in trainer.launched]
    rp = _rp(plan)
    s2 = rp.stage("s2")
    assert names == ["s1", *(b.name for b in s2.branches), "s2"]
    assert trainer.launched[-1] == ("s2", "first-launch", 400_000)  # the stage trains at the chosen base
    assert (
        s2.rotary_base == 400_000
        and s2.rope_method == "sweep"
        and "chosen by rope sweep" in s2.rope_explanation
    )


def test_without_a_chooser_the_loop_stops_at_the_choice(plan: Path) -> None:
    trainer = Trainer()
    result = run_until_done(lambda: _rp(plan), trainer)
    assert result.stop == "one-step" and "sweep branches are done" in result.reason
    assert next_step(_rp(plan)).action == "choose"


def test_a_branch_resumes_from_its_own_save(plan: Path) -> None:
    rp = _rp(plan)
    _save(rp, "s1", rp.stage("s1").train_iters)
    branch = rp.stage("s2").branches[1]
    _save(rp, branch.name, 1)
    step = next_step(_rp(plan))
    assert step.stage == rp.stage("s2").branches[0].name and step.action == "first-launch"
    own = branch_step(_rp(plan), branch)
    assert (
        own.action == "resume" and own.start_iteration == 1 and own.load == branch.save_dir / "iter_0000001"
    )


def test_rope_sweep_stops_at_its_choice_and_refuses_before_the_previous_stage(plan: Path) -> None:
    until = sweep_until("s2")
    rp = _rp(plan)
    with pytest.raises(StageError, match="start from what the stages before it finish"):
        until(rp, next_step(rp))
    Trainer()(rp, next_step(rp))  # s1 done
    rp = _rp(plan)
    assert until(rp, next_step(rp)) is None  # a branch: go on
    _fake_choice(100_000)(rp, NextStep("choose", "s2", ""))
    assert "100,000" in (until(_rp(plan), next_step(_rp(plan))) or "")
    with pytest.raises(StageError, match="has no RoPE sweep"):
        sweep_until("s1")(rp, next_step(rp))


def _evidence(base: int, hits: tuple[int, ...], loss: float | None = None) -> BranchEvidence:
    return BranchEvidence(
        f"s.rope-{base}", base, ("x",), 100, 4096, tuple(i / 4 for i in range(len(hits))), hits, 20, loss
    )


def test_the_rule_takes_the_best_worst_depth_then_the_total_then_the_loss_then_the_smaller_base() -> None:
    ev = [_evidence(1, (20, 20, 5)), _evidence(2, (12, 13, 12)), _evidence(3, (19, 19, 10))]
    assert choose(ev)[0] == 2  # 12 at its worst depth beats 5 and 10, though its total is lowest
    assert choose([_evidence(1, (10, 12)), _evidence(2, (10, 15))])[0] == 2  # tie on worst: total
    tied = [_evidence(1, (0, 0), 3.0), _evidence(2, (0, 0), 2.5), _evidence(3, (0, 0), 2.7)]
    base, why = choose(tied)
    assert base == 2 and "far-end loss" in why
    assert choose([_evidence(5, (3, 3)), _evidence(4, (3, 3))])[0] == 4  # all equal: the smaller base


def test_a_diverged_branch_ranks_last_on_loss_and_its_evidence_stays_json() -> None:
    nan = _evidence(1, (0, 0), math.nan)
    base, why = choose([nan, _evidence(2, (0, 0), 2.5)])
    assert base == 2 and "nan" not in why
    assert nan.to_json()["far_loss"] is None
    json.dumps(nan.to_json(), allow_nan=False)  # what SweepChoice's reader takes
    # losses equal to 4 decimals are shown with the places that tell them apart
    _, why = choose([_evidence(1, (0, 0), 0.674312), _evidence(2, (0, 0), 0.674309)])
    assert "(0.674309 vs 0.674312)" in why


def test_record_choice_evaluates_the_branches_and_records_the_evidence(plan: Path) -> None:
    trainer = Trainer()
    run_until_done(lambda: _rp(plan), trainer)  # s1 and the branches; stops at the choice
    rp = _rp(plan)
    with pytest.raises(StageError, match="no RoPE sweep"):
        record_choice(rp, rp.stage("s1"))
    choice = record_choice(rp, rp.stage("s2"))
    assert choice.rule == RULE and choice.base in choice.candidates
    assert [e["base"] for e in choice.evidence] == list(choice.candidates)
    for e in choice.evidence:
        assert e["length"] == 256 and e["keys"] == 1 and len(e["greedy_hits"]) == 2 and e["far_loss"] > 0
    on_disk = json.loads((rp.stage("s2").stage_dir / "sweep" / CHOICE_FILE).read_text())
    assert on_disk["base"] == choice.base
    records = [json.loads(x) for x in (Path(rp.run_dir) / "ledger.jsonl").read_text().splitlines()]
    sweep = [r for r in records if r.get("event") == "rope-sweep"]
    assert len(sweep) == 1 and sweep[0]["stage"] == "s2" and sweep[0]["base"] == choice.base
    assert _rp(plan).stage("s2").rotary_base == choice.base


def test_a_choice_made_among_other_candidates_does_not_apply(plan: Path, tmp_path: Path) -> None:
    rp = _rp(plan)
    _fake_choice(100_000)(rp, NextStep("choose", "s2", ""))
    assert _rp(plan).stage("s2").rotary_base == 100_000
    other = write_plan(
        tmp_path / "other.toml", rp.run_dir, s2_base="sweep = [100_000, 200_000], tokens = 1_024"
    )
    st = _rp(other).stage("s2")
    assert st.sweep is not None and st.sweep.pending and "the plan now asks for" in (st.sweep.stale or "")


def test_a_damaged_choice_is_named(plan: Path) -> None:
    rp = _rp(plan)
    path = rp.stage("s2").stage_dir / "sweep" / CHOICE_FILE
    path.parent.mkdir(parents=True)
    path.write_text('{"base": "many"}')
    with pytest.raises(PlanError, match="choice is damaged") as err:
        _rp(plan)
    assert str(path) in str(err.value.where)


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        ("sweep = [100_000, 200_000]", "goes with `sweep`"),
        ("base = 100_000, tokens = 10", "goes with `sweep`"),
        ("base = 100_000, sweep = [100_000, 200_000], tokens = 10", "exactly one of"),
        ('sweep = ["men", 200_000], params = { source = "exact" }, tokens = 10', "params"),
        ("sweep = [100_000], tokens = 10", "at least 2"),
        ("sweep = [100_000, 100_000], tokens = 1_024", "all give base 100,000"),
        ('sweep = ["nope", 100_000], tokens = 1_024', "sweep candidate 'nope'"),
    ],
)
def test_bad_sweeps_are_refused(fresh_run: Path, tmp_path: Path, rope: str, message: str) -> None:
    path = write_plan(tmp_path / "bad.toml", fresh_run, s2_base=rope)
    with pytest.raises(PlanError, match=message):
        _rp(path)


def test_sweep_stage_picks_the_pending_one(plan: Path) -> None:
    rp = _rp(plan)
    assert sweep_stage(rp, None).name == "s2"
    with pytest.raises(StageError, match="has no RoPE sweep"):
        sweep_stage(rp, "s1")


def test_rope_sweep_cli_shows_the_cost_and_refuses_cleanly(plan: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["rope", "sweep", str(plan), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["cost"]["branches"] == 4 and doc["cost"]["total_tokens"] == 4 * 1_024 and doc["dry_run"]
    assert doc["sweep"]["choice"] is None
    res = runner.invoke(app, ["rope", "sweep", str(plan), "--dry-run"])
    assert res.exit_code == 0 and "sweep of 4 branches × 1,024 tokens" in res.stdout
    for args, msg in ((["--stage", "s1"], "has no RoPE sweep"), (["--branch-index", "9"], "has 4 branches")):
        res = runner.invoke(app, ["rope", "sweep", str(plan), *args])
        assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["stage", "status", str(plan), "--json"])
    assert res.exit_code == 0
    sweeps = json.loads(res.stdout)["sweeps"]
    assert [b["status"] for b in sweeps["s2"]["branches"]] == ["pending"] * 4
    res = runner.invoke(app, ["plan", "show", str(plan)])
    assert "rope sweep pending among" in res.stdout and "sweep of 4 branches" in res.stdout


def test_a_dry_run_shows_the_sweeps_cost_before_its_first_branch(plan: Path) -> None:
    from longctx.stage.run_policy import RunOptions, run_steps

    Trainer()(_rp(plan), next_step(_rp(plan)))  # s1 done
    heard = Heard()
    steps = run_steps(
        lambda: _rp(plan),
        RunOptions(dry_run=True, until_done=True),
        launcher=never,
        facts=never,
        report=heard,
    )
    assert steps.result.stop == "dry-run" and steps.planned[0].stage.name.startswith("s2.rope-")
    assert heard.events[0].startswith("sweep of 4 branches × 1,024 tokens = 4,096 tokens")
    assert heard.events[1] == f"launching {steps.planned[0].stage.name}"


def test_a_stage_whose_sweep_is_pending_has_no_launch(plan: Path) -> None:
    from longctx.stage.run import local_spec

    rp = _rp(plan)
    with pytest.raises(StageError, match="RoPE base is not chosen yet"):
        local_spec(rp, rp.stage("s2"))
    res = CliRunner().invoke(app, ["stage", "args", str(plan), "s2"])
    assert res.exit_code == 2 and "not chosen yet" in res.output and "Traceback" not in res.output
    local_spec(rp, rp.stage("s2").branches[0])  # a branch has its base
    _fake_choice(400_000)(rp, NextStep("choose", "s2", ""))
    spec, _ = local_spec(_rp(plan), _rp(plan).stage("s2"))
    assert spec.rotary_base == 400_000


def test_launchable_stages_are_a_pending_sweeps_branches(plan: Path) -> None:
    rp = _rp(plan)
    s1, s2 = rp.stages
    assert [st.name for st in rp.launchable()] == ["s1", *(b.name for b in s2.branches)]
    assert rp.launchable(["s1"]) == [s1]
    _fake_choice(100_000)(rp, NextStep("choose", "s2", ""))
    assert [st.name for st in _rp(plan).launchable()] == ["s1", "s2"]
