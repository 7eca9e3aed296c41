"""Evaluate a plan's checkpoints: after a stage, a summary of the whole ladder, or one checkpoint.

Entry points:

    evaluate_finished_stage(rp, stage)                               → EvalReport   (after a local stage)
    summarize_plan(rp)                                               → EvalReport   (`longctx eval summary`)
    evaluate_path(rp, ckpt, stage=…)                                 → EvalReport   (`longctx eval run`)
    demo_summary(rp) / render_summary(summary, console)                             (the demo's step)

Each builds `CheckpointRef`s from the plan (its base, its stages' save dirs, its tokenizer and
held-out data) and runs the engine, `longctx.eval.engine.evaluate_checkpoints` (re-exported here with
the rest of the engine's public names). Results are cached as JSON under `<run_dir>/eval/cache/`, so
the evaluation after the last stage re-uses what earlier stages measured and only adds the new length
and the new checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from longctx.checkpoint.save_layout import read_tracker
from longctx.errors import EvalError
from longctx.eval.data import heldout_for_stage
from longctx.eval.engine import (
    BASE_LABEL,
    CheckpointRef,
    ResultCache,
    check_length,
    check_tokenizer,
    evaluate_checkpoints,
    write_outputs,
)
from longctx.eval.load import checkpoint_info
from longctx.eval.report_tables import markdown_table, print_report, print_tables
from longctx.eval.results import EvalReport
from longctx.eval.settings import EvalSettings
from longctx.mcore.parallel import is_main_process
from longctx.plan.derive import ResolvedPlan
from longctx.plan.stage_data import plan_tokenizer
from longctx.tokenizer.load import LoadedTokenizer
from longctx.util.confine import check_output_dir, refuse_write_into

__all__ = [
    "BASE_LABEL",
    "CheckpointRef",
    "ResultCache",
    "check_length",
    "check_tokenizer",
    "demo_summary",
    "evaluate_checkpoints",
    "evaluate_finished_stage",
    "evaluate_path",
    "plan_lengths",
    "plan_settings",
    "render_summary",
    "summarize_plan",
    "write_outputs",
]


def plan_lengths(rp: ResolvedPlan, upto: int | None = None) -> list[int]:
    """The base's length and each stage's (up to stage index `upto`)."""
    stages = rp.stages if upto is None else rp.stages[: upto + 1]
    return sorted({int(rp.base.seq_length), *(int(s.seq_length) for s in stages)})


def plan_settings(rp: ResolvedPlan, **overrides: object) -> EvalSettings:
    """The plan's `[eval]` settings with `overrides` (the fields an option gave; None = not given).
    Raises EvalError naming the field for a bad value."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return EvalSettings.model_validate({**rp.eval.model_dump(), **given})
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "settings"
        msg = first["msg"].removeprefix("Value error, ")
        raise EvalError(
            f"bad evaluation setting {field}: {msg}",
            where=f"[eval].{field} of plan {rp.name}, or the option that overrides it",
            fix="give a value the plan's [eval] table accepts (docs/evaluation.md)",
        ) from None


def settings_origin(rp: ResolvedPlan, settings: EvalSettings) -> str:
    """Where `settings` come from: the plan's [eval] table, and what differs from it."""
    where = f"the [eval] of plan {rp.name}"
    changes = settings.changes_from(rp.eval)
    return where if not changes else f"{where}, overridden: {'; '.join(changes)}"


def _plan_tokenizer(rp: ResolvedPlan) -> LoadedTokenizer:
    # prompts are encoded the way the plan declares its training data encoded (Megatron's type)
    return plan_tokenizer(rp)


def _base_path(rp: ResolvedPlan) -> Path | None:
    return rp.base.path


def _has_checkpoint(save_dir: Path) -> bool:
    try:
        return read_tracker(save_dir) is not None
    except Exception:  # a garbage tracker: the stage has no usable checkpoint
        return False


