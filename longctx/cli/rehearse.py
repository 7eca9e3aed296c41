"""`longctx rehearse PLAN`: every stage of a plan at its full length on a micro model, here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from longctx.cli._common import cli_errors, console, print_json, resolved_plan, stdout_to_stderr
from longctx.cli._params import Json
from longctx.errors import StageError
from longctx.util.table import narrow_table
from longctx.util.units import human_length

if TYPE_CHECKING:
    from longctx.rehearse.run import RehearsalReport

BACKENDS = ("local", "megatron-lm")
# the rehearsal is imported inside the command: it loads torch, megatron-core and transformers

HELP = (
    "Rehearse PLAN before the cluster runs it: every stage at its full length (16K, 64K, 128K …) on a "
    "micro model that keeps the plan's attention structure (heads per group, qk-norm, rotary percent), "
    "with the plan's tokenizer, data, RoPE bases, objective and CP (reduced only to what this machine runs, "
    "and said so), through the same code as the real chain: preflight checks, `stage run` launches, a "
    "SIGTERM and resume in the longest stage, evaluation at every length up to each stage's, and "
    "`export hf` of the last stage with its logits checked against longctx's at the full length. Its run "
    "directory is its own (marked as a rehearsal); a rerun resumes. Exit 2 when a stage fails a check. "
    "With --backend megatron-lm the stages run through Megatron-LM's pretrain_gpt.py (CPU shims here), "
    "which records its own loss, step time, memory, built RoPE base and positions for the checks. "
    "With --slurm the stages run as the chain of Slurm jobs `slurm submit` queues (the plan's profile, "
    "`local`: the one-node cluster of scripts/slurm/local-cluster), the SIGTERM goes to the longest stage's "
    "job and the next job resumes from its save; the rehearsal waits for the chain and the eval jobs it "
    "submits (refused, before anything is written, without sbatch or while the run dir's jobs are queued).\n\n"
    "Examples:\n\n  longctx rehearse stages/baby_9b_dense.toml --run-dir /tmp/baby-rehearsal\n\n"
    "  longctx rehearse baby_9b_dense --run-dir r --tokenizer tok/ --manifest tok/manifest.toml --json\n\n"
    "  LONGCTX_MEGATRON_LM=~/Megatron-LM longctx rehearse stages/baby_9b_dense.toml --run-dir r "
    "--backend megatron-lm\n\n"
    "  longctx rehearse stages/baby_9b_dense.toml --run-dir r --slurm --slurm-time 20"
)


def _parse_depths(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise StageError(
            f"--depths {text!r} is not a comma-separated list of fractions",
            where="--depths",
            fix="e.g. --depths 0,0.5",
        ) from None


def _backend(text: str) -> str:
    if text not in BACKENDS:
        raise StageError(
            f"unknown backend {text!r}", where="--backend", fix=f"use one of: {', '.join(BACKENDS)}"
        )
    return text


def _check_slurm_time(slurm: bool, minutes: int | None) -> None:
    if not slurm and minutes is not None:
        raise StageError(
            "--slurm-time is the time limit of the Slurm chain's jobs, but --slurm is not given",
            where="--slurm-time",
            fix="add --slurm, or leave out --slurm-time",
        )


def report_table(report: object) -> Table:
    on = "" if report.chain == "local" else " (Slurm jobs)"  # type: ignore[attr-defined]
    t = narrow_table(f"longctx rehearse: stages on {report.backend}{on}")  # type: ignore[attr-defined]
    for c in ("stage", "length", "CP", "s/iter", "µs/token", "peak GiB", "model GiB", "RoPE built", "checks"):
        t.add_column(c, justify="left" if c in ("stage", "checks") else "right")
    for s in report.stages:  # type: ignore[attr-defined]
        failed = [c.name for c in s.checks if not c.ok]
        t.add_row(
            s.stage,
            human_length(s.seq_length),
            f"{s.cp}" if s.cp == s.cp_plan else f"{s.cp} (plan {s.cp_plan})",
            "—" if s.seconds_per_iteration is None else f"{s.seconds_per_iteration:.1f}",
            "—" if s.seconds_per_token is None else f"{1e6 * s.seconds_per_token:.0f}",
            "—" if s.peak_memory_gib is None else f"{s.peak_memory_gib:.2f}",
            f"{s.memory_model_gib:.2f}",
            "—" if s.rotary_base_built is None else f"{s.rotary_base_built:,.0f}",
            "ok" if not failed else "FAILED: " + ", ".join(failed),
        )
    return t


def print_report(report: RehearsalReport) -> None:
    """The report as text: the stages' table, then what was reduced, the cost of length, the jobs, the export."""
    console.print(report_table(report))
    for r in report.reductions:
        console.print(
            f"  reduced{f' ({r.stage})' if r.stage else ''}: {r.what}", highlight=False, soft_wrap=True
        )
    if report.cost is not None and report.cost.seconds_per_token_ratio is not None:
        c = report.cost
        console.print(
            f"cost of length: seconds per token ×{c.seconds_per_token_ratio:.2f} from the first stage to the "
            f"last, FLOPs per token ×{c.flops_per_token_ratio:.2f} (attention ×{c.attention_flops_ratio:.1f}); "
            f"a {c.matmul} runs at {c.matmul_flops_per_s / 1e9:.1f} GFLOP/s",
            highlight=False,
            soft_wrap=True,
        )
    if report.slurm_jobs:
        jobs = ", ".join(f"{j.job_id} {j.state}" for j in report.slurm_jobs)
        evals = ", ".join(f"{st} {j.job_id} {j.state}" for st, j in report.eval_jobs.items()) or (
            f"none ({report.eval_jobs_skipped})" if report.eval_jobs_skipped else "none"
        )
        console.print(f"slurm: chain jobs {jobs}; eval jobs {evals}", highlight=False, soft_wrap=True)
    if report.export is not None:
        e = report.export
        console.print(
            f"export: logits at {e.length:,} tokens within {e.relative_difference:.1e} of longctx's "
            f"(argmax agreement {e.argmax_agreement:.1%})",
            highlight=False,
        )


