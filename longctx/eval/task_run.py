"""The needle tasks of one length, end to end: the items of every task the settings list (beyond
`single`, which the passkey grid measures), scored by generation (causal) or infilling (diffusion)."""

from __future__ import annotations

from collections.abc import Callable

from longctx.eval.grid import PasskeyGrid, check_depths
from longctx.eval.needles import TaskGrid, TaskItem
from longctx.eval.prefix_extend import PrefixExtender
from longctx.eval.score import ScoreFn
from longctx.eval.settings import EvalSettings
from longctx.eval.task_infill import score_task_infill
from longctx.eval.task_results import TaskResult, natural_share
from longctx.eval.task_score import TaskItemScore, score_tasks
from longctx.eval.unmask import InfillFn
from longctx.objective import Objective
from longctx.plan.eval_tasks import TaskSpec, parse_task
from longctx.tokenizer.load import LoadedTokenizer

TaskItems = dict[str, list[TaskItem]]


def task_specs(settings: EvalSettings) -> list[TaskSpec]:
    """The tasks to build items for: every listed one but `single`."""
    return [parse_task(t) for t in settings.tasks if t != "single"]


def task_items(grid: PasskeyGrid, settings: EvalSettings, length: int, *, closed: bool = False) -> TaskItems:
    """Every task's items at `length`: keys_per_cell items per depth, as the passkey grid has."""
    tasks = TaskGrid(grid)
    depths = check_depths(settings.depths)
    return {
        spec.name: tasks.items(spec, length, depths, settings.keys_per_cell, closed=closed)
        for spec in task_specs(settings)
    }


def _result(length: int, items: list[TaskItem], scores: list[TaskItemScore]) -> TaskResult:
    return TaskResult.from_items(
        items[0].task,
        length,
        scores,
        natural_share([it.natural for it in items]),
        control=items[0].spec.control,
    )


def run_causal_tasks(
    by_task: TaskItems,
    length: int,
    score: ScoreFn,
    tokenizer: LoadedTokenizer,
    *,
    batch_size: int,
    advance: Callable[[int], None] | None = None,
    extend: PrefixExtender | None = None,
) -> list[TaskResult]:
    """Each task's items answered by greedy generation (`longctx.eval.task_score`)."""
    return [
        _result(
            length,
            items,
            score_tasks(
                items, score, tokenizer.decode, batch_size=batch_size, advance=advance, extend=extend
            ),
        )
        for items in by_task.values()
        if items
    ]


def run_infill_tasks(
    by_task: TaskItems,
    length: int,
    infill: InfillFn,
    tokenizer: LoadedTokenizer,
    *,
    objective: Objective,
    seed: int,
    threshold: float,
    batch_size: int,
    advance: Callable[[int], None] | None = None,
) -> list[TaskResult]:
    """Each task's closed items answered by infilling (`longctx.eval.task_infill`), decoded most
    confident first (`threshold`: `longctx.eval.unmask`)."""
    out = []
    for items in by_task.values():
        if not items:
            continue
        scores = score_task_infill(
            items,
            infill,
            tokenizer.decode,
            kind=objective.kind,
            mask_id=objective.mask_id,
            vocab_size=tokenizer.vocab_size,
            seed=seed,
            threshold=threshold,
            batch_size=batch_size,
            advance=advance,
        )
        out.append(_result(length, items, scores))
    return out
