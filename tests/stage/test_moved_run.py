"""A run directory that moves keeps its identity: what binds a launch is hashed from content and sizes,
so a copied run resumes with `stage run` and no flag, and a real change is still refused."""

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
from longctx.stage.ledger_events import Launch, RecordedBinding
from longctx.stage.run import binding_for
from tests.bad_input.harness import refused
from tests.fixtures.run import write_plan

runner = CliRunner()
S1_TOKENS = 4 * 4 * 128  # 4 iterations of 4 × 128 tokens
S1_ROPE = 'rope = { method = "men-safe", params = { source = "exact" } }'


def _interrupt_after(save: Path, it: int) -> None:
    """Leave the stage as a job killed after its save at `it` leaves it: later saves gone."""
    for d in save.glob("iter_*"):
        if int(d.name.split("_")[1]) > it:
            shutil.rmtree(d)
    (save / "latest_checkpointed_iteration.txt").write_text(str(it))


@pytest.mark.slow  # two real launches of the local trainer
def test_a_copied_run_resumes_without_force_and_a_real_change_is_refused(
    fresh_run: Path, tmp_path: Path
) -> None:
    plan = write_plan(tmp_path / "plan.toml", fresh_run, s1_tokens=S1_TOKENS, s1_save=2)
    first = runner.invoke(app, ["stage", "run", str(plan), "--no-eval", "--json"])
    assert first.exit_code == 0, first.output
    _interrupt_after(fresh_run / "stages" / "s1" / "checkpoints", 2)

    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(fresh_run, moved, symlinks=True)
    shutil.rmtree(fresh_run)  # the old place is gone: nothing may still be read from there
    copy_plan = write_plan(tmp_path / "moved.toml", moved, s1_tokens=S1_TOKENS, s1_save=2)
    r = runner.invoke(app, ["stage", "run", str(copy_plan), "--no-eval", "--json"])
    assert r.exit_code == 0, r.output
    [launch] = json.loads(r.stdout)
    assert (launch["stage"], launch["action"], launch["start_iteration"]) == ("s1", "resume", 2), launch
    assert launch["end_iteration"] == 4, launch
    records = [x for x in ledger.read(moved) if x.event == "launch"]
    assert len(records) == 2 and records[-1].forced is None

    # the same copy with another RoPE base for the started stage: refused, nothing written
    _interrupt_after(moved / "stages" / "s1" / "checkpoints", 2)
    other = write_plan(tmp_path / "other.toml", moved, s1_tokens=S1_TOKENS, s1_save=2)
    other.write_text(other.read_text().replace(S1_ROPE, "rope = { base = 30000 }", 1))
    before = ledger.ledger_path(moved).read_bytes()
    r = runner.invoke(app, ["stage", "run", str(other), "--no-eval", "--json"])
    assert r.exit_code == 2, r.output
    err = json.loads(r.stdout)["error"]
    assert "launched with different inputs" in err["what"] and "rotary_base" in err["what"], err
    assert ledger.ledger_path(moved).read_bytes() == before


def test_a_ledger_that_binds_the_data_by_the_old_digest_is_refused_until_forced(
    fresh_run: Path, tmp_path: Path
) -> None:
    """Records without the `identity` mark hashed absolute paths into data_digest, a digest no longer
    computed: a launch is refused with what/where/fix and nothing written; --force records today's binding."""
    plan = write_plan(tmp_path / "plan.toml", fresh_run)
    rp = resolve_plan(load_plan(plan))
    st = rp.stages[0]
    current = binding_for(rp, st)
    old = current.to_json()
    del old["identity"]
    old["data_digest"] = "0123456789abcdef"  # what the path-hashing digest looked like
    old["base_identity"] = f"{st.load_from}@{current.base_identity}"
    ledger.append(fresh_run, Launch(stage="s1", binding=RecordedBinding.model_validate(old)))
    text = refused(
        ["stage", "run", plan, "--no-eval"], [fresh_run], needle="recorded its data by a digest of paths"
    )
    assert str(ledger.ledger_path(fresh_run)) in text.replace("\n", "") and "--force" in text
    with pytest.raises(StageError, match="no longer computed"):
        ledger.check_binding(fresh_run, "s1", current, force=False)
    # forced: the old digest is the one conflict (the base still compares without its directory)
    forced = ledger.check_binding(fresh_run, "s1", current, force=True)
    assert forced == {"data_digest": ("0123456789abcdef", current.data_digest)}
    changed = binding_for(rp, st)
    changed.rotary_base = 123456
    assert list(ledger.binding_conflicts(RecordedBinding.model_validate(old), changed)) == [
        "data_digest",
        "rotary_base",
    ]