@cli_errors
def rehearse(
    plan: Path = typer.Argument(..., help="the plan to rehearse (a path, or a shipped plan's name)"),
    run_dir: Path = typer.Option(
        ..., "--run-dir", help="the rehearsal's own directory (created; a rerun resumes)"
    ),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="rehearse with this tokenizer (one of the plan's kind)"
    ),
    manifest: Path | None = typer.Option(
        None, "--manifest", help="the manifest --tokenizer is checked against"
    ),
    iterations: int = typer.Option(3, "--iterations", min=2, max=100, help="training iterations per stage"),
    max_ranks: int = typer.Option(
        8, "--max-ranks", min=1, max=64, help="the most processes one stage runs here"
    ),
    layers: int = typer.Option(2, "--layers", min=1, max=8, help="layers of the micro model"),
    head_dim: int = typer.Option(16, "--head-dim", min=8, max=256, help="the largest head dim kept"),
    depths: str = typer.Option("0,0.5", "--depths", help="needle depths evaluated, comma-separated"),
    backend: str = typer.Option(
        "local",
        "--backend",
        help="local (longctx's trainer) or megatron-lm (the stages through pretrain_gpt.py of "
        "$LONGCTX_MEGATRON_LM or [megatron].path, on this machine)",
    ),
    slurm: bool = typer.Option(
        False, "--slurm", help="run the stages as a chain of Slurm jobs (sbatch), as `slurm submit` does"
    ),
    slurm_time: int | None = typer.Option(
        None,
        "--slurm-time",
        min=2,
        help="--slurm: each chain job's time limit in minutes (default: the profile's)",
    ),
    json_out: Json = False,
) -> None:
    from longctx.plan.micro import MicroShapeOptions
    from longctx.plan.rehearsal import RehearsalOptions
    from longctx.rehearse.run import rehearse as run_rehearsal
    from longctx.rehearse.slurm_chain import SlurmRehearsal

    _check_slurm_time(slurm, slurm_time)
    opts = RehearsalOptions(
        shape=MicroShapeOptions(layers=layers, head_dim=head_dim),
        iterations=iterations,
        max_ranks=max_ranks,
        depths=_parse_depths(depths),
        tokenizer=tokenizer,
        manifest=manifest,
        backend=_backend(backend),
    )
    source = resolved_plan(plan)
    with stdout_to_stderr(json_out):
        report = run_rehearsal(
            source,
            run_dir,
            opts,
            echo=lambda s: console.print(s, highlight=False, soft_wrap=True),
            slurm=SlurmRehearsal(time_minutes=slurm_time) if slurm else None,
        )
    if json_out:
        print_json(report.model_dump(mode="json") | {"ok": report.ok})
    else:
        print_report(report)
    if not report.ok:
        if json_out:  # the report above is the one JSON document; its "ok" says what failed
            raise typer.Exit(2)
        failed = [f"{s.stage}: {c.name} ({c.detail})" for s in report.stages for c in s.checks if not c.ok]
        raise StageError(
            "the rehearsal found problems: " + "; ".join(failed + report.problems),
            where=report.run_dir,
            fix="fix what failed before the real run; rerun the rehearsal to check",
        )