def _ladder_refs(
    rp: ResolvedPlan, upto: int, notes: list[str], base: Path | None = None
) -> list[CheckpointRef]:
    """Base + stages[0..upto], each allowed to extrapolate (the comparison is the point)."""
    refs: list[CheckpointRef] = []
    base = base or _base_path(rp)
    if base is not None and base.exists():
        refs.append(
            CheckpointRef(
                BASE_LABEL, base, allow_extrapolation=True, expected_rotary_base=int(rp.base.rotary_base)
            )
        )
    else:
        notes.append(f"the base checkpoint ({base or rp.base.hub_id}) is not on disk; not evaluated")
    for st in rp.stages[: upto + 1]:
        if _has_checkpoint(st.save_dir):
            refs.append(
                CheckpointRef(
                    st.name, st.save_dir, allow_extrapolation=True, expected_rotary_base=st.rotary_base
                )
            )
        else:
            notes.append(f"stage {st.name} has no finished checkpoint in {st.save_dir}; not evaluated")
    return refs


def _run_dir_cache(rp: ResolvedPlan) -> Path:
    return Path(rp.run_dir) / "eval" / "cache"


def evaluate_finished_stage(
    rp: ResolvedPlan, stage_name: str, *, settings: EvalSettings | None = None, echo: bool = True
) -> EvalReport:
    """Evaluate a finished stage against the base and the earlier stages at every length so far.

    Writes `<run_dir>/stages/<stage>/eval/{report.json, niah.png, loss_by_position.png, summary.md}`;
    results measured by earlier stages' evaluations are re-used from the cache.
    """
    st = rp.stage(stage_name)  # PlanError naming the stages for unknown names
    if not _has_checkpoint(st.save_dir):
        raise EvalError(
            f"stage {stage_name} has no finished checkpoint",
            where=str(st.save_dir),
            fix="finish the stage first (longctx stage run), then evaluate it",
        )
    notes: list[str] = []
    refs = _ladder_refs(rp, st.index, notes)
    log = _stderr_log if echo else None
    settings = settings or plan_settings(rp)
    report = evaluate_checkpoints(
        refs,
        lengths=plan_lengths(rp, st.index),
        tokenizer=_plan_tokenizer(rp),
        heldout=heldout_for_stage(rp, st),
        settings=settings,
        short_length=int(rp.base.seq_length),
        cache_dir=_run_dir_cache(rp),
        plan=rp.name,
        stage=stage_name,
        log=log,
    )
    report.notes = notes + report.notes
    report.settings_origin = settings_origin(rp, settings)
    write_outputs(report, st.stage_dir / "eval")
    if echo and is_main_process():
        print_report(report, stderr=True)
    return report


def summarize_plan(
    rp: ResolvedPlan,
    *,
    lengths: Sequence[int] | None = None,
    settings: EvalSettings | None = None,
    out_dir: Path | None = None,
    data: Sequence[str] | None = None,
    cp: int = 1,
    use_cache: bool = True,
    base: Path | None = None,
) -> EvalReport:
    """Base + every stage with a finished checkpoint, at every stage's length (or `lengths`);
    `base` overrides the plan's base checkpoint path."""
    if out_dir is not None:  # before anything is evaluated
        check_output_dir(Path(out_dir), option="--out", what="the evaluation's report and plots")
    notes: list[str] = []
    refs = _ladder_refs(rp, len(rp.stages) - 1, notes, base)
    if not refs:
        raise EvalError(
            "no checkpoint of this plan is on disk yet",
            where=str(rp.run_dir),
            fix="run the stages first (longctx stage run --until-done)",
        )
    last = rp.stages[-1]
    settings = settings or plan_settings(rp)
    report = evaluate_checkpoints(
        refs,
        lengths=list(lengths) if lengths else plan_lengths(rp),
        tokenizer=_plan_tokenizer(rp),
        heldout=heldout_for_stage(rp, last, data),
        settings=settings,
        short_length=int(rp.base.seq_length),
        cp=cp,
        cache_dir=_run_dir_cache(rp) if use_cache else None,
        plan=rp.name,
        stage=None,
    )
    report.notes = notes + report.notes
    report.settings_origin = settings_origin(rp, settings)
    return write_outputs(report, out_dir or Path(rp.run_dir) / "eval" / "summary")


