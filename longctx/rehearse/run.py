"""`longctx rehearse PLAN`: every stage of a plan at its full length, on a micro model, here, before
the cluster spends an allocation on it.

Steps (a rehearsal's run directory is its own, marked with `rehearsal.json`; a rerun resumes):
 1. plan      — the rehearsal plan derived from the user's (`longctx.plan.rehearsal`), written as TOML;
 2. checks    — the tokenizer against its manifest, every stage's data at its length and budget;
 3. base      — a micro base initialised and saved at the base's length (one training step);
 4. stages    — the chain through `run_until_done`, one `stage run` per step on the rehearsal's backend
                (longctx's trainer, or Megatron-LM's pretrain_gpt.py recording its own measurements),
                SIGTERM once in the longest stage after its first save, then the resume; with `slurm`,
                the same steps as a chain of Slurm jobs (`slurm_chain.py`), with their eval jobs;
 5. eval      — each stage's checkpoint at every plan length up to its own;
 6. export    — the last stage to Hugging Face, its logits against longctx's at the full length;
 7. report    — per stage: time, memory against the memory model, the RoPE base built, the longest
                distance trained, the loss, the resume, evaluation and export at length.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from longctx.checkpoint.save_layout import read_tracker
from longctx.data.check import DataReport
from longctx.errors import StageError
from longctx.eval.data import heldout_for_stage
from longctx.eval.engine import CheckpointRef, evaluate_checkpoints
from longctx.eval.results import CheckpointEval
from longctx.eval.runner import plan_lengths, plan_settings
from longctx.export import export_hf
from longctx.launch.local import LocalLauncher
from longctx.plan.derive import ResolvedPlan, open_plan
from longctx.plan.rehearsal import (
    Reduction,
    RehearsalOptions,
    RehearsalPlan,
    rehearsal_plan,
    write_rehearsal_plan,
)
from longctx.plan.rehearsal_mark import REHEARSAL_MARK
from longctx.plan.stage_data import check_plan_data, plan_tokenizer, stage_blend
from longctx.rehearse.chain import ChainRun, LocalChain, SlurmJob
from longctx.rehearse.cost import LengthCost, length_cost
from longctx.rehearse.figures import StageFigures, memory_model, stage_figures
from longctx.rehearse.parity import Parity, export_parity
from longctx.rehearse.slurm_chain import SlurmChain, SlurmRehearsal, require_slurm
from longctx.slurm.commands import preflight_chain
from longctx.slurm.profiles import load_profile
from longctx.stage.checkout import require_checkout_version
from longctx.stage.run import megatron_lm_script, megatron_on_cpu, refuse_python_megatron_cannot_resume
from longctx.tokenizer import load_tokenizer, verify_tokenizer
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec
from longctx.util.fs import atomic_write_json

Echo = Callable[[str], None]
PLAN_FILE = "plan.toml"
BASE_ITERATIONS = 1


class RehearsalReport(BaseModel):
    """What `longctx rehearse` prints (and `--json` gives whole)."""

    model_config = ConfigDict(extra="forbid")

    plan: str
    rehearsal_plan: str
    run_dir: str
    backend: str
    machine: str
    reductions: list[Reduction] = Field(default_factory=list)
    stages: list[StageFigures] = Field(default_factory=list)
    interruption: dict[str, object] | None = None
    export: Parity | None = None
    cost: LengthCost | None = None  # seconds per token by length against the FLOPs, FLOP/s against a matmul
    export_dir: str | None = None
    export_skipped: str | None = (
        None  # why the last stage was not exported (a diffusion objective, or not asked)
    )
    preflight: str | None = None  # megatron-lm: what Megatron-LM's parser accepted before the chain
    chain: str = "local"  # where the stages ran: "local" (`stage run` here) or "slurm" (a chain of jobs)
    slurm_jobs: list[SlurmJob] = Field(default_factory=list)  # slurm: the chain's jobs as they ended
    # slurm: stage → the eval job `slurm job-end` submitted when the stage finished, as it ended
    eval_jobs: dict[str, SlurmJob] = Field(default_factory=dict)
    eval_jobs_skipped: str | None = None  # slurm: why the chain had no eval jobs
    wall_seconds: float = 0.0
    load_average: tuple[float, float, float] | None = None  # at the end: what shared the cores
    problems: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.problems and all(s.ok for s in self.stages) and (self.export is None or self.export.ok)
        )


def machine() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _check_mark(run_dir: Path, rehearsal: RehearsalPlan, backend: str) -> None:
    """The run dir is a rehearsal's: refuse one that holds a real run, another plan's rehearsal, or one
    on the other backend (its finished stages would be reported as this backend's)."""
    mark = run_dir / REHEARSAL_MARK
    if mark.exists():
        marked = json.loads(mark.read_text(encoding="utf-8"))
        source = marked.get("source")
        if source != rehearsal.source:
            raise StageError(
                f"{run_dir} holds the rehearsal of another plan ({source})",
                where=str(mark),
                fix="give another --run-dir, or remove that directory",
            )
        before = marked.get("backend", "local")  # marks written before the megatron-lm backend
        if before != backend:
            raise StageError(
                f"{run_dir} holds a rehearsal on the {before} backend; this one runs on {backend}",
                where=str(mark),
                fix=f"give another --run-dir for the {backend} rehearsal, or rerun with --backend {before}",
            )
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise StageError(
            f"{run_dir} is not empty and is no rehearsal's run directory",
            where=str(run_dir),
            fix="give an empty or new --run-dir: a rehearsal never writes into a real run",
        )


def _mark(run_dir: Path, rehearsal: RehearsalPlan, backend: str, chain: str) -> None:
    """Mark the run dir as this rehearsal's; `chain` says where its stages last ran (either way's saves
    resume the other's: both run the same `stage run`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        run_dir / REHEARSAL_MARK,
        {
            "source": rehearsal.source,
            "rehearsal": True,
            "backend": backend,
            "chain": chain,
            "reductions": [r.model_dump() for r in rehearsal.reductions],
        },
    )


def _checks(rp: ResolvedPlan, echo: Echo) -> None:
    rep = verify_tokenizer(rp.tokenizer.path, rp.tokenizer.manifest)
    if not rep.ok:
        errors = "; ".join(f.message for f in rep.findings.errors)
        raise StageError(
            f"the tokenizer does not match its manifest: {errors}",
            where=str(rp.tokenizer.path),
            fix="rehearse with the tokenizer the manifest pins (--tokenizer/--manifest)",
        )
    # what `plan check --check-data` runs: each stage's data at its length and budget, its split, coverage
    for name, report in check_plan_data(rp, tokenizer=rp.tokenizer.path, scan=False).items():
        found = report.all_findings() if isinstance(report, DataReport) else report.findings
        if found.errors:
            first = found.errors[0]
            raise StageError(
                f"the data of stage {name} fails its checks: {first.message}",
                where=first.where,
                fix=first.fix,
            )
    echo(
        f"    tokenizer matches {rp.tokenizer.manifest_path}; data passes at {[s.seq_length for s in rp.stages]}"
    )


def _base(rp: ResolvedPlan, run_dir: Path, echo: Echo) -> None:
    """A micro base: initialised and trained one step at the base's length, saved where the plan looks."""
    save = rp.base.path
    assert save is not None
    if save.exists() and read_tracker(save) is not None:
        return
    tok = load_tokenizer(rp.tokenizer.path)
    first = rp.stages[0]
    seq = rp.base.seq_length
    spec = TrainSpec(
        stage="base",
        arch=rp.arch,
        seq_length=seq,
        max_position_embeddings=seq,
        rotary_base=rp.base.rotary_base,
        padded_vocab_size=first.padded_vocab_size,
        output_vocab_size=first.output_vocab_size,
        objective=rp.objective,
        tokenizer=TokenizerInfo(
            path=str(rp.tokenizer.path),
            md5=tok.md5,
            vocab_size=tok.vocab_size,
            eod_id=tok.eod_id,
            pad_id=tok.pad_id,
        ),
        data=[(e.weight, e.prefix) for e in stage_blend(rp, first).entries],
        split=first.data.split if first.data else "99,1,0",
        data_cache_path=str(run_dir / "cache"),
        global_batch_size=1,
        train_iters=BASE_ITERATIONS,
        lr=LRSchedule(lr=1e-3, min_lr=1e-4, decay_iters=BASE_ITERATIONS),
        save=str(save),
        save_interval=BASE_ITERATIONS,
        metrics_file=str(run_dir / "base" / "metrics.jsonl"),
    )
    spec_path = run_dir / "base" / "train_spec.json"
    spec.dump(spec_path)
    code = LocalLauncher(echo=False).run(
        [sys.executable, "-m", "longctx.train", "--spec", str(spec_path)],
        nproc=1,
        env={"OMP_NUM_THREADS": str(os.cpu_count() or 1)},
        log=run_dir / "base" / "train.log",
    )
    if code != 0:
        raise StageError(
            f"the micro base failed to build (exit {code})", where=str(run_dir / "base" / "train.log")
        )
    echo(f"    micro base saved at {seq:,} tokens, RoPE base {rp.base.rotary_base:,} → {save}")


def _evaluate(rp: ResolvedPlan, echo: Echo) -> dict[str, CheckpointEval]:
    """Each stage at every plan length up to its own (its checkpoint alone: the ladder is not the point)."""
    settings = plan_settings(rp)
    out: dict[str, CheckpointEval] = {}
    for st in rp.stages:
        t0 = time.monotonic()
        ref = CheckpointRef(
            st.name, st.save_dir, allow_extrapolation=True, expected_rotary_base=st.rotary_base
        )
        lengths = [
            n for n in plan_lengths(rp, st.index) if n >= rp.stages[0].seq_length or n == st.seq_length
        ]
        report = evaluate_checkpoints(
            [ref],
            lengths=lengths,
            tokenizer=plan_tokenizer(rp),
            heldout=heldout_for_stage(rp, st),
            settings=settings,
            short_length=int(rp.base.seq_length),
            cache_dir=Path(rp.run_dir) / "eval" / "cache",
            plan=rp.name,
            stage=st.name,
        )
        out[st.name] = report.checkpoints[0]
        echo(f"    eval {st.name} at {', '.join(f'{n:,}' for n in lengths)} [{time.monotonic() - t0:.1f} s]")
    return out


def _export(rp: ResolvedPlan, plan_file: Path, echo: Echo) -> tuple[Parity, Path]:
    last = rp.stages[-1]
    out = Path(rp.run_dir) / "export" / last.name
    if not (out / "config.json").exists():
        export_hf(last.save_dir, plan_file, out=out, stage=last.name, run_dir=rp.run_dir)
    tok = load_tokenizer(rp.tokenizer.path)
    parity = export_parity(last.save_dir, out, length=last.seq_length, vocab=tok.vocab_size)
    echo(
        f"    export {last.name} → {out}: logits at {last.seq_length:,} tokens within "
        f"{parity.relative_difference:.1e} of longctx's"
    )
    return parity, out


def _megatron_lm(rp: ResolvedPlan, opts: RehearsalOptions) -> RehearsalOptions:
    """megatron-lm: the checkout the stages will run (refused before anything is written when there is none
    here, it has another release line than the plan's, or this Python cannot resume Megatron-LM's saves)."""
    if opts.backend != "megatron-lm":
        return opts
    script = megatron_lm_script(rp)
    require_checkout_version(rp, script.parent)
    refuse_python_megatron_cannot_resume()
    return opts.model_copy(update={"megatron_lm": script.parent})


# how Megatron-LM trains here without CUDA (longctx.mcore.megatron_lm_cpu), against the cluster's build
MEGATRON_ON_CPU = Reduction(
    what="Megatron-LM on this machine's CPU: megatron-core's local layers (no TransformerEngine, no fused "
    "kernels), gloo, CP > 1 through longctx's ring attention (--spec)",
    real_needs="the nodes' TransformerEngine and NCCL: `slurm submit` preflights every stage's argv against the "
    "cluster profile's device facts",
)


def _preflight(rp: ResolvedPlan, opts: RehearsalOptions, echo: Echo) -> str | None:
    """megatron-lm: every stage's argv through the checkout's parser once, before the chain, as `slurm submit`
    does before it queues one (the launches then skip theirs, as the chain's jobs could)."""
    if opts.backend != "megatron-lm":
        return None
    report = preflight_chain(rp, load_profile(rp.cluster.profile))
    if report is None:
        return None
    said = f"{len(report.stages)} stages accepted by {report.script} ({report.facts.source})"
    echo(f"    preflight: {said}")
    return said


def longest_stage(rp: ResolvedPlan) -> str:
    return max(rp.stages, key=lambda s: (s.seq_length, s.index)).name


def _chain(
    plan_file: Path,
    rp: ResolvedPlan,
    backend: str,
    interrupt: str | None,
    slurm: SlurmRehearsal | None,
    echo: Echo,
) -> ChainRun:
    """The stages: `stage run` subprocesses here, or (`slurm`) the chain of Slurm jobs a real run submits."""
    if slurm is not None:
        return SlurmChain(plan_file, rp.run_dir, interrupt=interrupt, echo=echo, options=slurm).run()
    return LocalChain(plan_file, rp.run_dir, backend=backend, interrupt=interrupt, echo=echo).run()


def _job_problems(chain: ChainRun) -> list[str]:
    """An eval job that did not complete is a problem: the cluster's eval job of that stage would fail too."""
    return [
        f"the eval job {job.job_id} of stage {stage} ended {job.state} (its log: slurm-{job.job_id}.log)"
        for stage, job in chain.eval_jobs.items()
        if job.state != "COMPLETED"
    ]


def rehearse(
    source: ResolvedPlan,
    run_dir: Path,
    opts: RehearsalOptions | None = None,
    *,
    echo: Echo = print,
    interrupt: bool = True,
    export: bool = True,
    slurm: SlurmRehearsal | None = None,
) -> RehearsalReport:
    """Rehearse `source` in `run_dir` (see the module docstring); the report says what each stage did.
    `interrupt=False` / `export=False` leave out the SIGTERM and the export: a rerun that has proven them
    already (e.g. with one stage changed) need not pay for them again. `slurm`: the stages run as a chain
    of Slurm jobs (refused before anything is written where there is no sbatch, or the run dir's jobs
    are still queued)."""
    t0 = time.monotonic()
    run_dir = run_dir.resolve()
    opts = _megatron_lm(source, opts or RehearsalOptions())
    rehearsal = rehearsal_plan(source, run_dir, opts)
    if opts.backend == "megatron-lm" and megatron_on_cpu():
        rehearsal.reductions.append(MEGATRON_ON_CPU)
    _check_mark(run_dir, rehearsal, opts.backend)
    if slurm is not None:
        require_slurm(run_dir)
    _mark(run_dir, rehearsal, opts.backend, "local" if slurm is None else "slurm")
    plan_file = write_rehearsal_plan(rehearsal, run_dir / PLAN_FILE)
    rp = open_plan(plan_file, run_dir)
    echo(f"==> rehearsal of {rehearsal.source} in {run_dir} ({len(rehearsal.reductions)} reductions)")
    _checks(rp, echo)
    preflight = _preflight(rp, opts, echo)
    _base(rp, run_dir, echo)
    chain = _chain(plan_file, rp, opts.backend, longest_stage(rp) if interrupt else None, slurm, echo)
    rp = open_plan(plan_file, run_dir)
    evals = _evaluate(rp, echo)
    parity, out, skipped = None, None, None
    if not export:
        skipped = "not asked for (export=False)"
        echo(f"    export skipped: {skipped}")
    elif rp.objective.kind == "ar":
        parity, out = _export(rp, plan_file, echo)
    else:  # `export hf` refuses it: no transformers causal LM computes a bidirectional denoiser
        skipped = f"export hf takes autoregressive plans; this one trains {rp.objective.kind}"
        echo(f"    export skipped: {skipped}")
    stages = [
        stage_figures(
            st, source.stage(st.name), evals.get(st.name), chain, memory_model(rp.arch, st, opts.backend)
        )
        for st in rp.stages
    ]
    cost = length_cost(
        rp.arch,
        [(s.stage, s.seq_length, s.seconds_per_iteration) for s in stages],
        causal=rp.objective.causal,
        vocab_rows=rp.stages[0].padded_vocab_size,
    )
    report = RehearsalReport(
        plan=rehearsal.source,
        rehearsal_plan=str(plan_file),
        run_dir=str(run_dir),
        backend=opts.backend,
        machine=machine(),
        reductions=rehearsal.reductions,
        stages=stages,
        interruption=chain.interruption.model_dump() if chain.interruption else None,
        export=parity,
        cost=cost,
        export_dir=None if out is None else str(out),
        export_skipped=skipped,
        preflight=preflight,
        chain=chain.chain,
        slurm_jobs=chain.jobs,
        eval_jobs=chain.eval_jobs,
        eval_jobs_skipped=chain.eval_jobs_skipped,
        problems=_job_problems(chain),
        wall_seconds=time.monotonic() - t0,
        load_average=os.getloadavg(),
    )
    atomic_write_json(run_dir / "report.json", report.model_dump(mode="json") | {"ok": report.ok})
    return report


__all__ = ["RehearsalReport", "longest_stage", "rehearse"]
