"""What runs next, decided from disk — never from exit codes (Megatron exits 0 on every early exit).

For each stage, in order: its save dir's tracker and complete iterations give `pending` (no progress),
`in-progress` (a complete save below the target) or `done` (a complete save at or past the target).
The next step is the first stage not done: a `first-launch` (load the previous stage's final weights
with finetune semantics) when it has no complete save, else a `resume`. A stage with a complete save is
never started again from the previous stage: a complete save the tracker does not name (a job killed
between the save and the tracker write) is a *repair* — the tracker is pointed at it before launch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from longctx.checkpoint.save_layout import (
    TRACKER,
    complete_iterations,
    iter_dir_name,
    iteration_dirs_in,
    read_tracker,
)
from longctx.checkpoint.tree import DirTree
from longctx.errors import CheckpointError, StageError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.util.fs import atomic_write_text

Status = Literal["pending", "in-progress", "done"]
Action = Literal["first-launch", "resume", "choose", "all-done", "blocked"]


@dataclasses.dataclass
class Repair:
    """A tracker fix the launch applies before starting (and records in the ledger)."""

    tracker: Path
    old: str | None
    new: int | None  # None: move the tracker aside (it names no complete save)
    reason: str

    def apply(self) -> None:
        if self.new is None:
            self.tracker.rename(self.tracker.with_name(TRACKER + ".invalid"))
        else:
            atomic_write_text(self.tracker, f"{self.new}\n")


@dataclasses.dataclass
class StageState:
    name: str
    index: int
    target_iterations: int
    save_dir: Path
    tracker: int | None
    complete: list[int]
    incomplete: list[int]
    status: Status
    iteration: int  # progress a relaunch starts from (0 when pending)
    repair: Repair | None = None

    @property
    def latest_complete(self) -> int | None:
        return self.complete[-1] if self.complete else None


@dataclasses.dataclass
class NextStep:
    action: Action
    stage: str | None
    reason: str
    load: Path | None = None
    start_iteration: int = 0
    repair: Repair | None = None
    # a first launch from the previous stage: that stage's tracker fix (its final save is what loads)
    load_repair: Repair | None = None

    def repairs(self) -> list[Repair]:
        return [r for r in (self.load_repair, self.repair) if r is not None]


def stage_state(st: ResolvedStage) -> StageState:
    save = st.save_dir
    tracker_path = save / TRACKER
    tracker_it: int | None = None
    tracker_text: str | None = None
    tracker_bad: str | None = None
    if tracker_path.exists():
        tracker_text = tracker_path.read_text(errors="replace").strip()
        try:
            t = read_tracker(save)
            tracker_it = t.iteration if t else None
        except CheckpointError as err:
            tracker_bad = err.what
    complete = complete_iterations(save)
    all_dirs = sorted(iteration_dirs_in(DirTree(save))) if save.is_dir() else []
    incomplete = [i for i in all_dirs if i not in complete]
    newest = complete[-1] if complete else None

    repair: Repair | None = None
    if tracker_bad is not None:
        repair = Repair(tracker_path, tracker_text, newest, f"the tracker is unreadable ({tracker_bad})")
    elif tracker_it is not None and tracker_it not in complete:
        repair = Repair(
            tracker_path,
            tracker_text,
            newest,
            f"the tracker names iteration {tracker_it}, which has no complete save",
        )
    elif newest is not None and (tracker_it is None or newest > tracker_it):
        repair = Repair(
            tracker_path,
            tracker_text,
            newest,
            f"iteration {newest} is saved completely but the tracker "
            + ("is missing" if tracker_it is None else f"names {tracker_it}"),
        )
    effective = newest if repair is not None else tracker_it
    if effective is None:
        status: Status = "pending"
    elif effective >= st.train_iters:
        status = "done"
    else:
        status = "in-progress"
    return StageState(
        st.name,
        st.index,
        st.train_iters,
        save,
        tracker_it,
        complete,
        incomplete,
        status,
        effective or 0,
        repair,
    )


def plan_state(rp: ResolvedPlan) -> list[StageState]:
    return [stage_state(st) for st in rp.stages]


def base_ready(rp: ResolvedPlan) -> str | None:
    """Why the base checkpoint cannot start stage 1 (None when it can)."""
    first = rp.stages[0]
    base = first.load_from
    if base is None:
        return "the plan has no base.path"
    if not base.exists():
        return f"base checkpoint {base} does not exist"
    try:
        t = read_tracker(base)
    except CheckpointError as err:
        return err.what
    if t is None:
        return (
            f"base checkpoint {base} has no {TRACKER}: Megatron-LM's --pretrained-checkpoint needs one "
            "(run `longctx ckpt adopt` on the snapshot)"
        )
    if not (base / t.dir_name).is_dir():
        return f"the base tracker names {t.dir_name}, which is not in {base}"
    want = rp.base.iteration
    if want is not None and not t.release and t.iteration != want:
        return f"the base tracker names iteration {t.iteration}, the plan says base.iteration = {want}"
    return None


def branch_step(rp: ResolvedPlan, branch: ResolvedStage, load_repair: Repair | None = None) -> NextStep:
    """What a sweep branch needs next: `all-done`, a resume, or a first launch from what its stage loads
    (`blocked` when that is the base checkpoint and it is not ready)."""
    b = stage_state(branch)
    if b.status == "done":
        return NextStep("all-done", branch.name, f"sweep branch {branch.name} is done")
    if b.status == "in-progress":
        return NextStep(
            "resume",
            branch.name,
            f"sweep branch {branch.name} resumes at iteration {b.iteration}/{b.target_iterations}",
            load=branch.save_dir / iter_dir_name(b.iteration),
            start_iteration=b.iteration,
            repair=b.repair,
        )
    why = base_ready(rp) if branch.index == 0 else None
    if why:
        return NextStep("blocked", branch.name, why, load=branch.load_from)
    if branch.index == 0:
        origin = "the base checkpoint"
    else:
        prev = rp.stages[branch.index - 1]
        origin = f"stage {prev.name}'s final weights"
        load_repair = load_repair or stage_state(prev).repair
    return NextStep(
        "first-launch",
        branch.name,
        f"sweep branch {branch.name} (RoPE base {branch.rotary_base:,}) starts from {origin}",
        load=branch.load_from,
        repair=b.repair,
        load_repair=load_repair,
    )


def _sweep_step(rp: ResolvedPlan, st: ResolvedStage, load_repair: Repair | None) -> NextStep | None:
    """A pending sweep's next step: its first unfinished branch, else the choice (None: no sweep pending)."""
    if st.sweep is None or not st.sweep.pending:
        return None
    for branch in st.branches:
        step = branch_step(rp, branch, load_repair)
        if step.action != "all-done":
            return step
    return NextStep(
        "choose",
        st.name,
        f"stage {st.name}: all {len(st.branches)} sweep branches are done; "
        "evaluate them and choose its RoPE base",
    )


