"""The evaluation engine: a list of checkpoints → passkey grid, loss by position and short-context loss
per checkpoint, as one EvalReport; `write_outputs` puts it on disk with its plots.

    evaluate_checkpoints(refs, lengths=…, tokenizer=…, heldout=…)  → EvalReport
    write_outputs(report, out_dir)                                   → EvalReport (report.json, plots, summary.md)

Results per (checkpoint contents, length, settings, tokenizer, held-out data) are cached as JSON in a
`ResultCache`; a checkpoint whose results are all cached is not even loaded. Within a length, each part
(the passkey grid with the loss by position, the packed windows, each needle task) is kept as it is
measured, so an evaluation stopped mid-length resumes after the last part it finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longctx.errors import EvalError
from longctx.eval.accuracy import paired_delta_interval
from longctx.eval.data import HeldOut
from longctx.eval.grid import PasskeyGrid, PasskeyItem, check_depths
from longctx.eval.infill import context_elbo, elbo_contexts, model_infiller, score_infill
from longctx.eval.load import CheckpointInfo, checkpoint_info, load_model
from longctx.eval.loss_position import (
    PackedLoss,
    loss_by_position,
    packed_loss_by_position,
    packed_windows,
    position_buckets,
)
from longctx.eval.plots import plot_elbo_by_context, plot_loss_by_position, plot_niah
from longctx.eval.prefix_extend import PrefixExtender, prefix_extender
from longctx.eval.progress import Cell, EvalProgress, length_cells, short_cell, silent
from longctx.eval.report_tables import markdown_table
from longctx.eval.results import (
    METHOD_TEXT,
    CheckpointEval,
    EvalReport,
    LengthResult,
    PasskeyResult,
)
from longctx.eval.score import ScoreFn, forwards_needed, model_scorer, score_passkey
from longctx.eval.settings import EvalSettings
from longctx.eval.short_context import ShortLoss, short_context_loss
from longctx.eval.task_results import TaskResult
from longctx.eval.task_run import TaskItems, run_causal_tasks, run_infill_tasks, task_items
from longctx.eval.unmask import InfillFn
from longctx.mcore.attention_scale import scale_attention_logits
from longctx.mcore.parallel import EvalParallel, eval_parallel, is_main_process
from longctx.objective import Objective
from longctx.tokenizer.load import LoadedTokenizer
from longctx.util.confine import check_output_dir
from longctx.util.fs import atomic_write_json, atomic_write_text
from longctx.util.progress import progress_bar

# the reference model of the short-context regression
BASE_LABEL = "base"


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
    attention_scale: float = 1.0  # attention logits × this (longctx.mcore.attention_scale): a diagnostic


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

    def discard(self, key: str) -> None:
        if self.root is not None:
            (self.root / f"{key}.json").unlink(missing_ok=True)


def _key(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


# 16M tokens: beyond every released context window (and the filler needed for it is built in memory)
MAX_EVAL_LENGTH = 1 << 24


def check_length(info: CheckpointInfo, length: int, *, allow_extrapolation: bool, cp: int) -> bool:
    """Raise EvalError for lengths this checkpoint cannot be evaluated at; True when extrapolating."""
    if length < 2:
        raise EvalError(
            f"length {length} is too short to evaluate",
            where="--lengths",
            fix="use lengths of at least 64 tokens",
        )
    if length > MAX_EVAL_LENGTH:
        raise EvalError(
            f"length {length:,} is beyond what longctx evaluates ({MAX_EVAL_LENGTH:,} tokens)",
            where="--lengths",
            fix=f"evaluate at lengths up to {MAX_EVAL_LENGTH:,} (16M) tokens",
        )
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


def check_tokenizer(info: CheckpointInfo, tokenizer: LoadedTokenizer) -> None:
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
    """What every checkpoint of one report is evaluated with."""

    tokenizer: LoadedTokenizer
    heldout: HeldOut
    settings: EvalSettings
    short_length: int
    parallel: EvalParallel
    cache: ResultCache
    grid: PasskeyGrid
    notes: list[str]
    progress: EvalProgress = dataclasses.field(default_factory=silent)


@dataclasses.dataclass
class _Job:
    """One checkpoint's evaluation: its info, its lengths, and the fingerprint its cached results carry."""

    ref: CheckpointRef
    info: CheckpointInfo
    lens: list[int]
    extrapolated: dict[int, bool]
    fingerprint: str

    def length_key(self, n: int) -> str:
        return _key("length", n, self.fingerprint)

    def short_key(self, short_length: int) -> str:
        return _key("short", short_length, self.fingerprint)

    def partial_key(self, n: int) -> str:
        """A length's parts measured so far (stopped before its last task)."""
        return _key("length-partial", n, self.fingerprint)


