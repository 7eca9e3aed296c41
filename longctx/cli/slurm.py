"""`longctx slurm …`: batch scripts, self-healing job chains, their status, cancelling them."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from longctx.cli._common import cli_errors, console, err_console, print_json, resolved_plan
from longctx.cli._params import Json, Plan, RunDir, force
from longctx.util.table import narrow_table

if TYPE_CHECKING:
    from longctx.plan.derive import ResolvedPlan
    from longctx.slurm.chain import ChainEstimate
    from longctx.slurm.script import Rendered
    from longctx.slurm.status import ChainStatus

app = typer.Typer(
    help=(
        "Slurm job chains that carry on from the last checkpoint, across stages, until the plan is done.\n\n"
        "Every job of a chain runs the same script: `longctx stage run` decides from disk what to train, so any "
        "job may die (time limit, node failure, hang) and the next one continues; the job that finds the plan "
        "complete cancels the rest.\n\n"
        "Examples:\n\n"
        "  longctx slurm render stages/baby_9b_dense.toml --out jobs/          # look before submitting\n\n"
        "  longctx slurm submit stages/baby_9b_dense.toml --dry-run            # the estimate and sbatch lines\n\n"
        "  longctx slurm submit stages/baby_9b_dense.toml --chain 12\n\n"
        "  longctx slurm status stages/baby_9b_dense.toml --json\n\n"
        "  longctx slurm cancel stages/baby_9b_dense.toml\n\n"
        "  longctx slurm profiles                                            # leonardo, generic, local, …"
    ),
    no_args_is_help=True,
)

# The library is imported inside the commands: `longctx --help` need not load the plan machinery.

PROFILE = typer.Option(
    None, "--profile", help="cluster profile name or .toml path (default: the plan's cluster.profile)"
)
OUT = typer.Option(None, "--out", help="where the scripts go (default: RUN_DIR/slurm)")
TIME = typer.Option(None, "--time", help='time limit per job, Slurm format ("24:00:00", "1" = 1 minute)')
SIGNAL = typer.Option(None, "--signal", help='signal before the time limit, e.g. "TERM@240" (never B:)')
QOS = typer.Option(None, "--qos", help="QoS (checked against the profile's QoS table)")
PARTITION = typer.Option(None, "--partition", help="partition")
ACCOUNT = typer.Option(None, "--account", help="account")
BACKEND = typer.Option(None, "--backend", help="local or megatron-lm (default: the profile's)")
LONGCTX_CMD = typer.Option(
    None, "--longctx-cmd", help="how jobs run longctx (default: this interpreter with -m longctx)"
)
Force = force("queue a chain even if jobs of this plan are still queued")


def _render(
    plan: Path,
    run_dir: Path | None,
    profile: str | None,
    out: Path | None,
    time: str | None,
    signal: str | None,
    qos: str | None,
    partition: str | None,
    account: str | None,
    backend: str | None,
    longctx_cmd: str | None,
) -> tuple[ResolvedPlan, Rendered]:
    from longctx.slurm.script import render

    rp = resolved_plan(plan, run_dir)
    overrides: dict[str, Any] = {
        "time": time,
        "signal": signal,
        "qos": qos,
        "partition": partition,
        "account": account,
        "backend": backend,
    }
    try:
        cmd = shlex.split(longctx_cmd) if longctx_cmd else None
    except ValueError as err:
        from longctx.errors import SlurmError

        raise SlurmError(
            f"--longctx-cmd cannot be split into words: {err}",
            where="--longctx-cmd",
            fix="balance its quotes, e.g. --longctx-cmd '/opt/venv/bin/longctx'",
        ) from None
    return rp, render(rp, profile=profile, overrides=overrides, out_dir=out, longctx_command=cmd)


def _warn(rendered: Rendered) -> None:
    for w in rendered.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)


@app.command("render")
@cli_errors
def render_cmd(
    plan: Plan,
    run_dir: RunDir = None,
    profile: str | None = PROFILE,
    out: Path | None = OUT,
    time: str | None = TIME,
    signal: str | None = SIGNAL,
    qos: str | None = QOS,
    partition: str | None = PARTITION,
    account: str | None = ACCOUNT,
    backend: str | None = BACKEND,
    longctx_cmd: str | None = LONGCTX_CMD,
    stdout: bool = typer.Option(False, "--stdout", help="print the chain script instead of writing files"),
    json_out: Json = False,
) -> None:
    """Write the plan's batch scripts: chain.sbatch (every chain job) and, for megatron-lm, eval-STAGE.sbatch.

    Values come from the profile, then the plan's slurm table, then these options; QoS limits, the
    time limit against exit_duration_in_mins + the save margin, and the signal are checked first.

    Example: longctx slurm render stages/baby_9b_dense.toml --profile leonardo --out jobs/
    """
    _, rendered = _render(
        plan, run_dir, profile, out, time, signal, qos, partition, account, backend, longctx_cmd
    )
    _warn(rendered)
    if stdout:
        typer.echo(rendered.chain.text, nl=False)
        return
    written = rendered.write()
    if json_out:
        print_json(
            {
                "scripts": [str(p) for p in written],
                "warnings": list(rendered.warnings),
                "profile": rendered.settings.profile.name,
                "nodes": rendered.settings.nodes,
            }
        )
        return
    for p in written:
        console.print(f"[green]wrote[/] {p}", highlight=False)


@app.command("submit")
@cli_errors
def submit_cmd(
    plan: Plan,
    chain: int | None = typer.Option(
        None, "--chain", help="number of jobs (default: estimated from tokens and throughput)"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the estimate and the sbatch commands; submit nothing"
    ),
    force: Force = False,
    run_dir: RunDir = None,
    profile: str | None = PROFILE,
    out: Path | None = OUT,
    time: str | None = TIME,
    signal: str | None = SIGNAL,
    qos: str | None = QOS,
    partition: str | None = PARTITION,
    account: str | None = ACCOUNT,
    backend: str | None = BACKEND,
    longctx_cmd: str | None = LONGCTX_CMD,
    preflight: bool | None = typer.Option(
        None,
        "--preflight/--no-preflight",
        help="megatron-lm backend: check every stage left with the checkout's Megatron-LM and the profile's "
        "device facts before queueing (default: on, except with --dry-run)",
    ),
    json_out: Json = False,
) -> None:
    """Render the scripts and queue N chain jobs, each `--dependency=afterany:` the previous one.

    Before queueing, a megatron-lm chain's stages go through the checkout's Megatron-LM (`stage args
    --check`): a refused argv (unknown flag, validator assertion, missing TE) fails here, not on the nodes.

    Job ids go to the ledger. Without --chain, N = the jobs the remaining tokens need at the profile's (or
    the plan's slurm.tokens_per_gpu_second) throughput, plus spares (see `longctx.slurm.chain`).

    Example: longctx slurm submit stages/baby_9b_dense.toml --dry-run
    """
    from longctx.slurm.chain import submit

    rp, rendered = _render(
        plan, run_dir, profile, out, time, signal, qos, partition, account, backend, longctx_cmd
    )
    _warn(rendered)
    if rendered.settings.backend == "megatron-lm" and (preflight if preflight is not None else not dry_run):
        from longctx.slurm.commands import preflight_chain

        report = preflight_chain(rp, rendered.settings.profile)
        if report is not None:
            err_console.print(
                f"preflight: Megatron-LM accepts {', '.join(s.stage for s in report.stages)} "
                f"({report.facts.source}, {report.seconds:.0f} s)",
                highlight=False,
            )
    result = submit(rendered, rp, chain=chain, dry_run=dry_run, force=force)
    if json_out:
        print_json(result)
        return
    if result.estimate is not None:
        console.print(_estimate_table(result.estimate))
    if dry_run:
        console.print(
            f"[bold]dry run[/]: {len(result.commands)} jobs; scripts not written (`slurm render` writes them)"
        )
        for argv in result.commands:
            typer.echo(" ".join(shlex.quote(w) for w in argv))
        return
    console.print(
        f"[green]queued[/] {len(result.job_ids)} jobs (chain {result.chain_id}): {', '.join(result.job_ids)}",
        highlight=False,
    )


def _estimate_table(est: ChainEstimate) -> Table:
    t = Table(
        title=f"chain estimate: {est.jobs} jobs ({est.spare} spare), {est.train_minutes_per_job:.0f} min of "
        "training per job"
    )
    for c in ("stage", "iterations left", "tokens left", "tokens/s (job)", "hours", "jobs"):
        t.add_column(c, justify="right")
    for s in est.stages:
        t.add_row(
            s.stage,
            f"{s.remaining_iterations:,}",
            f"{s.remaining_tokens:,}",
            f"{s.tokens_per_second:,.0f}",
            f"{s.train_hours:.1f}",
            str(s.jobs),
        )
    return t


@app.command("status")
@cli_errors
def status_cmd(
    plan: Plan,
    run_dir: RunDir = None,
    profile: str | None = PROFILE,
    json_out: Json = False,
) -> None:
    """Per stage: iteration / target, tokens, last checkpoint, ETA; every job of the plan and its state.

    Example: longctx slurm status stages/baby_9b_dense.toml --json
    """
    from longctx.slurm.status import chain_status

    st = chain_status(resolved_plan(plan, run_dir), profile=profile)
    if json_out:
        print_json(st)
        return
    console.print(_status_tables(st))


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    from longctx.slurm.timefmt import format_seconds

    return format_seconds(seconds)


def _count(n: int) -> str:
    """Token counts in a column: 51,200 / 12.3M / 4.5B."""
    for unit, scale in (("B", 10**9), ("M", 10**6)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:,}"


def _status_tables(st: ChainStatus) -> Table:
    outer = Table.grid()
    t = narrow_table(
        f"{st.plan}: next {st.next_action}"
        + (f" {st.next_stage}" if st.next_stage else "")
        + f" — {st.next_reason}"
    )
    for c in ("stage", "status", "iteration", "tokens", "last save", "tokens/s", "ETA stage", "ETA plan"):
        t.add_column(c, justify="left" if c in ("stage", "status") else "right")
    for s in st.stages:
        t.add_row(
            s.stage,
            s.status,
            f"{s.iteration}/{s.target}",
            f"{_count(s.tokens_done)}/{_count(s.tokens_target)}",
            "—" if s.last_checkpoint_iteration is None else str(s.last_checkpoint_iteration),
            "?"
            if s.tokens_per_s is None
            else f"{s.tokens_per_s:,.0f}" + ("" if s.rate_source == "pace" else "~"),
            _hms(s.stage_eta_seconds),
            _hms(s.eta_seconds),
        )
    outer.add_row(t)
    for s in st.stages:
        if s.resume_jump:
            outer.add_row(f"[yellow]warning:[/] {s.stage}: {escape(s.resume_jump)}")
    j = narrow_table(
        f"jobs (finished states from {st.job_source}" + ("" if st.slurm else "; Slurm not reachable") + ")"
    )
    for c in ("job", "kind", "state", "exit", "elapsed", "stage", "iterations", "note"):
        j.add_column(c)
    for r in st.jobs:
        j.add_row(
            r.job_id,
            r.kind + (f" #{r.position}" if r.position else ""),
            r.state,
            r.exit_code or "",
            r.elapsed or "",
            r.stage or "",
            r.iterations or "",
            r.note or r.reason or "",
        )
    outer.add_row(j)
    outer.add_row(
        f"running: {', '.join(st.running) or '—'}   pending: {', '.join(st.pending) or '—'}   "
        f"ETA: {_hms(st.eta_seconds)}"
    )
    if st.last_failure:
        outer.add_row(f"[red]last failure:[/] {st.last_failure}")
    return outer


@app.command("cancel")
@cli_errors
def cancel_cmd(plan: Plan, run_dir: RunDir = None, json_out: Json = False) -> None:
    """Cancel every queued or running job this plan submitted (chain and eval jobs).

    Example: longctx slurm cancel stages/baby_9b_dense.toml
    """
    from longctx.slurm.chain import cancel

    ids = cancel(resolved_plan(plan, run_dir))
    if json_out:
        print_json({"cancelled": ids})
        return
    console.print(f"cancelled {len(ids)} jobs" + (f": {', '.join(ids)}" if ids else ""), highlight=False)


@app.command("job-end", hidden=True)
@cli_errors
def job_end_cmd(
    plan: Plan,
    run_dir: RunDir = None,
    exit_code: int = typer.Option(..., "--exit-code", help="exit status of `stage run` in this job"),
    scripts_dir: Path | None = typer.Option(
        None, "--scripts-dir", help="where eval-STAGE.sbatch scripts are"
    ),
    json_out: Json = False,
) -> None:
    """Run by each chain job after `stage run`: record its end, submit finished stages' eval jobs, and
    cancel the jobs queued behind when the plan is complete (or cannot go on)."""
    from longctx.slurm.chain import job_end

    out = job_end(resolved_plan(plan, run_dir), exit_code, scripts_dir=scripts_dir)
    if json_out:
        print_json(out)
        return
    console.print(
        f"longctx: job {out.job_id} ended (exit {out.exit_code}, +{out.progress} iterations); next: "
        f"{out.next_action} — {out.reason}",
        highlight=False,
    )
    if out.cancelled:
        console.print(f"longctx: cancelled the queued jobs {', '.join(out.cancelled)}", highlight=False)
    for stage, jid in out.eval_jobs.items():
        console.print(f"longctx: queued eval job {jid} for stage {stage}", highlight=False)
    if out.sweep is not None:
        sw = out.sweep
        console.print(
            f"longctx: queued stage {sw.stage}'s RoPE sweep: job array {sw.array_job or '—'} (tasks "
            f"{','.join(map(str, sw.tasks)) or 'none'}), choose job {sw.choose_job}"
            + (f"; chain job {sw.waiting} now waits for it" if sw.waiting else ""),
            highlight=False,
        )


@app.command("profiles")
@cli_errors
def profiles_cmd(json_out: Json = False) -> None:
    """The cluster profiles longctx knows (packaged, and directories on $LONGCTX_SLURM_PROFILES)."""
    from longctx.slurm.profiles import available_profiles, load_profile, profile_path

    profs = [(load_profile(n), profile_path(n)) for n in available_profiles()]
    if json_out:
        print_json([{"name": p.name, "path": str(path), **p.model_dump()} for p, path in profs])
        return
    t = Table(title="Slurm profiles")
    for c in ("name", "description", "GPUs/node", "partition", "QoS", "time", "signal", "backend", "file"):
        t.add_column(c)
    for p, path in profs:
        t.add_row(
            p.name,
            p.description,
            str(p.gpus_per_node),
            p.partition or "",
            p.qos or "",
            p.time,
            p.signal,
            p.backend,
            str(path),
        )
    console.print(t)
