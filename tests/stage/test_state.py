"""The stage state machine over real checkpoint directories (copies of a megatron-core save).

Each case lays out stage save dirs the way a killed or finished job leaves them and checks what runs
next. Iteration directories are copies of the base model's torch_dist save (written by the local
trainer through megatron-core): the state machine reads names, metadata.json, .metadata and trackers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import StageError
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.stage import ledger
from longctx.stage.run import LaunchPlan, execute, prepare_launch
from longctx.stage.state import next_step, plan_state
from tests.fixtures.run import BASE_ITERS, write_plan

S1_TARGET = 6  # 6·4·128 tokens / (4 × 128)


def _iter(src_run: Path) -> Path:
    return src_run / "base" / "checkpoints" / f"iter_{BASE_ITERS:07d}"


def put(run: Path, stage: str, it: int, *, complete: bool = True, tracker: str | None = None) -> Path:
    save = run / "stages" / stage / "checkpoints"
    save.mkdir(parents=True, exist_ok=True)
    d = save / f"iter_{it:07d}"
    shutil.copytree(_iter(run), d)
    if not complete:
        (d / "metadata.json").unlink()  # rank 0 writes it last: the save did not finish
    if tracker is not None:
        (save / "latest_checkpointed_iteration.txt").write_text(tracker)
    return d


@pytest.fixture
def plan(fresh_run: Path, tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.toml", fresh_run)


def state(plan: Path):
    rp = resolve_plan(load_plan(plan))
    states = plan_state(rp)
    return rp, states, next_step(rp, states)


def test_fresh_run_first_launch_from_base(plan: Path, fresh_run: Path) -> None:
    rp, states, step = state(plan)
    assert [s.status for s in states] == ["pending", "pending"]
    assert rp.stages[0].train_iters == S1_TARGET
    assert (step.action, step.stage, step.load) == ("first-launch", "s1", fresh_run / "base" / "checkpoints")
    assert step.repair is None


def test_interrupted_first_launch_starts_again_from_base(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", 2, complete=False)
    _, states, step = state(plan)
    assert states[0].status == "pending" and states[0].incomplete == [2] and states[0].complete == []
    assert (step.action, step.stage) == ("first-launch", "s1")


def test_interrupted_resume_uses_the_tracker(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", 2, tracker="2")
    put(fresh_run, "s1", 4, complete=False)
    _, states, step = state(plan)
    assert states[0].status == "in-progress" and states[0].iteration == 2 and states[0].incomplete == [4]
    assert (step.action, step.stage, step.start_iteration, step.repair) == ("resume", "s1", 2, None)


def test_complete_save_without_tracker_is_resumed_never_restarted(plan: Path, fresh_run: Path) -> None:
    # killed between the save and the tracker write: progress exists, so no restart from the base
    put(fresh_run, "s1", 2, tracker="2")
    put(fresh_run, "s1", 4)
    _, _, step = state(plan)
    assert (step.action, step.start_iteration) == ("resume", 4)
    assert step.repair is not None and step.repair.new == 4 and "tracker names 2" in step.repair.reason

    shutil.rmtree(fresh_run / "stages" / "s1" / "checkpoints" / "iter_0000002")
    (fresh_run / "stages" / "s1" / "checkpoints" / "latest_checkpointed_iteration.txt").unlink()
    _, _, step = state(plan)
    assert (step.action, step.start_iteration) == ("resume", 4)
    assert "tracker is missing" in step.repair.reason


def test_tracker_naming_an_incomplete_save_falls_back(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", 2)
    put(fresh_run, "s1", 4, complete=False, tracker="4")
    _, _, step = state(plan)
    assert (step.action, step.start_iteration) == ("resume", 2)
    assert "names iteration 4, which has no complete save" in step.repair.reason


def test_garbage_tracker_is_repaired(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", 2, tracker="hello")
    _, _, step = state(plan)
    assert (step.action, step.start_iteration) == ("resume", 2)
    assert "unreadable" in step.repair.reason
    step.repair.apply()
    assert (fresh_run / "stages/s1/checkpoints/latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_finished_stage_hands_over_to_the_next(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", S1_TARGET, tracker=str(S1_TARGET))
    _, states, step = state(plan)
    assert [s.status for s in states] == ["done", "pending"]
    assert (step.action, step.stage, step.load) == ("first-launch", "s2", fresh_run / "stages/s1/checkpoints")


def test_all_done(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", S1_TARGET, tracker=str(S1_TARGET))
    put(fresh_run, "s2", 4, tracker="4")
    _, states, step = state(plan)
    assert [s.status for s in states] == ["done", "done"] and step.action == "all-done"
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--backend", "local"])
    assert r.exit_code == 0 and "nothing to run" in r.output
    r = CliRunner().invoke(app, ["stage", "next", str(plan), "--json"])
    assert json.loads(r.output)["action"] == "all-done"


def test_base_without_tracker_blocks(plan: Path, fresh_run: Path) -> None:
    (fresh_run / "base/checkpoints/latest_checkpointed_iteration.txt").unlink()
    _, _, step = state(plan)
    assert step.action == "blocked" and "ckpt adopt" in step.reason
    r = CliRunner().invoke(app, ["stage", "next", str(plan)])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--dry-run"])
    assert r.exit_code == 2 and "cannot launch stage s1" in r.output


def test_status_json(plan: Path, fresh_run: Path) -> None:
    put(fresh_run, "s1", 2, tracker="2")
    r = CliRunner().invoke(app, ["stage", "status", str(plan), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["next"]["action"] == "resume"
    assert out["stages"][0] | {"save_dir": None, "pace": None} == {
        "stage": "s1",
        "status": "in-progress",
        "iteration": 2,
        "target": S1_TARGET,
        "tracker": 2,
        "complete": [2],
        "incomplete": [],
        "repair": None,
        "save_dir": None,
        "pace": None,
    }
    # no launch recorded: no pace measured, so no time to finish either
    assert out["stages"][0]["pace"] == {
        "tokens_per_s": None,
        "measured": False,
        "stage_eta_seconds": None,
        "plan_eta_seconds": None,
        "resume_jumps": [],
    }


class Recorder:
    """Records launches instead of running them (the refusal happens before any launch)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv, *, nproc, env, log) -> int:
        self.calls.append(list(argv))
        return 0


