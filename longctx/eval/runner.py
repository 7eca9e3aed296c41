"""Evaluate checkpoints: passkey grid, loss by position, short-context loss; write JSON and plots.

Entry points:

    evaluate_checkpoints(refs, lengths=…, tokenizer=…, heldout=…)  → EvalReport   (the engine)
    evaluate_path(rp, ckpt, stage=…)                                 → EvalReport   (`longctx eval run`)
    evaluate_finished_stage(rp, stage)                               → EvalReport   (after a local stage)
    summarize_plan(rp)                                               → EvalReport   (`longctx eval summary`)

Results per (checkpoint contents, length, settings, tokenizer, held-out data) are cached as JSON under
`<run_dir>/eval/cache/`, so the evaluation after the last stage re-uses what earlier stages measured
and only adds the new length and the new checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from longctx.errors import EvalError
from longctx.eval.data import HeldOut, heldout_for_stage
from longctx.eval.grid import PasskeyGrid, check_depths
from longctx.eval.load import CheckpointInfo, checkpoint_info, load_model
from longctx.eval.loss_position import loss_by_position, position_buckets
from longctx.eval.results import (
    METHOD_TEXT,
    CheckpointEval,
    EvalReport,
    LengthResult,
    PasskeyResult,
)
from longctx.eval.score import forwards_needed, model_scorer, score_passkey
from longctx.eval.settings import EvalSettings
from longctx.eval.short_context import ShortLoss, short_context_loss
from longctx.mcore.parallel import EvalParallel, eval_parallel, is_main_process
from longctx.util.fs import atomic_write_json
from longctx.util.progress import progress_bar

BASE_LABEL = "base"
# what runs after each local stage; `eval summary` and the demo use the same, so they re-use those results
STAGE_SETTINGS = EvalSettings()


@dataclasses.dataclass
class CheckpointRef:
    """A checkpoint to evaluate and how."""

    label: str
    path: Path
    rotary_base: int | None = None  # None: the base the checkpoint was trained with
    allow_extrapolation: bool = False  # evaluate lengths beyond its trained window
    lengths: list[int] | None = None  # None: the report's lengths
    passkey: bool = True  # False: only the short-context loss (a base reference)
    expected_rotary_base: int | None = None  # what the plan says; a difference becomes a note


class ResultCache:
    """JSON results keyed by everything that determines them; `root=None` disables caching."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def get(self, key: str) -> dict[str, Any] | None:
        if self.root is None:
            return None
        path = self.root / f"{key}.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def put(self, key: str, obj: Any) -> None:
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.root / f"{key}.json", obj)


def _key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


def check_length(info: CheckpointInfo, length: int, *, allow_extrapolation: bool, cp: int) -> bool:
    """Raise EvalError for lengths this checkpoint cannot be evaluated at; True when extrapolating."""
    if length < 2:
        raise EvalError(f"length {length} is too short to evaluate")
    if cp > 1 and length % (2 * cp):
        raise EvalError(
            f"length {length} does not split into 2·CP = {2 * cp} equal chunks (CP = {cp})",
            fix=f"use lengths that are multiples of {2 * cp}",
        )
    beyond = info.max_position is not None and length > info.max_position
    if beyond and not allow_extrapolation:
        raise EvalError(
            f"length {length} is above the checkpoint's max position {info.max_position} (its trained window)",
            where=info.path,
            fix=f"evaluate at lengths ≤ {info.max_position}, or pass --extrapolate to measure RoPE beyond it",
        )
    return beyond


def check_tokenizer(info: CheckpointInfo, tokenizer: Any) -> None:
    if info.tokenizer_md5 and tokenizer.md5 != info.tokenizer_md5:
        raise EvalError(
            f"the tokenizer (md5 {tokenizer.md5}) is not the one the checkpoint was trained with "
            f"(md5 {info.tokenizer_md5})",
            where=info.path,
            fix="evaluate with the plan whose tokenizer trained this checkpoint",
        )
    if tokenizer.vocab_size > info.padded_vocab_size:
        raise EvalError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, the model only {info.padded_vocab_size} rows",
            where=info.path,
            fix="evaluate with the checkpoint's own tokenizer",
        )