@dataclasses.dataclass
class _Pending:
    """A checkpoint read, its cached results taken, and what is still to measure."""

    job: _Job
    out: CheckpointEval
    results: dict[int, LengthResult]
    todo: list[int]
    short: ShortLoss | None
    need_short: bool
    partial: dict[int, LengthResult] = dataclasses.field(default_factory=dict)

    def cells(self, ctx: _Context) -> list[Cell]:
        """What `_measure` will measure, for the progress count."""
        s, label = ctx.settings, self.job.ref.label
        causal = self.job.info.objective == "ar"
        packed = causal and s.packed_windows > 0 and ctx.tokenizer.eod_id is not None
        cells = [
            c
            for n in self.todo
            for c in length_cells(label, n, s, causal=causal, packed=packed)
            if not _part_done(self.partial.get(n), c.what)
        ]
        return cells + ([short_cell(label, s, ctx.short_length)] if self.need_short else [])


def _part_done(r: LengthResult | None, what: str) -> bool:
    """Whether a partial result of a length holds the part `what` (a progress cell's name)."""
    if r is None:
        return False
    if what in ("passkey", "loss by position"):  # measured and kept together
        return True
    if what == "packed windows":
        return r.packed is not None
    return r.task(what) is not None


def _prepare(ref: CheckpointRef, lengths: Sequence[int], ctx: _Context) -> _Pending:
    """Read the checkpoint and take what the cache holds; nothing is loaded yet."""
    job = _start_job(ref, lengths, ctx)
    info = job.info
    out = CheckpointEval(
        label=ref.label,
        checkpoint=info.to_json(),
        trained_length=info.max_position,
        rotary_base=info.rotary_base,
    )
    results, todo = _cached_lengths(job, ctx, out.cached)
    short = _cached_short(job, ctx, out.cached)
    need_short = ctx.settings.short_docs > 0 and short is None and info.objective == "ar"
    partial = {}
    for n in todo if info.objective == "ar" else []:
        hit = ctx.cache.get(job.partial_key(n))
        if hit is not None:
            partial[n] = LengthResult.model_validate(hit)
    return _Pending(job, out, results, todo, short, need_short, partial)


def _evaluate_one(pending: _Pending, ctx: _Context) -> CheckpointEval:
    """The model is loaded only for what the cache does not hold."""
    t0 = time.perf_counter()
    job, out, results, short = pending.job, pending.out, pending.results, pending.short
    if pending.todo or pending.need_short:
        measured_short = _measure(job, pending, ctx, results)
        if pending.need_short:
            short = measured_short
    for n in job.lens:
        r = results[n]
        r.extrapolated = job.extrapolated[n]  # cached results keep the flag current
        out.results.append(r)
    out.short = short
    out.seconds = time.perf_counter() - t0
    return out


def _start_job(ref: CheckpointRef, lengths: Sequence[int], ctx: _Context) -> _Job:
    """Read the checkpoint and check it against the tokenizer and the lengths; a rotary base other than
    the plan's becomes a note."""
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
    extrapolated = {
        n: check_length(info, n, allow_extrapolation=ref.allow_extrapolation, cp=ctx.parallel.cp)
        for n in lens
    }
    common = (info.identity, info.rotary_base, ctx.tokenizer.md5, ctx.heldout.identity(), ctx.parallel.cp)
    if ref.attention_scale != 1.0:  # a scaled model is another model; unscaled results keep their keys
        common += (f"attention×{ref.attention_scale!r}",)
        ctx.notes.append(
            f"{ref.label}: evaluated with its attention logits × {ref.attention_scale:g} (--attention-scale)"
        )
    return _Job(ref, info, lens, extrapolated, ctx.settings.fingerprint(*common))


def _cached_lengths(job: _Job, ctx: _Context, cached: list[str]) -> tuple[dict[int, LengthResult], list[int]]:
    """The lengths the cache holds (their names appended to `cached`), and the lengths still to measure."""
    results: dict[int, LengthResult] = {}
    todo: list[int] = []
    for n in job.lens:
        hit = ctx.cache.get(job.length_key(n))
        if hit is not None:
            results[n] = LengthResult.model_validate(hit)
            cached.append(str(n))
        else:
            todo.append(n)
    return results, todo


