"""One rehearsed stage in figures, each read from what the run left on disk (the metrics.jsonl its trainer
wrote: longctx's, or Megatron-LM's through longctx's runner; the chain's launches; the evaluation), and the
checks a stage must pass at its length."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from longctx.arch import ModelArch
from longctx.eval.results import CheckpointEval
from longctx.plan.derive import ResolvedStage
from longctx.plan.memory import CPU_LOCAL_BF16, CPU_LOCAL_FP32, GiB, MemoryInputs, estimate
from longctx.rehearse.chain import ChainRun

# a stage's last loss may sit this far above its first (the batches differ; data near its entropy floor
# cannot fall further): more is divergence
LOSS_RISE = 0.02
# the base the engine built, read back from float32 inverse frequencies, against the plan's integer
ROPE_TOLERANCE = 1e-5


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    ok: bool
    detail: str


class LengthFigures(BaseModel):
    """The stage's checkpoint evaluated at one length."""

    model_config = ConfigDict(extra="forbid")

    length: int
    greedy_accuracy: float
    loglik_accuracy: float | None = None
    mean_loss: float | None = None
    long_loss: float | None = None  # positions ≥ length / 2
    seconds: float


class StageFigures(BaseModel):
    """What a rehearsed stage measured; `checks` are what it must pass."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    seq_length: int
    cp: int
    cp_plan: int
    iterations: int
    seconds_per_iteration: float | None = None  # median over the stage's iterations
    seconds_per_token: float | None = None
    peak_memory_gib: float | None = None  # the largest rank's growth over its process before the model
    memory_model_gib: float  # the memory model for the micro shape on this device, per rank
    rotary_base_plan: int
    rotary_base_built: float | None = None
    longest_distance: int | None = None  # the largest position id RoPE was given
    losses: list[float] = Field(default_factory=list)
    loss_fell: bool = False  # the last iteration's loss below the first's
    launches: int = 0
    evaluation: list[LengthFigures] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def memory_model(arch: ModelArch, st: ResolvedStage, backend: str = "local") -> float:
    """Bytes per rank the memory model gives a step of `st` on the CPU: the local trainer's (fp32), or
    Megatron-LM's (bf16 weights with fp32 grads and masters, the distributed optimizer its argv asks)."""
    megatron = backend == "megatron-lm"
    inp = MemoryInputs(
        arch=arch,
        padded_vocab_size=st.padded_vocab_size,
        seq_length=st.seq_length,
        micro_batch_size=1,
        tp=1,
        pp=1,
        cp=st.cp,
        dp=1,
        num_microbatches=1,
        sequence_parallel=False,
        recompute=st.recompute,  # type: ignore[arg-type]
        distributed_optimizer=megatron,
        device=CPU_LOCAL_BF16 if megatron else CPU_LOCAL_FP32,
    )
    return estimate(inp, gpu_memory_gib=1024.0, margin=0.0).total


def _iterations_check(metrics: list[dict[str, Any]], target: int, chain: ChainRun, stage: str) -> Check:
    seen = [int(m["iteration"]) for m in metrics]
    ok = seen == list(range(1, target + 1))
    stop = chain.interruption if chain.interruption and chain.interruption.stage == stage else None
    if stop is None:
        return Check(name="iterations", ok=ok, detail=f"iterations {seen} of {target}")
    resumed = [launch for launch in chain.launches if launch.stage == stage and launch.action == "resume"]
    ok = ok and (stop.finished_first or (bool(resumed) and resumed[0].start_iteration == stop.stopped_at))
    return Check(
        name="resume",
        ok=ok,
        detail=f"SIGTERM stopped the stage at iteration {stop.stopped_at} of {stop.target}; resumed from "
        f"{resumed[0].start_iteration if resumed else '—'}; iterations trained {seen} (each once)",
    )


def _checks(fig: StageFigures, metrics: list[dict[str, Any]], target: int, chain: ChainRun) -> list[Check]:
    losses = fig.losses
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    checks = [
        Check(
            name="loss",
            ok=finite and losses[-1] <= losses[0] * (1 + LOSS_RISE),
            detail=f"loss {losses[0]:.4f} → {losses[-1]:.4f} ({'fell' if fig.loss_fell else 'did not fall'})"
            if losses
            else "no loss logged",
        ),
        _iterations_check(metrics, target, chain, fig.stage),
    ]
    built = fig.rotary_base_built
    checks.append(
        Check(
            name="rope",
            ok=built is not None
            and abs(built - fig.rotary_base_plan) <= ROPE_TOLERANCE * fig.rotary_base_plan,
            detail=f"built {built:,.0f} for the plan's {fig.rotary_base_plan:,}"
            if built
            else "no RoPE base read",
        )
    )
    want = fig.seq_length - 1
    checks.append(
        Check(
            name="distance",
            ok=fig.longest_distance == want,
            detail=f"longest position trained {fig.longest_distance} of {want}",
        )
    )
    at_length = next((e for e in fig.evaluation if e.length == fig.seq_length), None)
    checks.append(
        Check(
            name="evaluation",
            ok=at_length is not None,
            detail=f"evaluated at {[e.length for e in fig.evaluation]}",
        )
    )
    return checks


def _evaluation(ce: CheckpointEval | None) -> list[LengthFigures]:
    if ce is None:
        return []
    return [
        LengthFigures(
            length=r.length,
            greedy_accuracy=r.passkey.greedy_accuracy,
            loglik_accuracy=r.passkey.loglik_accuracy,
            mean_loss=r.position.mean_loss if r.position else None,
            long_loss=r.position.long_loss if r.position else None,
            seconds=r.seconds,
        )
        for r in ce.results
    ]


def stage_figures(
    st: ResolvedStage, real: ResolvedStage, ce: CheckpointEval | None, chain: ChainRun, model_bytes: float
) -> StageFigures:
    """`st` (the rehearsal's stage) beside `real` (the user's)."""
    metrics = read_metrics(st.stage_dir / "metrics.jsonl")
    # the step alone (a save of the iteration before is not the length's cost)
    seconds = [float(m["step_seconds"]) for m in metrics if "step_seconds" in m]
    spi = statistics.median(seconds) if seconds else None
    peaks = [m["peak_growth_bytes"] for m in metrics if m.get("peak_growth_bytes") is not None]
    fig = StageFigures(
        stage=st.name,
        seq_length=st.seq_length,
        cp=st.cp,
        cp_plan=real.cp,
        iterations=len(metrics),
        seconds_per_iteration=spi,
        seconds_per_token=spi / st.seq_length if spi else None,
        peak_memory_gib=max(peaks) / GiB if peaks else None,
        memory_model_gib=model_bytes / GiB,
        rotary_base_plan=real.rotary_base,
        rotary_base_built=next((m["rotary_base_built"] for m in metrics if m.get("rotary_base_built")), None),
        longest_distance=max((int(m["max_position"]) for m in metrics if "max_position" in m), default=None),
        losses=[float(m["loss"]) for m in metrics],
        evaluation=_evaluation(ce),
        launches=sum(1 for launch in chain.launches if launch.stage == st.name),
    )
    fig.loss_fell = len(fig.losses) > 1 and fig.losses[-1] < fig.losses[0]
    fig.checks = _checks(fig, metrics, st.train_iters, chain)
    return fig