@dataclasses.dataclass
class _Context:
    tokenizer: Any
    heldout: HeldOut
    settings: EvalSettings
    short_length: int
    parallel: EvalParallel
    cache: ResultCache
    grid: PasskeyGrid
    notes: list[str]


def _evaluate_one(ref: CheckpointRef, lengths: Sequence[int], ctx: _Context) -> CheckpointEval:
    t0 = time.perf_counter()
    s = ctx.settings
    info = checkpoint_info(ref.path, rotary_base=ref.rotary_base)
    check_tokenizer(info, ctx.tokenizer)
    if (
        ref.expected_rotary_base is not None
        and ref.rotary_base is None
        and info.rotary_base != ref.expected_rotary_base
    ):
        ctx.notes.append(
            f"{ref.label}: the checkpoint's rotary base {info.rotary_base:,} differs from the "
            f"plan's {ref.expected_rotary_base:,}; evaluated with the checkpoint's"
        )
    lens = list(ref.lengths if ref.lengths is not None else lengths) if ref.passkey else []
    extrapolated = {n: check_length(info, n, allow_extrapolation=ref.allow_extrapolation, cp=ctx.parallel.cp)
                    for n in lens}  # fmt: skip
    common = (info.identity, info.rotary_base, ctx.tokenizer.md5, ctx.heldout.identity(), ctx.parallel.cp)
    out = CheckpointEval(label=ref.label, checkpoint=info.to_json(), trained_length=info.max_position,
                         rotary_base=info.rotary_base)  # fmt: skip
    todo: list[int] = []
    results: dict[int, LengthResult] = {}
    for n in lens:
        hit = ctx.cache.get(_key("length", n, s.fingerprint(*common)))
        if hit is not None:
            results[n] = LengthResult.model_validate(hit)
            out.cached.append(str(n))
        else:
            todo.append(n)
    short_key = _key("short", ctx.short_length, s.fingerprint(*common))
    short: ShortLoss | None = None
    if s.short_docs > 0:
        hit = ctx.cache.get(short_key)
        if hit is not None:
            short = ShortLoss.model_validate(hit)
            out.cached.append("short")
    need_short = s.short_docs > 0 and short is None
    if todo or need_short:
        items = {n: ctx.grid.grid([n], s.depths, s.keys_per_cell) for n in todo}
        loss_docs = {n: ctx.heldout.long_documents(n, s.loss_docs) for n in todo}
        short_docs = ctx.heldout.short_documents(ctx.short_length, s.short_docs) if need_short else []
        total = sum(forwards_needed(v) for v in items.values()) + sum(len(d[0]) for d in loss_docs.values())
        total += len(short_docs)
        loaded = load_model(info, ctx.parallel, max_length=max([*todo, ctx.short_length]))
        score = model_scorer(loaded)
        with progress_bar(f"eval {ref.label}", total, unit="forwards") as advance:
            for n in todo:
                t1 = time.perf_counter()
                scores = score_passkey(items[n], score, batch_size=s.batch_size, advance=advance)
                natural = sum(it.natural for it in items[n]) / len(items[n])
                docs, packed = loss_docs[n]
                if packed:
                    ctx.notes.append(
                        f"loss by position at {n}: no held-out document is {n} tokens long; "
                        "held-out documents were packed back to back (positions are sample positions)"
                    )
                position = loss_by_position(score, docs, buckets=position_buckets(n, kind=s.buckets, first=s.bucket_first),
                                            packed=packed, batch_size=s.batch_size, advance=advance)  # fmt: skip
                results[n] = LengthResult(
                    length=n, extrapolated=extrapolated[n], position=position,
                    passkey=PasskeyResult.from_items(n, s.distractors, scores, natural),
                    seconds=time.perf_counter() - t1,
                )  # fmt: skip
                if ctx.parallel.is_main:
                    ctx.cache.put(
                        _key("length", n, s.fingerprint(*common)), results[n].model_dump(mode="json")
                    )
            if need_short:
                short = short_context_loss(score, short_docs, length=ctx.short_length, batch_size=s.batch_size,
                                           cp=ctx.parallel.cp, advance=advance)  # fmt: skip
                if ctx.parallel.is_main:
                    ctx.cache.put(short_key, short.model_dump(mode="json"))
        del loaded, score
    for n in lens:
        r = results[n]
        r.extrapolated = extrapolated[n]  # cached results keep the flag current
        out.results.append(r)
    out.short = short
    out.seconds = time.perf_counter() - t0
    return out