def _cached_short(job: _Job, ctx: _Context, cached: list[str]) -> ShortLoss | None:
    if not ctx.settings.short_docs > 0:
        return None
    hit = ctx.cache.get(job.short_key(ctx.short_length))
    if hit is None:
        return None
    cached.append("short")
    return ShortLoss.model_validate(hit)


def _measure(
    job: _Job, pending: _Pending, ctx: _Context, results: dict[int, LengthResult]
) -> ShortLoss | None:
    """Load the model once and measure the lengths still to do (into `results`) and, when asked, the short
    loss (returned); each result is cached as soon as it is measured."""
    s, todo, partial = ctx.settings, pending.todo, pending.partial
    if job.info.objective != "ar":
        _measure_diffusion(job, todo, ctx, results)
        return None
    # every length's items are drawn, measured or not, so the grid's draws do not depend on the cache
    items = {n: ctx.grid.grid([n], s.depths, s.keys_per_cell) for n in todo}
    tasks = {n: task_items(ctx.grid, s, n) for n in todo}
    loss_docs = {n: ctx.heldout.long_documents(n, s.loss_docs) for n in todo}
    short_docs = ctx.heldout.short_documents(ctx.short_length, s.short_docs) if pending.need_short else []
    windows = _packed_windows(todo, ctx)
    total = len(short_docs)
    for n in todo:
        done = partial.get(n)
        total += 0 if done else forwards_needed(items[n]) + len(loss_docs[n][0])
        total += 0 if _part_done(done, "packed windows") else 2 * len(windows.get(n, []))
        total += sum(len(v) for name, v in tasks[n].items() if not _part_done(done, name))
    loaded = load_model(job.info, ctx.parallel, max_length=max([*todo, ctx.short_length]))
    scale_attention_logits(loaded.model, job.ref.attention_scale)
    score = model_scorer(loaded)
    eod = ctx.tokenizer.eod_id
    within = model_scorer(loaded, eod=eod) if eod is not None else None
    scorers = _Scorers(score, within, prefix_extender(loaded))
    short: ShortLoss | None = None
    label = job.ref.label
    with progress_bar(f"eval {label}", total, unit="forwards") as advance:
        for n in todo:
            work = (items[n], loss_docs[n], windows.get(n), tasks[n])
            results[n] = _measure_parts(job, n, partial.get(n), work, scorers, advance, ctx)
            if ctx.parallel.is_main:
                ctx.cache.put(job.length_key(n), results[n].model_dump(mode="json"))
                ctx.cache.discard(job.partial_key(n))
        if pending.need_short:
            short = short_context_loss(
                score,
                short_docs,
                length=ctx.short_length,
                batch_size=s.batch_size,
                cp=ctx.parallel.cp,
                advance=advance,
            )
            ctx.progress.finished(label, ctx.short_length, "short-context loss")
            if ctx.parallel.is_main:
                ctx.cache.put(job.short_key(ctx.short_length), short.model_dump(mode="json"))
    return short


@dataclasses.dataclass(frozen=True)
class _Scorers:
    score: ScoreFn  # whole sequences
    within: ScoreFn | None  # attention within the documents between EOD tokens
    extend: PrefixExtender | None  # greedy generation's later rounds over the answer positions only


def _measure_parts(
    job: _Job,
    n: int,
    done: LengthResult | None,
    work: tuple[list[PasskeyItem], tuple[list[np.ndarray], bool], list[np.ndarray] | None, TaskItems],
    scorers: _Scorers,
    advance: Callable[..., None],
    ctx: _Context,
) -> LengthResult:
    """The parts of length `n` that `done` (a partial result from the cache) lacks, each kept as a partial
    result once measured: at 128K one needle task can take an hour of a job's time limit."""
    items, loss_docs, windows, tasks = work
    score, within = scorers.score, scorers.within
    label, eod = job.ref.label, ctx.tokenizer.eod_id

    def keep(r: LengthResult) -> None:
        if ctx.parallel.is_main:
            ctx.cache.put(job.partial_key(n), r.model_dump(mode="json"))

    r = done
    if r is None:
        r = _measure_length(job, n, items, loss_docs, score, advance, ctx)
        r.tasks = []
        keep(r)
    if within is not None and eod is not None and windows is not None and r.packed is None:
        r.packed = _measure_packed(n, windows, score, within, eod, advance, ctx)
        ctx.progress.finished(label, n, "packed windows")
        keep(r)
    for name, task in tasks.items():  # one task at a time: a progress line each
        if r.task(name) is not None:
            continue
        r.tasks += run_causal_tasks(
            {name: task},
            n,
            score,
            ctx.tokenizer,
            batch_size=ctx.settings.batch_size,
            advance=advance,
            extend=scorers.extend,
        )
        ctx.progress.finished(label, n, name)
        keep(r)
    return r


