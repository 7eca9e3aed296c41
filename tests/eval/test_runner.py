"""The stage hook and the summary: files written (valid PNGs, JSON), the table, the result cache,
held-out data selection, and errors for unknown stages and unfinished checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from longctx.errors import EvalError, PlanError
from longctx.eval import engine
from longctx.eval.data import HeldOut, train_end
from longctx.eval.results import EvalReport
from longctx.eval.runner import evaluate_finished_stage, evaluate_path, summarize_plan
from longctx.eval.settings import EvalSettings
from longctx.eval.task_run import run_causal_tasks
from tests.fixtures.eval import BASE_LEN, S1_LEN, S2_LEN, EvalRun

# small and fast: two depths, one key, one distractor
FAST = EvalSettings(depths=[0.0, 1.0], keys_per_cell=1, distractors=1, loss_docs=2, short_docs=4)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.std(img)) > 0.01  # not a blank canvas


def test_finished_stage_writes_report_and_plots(eval_run_copy: EvalRun) -> None:
    rp = eval_run_copy.resolved()
    report = evaluate_finished_stage(rp, "s2", settings=FAST, echo=False)
    out = eval_run_copy.run_dir / "stages" / "s2" / "eval"
    assert report.out_dir == str(out)
    for name in ("niah.png", "loss_by_position.png"):
        assert_png(out / name)
    assert report.plots == {
        "niah": str(out / "niah.png"),
        "loss_by_position": str(out / "loss_by_position.png"),
    }
    data = json.loads((out / "report.json").read_text())
    again = EvalReport.model_validate(data)
    assert [c.label for c in again.checkpoints] == ["base", "s1", "s2"]
    assert again.lengths == [BASE_LEN, S1_LEN, S2_LEN]
    # every checkpoint at every length; beyond its trained window is flagged, not refused
    for ce in again.checkpoints:
        assert [r.length for r in ce.results] == [BASE_LEN, S1_LEN, S2_LEN]
        assert [r.extrapolated for r in ce.results] == [n > ce.trained_length for n in again.lengths]
        for r in ce.results:
            assert len(r.passkey.cells) == 2 and len(r.passkey.items) == 2
            assert r.position.length == r.length and r.position.docs == 2 and not r.position.packed
        assert ce.short is not None and ce.short.length == BASE_LEN and ce.short.docs == 4
    assert again.checkpoints[0].short_delta_vs_base == 0.0
    assert {c.rotary_base for c in again.checkpoints} == {10000, 20000, 40000}
    summary = (out / "summary.md").read_text()
    assert "| base | 64 |" in summary and "| s2 | 256 |" in summary
    assert "log-likelihood vs 1 distractors" in summary
    rows = report.table()
    assert rows[2]["checkpoint"] == "s2" and rows[2][str(S2_LEN)]["extrapolated"] is False
    assert rows[0][str(S2_LEN)]["extrapolated"] is True


def test_cache_reuses_earlier_stage_results(eval_run_copy: EvalRun) -> None:
    rp = eval_run_copy.resolved()
    first = evaluate_finished_stage(rp, "s1", settings=FAST, echo=False)
    assert first.lengths == [BASE_LEN, S1_LEN]
    assert all(not c.cached for c in first.checkpoints)
    second = evaluate_finished_stage(rp, "s2", settings=FAST, echo=False)
    by = {c.label: c for c in second.checkpoints}
    # base and s1 at 64 and 128 (and their short losses) come from the s1 evaluation
    assert by["base"].cached == [str(BASE_LEN), str(S1_LEN), "short"]
    assert by["s1"].cached == [str(BASE_LEN), str(S1_LEN), "short"]
    assert by["s2"].cached == []
    assert by["s1"].at(S1_LEN) == first.checkpoints[1].at(S1_LEN)
    # other settings are other results
    other = evaluate_finished_stage(rp, "s1", settings=FAST.model_copy(update={"seed": 9}), echo=False)
    assert all(not c.cached for c in other.checkpoints)


def test_an_evaluation_stopped_mid_length_resumes_after_its_last_finished_part(
    eval_run_copy: EvalRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    rp = eval_run_copy.resolved()
    settings = FAST.model_copy(update={"tasks": ["single", "multikey-2", "absent-2"], "short_docs": 0})
    ran: list[tuple[str, int]] = []

    def stopped_at_the_second(tasks, n, *args, **kwargs):  # type: ignore[no-untyped-def]
        (name,) = tasks
        if len(ran) == 1:
            raise KeyboardInterrupt  # the job's time limit, mid-length
        ran.append((name, n))
        return run_causal_tasks(tasks, n, *args, **kwargs)

    monkeypatch.setattr(engine, "run_causal_tasks", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        evaluate_finished_stage(rp, "s1", settings=settings, echo=False)
    assert ran == [("multikey-2", BASE_LEN)]
    ran.append(("", 0))  # from here on nothing stops
    resumed = evaluate_finished_stage(rp, "s1", settings=settings, echo=False)
    # the base at 64 resumed at absent-2: its passkey grid, loss and multikey-2 came from the partial result
    assert ran[2] == ("absent-2", BASE_LEN)
    # 2 checkpoints × 2 lengths × 2 tasks, less the one finished before the stop
    assert ran[2:].count(("multikey-2", BASE_LEN)) == 1 and len(ran[2:]) == 2 * 2 * 2 - 1  # s1's
    # and it equals an evaluation that was never stopped
    shutil.rmtree(eval_run_copy.run_dir / "eval" / "cache")
    clean = evaluate_finished_stage(rp, "s1", settings=settings, echo=False)
    assert len(ran[2:]) == 2 * (2 * 2 * 2) - 1
    for a, b in zip(resumed.checkpoints, clean.checkpoints, strict=True):
        for ra, rb in zip(a.results, b.results, strict=True):
            assert ra.tasks == rb.tasks
            assert ra.passkey.cells == rb.passkey.cells and ra.position.long_loss == rb.position.long_loss


def test_summary_and_single_checkpoint(eval_run_copy: EvalRun, tmp_path: Path) -> None:
    rp = eval_run_copy.resolved()
    report = summarize_plan(rp, settings=FAST, lengths=[S2_LEN])
    assert [c.label for c in report.checkpoints] == ["base", "s1", "s2"]
    assert Path(report.out_dir or "") == eval_run_copy.run_dir / "eval" / "summary"
    assert_png(Path(report.plots["niah"]))
    # one checkpoint: lengths within its window by default; the base is only the short-loss reference
    one = evaluate_path(rp, eval_run_copy.stage("s1"), settings=FAST, out_dir=tmp_path / "one")
    assert one.lengths == [BASE_LEN, S1_LEN]
    assert [c.label for c in one.checkpoints] == ["base", "s1"]
    assert one.checkpoints[0].results == [] and one.checkpoints[0].short is not None
    assert one.checkpoints[1].short_delta_vs_base is not None
    assert_png(tmp_path / "one" / "loss_by_position.png")
    # the base itself is labelled base
    assert [c.label for c in evaluate_path(rp, eval_run_copy.base, settings=FAST).checkpoints] == ["base"]


def test_rotary_base_differing_from_the_plan_is_noted(eval_run_copy: EvalRun) -> None:
    text = eval_run_copy.plan.read_text().replace("rope = { base = 40000 }", "rope = { base = 80000 }")
    eval_run_copy.plan.write_text(text)
    report = evaluate_path(
        eval_run_copy.resolved(),
        eval_run_copy.stage("s2"),
        stage="s2",
        settings=FAST,
        lengths=[S2_LEN],
        base_reference=False,
    )
    assert any("rotary base 40,000 differs from the plan's 80,000" in n for n in report.notes)


def test_unknown_and_unfinished_stages(eval_run_copy: EvalRun) -> None:
    rp = eval_run_copy.resolved()
    with pytest.raises(PlanError) as err:
        evaluate_finished_stage(rp, "s9", settings=FAST, echo=False)
    assert err.value.what == "plan 'evaltiny' has no stage 's9'"
    assert err.value.fix == "use one of: s1, s2"
    (eval_run_copy.stage("s2") / "latest_checkpointed_iteration.txt").unlink()
    with pytest.raises(EvalError) as err2:
        evaluate_finished_stage(rp, "s2", settings=FAST, echo=False)
    assert err2.value.what == "stage s2 has no finished checkpoint"


def test_lengths_beyond_the_window_need_extrapolate(eval_run_copy: EvalRun) -> None:
    rp = eval_run_copy.resolved()
    with pytest.raises(EvalError) as err:
        evaluate_path(rp, eval_run_copy.stage("s1"), lengths=[S2_LEN], settings=FAST)
    assert "above the checkpoint's max position 128" in err.value.what
    report = evaluate_path(rp, eval_run_copy.stage("s1"), lengths=[S2_LEN], settings=FAST, extrapolate=True)
    assert report.checkpoints[-1].results[0].extrapolated


# -- held-out data ---------------------------------------------------------------------------------


def test_heldout_documents_are_the_split_tail(eval_run: EvalRun) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = str(eval_run.data_prefix)
    ds = IndexedDataset(prefix)
    n = len(ds.sequence_lengths)
    start = train_end(n, "90,10,0")
    assert start == round(0.9 * n) and start < n
    held = HeldOut([prefix], "90,10,0")
    assert held.count() == n - start
    docs, packed = held.long_documents(S2_LEN, 3)
    assert not packed and len(docs) == 3
    expected = [np.asarray(ds[i][:S2_LEN]) for i in range(start, n) if ds.sequence_lengths[i] >= S2_LEN][:3]
    for got, want in zip(docs, expected, strict=True):
        assert np.array_equal(got, want)
    # longer than any held-out document: packed back to back, flagged
    longest = int(max(ds.sequence_lengths[start:]))
    packed_docs, packed = held.long_documents(longest + 8, 1)
    assert packed and len(packed_docs[0]) == longest + 8
    assert np.array_equal(packed_docs[0][: ds.sequence_lengths[start]], ds[start])
    shorts = held.short_documents(BASE_LEN, 5)
    assert len(shorts) == 5 and all(len(d) <= BASE_LEN for d in shorts)


def test_heldout_errors(eval_run: EvalRun, tmp_path: Path) -> None:
    with pytest.raises(EvalError) as err:
        HeldOut([str(tmp_path / "missing")], "90,10,0")
    assert err.value.what == "indexed dataset not found (PREFIX.idx / PREFIX.bin)"
    with pytest.raises(EvalError) as err:
        HeldOut([str(eval_run.data_prefix)], "100,0,0").long_documents(64, 1)
    assert err.value.what.startswith("the split '100,0,0' holds out no documents")
    assert HeldOut([str(eval_run.data_prefix)], None).count() == 160  # explicit data: all unseen