def demo_summary(
    rp: ResolvedPlan, *, base: Path | None = None, settings: EvalSettings | None = None
) -> dict[str, Any]:
    """The demo's evaluation step: `summarize_plan` with the plan's [eval] settings (what `eval summary`
    uses too, and the stages' evaluations, so each re-uses what the others measured), as a JSON-able dict
    with the table, plots and a Markdown rendering."""
    report = summarize_plan(rp, settings=settings, base=base)
    return {
        "lengths": report.lengths,
        "method": report.method,
        "settings": report.settings.model_dump(mode="json"),
        "table": report.table(),
        "plots": report.plots,
        "out_dir": report.out_dir,
        "report": str(Path(report.out_dir or "") / "report.json"),
        "notes": report.notes,
        "markdown": markdown_table(report),
    }


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """Print a `demo_summary` result on a rich console: the table, the notes, the plot paths."""
    report = EvalReport.model_validate_json(Path(summary["report"]).read_text(encoding="utf-8"))
    print_tables(report, console)
    for note in report.notes:  # wrapped to the console's width (long paths folded)
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, overflow="fold")
    for name, path in report.plots.items():
        console.print(f"{name}: {path}", highlight=False, markup=False, overflow="fold")


def evaluate_path(
    rp: ResolvedPlan,
    checkpoint: Path,
    *,
    stage: str | None = None,
    lengths: Sequence[int] | None = None,
    settings: EvalSettings | None = None,
    rotary_base: int | None = None,
    attention_scale: float = 1.0,
    extrapolate: bool = False,
    base_reference: bool = True,
    data: Sequence[str] | None = None,
    out_dir: Path | None = None,
    cp: int = 1,
    use_cache: bool = True,
) -> EvalReport:
    """Evaluate one checkpoint with a plan's tokenizer and data (`longctx eval run`).

    Default lengths: the base's and the stages' (up to `stage`) that fit the checkpoint's trained
    window (all of them with `extrapolate`). The plan's base model is the short-context reference."""
    if out_dir is not None:
        check_output_dir(Path(out_dir), option="--out", what="the evaluation's report and plots")
        refuse_write_into(Path(out_dir), Path(checkpoint), "--out")
    st = rp.stage(stage) if stage is not None else rp.stages[-1]
    upto = st.index if stage is not None else None
    info = checkpoint_info(checkpoint, rotary_base=rotary_base)
    if lengths:
        lens = sorted({int(n) for n in lengths})
    else:
        lens = [
            n
            for n in plan_lengths(rp, upto)
            if extrapolate or info.max_position is None or n <= info.max_position
        ]
        if not lens:
            raise EvalError(
                f"none of the plan's lengths fit the checkpoint's window ({info.max_position})",
                where=info.path,
                fix="give --lengths, or --extrapolate",
            )
    label = info.stage or Path(info.path).parent.parent.name or "checkpoint"
    expected = st.rotary_base if stage is not None else None
    refs = []
    base = _base_path(rp)
    is_base = base is not None and base.exists() and checkpoint_info(base).identity == info.identity
    if is_base:
        label = BASE_LABEL
    elif label == BASE_LABEL:  # another model's base: keep the plan's base the only "base"
        label = f"{BASE_LABEL}-{Path(info.path).name}"
    if not is_base and base_reference and base is not None and base.exists():
        refs.append(CheckpointRef(BASE_LABEL, base, passkey=False))
    refs.append(
        CheckpointRef(
            label,
            Path(checkpoint),
            rotary_base=rotary_base,
            allow_extrapolation=extrapolate,
            expected_rotary_base=expected,
            attention_scale=attention_scale,
        )
    )
    settings = settings or plan_settings(rp)
    report = evaluate_checkpoints(
        refs,
        lengths=lens,
        tokenizer=_plan_tokenizer(rp),
        heldout=heldout_for_stage(rp, st, data),
        settings=settings,
        short_length=int(rp.base.seq_length),
        cp=cp,
        cache_dir=_run_dir_cache(rp) if use_cache else None,
        plan=rp.name,
        stage=stage,
    )
    report.settings_origin = settings_origin(rp, settings)
    return write_outputs(report, out_dir or Path(rp.run_dir) / "eval" / label)


def _stderr_log(msg: str) -> None:
    print(f"[longctx eval] {msg}", file=sys.stderr, flush=True)