def _measure_diffusion(job: _Job, todo: list[int], ctx: _Context, results: dict[int, LengthResult]) -> None:
    """A diffusion model at the lengths in `todo`: passkey by infilling and the ELBO by context
    (`longctx.eval.infill`); next-token losses mean nothing for it, so no loss by position or short loss."""
    s, info = ctx.settings, job.info
    items = {n: ctx.grid.grid([n], s.depths, s.keys_per_cell, closed=True) for n in todo}
    tasks = {n: task_items(ctx.grid, s, n, closed=True) for n in todo}
    docs = {n: ctx.heldout.long_documents(n, s.loss_docs)[0] for n in todo}
    contexts = {n: elbo_contexts(n, s.elbo_window) for n in todo}
    total = sum(len(v) for v in items.values()) + sum(len(docs[n]) * len(contexts[n]) for n in todo)
    total += _task_count(tasks)
    loaded = load_model(info, ctx.parallel, max_length=max(todo))
    scale_attention_logits(loaded.model, job.ref.attention_scale)
    infill = model_infiller(loaded, ctx.tokenizer.vocab_size)
    with progress_bar(f"eval {job.ref.label}", total, unit="forwards") as advance:
        for n in todo:
            results[n] = _diffusion_length(
                job, n, (items[n], tasks[n], docs[n], contexts[n]), infill, advance, ctx
            )
            if ctx.parallel.is_main:
                ctx.cache.put(job.length_key(n), results[n].model_dump(mode="json"))
    ctx.notes.append(
        f"{job.ref.label} is a {info.objective} model: passkey by infilling the restated key, and the ELBO of a "
        f"{s.elbo_window}-token window by its clean context instead of the loss by position"
    )


def _diffusion_length(
    job: _Job,
    n: int,
    what: tuple[list[PasskeyItem], TaskItems, list[np.ndarray], list[int]],
    infill: InfillFn,
    advance: Callable[..., None],
    ctx: _Context,
) -> LengthResult:
    """One length of a diffusion model: the passkey grid, the ELBO by context, the needle tasks."""
    s, info, label = ctx.settings, job.info, job.ref.label
    items, tasks, docs, contexts = what
    vocab = ctx.tokenizer.vocab_size
    objective = Objective(kind=info.objective, mask_id=info.mask_id if info.objective == "mdm" else None)
    t1 = time.perf_counter()
    scores = score_infill(
        items,
        infill,
        kind=objective.kind,
        mask_id=objective.mask_id,
        vocab_size=vocab,
        seed=s.seed,
        threshold=s.infill_threshold,
        batch_size=s.batch_size,
        advance=advance,
    )
    ctx.progress.finished(label, n, "passkey")
    elbo = context_elbo(
        docs,
        infill,
        objective=objective,
        vocab_size=vocab,
        window=s.elbo_window,
        contexts=contexts,
        t_levels=s.elbo_levels,
        seed=s.seed,
        advance=advance,
    )
    ctx.progress.finished(label, n, "elbo by context")
    done: list[TaskResult] = []
    for name, task in tasks.items():  # one task at a time: a progress line each
        done += run_infill_tasks(
            {name: task},
            n,
            infill,
            ctx.tokenizer,
            objective=objective,
            seed=s.seed,
            threshold=s.infill_threshold,
            batch_size=s.batch_size,
            advance=advance,
        )
        ctx.progress.finished(label, n, name)
    return LengthResult(
        length=n,
        extrapolated=job.extrapolated[n],
        position=None,
        context_elbo=elbo,
        objective=objective.kind,
        seconds=time.perf_counter() - t1,
        passkey=PasskeyResult.from_items(
            n, s.distractors, scores, sum(it.natural for it in items) / len(items)
        ),
        tasks=done,
    )


def _task_count(tasks: dict[int, TaskItems]) -> int:
    """Items of the needle tasks (one forward each when answered right; generation may take more)."""
    return sum(len(items) for by_task in tasks.values() for items in by_task.values())


