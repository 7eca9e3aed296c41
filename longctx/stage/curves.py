"""A plan's training curves across its stages, read from what either backend leaves on disk.

Per stage, the first readable source wins: TensorBoard events in `tensorboard/` (Megatron-LM's and the
local trainer's, read with TensorBoard's own reader, one file per launch), else the local trainer's
`metrics.jsonl`, else the launch logs the ledger names (Megatron-LM's or the local trainer's lines).
Every file is read through the run-file reader (`run_files`): a file that is not a regular file inside
the run, or larger than any run writes, stops the command (StageError) before it is opened by name; a
launch log is looked for only in its stage's `logs/` (the ledger's path is a name, never a place), so a
ledger naming a file elsewhere reads nothing outside the run. Numbers are bounded: an iteration beyond the
stage, an integer beyond 64 bits, a value that is not finite is a skipped point, named.
Every series is placed on one x-axis, consumed tokens across the plan: a stage's tokens start where
the stages before it end (their planned tokens). Launches come from the ledger: where each started
(first launch, resume) and how it ended (done, signal, stopped early, failed). Unreadable input is
reported by file and skipped, so what is readable is still drawn.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from longctx.errors import StageError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.stage import ledger
from longctx.stage.ledger_events import End, Launch, LedgerEvent
from longctx.stage.run_files import (
    EVENTS_BYTES,
    LEDGER_BYTES,
    LOG_BYTES,
    METRICS_BYTES,
    check_run_input,
    run_file_lines,
)
from longctx.train import event_tags as tags
from longctx.util import bounded_json
from longctx.util.confined_read import open_file

# Megatron-LM's log line of an iteration (training_log): iteration, consumed samples, time, lr, loss
_MEGATRON_LINE = re.compile(
    r"iteration\s+(?P<it>\d{1,15})/\s*\d+ \|.*?elapsed time per iteration \(ms\): (?P<ms>[\d.]{1,40}) \|"
    r".*?learning rate: (?P<lr>[-+.\dEe]{1,40}) \|.*?lm loss: (?P<loss>[-+.\dEe]{1,40}) \|"
)
# the local trainer's log line (longctx.train.loop, every log_interval)
_LOCAL_LINE = re.compile(
    r"\[longctx\] \S+ iteration (?P<it>\d{1,15})/\d+ loss (?P<loss>[-+.\dEe]{1,40}|nan) lr (?P<lr>[-+.\dEe]{1,40}) "
    r"grad-norm \S+ tokens/s (?P<tps>[\d,.]{1,40})"
)
_SIGNAL_IN_LOG = re.compile(r"exiting program after receiving SIG|exiting after iteration \d+ \(signal\)")


@dataclass
class StageCurve:
    stage: str
    seq_length: int
    rotary_base: int
    target_iterations: int
    tokens_per_iteration: int
    token_offset: int  # consumed tokens of the plan before this stage (the earlier stages' planned tokens)
    source: str | None = None  # "tensorboard" | "metrics.jsonl" | "logs" | None (nothing readable)
    # [iteration, plan tokens, value]
    loss: list[list[float]] = field(default_factory=list)
    lr: list[list[float]] = field(default_factory=list)
    tokens_per_s: list[list[float]] = field(default_factory=list)
    validation: list[list[float]] = field(default_factory=list)

    def tokens_at(self, iteration: int) -> int:
        return self.token_offset + iteration * self.tokens_per_iteration

    def add(self, series: list[list[float]], iteration: int, value: float) -> bool:
        """Append a point to `series`; False (nothing added) for an iteration outside the stage or a value
        that is not finite (a diverged loss, an overflowed rate: no place on the figure)."""
        if not 0 <= iteration <= self.target_iterations or not math.isfinite(value):
            return False
        series.append([iteration, self.tokens_at(iteration), value])
        return True


@dataclass
class LaunchMark:
    stage: str
    action: str  # first-launch | resume
    start_iteration: int
    end_iteration: int | None
    start_tokens: int
    end_tokens: int | None
    ended: str  # done | signal | stopped | failed | running
    time: str


@dataclass
class PlanCurves:
    plan: str
    run_dir: str
    stages: list[StageCurve]
    launches: list[LaunchMark]
    problems: list[str]  # what could not be read, each naming its file

    @property
    def readable(self) -> bool:
        return any(s.loss for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- TensorBoard events -------------------------------------------------------------------------------


EVENT_FILE = "TensorBoard event file"


def _event_files(tb_dir: Path, run_dir: Path) -> list[Path]:
    """The event files of `tb_dir`, each checked (a regular file inside the run, bounded) before
    TensorBoard's reader opens it by name: a FIFO there would block it forever."""
    if not tb_dir.is_dir():
        return []
    files = sorted(tb_dir.glob("events.out.tfevents.*"))
    for path in files:
        check_run_input(path, run_dir, EVENT_FILE, max_bytes=EVENTS_BYTES)
    return files