def test_ledger_refuses_a_relaunch_with_other_inputs(plan: Path, fresh_run: Path, tmp_path: Path) -> None:
    rp = resolve_plan(load_plan(plan))
    lp = prepare_launch(rp, "local")
    assert isinstance(lp, LaunchPlan)
    rec = Recorder()
    execute(rp, lp, rec)
    assert len(rec.calls) == 1
    launches = [r for r in ledger.read(fresh_run) if r.event == "launch"]
    assert launches[0].binding.rotary_base == rp.stages[0].rotary_base
    from longctx.tokenizer import tokenizer_md5

    assert launches[0].binding.tokenizer_md5 == tokenizer_md5(fresh_run / "tokenizer")

    # the same stage, relaunched with another RoPE base → refused, nothing launched, nothing recorded
    changed = write_plan(tmp_path / "plan2.toml", fresh_run, s2_base="base = 1234567")
    text = changed.read_text().replace(
        'rope = { method = "men-safe", params = { source = "exact" } }', "rope = { base = 123456 }", 1
    )
    changed.write_text(text)
    rp2 = resolve_plan(load_plan(changed))
    lp2 = prepare_launch(rp2, "local")
    before = ledger.read(fresh_run)
    with pytest.raises(
        StageError, match=r"launched with different inputs.*rotary_base: ledger \d+, now 123456"
    ):
        execute(rp2, lp2, rec)
    assert len(rec.calls) == 1 and ledger.read(fresh_run) == before

    # the data changed under the stage → refused too
    idx = fresh_run / "data" / "corpus_text_document.idx"
    idx.write_bytes(idx.read_bytes() + b"\0")
    lp3 = prepare_launch(rp, "local")
    with pytest.raises(StageError, match="data_digest"):
        execute(rp, lp3, rec)

    # --force launches and records the override
    execute(rp2, prepare_launch(rp2, "local"), rec, force=True)
    last = [r for r in ledger.read(fresh_run) if r.event == "launch"][-1]
    assert last.forced["rotary_base"][1] == 123456 and len(rec.calls) == 2


def test_garbage_tracker_of_a_finished_stage_is_repaired_by_the_next_launch(
    plan: Path, fresh_run: Path
) -> None:
    put(fresh_run, "s1", S1_TARGET, tracker="hello")
    _, states, step = state(plan)
    assert [s.status for s in states] == ["done", "pending"]
    assert (step.action, step.stage) == ("first-launch", "s2") and step.repair is None
    assert "unreadable" in step.load_repair.reason and step.load_repair.new == S1_TARGET
    # next, status and run --dry-run agree: s2 starts from s1's final save once s1's tracker is fixed
    r = CliRunner().invoke(app, ["stage", "next", str(plan), "--json"])
    assert r.exit_code == 0 and "unreadable" in json.loads(r.stdout)["load_repair"], r.output
    r = CliRunner().invoke(app, ["stage", "run", str(plan), "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    [launch] = json.loads(r.stdout)["launches"]
    assert launch["stage"] == "s2" and "unreadable" in launch["load_repair"]
    tracker = fresh_run / "stages/s1/checkpoints/latest_checkpointed_iteration.txt"
    assert tracker.read_text() == "hello"  # a dry run changes nothing
    step.load_repair.apply()
    assert tracker.read_text().strip() == str(S1_TARGET)