def _packed_windows(todo: list[int], ctx: _Context) -> dict[int, list[np.ndarray]]:
    """The packed windows per length (none when disabled or the tokenizer has no end-of-document id)."""
    s = ctx.settings
    eod = ctx.tokenizer.eod_id
    if s.packed_windows == 0 or not todo:
        return {}
    if eod is None:
        ctx.notes.append(
            "no packed-window loss: the tokenizer has no end-of-document id to separate documents"
        )
        return {}
    return {
        n: packed_windows(
            ctx.heldout.shuffled_documents(s.seed, eod=eod), n, s.packed_windows, eod=eod, seed=s.seed
        )
        for n in todo
    }


def _measure_packed(
    n: int,
    windows: list[np.ndarray],
    score: ScoreFn,
    within: ScoreFn,
    eod: int,
    advance: Callable[..., None],
    ctx: _Context,
) -> PackedLoss:
    s = ctx.settings
    return packed_loss_by_position(
        score,
        within,
        windows,
        eod=eod,
        batch_size=s.batch_size,
        advance=advance,
        buckets=position_buckets(n, kind=s.buckets, first=s.bucket_first),
    )


def _measure_length(
    job: _Job,
    n: int,
    items: list[PasskeyItem],
    loss_docs: tuple[list[np.ndarray], bool],
    score: ScoreFn,
    advance: Callable[..., None],
    ctx: _Context,
) -> LengthResult:
    """The passkey grid and the loss by position at length `n`."""
    s = ctx.settings
    t1 = time.perf_counter()
    scores = score_passkey(items, score, batch_size=s.batch_size, advance=advance)
    ctx.progress.finished(job.ref.label, n, "passkey")
    natural = sum(it.natural for it in items) / len(items)
    docs, packed = loss_docs
    if packed:
        ctx.notes.append(
            f"loss by position at {n}: no held-out document is {n} tokens long; "
            "held-out documents were packed back to back (positions are sample positions)"
        )
    position = loss_by_position(
        score,
        docs,
        buckets=position_buckets(n, kind=s.buckets, first=s.bucket_first),
        packed=packed,
        batch_size=s.batch_size,
        advance=advance,
    )
    ctx.progress.finished(job.ref.label, n, "loss by position")
    return LengthResult(
        length=n,
        extrapolated=job.extrapolated[n],
        position=position,
        passkey=PasskeyResult.from_items(n, s.distractors, scores, natural),
        seconds=time.perf_counter() - t1,
    )


def _check_refs(refs: Sequence[CheckpointRef], lengths: Sequence[int], cp: int) -> None:
    for ref in refs:
        info = checkpoint_info(ref.path, rotary_base=ref.rotary_base)
        for n in (ref.lengths if ref.lengths is not None else lengths) if ref.passkey else []:
            check_length(info, n, allow_extrapolation=ref.allow_extrapolation, cp=cp)


def evaluate_checkpoints(
    refs: Sequence[CheckpointRef],
    *,
    lengths: Sequence[int],
    tokenizer: LoadedTokenizer,
    heldout: HeldOut,
    settings: EvalSettings | None = None,
    short_length: int,
    cp: int = 1,
    cache_dir: Path | None = None,
    plan: str | None = None,
    stage: str | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = True,
) -> EvalReport:
    """Evaluate every checkpoint at `lengths` (each ref may narrow them); the ref labelled `base`
    is the reference for the short-context regression. `progress`: a line on stderr per measured cell
    (`longctx.eval.progress`; LONGCTX_NO_PROGRESS=1 silences it too)."""
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
    _check_refs(refs, lengths, cp)  # every checkpoint and length before the first one is scored
    filler = heldout.filler_tokens(2 * max(lengths, default=0)) if s.filler == "heldout" else None
    grid = PasskeyGrid(
        tokenizer,
        seed=s.seed,
        key_digits=s.key_digits,
        distractors=s.distractors,
        filler=s.filler,
        heldout_tokens=filler,
        any_digit_keys=s.any_digit_keys,
    )
    notes: list[str] = []
    evals: list[CheckpointEval] = []
    with eval_parallel(cp) as par:
        ctx = _Context(tokenizer, heldout, s, short_length, par, ResultCache(cache_dir), grid, notes)
        pending = [_prepare(ref, lengths, ctx) for ref in refs]  # the whole count before the first cell
        ctx.progress = EvalProgress(
            [c for p in pending for c in p.cells(ctx)],
            cached=sum(len(p.out.cached) for p in pending),
            enabled=par.is_main and progress,
        )
        for p in pending:
            if log is not None:
                log(f"evaluating {p.job.ref.label}: {p.job.ref.path}")
            evals.append(_evaluate_one(p, ctx))
    _short_deltas(evals)
    unnatural = [f"{e.label}@{r.length}" for e in evals for r in e.results if r.passkey.natural < 1.0]
    if unnatural:
        notes.append(
            "some passkey items cut a filler sentence right before the question (few tokens left "
            f"after the needle): {', '.join(unnatural)}"
        )
    return EvalReport(
        plan=plan,
        stage=stage,
        settings=s,
        method=METHOD_TEXT.format(n=s.distractors),
        lengths=lengths,
        checkpoints=evals,
        heldout={"prefixes": heldout.prefixes, "split": heldout.split, "held_out_documents": heldout.count()},
        notes=list(dict.fromkeys(notes)),
        seconds=time.perf_counter() - t0,
    )


