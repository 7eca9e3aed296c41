"""`longctx stage …`: the exact Megatron-LM argv, status from disk, and running the next step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from longctx.cli._common import cli_errors, console, err_console, print_json, resolved_plan, stdout_to_stderr
from longctx.cli._params import Json, Plan, RunDir, force
from longctx.cli.run_output import RunPrinter, device_facts, launcher_named, repair_text
from longctx.util.printable import printable

if TYPE_CHECKING:
    from longctx.plan.derive import ResolvedPlan
    from longctx.stage.pace import StagePace
    from longctx.stage.run import LaunchPlan
    from longctx.stage.state import NextStep, StageState

app = typer.Typer(
    help=(
        "Stages on disk: what runs next and how.\n\n"
        "Examples:\n\n"
        "  longctx stage args stages/baby_9b_dense.toml 64k      # pretrain_gpt.py flags, one per line\n\n"
        "  longctx stage args stages/baby_9b_dense.toml 64k --check   # …and through Megatron-LM's own checks\n\n"
        "  longctx stage status stages/tiny.toml --json\n\n"
        "  longctx stage curves stages/tiny.toml --out curves.png   # the plan's training as one figure\n\n"
        "  longctx stage next stages/tiny.toml\n\n"
        "  longctx stage run stages/tiny.toml --backend local    # one step: first launch, resume or nothing"
    ),
    no_args_is_help=True,
)

# The library is imported inside the commands: `longctx --help` need not load the plan machinery.

Force = force(
    "launch even if tokenizer/data/base/RoPE differ from the ledger; resume a started stage whose LR schedule "
    "changed (megatron-lm: adds --override-opt_param-scheduler); the override is recorded in the ledger"
)


@app.command("args")
@cli_errors
def args(
    plan: Plan,
    stage: str = typer.Argument(..., help="stage name"),
    run_dir: RunDir = None,
    check: bool = typer.Option(
        False,
        "--check",
        help="also put the argv through the checkout's Megatron-LM (parse_args, validate_args, "
        "TransformerConfig, the model's rotary base) with the cluster profile's device facts; exit 2 if refused",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="cluster profile whose device facts --check uses (default: the plan's cluster.profile)",
    ),
    json_out: Json = False,
) -> None:
    """Print the exact argv of STAGE for pretrain_gpt.py (or the plan's [megatron].entry_script), one flag
    per line (the same on every launch);
    with --json, as a JSON list. With --check the preflight report follows (on stderr; with --json one
    document {"argv": [...], "preflight": {...}}, on failure too)."""
    from longctx.stage.megatron_args import argv, launch_notes, render_lines

    rp = resolved_plan(plan, run_dir)
    st = rp.stage(stage)
    for note in launch_notes(rp, st):
        err_console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if st.data is not None and st.data.tier_mix is not None:
        from longctx.plan.stage_artifact import stage_blend_notes

        for note in stage_blend_notes(rp, st):
            err_console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if not check:
        if json_out:
            print_json(argv(rp, st))
        else:
            sys.stdout.write("\n".join(render_lines(rp, st)) + "\n")
        return
    from longctx.stage.preflight import preflight_plan

    words = argv(rp, st)
    report = preflight_plan(rp, device_facts(rp, profile), stages=[st.name])
    if json_out:
        print_json({"argv": words, "preflight": report.to_json()})
    else:
        sys.stdout.write("\n".join(render_lines(rp, st)) + "\n")
        sys.stdout.flush()
        for line in report.lines():
            err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(2)


def _pace_text(p: StagePace | None, *, plan: bool = False) -> str:
    """A pace column: tokens/s ('~' when estimated from an earlier stage) or an ETA ('?' unknown)."""
    if p is None:
        return "?"
    from longctx.slurm.timefmt import format_seconds

    if plan:
        return "?" if p.plan_eta_seconds is None else format_seconds(p.plan_eta_seconds)
    return "?" if p.stage_eta_seconds is None else format_seconds(p.stage_eta_seconds)


def _tokens_per_s(p: StagePace | None) -> str:
    if p is None or p.tokens_per_s is None:
        return "?"
    return ("" if p.measured else "~") + f"{p.tokens_per_s:,.0f}"


def _status_table(rp: ResolvedPlan, states: list[StageState], step: NextStep, pace: list[StagePace]) -> Table:
    from longctx.util.table import narrow_table

    t = narrow_table(f"{rp.name}: {step.reason}")
    for c in ("stage", "status", "iteration", "tracker", "last save", "tokens/s", "ETA stage", "ETA plan"):
        t.add_column(c, justify="right" if c not in ("stage", "status") else "left")
    for s, p in zip(states, pace, strict=True):
        color = {"done": "green", "in-progress": "yellow", "pending": "dim"}[s.status]
        saves = str(s.complete[-1]) if s.complete else "—"
        t.add_row(
            s.name,
            f"[{color}]{s.status}[/]",
            f"{s.iteration}/{s.target_iterations}",
            "—" if s.tracker is None else str(s.tracker),
            saves + (" +inc" if s.incomplete else ""),
            _tokens_per_s(p),
            _pace_text(p),
            _pace_text(p, plan=True),
        )
    return t


def _status_notes(states: list[StageState], pace: list[StagePace]) -> list[str]:
    """What the table has no room for: repairs, unfinished saves, resumes whose loss jumped."""
    notes = []
    for s, p in zip(states, pace, strict=True):
        if s.repair:
            notes.append(f"{s.name}: repair: {s.repair.reason}")
        if s.incomplete:
            notes.append(f"{s.name}: incomplete saves {', '.join(map(str, s.incomplete))}")
        if p.resume_jumps:
            notes.append(f"warning: {s.name}: {p.flag()}")
    return notes


def _state_json(
    rp: ResolvedPlan, states: list[StageState], step: NextStep, pace: list[StagePace]
) -> dict[str, Any]:
    by_stage = {p.stage: p for p in pace}
    return {
        "plan": rp.name,
        "run_dir": str(rp.run_dir),
        "next": {
            "action": step.action,
            "stage": step.stage,
            "reason": step.reason,
            "load": str(step.load) if step.load else None,
            "start_iteration": step.start_iteration,
        },
        "stages": [
            {
                "stage": s.name,
                "status": s.status,
                "iteration": s.iteration,
                "target": s.target_iterations,
                "tracker": s.tracker,
                "complete": s.complete,
                "incomplete": s.incomplete,
                "repair": s.repair.reason if s.repair else None,
                "save_dir": str(s.save_dir),
                "pace": _pace_json(by_stage.get(s.name)),
            }
            for s in states
        ],
    }


def _sweep_notes(rp: ResolvedPlan, sweeps: dict[str, dict[str, Any]]) -> list[str]:
    """Each swept stage: its RoPE base and why, the cost, and every branch's progress and evidence."""
    from longctx.plan.rope_sweep import describe

    notes = []
    for name, info in sweeps.items():
        st = rp.stage(name)
        notes.append(f"{name}: rotary base {st.rotary_base:,} — {st.rope_explanation}")
        notes += describe(st.sweep, st.branches[0].tokens_realized)
        notes += [
            f"  branch {b['branch']}: {b['status']} {b['iteration']}/{b['target']}" for b in info["branches"]
        ]
    return notes


def _pace_json(p: StagePace | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "tokens_per_s": p.tokens_per_s,
        "measured": p.measured,
        "stage_eta_seconds": p.stage_eta_seconds,
        "plan_eta_seconds": p.plan_eta_seconds,
        "resume_jumps": [vars(j) for j in p.resume_jumps],
    }


@app.command("status")
@cli_errors
def status(plan: Plan, run_dir: RunDir = None, json_out: Json = False) -> None:
    """Every stage's progress read from disk: tracker, complete and incomplete saves, what runs next; the
    pace of its last launch (tokens/s), the time to finish the stage and the plan, and resumes whose loss
    jumped far above its value before (a restart from the wrong save). --json has the detail."""
    from longctx.stage.pace import stage_pace
    from longctx.stage.state import next_step, plan_state
    from longctx.stage.sweep_choice import sweep_status

    rp = resolved_plan(plan, run_dir)
    states = plan_state(rp)
    step = next_step(rp, states)
    pace = stage_pace(rp, states)
    lock = _lock_json(rp)
    sweeps = {st.name: sweep_status(st) for st in rp.stages if st.sweep is not None}
    if json_out:
        print_json({**_state_json(rp, states, step, pace), "sweeps": sweeps, "lock": lock})
    else:
        console.print(_status_table(rp, states, step, pace))
        for note in _status_notes(states, pace) + _sweep_notes(rp, sweeps):
            console.print(printable(note), markup=False, highlight=False, soft_wrap=True)
        if lock is not None:
            stale = f" (stale: {lock['stale']})" if lock["stale"] else ""
            console.print(
                printable(f"locked by {lock['describe']}{stale}", newlines=False),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def _lock_json(rp: ResolvedPlan) -> dict[str, Any] | None:
    """The run lock's holder (None: no launch holds it), and why it is stale when it certainly is."""
    from longctx.stage.lock import read_holder, stale_reason

    holder = read_holder(rp.run_dir)
    if holder is None:
        return None
    return {**holder.to_json(), "describe": holder.describe(), "stale": stale_reason(holder)}


@app.command("curves")
@cli_errors
def curves(
    plan: Plan,
    run_dir: RunDir = None,
    out: Path | None = typer.Option(
        None,
        "--out",
        help="the PNG to write (default: <run_dir>/curves.png); an existing file is replaced only when it is "
        "a PNG (an earlier figure), never when it is an input, a file of the run's subdirectories, of the "
        "package or tracked by git",
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing --out file that is not a PNG"),
    json_out: Json = False,
) -> None:
    """Draw the whole plan's training as one PNG: loss against consumed tokens across every stage, stage
    boundaries (length, RoPE base), each launch of the ledger (first launch, resume, signal, failure),
    learning rate and tokens/s below, validation loss when logged. Reads TensorBoard events (either
    backend), else metrics.jsonl, else the Megatron-LM logs; unreadable files are named and skipped.
    Exit 2 when nothing is readable, or when a file of the run is no regular file inside it (a FIFO, a
    device, a link out) or larger than any run writes. --json: the series, the launches and the problems."""
    from longctx.errors import StageError
    from longctx.stage.curves import read_plan_curves
    from longctx.stage.curves_plot import plot_curves

    rp = resolved_plan(plan, run_dir)
    png_path = _curves_out(rp, out, force)
    with stdout_to_stderr(json_out):
        console.print(f"reading the training record of {rp.name} in {rp.run_dir} …")
        result = read_plan_curves(rp)
        for problem in result.problems:
            err_console.print(f"warning: {printable(problem)}", markup=False, highlight=False, soft_wrap=True)
        if not result.readable:
            raise StageError(
                f"no training curves readable for plan {rp.name!r}",
                where=str(rp.run_dir),
                fix="run a stage first (`longctx stage run`); each stage writes tensorboard/ events and "
                "metrics.jsonl (local) or logs (megatron-lm) under stages/<name>/",
            )
        png = plot_curves(result, png_path)
        console.print(f"wrote {png}")
    if json_out:
        print_json({"ok": True, "png": str(png), **result.to_json()})


def _curves_out(rp: ResolvedPlan, out: Path | None, force: bool) -> Path:
    """The PNG `stage curves` writes, checked against what it must never overwrite."""
    from longctx.util.confine import check_output_file

    inputs = [p for p in (rp.source, rp.stages[0].load_from) if p is not None]
    inputs += [rp.tokenizer.path]
    inputs += [st.save_dir for st in rp.stages]
    return check_output_file(
        out if out is not None else Path(rp.run_dir) / "curves.png",
        option="--out",
        kind="PNG figure",
        suffix=".png",
        magic=b"\x89PNG\r\n\x1a\n",
        inputs=inputs,
        run_dir=Path(rp.run_dir),
        force=force,
    )


@app.command("next")
@cli_errors
def next_(plan: Plan, run_dir: RunDir = None, json_out: Json = False) -> None:
    """What the next launch does: first-launch, resume, all-done (or blocked, with the reason; exit 2)."""
    from longctx.stage.state import next_step

    rp = resolved_plan(plan, run_dir)
    step = next_step(rp)
    if json_out:
        print_json(
            {
                "action": step.action,
                "stage": step.stage,
                "reason": step.reason,
                "load": str(step.load) if step.load else None,
                "start_iteration": step.start_iteration,
                "repair": step.repair.reason if step.repair else None,
                "load_repair": step.load_repair.reason if step.load_repair else None,
            }
        )
    else:
        console.print(f"{step.action}: {step.reason}{repair_text(step, ' (', ')')}")
    if step.action == "blocked":
        raise typer.Exit(2)


@app.command("run")
@cli_errors
def run(
    plan: Plan,
    run_dir: RunDir = None,
    backend: str = typer.Option("local", "--backend", help="local (embedded trainer) or megatron-lm"),
    launcher: str = typer.Option(
        "local", "--launcher", help="local (this host) or srun (inside a Slurm job)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would run; change nothing"),
    force: Force = False,
    until_done: bool = typer.Option(
        False, "--until-done", help="keep launching steps until the plan is done"
    ),
    eval_after: bool = typer.Option(
        True, "--eval/--no-eval", help="evaluate each finished stage (local backend)"
    ),
    preflight: bool = typer.Option(
        True,
        "--preflight/--no-preflight",
        help="megatron-lm backend: put each launch's argv through the checkout's Megatron-LM first (default)",
    ),
    sweep_branches: str = typer.Option(
        "inline",
        "--sweep-branches",
        help="a RoPE sweep's branches: inline (trained here, one after another) or array (stop there: a "
        "Slurm chain's job-end submits them as a job array)",
    ),
    json_out: Json = False,
) -> None:
    """Run the next step of the plan: first launch, resume, or nothing when all stages are done (exit 0).

    The decision comes from disk, so any job may die and the next `stage run` continues. A megatron-lm launch
    is checked first by the checkout's Megatron-LM with the plan's cluster profile's device facts
    (`stage args --check`; skip with --no-preflight). With --json the
    progress lines and the trainer's output go to stderr and stdout gets the launches' outcomes."""
    from longctx.errors import StageError
    from longctx.stage.run_policy import RunOptions, run_steps

    if sweep_branches not in ("inline", "array"):
        raise StageError(f"--sweep-branches {sweep_branches!r}", fix="give --sweep-branches inline or array")
    options = RunOptions(
        backend,
        dry_run=dry_run,
        force=force,
        until_done=until_done,
        eval_after=eval_after,
        preflight=preflight,
        branches_elsewhere=sweep_branches == "array",
    )
    with stdout_to_stderr(json_out):
        steps = run_steps(
            lambda: resolved_plan(plan, run_dir),
            options,
            launcher=lambda: launcher_named(launcher),
            facts=lambda rp: device_facts(rp, None),
            report=RunPrinter(),
        )
        result = steps.result
        if result.done:
            console.print(f"[green]{result.reason}[/]: nothing to run")
    if json_out:
        launches = [_planned_launch(lp) for lp in steps.planned]
        print_json(
            {"dry_run": True, "done": result.done, "launches": launches} if dry_run else result.outcomes
        )
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _planned_launch(lp: LaunchPlan) -> dict[str, Any]:
    """One --dry-run step for --json: the decision and the exact command, nothing run."""
    repair, load_repair = lp.step.repair, lp.step.load_repair
    return {
        "stage": lp.stage.name,
        "action": lp.step.action,
        "reason": lp.step.reason,
        "start_iteration": lp.step.start_iteration,
        "repair": repair.reason if repair else None,
        "load_repair": load_repair.reason if load_repair else None,
        "backend": lp.backend,
        "nproc": lp.nproc,
        "command": lp.command,
    }
