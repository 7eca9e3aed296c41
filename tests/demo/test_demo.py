"""The demo pipeline end to end on a small plan: every step, the SIGTERM interruption and resume, the
evaluation, and a second run that resumes instead of starting over."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.demo.run import DemoConfig, run_demo
from longctx.plan.derive import open_plan
from longctx.stage import ledger
from tests.fixtures.run import write_plan


def _small(plan: Path) -> DemoConfig:
    """The small demo on `plan`, stage s2 interrupted, its base pretrained by one process: what the stages
    extend is the same base either way, and a worker less is one import of torch and megatron-core less
    (the stages keep the plan's two ranks, CP 2 in s2)."""
    return dataclasses.replace(DemoConfig.small(plan, interrupt_stage="s2"), processes=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole demo run: minutes, more when other jobs share the cores
def test_small_demo_then_resume_then_eval_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "demo"
    # eight steps in the interrupted stage: the SIGTERM after its first save lands well before the end
    plan = write_plan(
        tmp_path / "plan.toml",
        run_dir,
        s2_tokens=8 * 2 * 256,
        s2_save=2,
        extra="\n[eval]\nkeys_per_cell = 3\n",
    )
    lines: list[str] = []
    report = run_demo(run_dir, _small(plan), echo=lines.append)

    assert [s.step for s in report.steps] == [
        "tokenizer",
        "corpus",
        "data",
        "checks",
        "base model",
        "stages",
        "evaluation",
    ]
    assert not any(s.skipped for s in report.steps)
    rows = {r["stage"]: r for r in report.stages}
    assert rows["s1"]["status"] == rows["s2"]["status"] == "done"
    assert rows["s1"]["launches"] == ["first-launch"]
    # the interrupted stage stopped after its first save and was resumed from it, not restarted
    assert rows["s2"]["launches"] == ["first-launch", "resume"]
    # `stage run` says it was stopped: the shell's code for SIGTERM
    assert report.interrupted is not None and report.interrupted["exit_code"] == 143
    assert 1 <= report.interrupted["stopped_at"] < report.interrupted["target"]
    resumes = [r for r in ledger.read(run_dir) if r.event == "launch" and r.action == "resume"]
    assert resumes[0].start_iteration == report.interrupted["stopped_at"]

    ev = report.evaluation
    assert ev is not None and Path(ev["report"]).exists()
    assert all(Path(p).stat().st_size > 1000 for p in ev["plots"].values())
    assert {row["checkpoint"] for row in ev["table"]} >= {"base", "s1", "s2"}
    assert ev["settings"]["keys_per_cell"] == 3
    demo_table = (run_dir / "eval" / "summary" / "summary.md").read_text()

    # a second run in the same directory resumes: nothing is rebuilt or retrained
    again = run_demo(run_dir, _small(plan), echo=lines.append)
    skipped = {s.step: s.skipped for s in again.steps}
    assert skipped["tokenizer"] and skipped["corpus"] and skipped["data"] and skipped["base model"]
    assert [r["launches"] for r in again.stages] == [r["launches"] for r in report.stages]
    _eval_summary_reuses_the_demos_results(plan, run_dir, ev, demo_table, monkeypatch)


def _eval_summary_reuses_the_demos_results(
    plan: Path, run_dir: Path, ev: dict, demo_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo evaluates with its plan's [eval]; `eval summary PLAN` afterwards measures the same, so it
    loads no model (every result from the demo's cache) and prints the demo's table."""

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval summary loaded a model: the demo's results were not re-used")

    monkeypatch.setattr("longctx.eval.engine.load_model", no_model)
    res = CliRunner().invoke(app, ["eval", "summary", str(plan), "--run-dir", str(run_dir), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"] == ev["settings"] and data["settings_origin"] == "the [eval] of plan test-tiny"
    lengths = {str(n) for n in data["lengths"]}
    assert all(set(ce["cached"]) >= lengths for ce in data["checkpoints"])
    assert {
        c["keys"] for ce in data["checkpoints"] for r in ce["results"] for c in r["passkey"]["cells"]
    } == {3}
    assert not any(p.name.startswith("summary-") for p in (run_dir / "eval").iterdir())  # nothing replaced
    # the same table, written to the same place (the plots' and the notes' lines aside)
    table = (run_dir / "eval" / "summary" / "summary.md").read_text()
    assert table.split("\nmethod:")[0] == demo_table.split("\nmethod:")[0]
    text = CliRunner().invoke(app, ["eval", "summary", str(plan), "--run-dir", str(run_dir)])
    assert text.exit_code == 0 and "settings: 3 keys per cell × 5 depths" in text.stdout
    assert "3/15" in text.stdout or "/15" in text.stdout  # 3 keys × 5 depths per length


def test_demo_cli_help_and_json_shape() -> None:
    r = CliRunner().invoke(app, ["demo", "--help"])
    assert r.exit_code == 0 and "stages/tiny.toml" in r.output and "--small" in r.output
    assert json.loads(json.dumps({"ok": True}))  # the --json report goes through print_json


@pytest.mark.timeout(1800)  # a whole demo run: minutes, more when other jobs share the cores
def test_small_masked_diffusion_demo(tmp_path: Path) -> None:
    """`demo --family mdm` on the small plan: the base pretrained with the masked-diffusion objective,
    the stages continued from it (CP 2 in s2, SIGTERM + resume), every checkpoint evaluated by infilling."""
    run_dir = tmp_path / "demo"
    plan = write_plan(
        tmp_path / "plan.toml",
        run_dir,
        s2_tokens=8 * 2 * 256,
        s2_save=2,
        # the evaluation's grid cut to what is read here (a cell per checkpoint and length, its ELBO):
        # one key per cell and one held-out document for the ELBO instead of the defaults' 2 and 3
        extra='\n[objective]\nkind = "mdm"\n[eval]\nkeys_per_cell = 1\nloss_docs = 1\n',
    )
    report = run_demo(run_dir, _small(plan), echo=[].append)
    rows = {r["stage"]: r for r in report.stages}
    assert rows["s1"]["status"] == rows["s2"]["status"] == "done"
    assert rows["s2"]["launches"] == ["first-launch", "resume"]
    assert all(r["final_loss"] is not None and r["final_loss"] > 0 for r in report.stages)
    base = json.loads((run_dir / "base" / "train_spec.json").read_text())
    assert base["objective"]["kind"] == "mdm" and base["output_vocab_size"] == base["padded_vocab_size"] - 1
    ev = report.evaluation
    assert ev is not None and set(ev["plots"]) == {"niah", "elbo_by_context"}
    for row in ev["table"]:
        cells = [v for k, v in row.items() if k.isdigit() and v is not None]
        assert cells and all(c["long_loss"] is None and c["elbo_widest_context"] > 0 for c in cells)
    assert any("infilling" in n for n in ev["notes"])


def test_demo_family_picks_its_plan() -> None:
    assert DemoConfig.from_options(family="mdm").plan.name == "tiny_mdm.toml"
    assert DemoConfig.from_options(family="udm").plan.name == "tiny_udm.toml"
    # --small on the autoregressive family: the smoke plan a fresh install is checked with
    small = DemoConfig.from_options(small=True, interrupt="512")
    assert small.plan.name == "tiny_smoke.toml" and small.interrupt_stage == "512"
    assert DemoConfig.from_options(small=True, plan=Path("x.toml")).plan == Path("x.toml")
    r = CliRunner().invoke(app, ["demo", "--family", "gpt", "--dir", "/nonexistent/x"])
    assert r.exit_code == 2 and "unknown model family 'gpt'" in r.output


def test_demo_to_16k_carries_the_4k_demo_on(tmp_path: Path) -> None:
    short, reach = DemoConfig.from_options(), DemoConfig.from_options(to="16k")
    assert reach.plan.name == "tiny_16k.toml" and reach.published == "ar" and reach.interrupt_stage == "16k"
    # the 4K demo's corpora, then the 16K one: a 4K demo's directory resumes into the 16K demo
    assert reach.corpora[: len(short.corpora)] == short.corpora
    assert [c.name for c in reach.corpora[len(short.corpora) :]] == ["long16k"]
    four, sixteen = open_plan(short.plan, tmp_path), open_plan(reach.plan, tmp_path)
    assert sixteen.stages[:-1] == four.stages and sixteen.arch == four.arch
    # the same needles, greedy only (a 16K forward per distractor would cost minutes per checkpoint)
    assert sixteen.eval == four.eval.model_copy(update={"distractors": 0})
    last = sixteen.stages[-1]
    assert (last.name, last.seq_length, last.cp, last.world) == ("16k", 16_384, 4, 4)
    assert last.sweep is not None and len(last.sweep.candidates) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "64k"], "the demo reaches no length '64k'"),
        (["--to", "16k", "--family", "mdm"], "--to 16k carries the autoregressive demo's own plan"),
        (["--to", "16k", "--small"], "--to 16k carries the autoregressive demo's own plan"),
        (["--to", "16k", "--plan", "x.toml"], "--to 16k carries the autoregressive demo's own plan"),
    ],
)
def test_demo_to_refuses_what_it_cannot_reach(args: list[str], message: str) -> None:
    r = CliRunner().invoke(app, ["demo", *args, "--dir", "/nonexistent/x"])
    assert r.exit_code == 2 and message in r.output and not Path("/nonexistent/x").exists()


@pytest.mark.parametrize("family", ["mdm", "udm"])
def test_the_published_diffusion_demos_have_no_small_variant(family: str) -> None:
    cfg = DemoConfig.from_options(family=family)
    assert cfg.published == family and cfg.plan.name == f"tiny_{family}.toml"
    r = CliRunner().invoke(app, ["demo", "--family", family, "--small", "--dir", "/nonexistent/x"])
    assert r.exit_code == 2 and f"the {family} demo has no small plan" in r.output