def _short_deltas(evals: list[CheckpointEval]) -> None:
    """Each checkpoint's short-context loss against the base's, with its paired interval."""
    base = next((e for e in evals if e.label == BASE_LABEL and e.short is not None), None)
    for e in evals:
        if base is not None and e.short is not None:
            e.short_delta_vs_base = e.short.loss - base.short.loss  # type: ignore[union-attr]
            if e is not base and e.short.doc_tokens == base.short.doc_tokens:  # type: ignore[union-attr]
                e.short_delta_interval = paired_delta_interval(
                    e.short.doc_nll,
                    base.short.doc_nll,  # type: ignore[union-attr]
                    e.short.doc_tokens,
                )


def _earlier(out_dir: Path) -> EvalReport | None:
    """The report an earlier evaluation left in `out_dir`, if it reads as one."""
    try:
        return EvalReport.model_validate_json((out_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def keep_other_settings(report: EvalReport, out_dir: Path) -> str | None:
    """When `out_dir` holds a report made with other settings (or lengths, or held-out data), move it
    to `<out_dir>-<its digest>` instead of overwriting it; a note saying what changed and where the
    earlier one is, or None when there was nothing else there."""
    if not (out_dir / "report.json").exists():
        return None
    old = _earlier(out_dir)
    if old is not None and old.identity() == report.identity():
        return None  # the same measurement, newer: replaced
    digest = old.identity()[:8] if old is not None else "unreadable"
    kept = out_dir.with_name(f"{out_dir.name}-{digest}")
    n = 1
    while kept.exists():  # nothing kept is ever replaced
        n += 1
        kept = out_dir.with_name(f"{out_dir.name}-{digest}-{n}")
    out_dir.rename(kept)
    if old is None:
        return f"{out_dir} held a report this version cannot read; kept as {kept}"
    changes = report.settings.changes_from(old.settings)
    if old.lengths != report.lengths:
        changes.append(f"lengths {','.join(map(str, old.lengths))} → {','.join(map(str, report.lengths))}")
    if old.heldout.get("prefixes") != report.heldout.get("prefixes") or old.heldout.get(
        "split"
    ) != report.heldout.get("split"):
        changes.append("held-out data")
    what = "; ".join(changes) or "another version of the evaluation"
    return f"the earlier report in {out_dir} was made with other settings ({what}); kept as {kept}"


def write_outputs(report: EvalReport, out_dir: Path) -> EvalReport:
    """report.json, niah.png, loss_by_position.png, summary.md under `out_dir` (atomically). An earlier
    report there made with other settings is kept beside it (`keep_other_settings`), with a note."""
    check_output_dir(out_dir, option="--out", what="the evaluation's report and plots")
    report.out_dir = str(out_dir)
    if not is_main_process():
        return report
    note = keep_other_settings(report, out_dir)
    if note is not None:
        report.notes.append(note)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, str] = {}
    if any(ce.results for ce in report.checkpoints):
        plots["niah"] = str(plot_niah(report, out_dir / "niah.png"))
    if any(r.position is not None for ce in report.checkpoints for r in ce.results):
        plots["loss_by_position"] = str(plot_loss_by_position(report, out_dir / "loss_by_position.png"))
    if any(r.context_elbo is not None for ce in report.checkpoints for r in ce.results):
        plots["elbo_by_context"] = str(plot_elbo_by_context(report, out_dir / "elbo_by_context.png"))
    report.plots = plots
    atomic_write_text(out_dir / "summary.md", markdown_table(report))
    atomic_write_json(out_dir / "report.json", report.model_dump(mode="json"))
    return report
