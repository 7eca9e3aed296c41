"""`longctx eval run|summary`: JSON, files, and exit code 2 with a clear message for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from tests.fixtures.eval import FAST, S1_LEN, S2_LEN, EvalRun

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, ["eval", *[str(a) for a in args]])


def test_run_json_and_files(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli(
        "run",
        eval_run_copy.stage("s2"),
        "--plan",
        eval_run_copy.plan,
        "--stage",
        "s2",
        "--lengths",
        "128,256",
        *FAST,
        "--out",
        out,
        "--json",
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["lengths"] == [S1_LEN, S2_LEN]
    assert [c["label"] for c in data["checkpoints"]] == ["base", "s2"]
    s2 = data["checkpoints"][1]
    assert [r["length"] for r in s2["results"]] == [S1_LEN, S2_LEN]
    assert s2["results"][1]["passkey"]["cells"][0]["depth"] == 0.0
    assert "loglik" in data["method"]
    for name in ("report.json", "summary.md", "niah.png", "loss_by_position.png"):
        assert (out / name).is_file()


def test_run_table(eval_run_copy: EvalRun) -> None:
    res = cli("run", eval_run_copy.stage("s1"), "--plan", eval_run_copy.plan, *FAST, "--no-base")
    assert res.exit_code == 0, res.output
    # the three tables (passkey, loss by length, short-context loss), the legend and the plots
    for text in (
        "passkey (",
        " s1 ",
        "loss at positions ≥ length/2",
        "short-context loss",
        "effective",
        "niah:",
    ):
        assert text in res.stdout, res.stdout


def test_summary(eval_run_copy: EvalRun) -> None:
    res = cli("summary", eval_run_copy.plan, "--lengths", "256", *FAST, "--json")
    assert res.exit_code == 0, res.output
    assert [c["label"] for c in json.loads(res.stdout)["checkpoints"]] == ["base", "s1", "s2"]
    assert (eval_run_copy.run_dir / "eval" / "summary" / "niah.png").is_file()


PLAN_EVAL = """
[eval]
keys_per_cell = 1
depths = [0.0, 1.0]
distractors = 1
loss_docs = 1
short_docs = 2
packed_windows = 0
"""


def test_the_plans_eval_settings_are_the_default_and_an_option_overrides_one(
    eval_run_copy: EvalRun, tmp_path: Path
) -> None:
    plan, run_dir = eval_run_copy.plan, eval_run_copy.run_dir
    plan.write_text(plan.read_text() + PLAN_EVAL)
    res = cli("summary", plan, "--lengths", S1_LEN)
    assert res.exit_code == 0, res.output
    # the table says what it measured and where the settings come from
    assert "settings: 1 keys per cell × 2 depths (0%, 100%), 1 distractors" in res.stdout, res.stdout
    assert "the [eval] of plan evaltiny" in res.stdout and "overridden" not in res.stdout
    first = json.loads((run_dir / "eval" / "summary" / "report.json").read_text())
    assert first["settings"]["keys_per_cell"] == 1
    assert {
        c["keys"] for ce in first["checkpoints"] for r in ce["results"] for c in r["passkey"]["cells"]
    } == {1}

    # an option overrides its field only; the plan's summary is kept, and the note says what changed
    res = cli("summary", plan, "--lengths", S1_LEN, "--keys", "2", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"]["keys_per_cell"] == 2 and data["settings"]["depths"] == [0.0, 1.0]
    assert data["settings_origin"] == "the [eval] of plan evaltiny, overridden: keys_per_cell 1 → 2"
    kept = sorted(p for p in (run_dir / "eval").iterdir() if p.name.startswith("summary-"))
    assert len(kept) == 1
    assert json.loads((kept[0] / "report.json").read_text())["settings"]["keys_per_cell"] == 1
    assert any(f"keys_per_cell 1 → 2); kept as {kept[0]}" in n for n in data["notes"]), data["notes"]
    assert "kept as" in (run_dir / "eval" / "summary" / "summary.md").read_text()

    # the same settings again: every result from the cache, the summary replaced in place, nothing more kept
    res = cli("summary", plan, "--lengths", S1_LEN, "--keys", "2", "--json")
    data = json.loads(res.stdout)
    assert all(set(ce["cached"]) == {str(S1_LEN), "short"} for ce in data["checkpoints"]), data["checkpoints"]
    assert not any("kept as" in n for n in data["notes"])
    assert len([p for p in (run_dir / "eval").iterdir() if p.name.startswith("summary-")]) == 1

    # `eval run` takes the plan's settings too
    res = cli(
        "run",
        eval_run_copy.stage("s1"),
        "--plan",
        plan,
        "--lengths",
        S1_LEN,
        "--no-base",
        "--json",
        "--out",
        tmp_path / "one",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["settings"]["keys_per_cell"] == 1


def test_summary_takes_the_plan_as_its_argument(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    _fails(cli("summary", missing), "plan file not found")
    _fails(cli("summary"), "missing: longctx eval summary PLAN")
    _fails(cli("summary", missing, "--plan", missing), "No such option: --plan")
    assert "--plan" not in cli("summary", "--help").output


def _fails(res, *texts: str) -> None:
    assert res.exit_code == 2, res.output
    for text in texts:
        assert text in res.output, res.output


def test_bad_inputs(eval_run: EvalRun, tmp_path: Path) -> None:
    plan = eval_run.plan
    s1 = eval_run.stage("s1")
    _fails(cli("run", tmp_path / "nope", "--plan", plan, "--out", tmp_path / "o"), "checkpoint not found")
    _fails(
        cli("run", s1, "--plan", plan, "--stage", "s9", "--out", tmp_path / "o"),
        "plan 'evaltiny' has no stage 's9'",
        "use one of: s1, s2",
    )
    _fails(
        cli("run", s1, "--plan", plan, "--lengths", "256", *FAST, "--out", tmp_path / "o"),
        "length 256 is above the checkpoint's max position 128",
        "--extrapolate",
    )
    _fails(
        cli("run", s1, "--plan", plan, "--lengths", "126", "--cp", "2", *FAST, "--out", tmp_path / "o"),
        "length 126 does not split into 2·CP = 4 equal chunks",
    )
    _fails(
        cli("run", s1, "--plan", plan, "--lengths", "128", "--cp", "2", *FAST, "--out", tmp_path / "o"),
        "evaluation with CP = 2 needs exactly 2 process(es)",
    )
    _fails(
        cli("run", s1, "--plan", plan, "--depths", "0,2", "--out", tmp_path / "o"),
        "needle depths must be fractions in [0, 1]",
    )
    _fails(
        cli("run", s1, "--plan", plan, "--filler", "lorem", "--out", tmp_path / "o"),
        "bad evaluation setting filler",
    )
    _fails(cli("run", s1, "--plan", tmp_path / "missing.toml"), "plan file not found")
    assert not (tmp_path / "o").exists()  # nothing written on failure


@pytest.mark.slow
def test_run_under_torchrun_with_context_parallelism(eval_run: EvalRun, tmp_path: Path) -> None:
    """Two processes, CP = 2 (the world size): rank 0 alone prints and writes; numbers equal CP = 1."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", LONGCTX_NO_PROGRESS="1", PYTHONWARNINGS="ignore")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    args = [
        "eval",
        "run",
        str(eval_run.stage("s2")),
        "--plan",
        str(eval_run.plan),
        "--lengths",
        "256",
        *FAST,
        "--no-base",
        "--no-cache",
        "--json",
    ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "longctx",
        *args,
        "--out",
        str(tmp_path / "cp2"),
    ]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cp2 = json.loads(proc.stdout)  # one JSON document: only rank 0 printed
    assert (tmp_path / "cp2" / "niah.png").is_file()
    res = cli("run", *args[2:], "--out", tmp_path / "cp1")
    assert res.exit_code == 0, res.output
    cp1 = json.loads(res.stdout)
    a, b = cp2["checkpoints"][0]["results"][0], cp1["checkpoints"][0]["results"][0]
    assert a["position"]["loss"] == pytest.approx(b["position"]["loss"], abs=1e-4)
    assert [i["logprob"] for i in a["passkey"]["items"]] == pytest.approx(
        [i["logprob"] for i in b["passkey"]["items"]], abs=1e-3
    )
