"""`stage status` and `slurm status` fit a 100-column terminal at their natural width with baby_9b_dense's
stages and worst-case cells (long runs: six-digit iterations, billions of tokens, day-long ETAs, a
resume flagged); the detail goes to --json and the notes below the table."""

from __future__ import annotations

from pathlib import Path

from longctx.cli.slurm import _status_tables
from longctx.cli.stage import _status_notes, _status_table
from longctx.plan.derive import resolve_plan
from longctx.plan.load import load_plan
from longctx.slurm.status import ChainStatus, JobRow, StageProgress
from longctx.stage.pace import ResumeJump, StagePace
from longctx.stage.state import NextStep, StageState
from longctx.util.table import TERMINAL_COLUMNS, natural_width

BABY = Path(__file__).resolve().parents[2] / "stages" / "baby_9b_dense.toml"


def _worst(rp) -> tuple[list[StageState], list[StagePace]]:
    states, pace = [], []
    for i, st in enumerate(rp.stages):
        states.append(
            StageState(
                st.name,
                i,
                123_456,
                Path("/x") / st.name,
                123_400,
                [123_000, 123_200, 123_400],
                [123_450],
                "in-progress",
                123_400,
            )
        )
        pace.append(
            StagePace(
                st.name, 1_234_567.0, i == 0, 9 * 86400.0, 99 * 86400.0, [ResumeJump(120_000, 2.1234, 7.9876)]
            )
        )
    return states, pace


def test_stage_status_table_fits() -> None:
    rp = resolve_plan(load_plan(BABY))
    states, pace = _worst(rp)
    step = NextStep("resume", rp.stages[0].name, f"resume {rp.stages[0].name} from iteration 123400")
    assert natural_width(_status_table(rp, states, step, pace)) <= TERMINAL_COLUMNS
    notes = _status_notes(states, pace)
    assert any("(wrong save?)" in n and "2.12 → 7.99" in n for n in notes)


def test_slurm_status_table_fits() -> None:
    rp = resolve_plan(load_plan(BABY))
    stages = [
        StageProgress(
            st.name,
            "in-progress",
            123_400,
            123_456,
            123_456_789_012,
            123_456_789_012,
            123_400,
            "2026-12-04T13:13:26+00:00",
            12.345,
            "pace",
            99 * 86400.0,
            1_234_567.0,
            9 * 86400.0,
            "loss 2.12 → 7.99 after the resume at 120000 (wrong save?)",
        )
        for st in rp.stages
    ]
    jobs = [
        JobRow(
            "1234567",
            "chain",
            12,
            "COMPLETED",
            "sacct",
            "0:0",
            None,
            "1-00:00:00",
            stage="64k",
            iterations="120000 → 123400",
        )
    ]
    st = ChainStatus(
        rp.plan.name,
        "/runs/baby",
        "resume",
        "64k",
        "resume 64k from iteration 123400",
        stages,
        jobs,
        [],
        [],
        99 * 86400.0,
        None,
        "sacct",
        True,
    )
    assert natural_width(_status_tables(st)) <= TERMINAL_COLUMNS