def evaluate_checkpoints(
    refs: Sequence[CheckpointRef],
    *,
    lengths: Sequence[int],
    tokenizer: Any,
    heldout: HeldOut,
    settings: EvalSettings | None = None,
    short_length: int,
    cp: int = 1,
    cache_dir: Path | None = None,
    plan: str | None = None,
    stage: str | None = None,
    log: Callable[[str], None] | None = None,
) -> EvalReport:
    """Evaluate every checkpoint at `lengths` (each ref may narrow them); the ref labelled `base`
    is the reference for the short-context regression."""
    t0 = time.perf_counter()
    s = settings or EvalSettings()
    check_depths(s.depths)
    lengths = sorted({int(n) for n in lengths})
    if not refs:
        raise EvalError("no checkpoints to evaluate")
    if cp > 1:
        for n in lengths:
            if n % (2 * cp):
                raise EvalError(
                    f"length {n} does not split into 2·CP = {2 * cp} equal chunks (CP = {cp})",
                    fix=f"use lengths that are multiples of {2 * cp}",
                )
    filler = heldout.filler_tokens(2 * max(lengths, default=0)) if s.filler == "heldout" else None
    grid = PasskeyGrid(tokenizer, seed=s.seed, key_digits=s.key_digits, distractors=s.distractors,
                       filler=s.filler, heldout_tokens=filler)  # fmt: skip
    notes: list[str] = []
    evals: list[CheckpointEval] = []
    with eval_parallel(cp) as par:
        ctx = _Context(tokenizer, heldout, s, short_length, par, ResultCache(cache_dir), grid, notes)
        for ref in refs:
            if log is not None:
                log(f"evaluating {ref.label}: {ref.path}")
            evals.append(_evaluate_one(ref, lengths, ctx))
    base = next((e for e in evals if e.label == BASE_LABEL and e.short is not None), None)
    for e in evals:
        if base is not None and e.short is not None:
            e.short_delta_vs_base = e.short.loss - base.short.loss  # type: ignore[union-attr]
    unnatural = [f"{e.label}@{r.length}" for e in evals for r in e.results if r.passkey.natural < 1.0]
    if unnatural:
        notes.append(
            "some passkey items cut a filler sentence right before the question (few tokens left "
            f"after the needle): {', '.join(unnatural)}"
        )
    return EvalReport(
        plan=plan, stage=stage, settings=s, method=METHOD_TEXT.format(n=s.distractors), lengths=lengths,
        checkpoints=evals,
        heldout={"prefixes": heldout.prefixes, "split": heldout.split,
                 "held_out_documents": heldout.count()},
        notes=list(dict.fromkeys(notes)), seconds=time.perf_counter() - t0,
    )  # fmt: skip