def _read_event_file(path: Path) -> dict[str, list[tuple[float, int, float]]]:
    """tag → [(wall time, step, value)] of one event file, with TensorBoard's reader (every event kept:
    a launch's file is read on its own, so a restart's steps are not purged as orphans)."""
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    return {t: [(e.wall_time, e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _truncated_tail(path: Path, run_dir: Path) -> int:
    """Bytes after the last complete record (a TFRecord: 8-byte length, 4-byte CRC, data, 4-byte CRC);
    TensorBoard's reader stops there silently, so the file is named here. Walks the record headers."""
    with open_file(path, run_dir, EVENT_FILE, error=StageError, max_bytes=EVENTS_BYTES) as fh:
        if fh is None:
            return 0
        end = fh.seek(0, 2)
        pos = 0
        while pos + 12 <= end:
            fh.seek(pos)
            size = int.from_bytes(fh.read(8), "little")
            if pos + 16 + size > end:
                break
            pos += 16 + size
        return end - pos


def _from_events(curve: StageCurve, tb_dir: Path, run_dir: Path, problems: list[str]) -> bool:
    read_any = False
    for path in _event_files(tb_dir, run_dir):
        try:
            scalars = _read_event_file(path)
        except Exception as err:  # the reader raises its own (DataLossError, …) on a corrupt file
            problems.append(
                f"{path}: not a readable TensorBoard event file ({type(err).__name__}: {err}); skipped"
            )
            continue
        loss = scalars.get(tags.LOSS, [])
        if not loss:
            problems.append(f"{path}: no {tags.LOSS!r} scalars (not a training event file); skipped")
            continue
        read_any = True
        tail = _truncated_tail(path, run_dir)
        if tail:
            problems.append(
                f"{path}: truncated ({tail} bytes of an unfinished record at the end); "
                f"read its {len(loss)} complete loss events"
            )
        steps = [s for _, s, _ in loss]
        if max(steps) > curve.target_iterations:
            problems.append(
                f"{path}: iterations up to {max(steps)} but stage {curve.stage} has {curve.target_iterations} "
                "(events of another run?); skipped"
            )
            continue
        skipped = 0
        for series, points in (
            (curve.loss, loss),
            (curve.lr, scalars.get(tags.LEARNING_RATE, [])),
            (curve.validation, scalars.get(tags.VALIDATION_LOSS, [])),
            (curve.tokens_per_s, _rates(curve, scalars, loss)),
        ):
            skipped += sum(not curve.add(series, s, v) for _, s, v in points)
        if skipped:
            problems.append(
                f"{path}: {skipped} values that are not finite numbers (or outside the stage); skipped"
            )
    return read_any and bool(curve.loss)


def _rates(
    curve: StageCurve, scalars: dict, loss: list[tuple[float, int, float]]
) -> list[tuple[float, int, float]]:
    """tokens/s: the local trainer's own tag, else from Megatron-LM's iteration-time, else from the wall
    times of consecutive loss events (Megatron-LM logs no timers to TensorBoard by default)."""
    per_iter = curve.tokens_per_iteration
    if scalars.get(tags.TOKENS_PER_SECOND):
        return scalars[tags.TOKENS_PER_SECOND]
    if scalars.get(tags.ITERATION_TIME):
        return [(t, s, per_iter / v) for t, s, v in scalars[tags.ITERATION_TIME] if v > 0]
    out = []
    for (t0, s0, _), (t1, s1, _) in itertools.pairwise(loss):
        if t1 > t0 and s1 > s0:
            out.append((t1, s1, (s1 - s0) * per_iter / (t1 - t0)))
    return out


# -- metrics.jsonl and logs ---------------------------------------------------------------------------


def _metrics_record(line: str) -> tuple[str | None, int, float, float, float] | None:
    """(stage, iteration, loss, lr, tokens/s) of a metrics line; None when it is not one (a field missing
    or of another type, a number beyond 64 bits or not finite)."""
    try:
        rec = bounded_json.loads(line)
    except bounded_json.BadJSON:
        return None
    if not isinstance(rec, dict):
        return None
    it, stage = rec.get("iteration"), rec.get("stage")
    values = [rec.get(k) for k in ("loss", "lr", "tokens_per_s")]
    if isinstance(it, bool) or not isinstance(it, int) or (stage is not None and not isinstance(stage, str)):
        return None
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        return None
    loss, lr, tps = (float(v) for v in values)  # type: ignore[arg-type]
    return stage, it, loss, lr, tps


def _from_metrics(curve: StageCurve, path: Path, run_dir: Path, problems: list[str]) -> bool:
    foreign = 0
    bad: list[int] = []
    for n, line in run_file_lines(path, run_dir, "metrics file", max_bytes=METRICS_BYTES):
        rec = _metrics_record(line) if line is not None else None
        if rec is None:
            bad.append(n)
            continue
        stage, it, loss, lr, tps = rec
        if (stage or curve.stage) != curve.stage or not 0 <= it <= curve.target_iterations:
            foreign += 1
            continue
        if not curve.add(curve.loss, it, loss):
            bad.append(n)
            continue
        curve.add(curve.lr, it, lr)
        curve.add(curve.tokens_per_s, it, tps)
    for n in bad[:5]:
        problems.append(f"{path}:{n}: not a metrics record; skipped")
    if len(bad) > 5:
        problems.append(f"{path}: {len(bad) - 5} more lines that are not metrics records; skipped")
    if foreign:
        problems.append(f"{path}: {foreign} records of another stage or run; skipped")
    return bool(curve.loss)


_LOG_NAME = re.compile(r"[\w.+-]{1,200}\.log")


def stage_log(root: Path, recorded: object) -> Path | None:
    """Where the launch log the ledger records lives in this run: its name in the stage's `logs/` (a run
    that moved keeps its logs there). None when the name is no launch log's (the ledger names a file
    elsewhere: nothing outside the run is read)."""
    name = Path(str(recorded or "")).name
    return root / "logs" / name if _LOG_NAME.fullmatch(name) else None


def _from_logs(curve: StageCurve, logs: list[tuple[str, Path]], run_dir: Path, problems: list[str]) -> bool:
    for recorded, log in logs:
        if not os.path.lexists(log):
            elsewhere = (
                ""
                if recorded == str(log)
                else f" (the ledger names {recorded}; only the run's own logs are read)"
            )
            problems.append(f"{log}: the ledger names this log but it is missing{elsewhere}")
            continue
        skipped = 0
        for _, line in run_file_lines(log, run_dir, "launch log", max_bytes=LOG_BYTES):
            if line is None:
                continue
            for m in _MEGATRON_LINE.finditer(line):
                it = int(m["it"])
                try:
                    loss, lr, ms = float(m["loss"]), float(m["lr"]), float(m["ms"])
                except ValueError:
                    skipped += 1
                    continue
                if not curve.add(curve.loss, it, loss):
                    skipped += 1
                    continue
                curve.add(curve.lr, it, lr)
                if ms > 0:
                    curve.add(curve.tokens_per_s, it, curve.tokens_per_iteration / (ms / 1000))
            for m in _LOCAL_LINE.finditer(line):
                it = int(m["it"])
                try:
                    loss, lr, tps = float(m["loss"]), float(m["lr"]), float(m["tps"].replace(",", ""))
                except ValueError:
                    skipped += 1
                    continue
                if not curve.add(curve.loss, it, loss):
                    skipped += 1
                    continue
                curve.add(curve.lr, it, lr)
                curve.add(curve.tokens_per_s, it, tps)
        if skipped:
            problems.append(
                f"{log}: {skipped} iteration lines with a loss that is not a finite number or an "
                "iteration outside the stage; skipped"
            )
    return bool(curve.loss)


# -- the plan -----------------------------------------------------------------------------------------


def _stage_curves(rp: ResolvedPlan) -> list[StageCurve]:
    out, offset = [], 0
    for st in rp.stages:
        per_iter = st.global_batch_size * st.seq_length
        out.append(StageCurve(st.name, st.seq_length, st.rotary_base, st.train_iters, per_iter, offset))
        offset += st.train_iters * per_iter
    return out


def _launch_marks(
    rp: ResolvedPlan, records: list[LedgerEvent], curves: dict[str, StageCurve], problems: list[str]
) -> list[LaunchMark]:
    marks: list[LaunchMark] = []
    open_launch: dict[str, tuple[LaunchMark, Launch]] = {}
    for rec in records:
        if not isinstance(rec, Launch | End) or rec.stage not in curves:
            continue
        stage = rec.stage
        c = curves[stage]
        if isinstance(rec, Launch):
            start = min(max(rec.start_iteration or 0, 0), c.target_iterations)
            mark = LaunchMark(
                stage, str(rec.action), start, None, c.tokens_at(start), None, "running", str(rec.time or "")
            )
            marks.append(mark)
            open_launch[stage] = (mark, rec)
        elif stage in open_launch:
            mark, launch = open_launch.pop(stage)
            end = min(max(rec.end_iteration or mark.start_iteration, 0), c.target_iterations)
            mark.end_iteration, mark.end_tokens = end, c.tokens_at(end)
            log = stage_log(rp.stage(stage).stage_dir, launch.log)
            mark.ended = _ended(rec, log, rp.run_dir, end >= c.target_iterations, problems)
    return marks


def _ended(end: End, log: Path | None, run_dir: Path, finished: bool, problems: list[str]) -> str:
    if end.exit_code not in (0, None) or end.outcome == "failed":
        return "failed"
    if finished:
        return "done"
    if end.outcome == "interrupted":
        return "signal"
    try:
        lines = (
            run_file_lines(log, run_dir, "launch log", max_bytes=LOG_BYTES) if log is not None else iter(())
        )
        signalled = any(line is not None and _SIGNAL_IN_LOG.search(line) for _, line in lines)
    except StageError as err:
        problems.append(f"{log}: {err.what}")
        signalled = False
    return "signal" if signalled else "stopped"


def read_plan_curves(rp: ResolvedPlan) -> PlanCurves:
    """Every stage's curves and every launch of the run directory; problems are collected, not raised."""
    run_dir = rp.run_dir
    problems: list[str] = []
    # a ledger that is no file of the run stops the command; a damaged one is named and skipped
    check_run_input(ledger.ledger_path(run_dir), run_dir, "ledger", max_bytes=LEDGER_BYTES)
    try:
        records = ledger.read(run_dir)
    except StageError as err:
        problems.append(f"{ledger.ledger_path(run_dir)}: {err}")
        records = []
    if not records:
        problems.append(f"{ledger.ledger_path(run_dir)}: no launches recorded (empty or missing ledger)")
    curves = _stage_curves(rp)
    for c in curves:
        _read_stage(rp, rp.stage(c.stage), c, records, problems)
    by_name = {c.stage: c for c in curves}
    marks = _launch_marks(rp, records, by_name, problems)
    return PlanCurves(rp.name, str(run_dir), curves, marks, problems)


def _read_stage(
    rp: ResolvedPlan, st: ResolvedStage, c: StageCurve, records: list[LedgerEvent], problems: list[str]
) -> None:
    root, run_dir = st.stage_dir, rp.run_dir
    launched = [r.log for r in records if isinstance(r, Launch) and r.stage == st.name]
    logs: list[tuple[str, Path]] = []
    for recorded in filter(None, launched):
        log = stage_log(root, recorded)
        if log is None:
            problems.append(
                f"{recorded}: the ledger names this as stage {st.name}'s log, but it is no launch log "
                f"of the run (they are {root / 'logs'}/*.log); not read"
            )
        elif log not in [p for _, p in logs]:
            logs.append((str(recorded), log))
    for source, read in (
        ("tensorboard", lambda: _from_events(c, root / "tensorboard", run_dir, problems)),
        ("metrics.jsonl", lambda: _from_metrics(c, root / "metrics.jsonl", run_dir, problems)),
        ("logs", lambda: _from_logs(c, logs, run_dir, problems)),
    ):
        c.loss, c.lr, c.tokens_per_s, c.validation = [], [], [], []
        if read():
            c.source = source
            for series in (c.loss, c.lr, c.tokens_per_s, c.validation):
                series.sort(key=lambda p: (p[0],))
            return
    c.loss, c.lr, c.tokens_per_s, c.validation = [], [], [], []
    if launched:  # launched, yet no curve: say where it looked
        problems.append(
            f"{root}: stage {st.name} was launched but neither tensorboard/, metrics.jsonl nor its "
            "logs hold a readable loss"
        )
