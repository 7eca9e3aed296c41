"""A plan's training curves across its stages, read from what either backend leaves on disk.

Per stage, the first readable source wins: TensorBoard events in `tensorboard/` (Megatron-LM's and the
local trainer's, read with TensorBoard's own reader, one file per launch), else the local trainer's
`metrics.jsonl`, else the launch logs the ledger names (Megatron-LM's or the local trainer's lines).
Every series is placed on one x-axis, consumed tokens across the plan: a stage's tokens start where
the stages before it end (their planned tokens). Launches come from the ledger: where each started
(first launch, resume) and how it ended (done, signal, stopped early, failed). Unreadable input is
reported by file and skipped, so what is readable is still drawn.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from longctx.errors import StageError
from longctx.plan import paths
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.stage import ledger
from longctx.train import event_tags as tags

# Megatron-LM's log line of an iteration (training_log): iteration, consumed samples, time, lr, loss
_MEGATRON_LINE = re.compile(
    r"iteration\s+(?P<it>\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): (?P<ms>[\d.]+) \|"
    r".*?learning rate: (?P<lr>[-+.\dEe]+) \|.*?lm loss: (?P<loss>[-+.\dEe]+) \|"
)
# the local trainer's log line (longctx.train.loop, every log_interval)
_LOCAL_LINE = re.compile(
    r"\[longctx\] \S+ iteration (?P<it>\d+)/\d+ loss (?P<loss>[-+.\dEe]+|nan) lr (?P<lr>[-+.\dEe]+) "
    r"grad-norm \S+ tokens/s (?P<tps>[\d,.]+)"
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- TensorBoard events -------------------------------------------------------------------------------


def _event_files(tb_dir: Path) -> list[Path]:
    return sorted(tb_dir.glob("events.out.tfevents.*")) if tb_dir.is_dir() else []


def _read_event_file(path: Path) -> dict[str, list[tuple[float, int, float]]]:
    """tag → [(wall time, step, value)] of one event file, with TensorBoard's reader (every event kept:
    a launch's file is read on its own, so a restart's steps are not purged as orphans)."""
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    return {t: [(e.wall_time, e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _truncated_tail(path: Path) -> int:
    """Bytes after the last complete record (a TFRecord: 8-byte length, 4-byte CRC, data, 4-byte CRC);
    TensorBoard's reader stops there silently, so the file is named here."""
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        size = int.from_bytes(data[pos : pos + 8], "little")
        if pos + 16 + size > len(data):
            break
        pos += 16 + size
    return len(data) - pos


def _from_events(curve: StageCurve, tb_dir: Path, problems: list[str]) -> bool:
    read_any = False
    for path in _event_files(tb_dir):
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
        tail = _truncated_tail(path)
        if tail:
            problems.append(f"{path}: truncated ({tail} bytes of an unfinished record at the end); "
                            f"read its {len(loss)} complete loss events")  # fmt: skip
        steps = [s for _, s, _ in loss]
        if max(steps) > curve.target_iterations:
            problems.append(
                f"{path}: iterations up to {max(steps)} but stage {curve.stage} has {curve.target_iterations} "
                "(events of another run?); skipped"
            )
            continue
        curve.loss += [[s, curve.tokens_at(s), v] for _, s, v in loss]
        curve.lr += [[s, curve.tokens_at(s), v] for _, s, v in scalars.get(tags.LEARNING_RATE, [])]
        curve.validation += [[s, curve.tokens_at(s), v] for _, s, v in scalars.get(tags.VALIDATION_LOSS, [])]
        curve.tokens_per_s += _rates(curve, scalars, loss)
    return read_any and bool(curve.loss)


def _rates(curve: StageCurve, scalars: dict, loss: list[tuple[float, int, float]]) -> list[list[float]]:
    """tokens/s: the local trainer's own tag, else from Megatron-LM's iteration-time, else from the wall
    times of consecutive loss events (Megatron-LM logs no timers to TensorBoard by default)."""
    per_iter = curve.tokens_per_iteration
    if scalars.get(tags.TOKENS_PER_SECOND):
        return [[s, curve.tokens_at(s), v] for _, s, v in scalars[tags.TOKENS_PER_SECOND]]
    if scalars.get(tags.ITERATION_TIME):
        return [[s, curve.tokens_at(s), per_iter / v] for _, s, v in scalars[tags.ITERATION_TIME] if v > 0]
    out = []
    for (t0, s0, _), (t1, s1, _) in itertools.pairwise(loss):
        if t1 > t0 and s1 > s0:
            out.append([s1, curve.tokens_at(s1), (s1 - s0) * per_iter / (t1 - t0)])
    return out


# -- metrics.jsonl and logs ---------------------------------------------------------------------------