def write_outputs(report: EvalReport, out_dir: Path) -> EvalReport:
    """report.json, niah.png, loss_by_position.png, summary.md under `out_dir` (atomically)."""
    from longctx.eval.plots import plot_loss_by_position, plot_niah
    from longctx.eval.render import markdown_table
    from longctx.util.fs import atomic_write_text

    report.out_dir = str(out_dir)
    if not is_main_process():
        return report
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, str] = {}
    if any(ce.results for ce in report.checkpoints):
        plots["niah"] = str(plot_niah(report, out_dir / "niah.png"))
        plots["loss_by_position"] = str(plot_loss_by_position(report, out_dir / "loss_by_position.png"))
    report.plots = plots
    atomic_write_text(out_dir / "summary.md", markdown_table(report))
    atomic_write_json(out_dir / "report.json", report.model_dump(mode="json"))
    return report


# -- plans -----------------------------------------------------------------------------------------


def plan_lengths(rp: Any, upto: int | None = None) -> list[int]:
    """The base's length and each stage's (up to stage index `upto`)."""
    stages = rp.stages if upto is None else rp.stages[: upto + 1]
    return sorted({int(rp.plan.base.seq_length), *(int(s.seq_length) for s in stages)})


def _plan_tokenizer(rp: Any) -> Any:
    from longctx.plan import paths
    from longctx.tokenizer import load_tokenizer

    return load_tokenizer(paths.resolve(rp.plan.tokenizer.path, rp.plan, field="tokenizer.path"))


def _base_path(rp: Any) -> Path | None:
    from longctx.plan import paths

    if rp.plan.base.path is None:
        return None
    return paths.resolve(rp.plan.base.path, rp.plan, field="base.path")


def _has_checkpoint(save_dir: Path) -> bool:
    from longctx.checkpoint.layout import read_tracker

    try:
        return read_tracker(save_dir) is not None
    except Exception:  # a garbage tracker: the stage has no usable checkpoint
        return False


def _ladder_refs(rp: Any, upto: int, notes: list[str], base: Path | None = None) -> list[CheckpointRef]:
    """Base + stages[0..upto], each allowed to extrapolate (the comparison is the point)."""
    refs: list[CheckpointRef] = []
    base = base or _base_path(rp)
    if base is not None and base.exists():
        refs.append(CheckpointRef(BASE_LABEL, base, allow_extrapolation=True,
                                  expected_rotary_base=int(rp.plan.base.rotary_base)))  # fmt: skip
    else:
        notes.append(f"the base checkpoint ({base or rp.plan.base.hub_id}) is not on disk; not evaluated")
    for st in rp.stages[: upto + 1]:
        if _has_checkpoint(st.save_dir):
            refs.append(CheckpointRef(st.name, st.save_dir, allow_extrapolation=True,
                                      expected_rotary_base=st.rotary_base))  # fmt: skip
        else:
            notes.append(f"stage {st.name} has no finished checkpoint in {st.save_dir}; not evaluated")
    return refs


def _run_dir_cache(rp: Any) -> Path:
    return Path(rp.run_dir) / "eval" / "cache"


def evaluate_finished_stage(
    rp: Any, stage_name: str, *, settings: EvalSettings | None = None, echo: bool = True
) -> EvalReport:
    """Evaluate a finished stage against the base and the earlier stages at every length so far.

    Writes `<run_dir>/stages/<stage>/eval/{report.json, niah.png, loss_by_position.png, summary.md}`;
    results measured by earlier stages' evaluations are re-used from the cache.
    """
    from longctx.plan import paths

    st = rp.stage(stage_name)  # PlanError naming the stages for unknown names
    if not _has_checkpoint(st.save_dir):
        raise EvalError(f"stage {stage_name} has no finished checkpoint", where=str(st.save_dir),
                        fix="finish the stage first (longctx stage run), then evaluate it")  # fmt: skip
    notes: list[str] = []
    refs = _ladder_refs(rp, st.index, notes)
    log = _stderr_log if echo else None
    report = evaluate_checkpoints(
        refs, lengths=plan_lengths(rp, st.index), tokenizer=_plan_tokenizer(rp), heldout=heldout_for_stage(rp, st),
        settings=settings or STAGE_SETTINGS, short_length=int(rp.plan.base.seq_length), cache_dir=_run_dir_cache(rp),
        plan=rp.plan.name, stage=stage_name, log=log,
    )  # fmt: skip
    report.notes = notes + report.notes
    write_outputs(report, paths.stage_dir(rp.plan, stage_name) / "eval")
    if echo and is_main_process():
        from longctx.eval.render import print_report

        print_report(report, stderr=True)
    return report


