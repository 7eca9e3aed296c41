"""`longctx bench greedy`: greedy generation of needle answers with the prefix cache vs whole-sequence
reruns, on one checkpoint at one length (one process).

Both modes answer the same items (one needle task, `items` per depth at five depths); the baseline reruns
whole sequences until the answers settle, the cached mode reruns only the answer positions after the
first forward of each batch (`longctx.eval.prefix_extend`). Reported: the median seconds of each, their
ratio, the full forwards each ran, how many items the checkpoint missed (a hit settles in one forward
either way), and whether the answers agree token for token.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from longctx.errors import EvalError
from longctx.eval.grid import PasskeyGrid
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.needles import TaskGrid, TaskItem
from longctx.eval.prefix_extend import PrefixExtender, prefix_extender
from longctx.eval.score import ScoreFn, TokenScores, model_scorer
from longctx.eval.task_score import greedy_answers
from longctx.mcore.parallel import eval_parallel
from longctx.plan.eval_tasks import parse_task
from longctx.tokenizer import load_tokenizer
from longctx.util.machine import cpu_model

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class GreedyBench:
    checkpoint: str
    length: int
    task: str
    items: int
    batch_size: int
    repeats: int
    misses: int = 0  # items whose greedy answer is not the reference (they take more than one round)
    full_seconds: list[float] = field(default_factory=list)
    cached_seconds: list[float] = field(default_factory=list)
    full_forwards: int = 0  # whole-sequence forwards per run
    cached_full_forwards: int = 0
    same_answers: bool = True
    machine: str = field(default_factory=cpu_model)
    threads: int = field(default_factory=torch.get_num_threads)

    @property
    def ratio(self) -> float:
        return statistics.median(self.full_seconds) / statistics.median(self.cached_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "full_median_s": statistics.median(self.full_seconds),
            "cached_median_s": statistics.median(self.cached_seconds),
            "speedup": self.ratio,
        }


def _items(tokenizer_dir: Path, task: str, length: int, per_depth: int) -> list[TaskItem]:
    spec = parse_task(task)
    if spec.kind == "single":
        raise EvalError(
            "the single task is scored from one teacher-forced forward, not by generation",
            fix="pass a generated task: multikey-2, multikey-4, multivalue-2, multiquery-2 or absent-2",
        )
    grid = TaskGrid(PasskeyGrid(load_tokenizer(tokenizer_dir)))
    return [grid.item(spec, length, d, i) for d in DEPTHS for i in range(per_depth)]


def _timed(items: list[TaskItem], score: ScoreFn, batch: int, extend: PrefixExtender | None) -> tuple:
    calls = 0

    def counted(tokens: torch.Tensor) -> TokenScores:
        nonlocal calls
        calls += 1
        return score(tokens)

    t0 = time.perf_counter()
    answers = greedy_answers(items, counted, batch_size=batch, extend=extend)
    return answers, time.perf_counter() - t0, calls


def run_greedy_bench(
    checkpoint: Path,
    tokenizer_dir: Path,
    *,
    length: int,
    task: str,
    per_depth: int,
    batch_size: int,
    repeats: int,
) -> GreedyBench:
    items = _items(tokenizer_dir, task, length, per_depth)
    r = GreedyBench(str(checkpoint), length, task, len(items), batch_size, repeats)
    with eval_parallel(1) as par:
        loaded = load_model(checkpoint_info(checkpoint), par, max_length=length)
        score = model_scorer(loaded)
        extend = prefix_extender(loaded)
        if extend is None or not extend.fits(batch_size, length):
            raise EvalError(
                f"the prefix cache does not apply to {checkpoint} at {length:,} tokens, batch {batch_size}",
                fix="a causal checkpoint, and a batch whose keys and values fit 1 GiB",
            )
        for _ in range(repeats):  # alternated, so that a change of load hits both alike
            plain, sec, r.full_forwards = _timed(items, score, batch_size, None)
            r.full_seconds.append(sec)
            cached, sec, r.cached_full_forwards = _timed(items, score, batch_size, extend)
            r.cached_seconds.append(sec)
            r.same_answers = r.same_answers and cached == plain
    r.misses = sum(a != list(it.reference) for a, it in zip(plain, items, strict=True))
    return r
