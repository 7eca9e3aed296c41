"""A stage's metrics.jsonl: one JSON line per training iteration, what `longctx rehearse`, the demo and the
trainer bench read. One schema and one writer for both trainers: longctx's own (`longctx.train.loop`) and
Megatron-LM's `pretrain_gpt.py` when longctx's runner is asked to record (`longctx.mcore.megatron_lm_metrics`).
"""

from __future__ import annotations

import dataclasses
import json
import resource
from pathlib import Path
from typing import IO, Any

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak so far: the CUDA allocator's on a GPU, else the resident set's high-water mark."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _status_kib("VmHWM") * 1024 or int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def start_memory_peak(device: torch.device) -> int:
    """Start measuring a new peak here and return the bytes in use now, to subtract from the peak later.

    On the CPU the resident set's high-water mark is reset to what is resident now (Linux's
    /proc/self/clear_refs): a transient peak of the imports before it would otherwise hide whatever a
    small model grows by, and the growth would read 0. Where the reset is refused, the peak so far.
    """
    if device.type == "cuda":
        return peak_memory_bytes(device)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return peak_memory_bytes(device)
    return _status_kib("VmRSS") * 1024 or peak_memory_bytes(device)


def _status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status; 0 where there is none (not Linux)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    return 0


@dataclasses.dataclass(frozen=True)
class IterationMetrics:
    """One iteration of a stage, as the whole group trained it (positions and memory: the largest rank's)."""

    stage: str
    iteration: int
    loss: float
    lr: float | None
    grad_norm: float | None
    tokens_per_s: float
    consumed_samples: int
    seconds: float  # since the last iteration's record (a save in between included)
    step_seconds: float  # the step alone
    max_position: int  # the largest position id RoPE was given so far in this launch
    peak_growth_bytes: int  # the process's peak over what it held before the model was built
    rotary_base_built: float | None  # read back from the built model's inverse frequencies

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class MetricsWriter:
    """Appends records to a metrics.jsonl (a resumed launch goes on after the last), one flushed line each."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, metrics: IterationMetrics) -> None:
        if self._file is not None:
            self._file.write(json.dumps(metrics.record()) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


__all__ = ["IterationMetrics", "MetricsWriter", "peak_memory_bytes", "start_memory_peak"]