def summarize_plan(
    rp: Any,
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
    notes: list[str] = []
    refs = _ladder_refs(rp, len(rp.stages) - 1, notes, base)
    if not refs:
        raise EvalError("no checkpoint of this plan is on disk yet", where=str(rp.run_dir),
                        fix="run the stages first (longctx stage run --until-done)")  # fmt: skip
    last = rp.stages[-1]
    report = evaluate_checkpoints(
        refs, lengths=list(lengths) if lengths else plan_lengths(rp), tokenizer=_plan_tokenizer(rp),
        heldout=heldout_for_stage(rp, last, data), settings=settings, short_length=int(rp.plan.base.seq_length),
        cp=cp, cache_dir=_run_dir_cache(rp) if use_cache else None, plan=rp.plan.name, stage=None,
    )  # fmt: skip
    report.notes = notes + report.notes
    return write_outputs(report, out_dir or Path(rp.run_dir) / "eval" / "summary")


def demo_summary(
    rp: Any, *, base: Path | None = None, settings: EvalSettings | None = None
) -> dict[str, Any]:
    """The demo's evaluation step: `summarize_plan` with the per-stage settings (so everything the
    stages measured is re-used), as a JSON-able dict with the table, plots and a Markdown rendering."""
    from longctx.eval.render import markdown_table

    report = summarize_plan(rp, settings=settings or STAGE_SETTINGS, base=base)
    return {
        "lengths": report.lengths,
        "method": report.method,
        "table": report.table(),
        "plots": report.plots,
        "out_dir": report.out_dir,
        "report": str(Path(report.out_dir or "") / "report.json"),
        "notes": report.notes,
        "markdown": markdown_table(report),
    }


def render_summary(summary: dict[str, Any], console: Any) -> None:
    """Print a `demo_summary` result on a rich console: the table, the notes, the plot paths."""
    from longctx.eval.render import report_table

    report = EvalReport.model_validate_json(Path(summary["report"]).read_text(encoding="utf-8"))
    console.print(report_table(report))
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    for name, path in report.plots.items():
        console.print(f"{name}: {path}", highlight=False, soft_wrap=True)


def evaluate_path(
    rp: Any,
    checkpoint: Path,
    *,
    stage: str | None = None,
    lengths: Sequence[int] | None = None,
    settings: EvalSettings | None = None,
    rotary_base: int | None = None,
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
            raise EvalError(f"none of the plan's lengths fit the checkpoint's window ({info.max_position})",
                            where=info.path, fix="give --lengths, or --extrapolate")  # fmt: skip
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
    refs.append(CheckpointRef(label, Path(checkpoint), rotary_base=rotary_base, allow_extrapolation=extrapolate,
                              expected_rotary_base=expected))  # fmt: skip
    report = evaluate_checkpoints(
        refs, lengths=lens, tokenizer=_plan_tokenizer(rp), heldout=heldout_for_stage(rp, st, data),
        settings=settings, short_length=int(rp.plan.base.seq_length), cp=cp,
        cache_dir=_run_dir_cache(rp) if use_cache else None, plan=rp.plan.name, stage=stage,
    )  # fmt: skip
    return write_outputs(report, out_dir or Path(rp.run_dir) / "eval" / label)


def _stderr_log(msg: str) -> None:
    print(f"[longctx eval] {msg}", file=sys.stderr, flush=True)