def next_step(rp: ResolvedPlan, states: list[StageState] | None = None) -> NextStep:
    states = states if states is not None else plan_state(rp)
    for st, s in zip(rp.stages, states, strict=True):
        if s.status == "done":
            continue
        if s.status == "pending":
            swept = _sweep_step(rp, st, states[st.index - 1].repair if st.index else None)
            if swept is not None:
                return swept
        if s.status == "in-progress":
            return NextStep(
                "resume",
                st.name,
                f"stage {st.name} resumes at iteration {s.iteration}/{s.target_iterations}",
                load=st.save_dir / iter_dir_name(s.iteration),
                start_iteration=s.iteration,
                repair=s.repair,
            )
        if st.index == 0:
            why = base_ready(rp)
            if why:
                return NextStep("blocked", st.name, why, load=st.load_from)
            return NextStep(
                "first-launch",
                st.name,
                f"stage {st.name} starts from the base checkpoint",
                load=st.load_from,
                repair=s.repair,
            )
        return NextStep(
            "first-launch",
            st.name,
            f"stage {st.name} starts from stage {rp.stages[st.index - 1].name}'s final weights",
            load=st.load_from,
            repair=s.repair,
            load_repair=states[st.index - 1].repair,
        )
    return NextStep("all-done", None, f"all {len(rp.stages)} stages are done")


def require_runnable(step: NextStep) -> None:
    if step.action == "blocked":
        raise StageError(
            f"cannot launch stage {step.stage}: {step.reason}",
            where=str(step.load),
            fix="fix the base checkpoint (see `longctx ckpt check`)",
        )
