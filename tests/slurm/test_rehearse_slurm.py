"""`longctx rehearse --slurm` on the local one-node cluster: stages/baby_9b_dense.toml scaled to one stage
(1,024 tokens at CP 2; one layer, 6 iterations) run as the chain of Slurm jobs `slurm submit`
queues. The SIGTERM goes to the longest stage's job steps after its first save, the next job resumes from
that save, `slurm job-end` submits an eval job per finished stage and the job that finishes the plan
cancels the spare jobs; the rehearsal waits for all of them and reads what happened from the ledger."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from longctx.plan.derive import open_plan
from longctx.rehearse.run import rehearse
from longctx.rehearse.slurm_chain import SlurmRehearsal
from longctx.slurm.records import submitted_ids
from longctx.stage import ledger
from longctx.stage.ledger_events import End, Launch
from longctx.stage.state import plan_state
from tests.fixtures.rehearsal import build_inputs, options, scaled_plan

pytestmark = pytest.mark.slurm

# one stage: crossing from stage to stage in a chain is tests/slurm/test_chain_slurm.py's, and each job
# costs the suite's one-chain-at-a-time Slurm unit its start-up
SCALED = {"64k": ("1k", 1024, 2)}
# the SIGTERM travels scancel → slurmctld → slurmd → the step (tenths of a second) and the trainer sees it
# after its step, not during a save: a 1K micro step takes about 0.25 s on an idle core, so a stage of 3
# iterations can finish before it lands (the rehearsal then says "finished first"); 6 leave it room
ITERATIONS = 6


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_rehearsal_runs_its_stages_as_a_slurm_chain(
    slurm_cluster: None,
    oellm_like_hf_dir: Path,
    oellm_like_manifest: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(build_inputs(tmp_path / "inputs") / "artifact"))
    plan = scaled_plan(tmp_path, SCALED)
    run = tmp_path / "run"
    said: list[str] = []
    report = rehearse(
        open_plan(plan),
        run,
        options(oellm_like_hf_dir, oellm_like_manifest).model_copy(update={"iterations": ITERATIONS}),
        echo=said.append,
        export=False,  # the export reads the last save as a local chain's would: nothing Slurm changes
        slurm=SlurmRehearsal(time_minutes=10),
    )
    assert report.ok, (report.problems, [(s.stage, c) for s in report.stages for c in s.checks if not c.ok])
    assert report.chain == "slurm"
    rp = open_plan(run / "plan.toml", run)
    assert all(s.status == "done" for s in plan_state(rp))

    records = ledger.read(run)
    chain = submitted_ids(run, "chain")
    assert [j.job_id for j in report.slurm_jobs] == chain
    launches = [r for r in records if isinstance(r, Launch)]
    assert launches and all(str(r.job_id) in chain for r in launches)  # every launch ran in a chain job
    launched = {str(r.job_id) for r in launches}
    assert len(launched) >= 2  # the first launch, and the resume after the SIGTERM in a later job

    stop = report.interruption
    assert stop is not None and stop["stage"] == "1k" and not stop["finished_first"], stop
    resumes = [r for r in launches if r.stage == "1k" and r.action == "resume"]
    assert resumes and resumes[0].start_iteration == stop["stopped_at"] > 0
    assert str(resumes[0].job_id) != next(str(r.job_id) for r in launches if r.stage == "1k")
    ends = [r for r in records if isinstance(r, End) and r.stage == "1k"]
    assert ends[-1].end_iteration == stop["target"] == rp.stage("1k").train_iters

    for s in report.stages:
        assert s.losses and all(math.isfinite(x) for x in s.losses)
    assert {st: j.state for st, j in report.eval_jobs.items()} == {"1k": "COMPLETED"}
    spares = [j for j in report.slurm_jobs if j.job_id not in launched]
    assert spares and all(j.state == "CANCELLED" for j in spares), report.slurm_jobs
    # what the user saw meanwhile: which job trains which stage, and the SIGTERM
    assert any("(chain 1/" in line and "stage 1k first-launch, iteration" in line for line in said), said
    assert any("SIGTERM to job" in line for line in said), said
