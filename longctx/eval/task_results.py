"""Results of the needle tasks beyond `single`, per length (pydantic: part of a LengthResult's JSON).

Each task's score is the share of its items that are hits (every expected key returned by greedy
generation or infilling), per depth and over the length, each with its Wilson 95 % interval. The
absent-name control has no hits; its `present` counts the items whose answer returned one of the
keys stated in the haystack (a model that copies whatever key it finds), with its interval too.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pydantic import BaseModel, computed_field

from longctx.eval.accuracy import wilson_interval
from longctx.eval.task_score import TaskItemScore


class TaskCell(BaseModel):
    depth: float
    items: int
    hits: int  # every expected key returned (0 for the control)
    present: int  # control: answers returning a key stated in the haystack

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy(self) -> float:
        return self.hits / self.items if self.items else float("nan")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.items)


class TaskResult(BaseModel):
    task: str
    length: int
    control: bool  # the absent-name control: reported, never a hit
    cells: list[TaskCell]
    items: list[TaskItemScore]
    natural: float  # share of items whose filler gaps are whole sentences

    @computed_field  # type: ignore[prop-decorator]
    @property
    def keys(self) -> int:
        """Items (named as the passkey result's count is)."""
        return sum(c.items for c in self.cells)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hits(self) -> int:
        return sum(c.hits for c in self.cells)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy(self) -> float:
        return self.hits / self.keys if self.keys else float("nan")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.keys)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def present(self) -> int:
        return sum(c.present for c in self.cells)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def present_interval(self) -> tuple[float, float]:
        return wilson_interval(self.present, self.keys)

    @classmethod
    def from_items(
        cls, task: str, length: int, scores: Sequence[TaskItemScore], natural: float, *, control: bool
    ) -> TaskResult:
        cells = []
        for depth in sorted({s.depth for s in scores}):
            group = [s for s in scores if s.depth == depth]
            cells.append(
                TaskCell(
                    depth=depth,
                    items=len(group),
                    hits=sum(s.hit for s in group),
                    present=sum(s.present_key is not None for s in group),
                )
            )
        return cls(
            task=task, length=length, control=control, cells=cells, items=list(scores), natural=natural
        )


def natural_share(flags: Sequence[bool]) -> float:
    return float(statistics.fmean([float(f) for f in flags])) if flags else float("nan")