def _from_metrics(curve: StageCurve, path: Path, problems: list[str]) -> bool:
    if not path.is_file():
        return False
    foreign = 0
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            rec = json.loads(line)
            it = int(rec["iteration"])
            if rec.get("stage", curve.stage) != curve.stage or it > curve.target_iterations:
                foreign += 1
                continue
            x = curve.tokens_at(it)
            curve.loss.append([it, x, float(rec["loss"])])
            curve.lr.append([it, x, float(rec["lr"])])
            curve.tokens_per_s.append([it, x, float(rec["tokens_per_s"])])
        except (ValueError, KeyError, TypeError):
            problems.append(f"{path}:{n}: not a metrics record; skipped")
    if foreign:
        problems.append(f"{path}: {foreign} records of another stage or run; skipped")
    return bool(curve.loss)


def _from_logs(curve: StageCurve, logs: list[Path], problems: list[str]) -> bool:
    for log in logs:
        if not log.is_file():
            problems.append(f"{log}: the ledger names this log but it is missing")
            continue
        text = log.read_text(encoding="utf-8", errors="replace")
        for m in _MEGATRON_LINE.finditer(text):
            it, x = int(m["it"]), curve.tokens_at(int(m["it"]))
            curve.loss.append([it, x, float(m["loss"])])
            curve.lr.append([it, x, float(m["lr"])])
            if float(m["ms"]) > 0:
                curve.tokens_per_s.append([it, x, curve.tokens_per_iteration / (float(m["ms"]) / 1000)])
        for m in _LOCAL_LINE.finditer(text):
            it, x = int(m["it"]), curve.tokens_at(int(m["it"]))
            curve.loss.append([it, x, float(m["loss"])])
            curve.lr.append([it, x, float(m["lr"])])
            curve.tokens_per_s.append([it, x, float(m["tps"].replace(",", ""))])
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
    rp: ResolvedPlan, records: list[dict[str, Any]], curves: dict[str, StageCurve]
) -> list[LaunchMark]:
    marks: list[LaunchMark] = []
    open_launch: dict[str, tuple[LaunchMark, dict[str, Any]]] = {}
    for rec in records:
        stage = rec.get("stage")
        if stage not in curves:
            continue
        c = curves[stage]
        if rec.get("event") == "launch":
            start = int(rec.get("start_iteration") or 0)
            mark = LaunchMark(stage, str(rec.get("action")), start, None, c.tokens_at(start), None, "running",
                              str(rec.get("time", "")))  # fmt: skip
            marks.append(mark)
            open_launch[stage] = (mark, rec)
        elif rec.get("event") == "end" and stage in open_launch:
            mark, launch = open_launch.pop(stage)
            end = int(rec.get("end_iteration") or mark.start_iteration)
            mark.end_iteration, mark.end_tokens = end, c.tokens_at(end)
            mark.ended = _ended(rec, launch, end >= c.target_iterations)
    return marks


def _ended(end: dict[str, Any], launch: dict[str, Any], finished: bool) -> str:
    if end.get("exit_code") not in (0, None) or end.get("outcome") == "failed":
        return "failed"
    if finished:
        return "done"
    log = Path(str(launch.get("log") or ""))
    try:
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    except OSError:
        text = ""
    return "signal" if _SIGNAL_IN_LOG.search(text) or end.get("outcome") == "interrupted" else "stopped"


def read_plan_curves(rp: ResolvedPlan) -> PlanCurves:
    """Every stage's curves and every launch of the run directory; problems are collected, not raised."""
    run_dir = paths.run_dir(rp.plan)
    problems: list[str] = []
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
    return PlanCurves(rp.plan.name, str(run_dir), curves, _launch_marks(rp, records, by_name), problems)


def _read_stage(
    rp: ResolvedPlan, st: ResolvedStage, c: StageCurve, records: list[dict[str, Any]], problems: list[str]
) -> None:
    root = paths.stage_dir(rp.plan, st.name)
    logs = [
        Path(r["log"])
        for r in records
        if r.get("event") == "launch" and r.get("stage") == st.name and r.get("log")
    ]
    for source, read in (
        ("tensorboard", lambda: _from_events(c, root / "tensorboard", problems)),
        ("metrics.jsonl", lambda: _from_metrics(c, root / "metrics.jsonl", problems)),
        ("logs", lambda: _from_logs(c, logs, problems)),
    ):
        c.loss, c.lr, c.tokens_per_s, c.validation = [], [], [], []
        if read():
            c.source = source
            for series in (c.loss, c.lr, c.tokens_per_s, c.validation):
                series.sort(key=lambda p: (p[0],))
            return
    c.loss, c.lr, c.tokens_per_s, c.validation = [], [], [], []
    if logs:  # launched, yet no curve: say where it looked
        problems.append(f"{root}: stage {st.name} was launched but neither tensorboard/, metrics.jsonl nor its "
                        "logs hold a readable loss")  # fmt: skip
