"""`longctx rope …`: pick the rotary base per stage, check a base against a length, plot the cos-sum."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from longctx.cli._common import (
    cli_errors,
    console,
    exit_for,
    positive_size,
    positive_sizes,
    print_findings,
    print_json,
    resolved_plan,
    stdout_to_stderr,
)
from longctx.cli._params import Json, Plan, RunDir
from longctx.cli.run_output import RunPrinter, device_facts, launcher_named
from longctx.errors import CheckpointError

if TYPE_CHECKING:
    from longctx.plan.derive import ResolvedPlan, ResolvedStage
    from longctx.rope import RopeModelArgs
    from longctx.rope.check import RopeCheck
    from longctx.stage.sweep_choice import SweepCost

# The library is imported inside the commands: `longctx --help` need not load numpy and the RoPE maths.

app = typer.Typer(
    help=(
        "RoPE base planning: which --rotary-base each stage needs, by several published methods, with "
        "Men et al.'s cos-sum bound and Liu et al.'s extrapolation bound as diagnostics.\n\n"
        "Methods: fixed, abf, men, men-safe, liu, ntk (base changes) and yarn, llama3, linear (scalings, "
        "mapped to Megatron flags only where a version honours them). A base below the pretraining base "
        "is reported as a warning, not an error.\n\n"
        "Examples:\n\n"
        "  longctx rope suggest --rotary-dim 128 --base 100000 --from-length 4096 --lengths 16384,65536,131072\n\n"
        "  longctx rope suggest --from-checkpoint /ckpt/base --lengths 16K,64K,128K --json\n\n"
        "  longctx rope check --base 1000000 --rotary-dim 128 --length 32768 --json\n\n"
        "  longctx rope plot --bases 5000000,31000000 --rotary-dim 128 --lengths 16K,64K,128K --out cossum.png\n\n"
        "  longctx rope choose yarn --rotary-dim 128 --base 1000000 --from-length 32K --length 128K "
        "--megatron 0.19.2\n\n"
        "Timing: `longctx bench rope`."
    ),
    no_args_is_help=True,
)

_BASE_RE = re.compile(r"^[0-9][0-9_]*(\.[0-9]*)?([eE][+]?[0-9]+)?$")


def parse_base(text: str, *, option: str = "--base") -> int:
    """'1000000', '1_000_000' or '1e6' → 1000000; anything not an integer > 1 is refused.

    No K/M suffixes: '500K' would be ambiguous between 500 000 and 512 000.
    """
    raw = text.strip()
    if not _BASE_RE.match(raw):
        raise typer.BadParameter(
            f"{option}: not a base: {text!r} (write digits or scientific notation, e.g. 1000000 or 1e6)"
        )
    from longctx.rope.base_bound import check_base

    digits = raw.replace("_", "")
    value = float(digits)
    if not math.isfinite(value) or value != int(value):
        raise typer.BadParameter(
            f"{option}: the rotary base must be an integer (Megatron's --rotary-base), got {text!r}"
        )
    base = int(digits) if digits.isdigit() else int(value)  # digits exactly; '1e6' through the float
    # the bound every base is held to (RopeError: a message with its fix, and one JSON document)
    return check_base(base, what=f"{option}: the rotary base", where=option)


_size = positive_size
_sizes = positive_sizes


def read_checkpoint_rope(path: Path) -> RopeModelArgs:
    """Rotary dim, base and length from a checkpoint's saved args (via longctx.checkpoint)."""
    from longctx.checkpoint import inspect_checkpoint
    from longctx.rope import rope_args_from_checkpoint_args

    info = inspect_checkpoint(path)
    args = getattr(info, "args", None)
    if not args:
        raise CheckpointError(
            "the checkpoint carries no saved Megatron args",
            where=str(path),
            fix="pass the RoPE inputs explicitly",
        )
    arch = getattr(info, "arch", None)
    kv = getattr(arch, "head_dim", None) or getattr(arch, "kv_channels", None)
    percent = getattr(arch, "rotary_percent", None)
    return rope_args_from_checkpoint_args(args, kv_channels=kv, rotary_percent=percent, where=str(path))


def _model_inputs(
    checkpoint: Path | None,
    rotary_dim: int | None,
    head_dim: int | None,
    base: str | None,
    length: str | None,
    *,
    base_option: str,
    length_option: str,
    need_pretrain: bool,
) -> tuple[int, int | None, int | None, int | None]:
    """(rotary_dim, head_dim, pretraining base, pretraining length); explicit options beat the checkpoint."""
    from longctx.rope.check import resolve_inputs

    ck = read_checkpoint_rope(checkpoint) if checkpoint is not None else None
    facts = resolve_inputs(
        ck,
        rotary_dim=rotary_dim,
        head_dim=head_dim,
        base=parse_base(base, option=base_option) if base is not None else None,
        length=_size(length, length_option) if length is not None else None,
        base_option=base_option,
        length_option=length_option,
        need_pretrain=need_pretrain,
    )
    return facts.rotary_dim, facts.head_dim, facts.pretrain_base, facts.pretrain_length


_CHECKPOINT_OPT = typer.Option(
    None,
    "--from-checkpoint",
    help="Read rotary dim (kv_channels × rotary_percent), base and length from a checkpoint's saved args; "
    "explicit options win.",
)
_HEAD_DIM_OPT = typer.Option(
    None,
    "--head-dim",
    min=2,
    help="kv_channels, only for partial rotary (each unrotated pair adds 1 to the cos-sum).",
)


@app.command("suggest")
@cli_errors
def suggest_cmd(
    lengths: str = typer.Option(
        ..., "--lengths", help="Target lengths, e.g. 16384,65536,131072 or 16K,64K,128K."
    ),
    rotary_dim: int | None = typer.Option(None, "--rotary-dim", min=1, help="kv_channels × rotary_percent."),
    base: str | None = typer.Option(None, "--base", help="Pretraining rotary base, e.g. 100000 or 1e5."),
    from_length: str | None = typer.Option(
        None, "--from-length", help="Pretraining length, e.g. 4096 or 4K."
    ),
    checkpoint: Path | None = _CHECKPOINT_OPT,
    head_dim: int | None = _HEAD_DIM_OPT,
    factor: float = typer.Option(4.0, "--factor", min=1.0, help="men-safe multiplier of Men's bound."),
    abf_base: str = typer.Option("500000", "--abf-base", help="The base the abf row uses."),
    scaling: bool = typer.Option(
        False, "--scaling", help="Also list yarn, llama3 and linear (keep the base)."
    ),
    explain: bool = typer.Option(False, "--explain", help="Print each method's explanation under the table."),
    json_out: Json = False,
) -> None:
    """Every method at every target length, with diagnostics and a recommended base per length.

    Columns: the integer base; its ratio to Men's exact bound; the first position where the cos-sum
    turns negative (searched to 4 × the length); the minimum of the cos-sum below the length; Liu's
    extrapolation limit 2π·base^(d_extra/d). The recommendation is men-safe (4 × Men's bound, two
    significant digits), never below the previous stage or the exact bound.

    Example: longctx rope suggest --rotary-dim 128 --base 100000 --from-length 4096 --lengths 16384,65536,131072
    """
    from longctx.rope import BASE_METHODS, SCALING_METHODS, suggest
    from longctx.rope.rope_tables import suggest_header, suggest_lines, suggest_table

    targets = _sizes(lengths, "--lengths") or []
    dim, hd, b, n = _model_inputs(
        checkpoint,
        rotary_dim,
        head_dim,
        base,
        from_length,
        base_option="--base",
        length_option="--from-length",
        need_pretrain=True,
    )
    methods = BASE_METHODS + (SCALING_METHODS if scaling else ())
    result = suggest(
        rotary_dim=dim,
        pretrain_base=b,  # type: ignore[arg-type]
        pretrain_length=n,  # type: ignore[arg-type]
        lengths=targets,
        head_dim=hd,
        methods=methods,
        safe_factor=factor,
        abf_base=parse_base(abf_base, option="--abf-base"),
    )
    if json_out:
        print_json(result)
        return
    console.print(suggest_header(result, dim, hd, n, b), highlight=False)  # type: ignore[arg-type]
    console.print(suggest_table(result))
    for line in suggest_lines(result):
        console.print(line, highlight=False)
    if explain:
        for row in result.lengths:
            console.print(f"\n[bold]{row.length:,}[/]", highlight=False)
            for c in row.choices:
                console.print(f"  • {c.explanation}", highlight=False, soft_wrap=True)


@app.command("check")
@cli_errors
def check_cmd(
    base: str | None = typer.Option(None, "--base", help="The base to check (default: the checkpoint's)."),
    length: str | None = typer.Option(
        None, "--length", help="Context length to check it for, e.g. 32768 or 32K."
    ),
    rotary_dim: int | None = typer.Option(None, "--rotary-dim", min=1, help="kv_channels × rotary_percent."),
    head_dim: int | None = _HEAD_DIM_OPT,
    pretrain_base: str | None = typer.Option(
        None, "--pretrain-base", help="Pretraining base (for Liu's bound and the below-pretraining warning)."
    ),
    pretrain_length: str | None = typer.Option(
        None, "--pretrain-length", "--from-length", help="Pretraining length (for Liu's bound)."
    ),
    checkpoint: Path | None = _CHECKPOINT_OPT,
    cap: str | None = typer.Option(
        None, "--cap", help="Search the first failing position up to here (default 4 × length)."
    ),
    json_out: Json = False,
) -> None:
    """Diagnostics of one base at one length; exit 2 when the base is below Men's bound for that length.

    Prints the first position where Σcos(m·θ_i) turns negative, the minimum below the length, Men's
    bound (exact search, paper table, fit) and, with the pretraining base and length, Liu's
    extrapolation limit. Small cos-sum dips above the bound are reported but do not fail the check; a
    base below the pretraining base is a warning.

    Example: longctx rope check --base 1000000 --rotary-dim 128 --length 32768 --json
    """
    from longctx.rope.check import check_base

    dim, hd, ck_base, ck_length = _model_inputs(
        checkpoint,
        rotary_dim,
        head_dim,
        pretrain_base,
        pretrain_length,
        base_option="--pretrain-base",
        length_option="--pretrain-length",
        need_pretrain=False,
    )
    the_base = parse_base(base) if base is not None else ck_base
    n = _size(length, "--length") if length is not None else (ck_length if checkpoint else None)
    result = check_base(
        the_base,
        dim,
        n,
        head_dim=hd,
        pretrain_base=ck_base,
        pretrain_length=ck_length,
        search_cap=_size(cap, "--cap"),
    )
    if json_out:
        print_json(result.to_json())
        exit_for(result.findings)
        return
    _print_check(result)
    exit_for(result.findings)


def _print_check(result: RopeCheck) -> None:
    from longctx.rope.rope_tables import check_table

    console.print(check_table(result))
    print_findings(result.findings)
    style = "green" if result.passes else "bold red"
    console.print(f"base {result.base:,} at {result.length:,}: [{style}]{result.verdict}[/]", highlight=False)


# the first bytes of a figure matplotlib writes: an existing file that starts so is an earlier plot
_FIGURE_MAGIC = {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}


@app.command("plot")
@cli_errors
def plot_cmd(
    bases: str = typer.Option(..., "--bases", help="Bases to draw, comma-separated, e.g. 1000000,5e6,3.1e7."),
    lengths: str = typer.Option(..., "--lengths", help="Target lengths to mark, e.g. 16K,64K,128K."),
    out: Path = typer.Option(..., "--out", help="Image to write (.png, .svg or .pdf)."),
    rotary_dim: int | None = typer.Option(None, "--rotary-dim", min=1, help="kv_channels × rotary_percent."),
    head_dim: int | None = _HEAD_DIM_OPT,
    checkpoint: Path | None = _CHECKPOINT_OPT,
    max_position: str | None = typer.Option(
        None, "--max-position", help="Right end of the x axis (default 1.1 × longest length)."
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing file that is not a figure"),
    json_out: Json = False,
) -> None:
    """Draw the cos-sum Σcos(m·θ_i) for chosen bases, with the target lengths marked.

    Top: the whole curve (per-pixel min/max envelope, so single-position dips stay visible); bottom: a
    zoom around zero. Dots mark each base's first failing position.

    Example: longctx rope plot --bases 5000000,31000000 --rotary-dim 128 --lengths 16K,64K,128K --out cossum.png
    """
    from longctx.rope.plot import plot_cos_sum
    from longctx.rope.rope_tables import fmt_pos
    from longctx.util.confine import check_output_file

    magic = _FIGURE_MAGIC.get(out.suffix.lower())
    if magic is not None:  # another suffix is refused by the plot itself
        check_output_file(
            out,
            option="--out",
            kind=f"{out.suffix[1:].upper()} figure",
            suffix=out.suffix.lower(),
            magic=magic,
            force=force,
        )
    base_list = [parse_base(t, option="--bases") for t in bases.split(",") if t.strip()]
    dim, hd, _, _ = _model_inputs(
        checkpoint,
        rotary_dim,
        head_dim,
        None,
        None,
        base_option="--base",
        length_option="--from-length",
        need_pretrain=False,
    )
    result = plot_cos_sum(
        base_list,
        dim,
        _sizes(lengths, "--lengths") or [],
        out,
        head_dim=hd,
        max_position=_size(max_position, "--max-position"),
    )
    if json_out:
        print_json(result)
        return
    for b in base_list:
        first = result.first_failing_position[b]
        console.print(
            f"base {b:>13,}: first failing position {fmt_pos(first, result.max_position)}, "
            f"min {result.min_cos_sum[b]:+.3f}",
            highlight=False,
        )
    console.print(f"[green]wrote[/] {out}", highlight=False)


@app.command("methods")
@cli_errors
def methods_cmd(json_out: Json = False) -> None:
    """List the methods a plan may name, with their parameters and defaults.

    Example: longctx rope methods --json
    """
    from longctx.rope import METHODS
    from longctx.rope.methods import REQUIRED

    rows = [
        {
            "name": m.name,
            "kind": m.kind,
            "summary": m.summary,
            "params": [
                {
                    "name": p.name,
                    "type": p.type.__name__,
                    "default": None if p.default is REQUIRED else p.default,
                    "required": p.default is REQUIRED,
                    "help": p.help,
                    "choices": list(p.choices),
                }
                for p in m.params
            ],
        }
        for m in METHODS.values()
    ]
    if json_out:
        print_json(rows)
        return
    table = Table()
    for col in ("method", "kind", "what", "parameters"):
        table.add_column(col, overflow="fold")
    for r in rows:
        params = "; ".join(f"{p['name']}: {p['help']}" for p in r["params"]) or "–"
        table.add_row(r["name"], r["kind"], r["summary"], params)
    console.print(table)


def _parse_params(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--param: expected NAME=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


@app.command("choose")
@cli_errors
def choose_cmd(
    method: str = typer.Argument(..., help="fixed, abf, men, men-safe, liu, ntk, yarn, llama3 or linear."),
    length: str = typer.Option(..., "--length", help="Target length, e.g. 131072 or 128K."),
    rotary_dim: int | None = typer.Option(None, "--rotary-dim", min=1, help="kv_channels × rotary_percent."),
    base: str | None = typer.Option(None, "--base", help="Pretraining rotary base."),
    from_length: str | None = typer.Option(None, "--from-length", help="Pretraining length."),
    checkpoint: Path | None = _CHECKPOINT_OPT,
    head_dim: int | None = _HEAD_DIM_OPT,
    param: list[str] = typer.Option([], "--param", "-p", help="Method parameter NAME=VALUE (repeatable)."),
    megatron: str | None = typer.Option(
        None, "--megatron", help="Megatron-LM/megatron-core version to map to flags, e.g. 0.16.1."
    ),
    json_out: Json = False,
) -> None:
    """One method's base for one target length, why, and (with --megatron) the Megatron-LM flags.

    Exits 2 when the version would ignore or misapply the choice (the message says why).

    Example:
    longctx rope choose men-safe --rotary-dim 128 --base 100000 --from-length 4K --length 128K --megatron 0.16.1
    """
    from longctx.rope import choose_base, megatron_rope_flags
    from longctx.rope.rope_tables import fmt_pos

    dim, hd, b, n = _model_inputs(
        checkpoint,
        rotary_dim,
        head_dim,
        base,
        from_length,
        base_option="--base",
        length_option="--from-length",
        need_pretrain=True,
    )
    choice = choose_base(
        method,
        rotary_dim=dim,
        pretrain_base=b,  # type: ignore[arg-type]
        pretrain_length=n,  # type: ignore[arg-type]
        target_length=_size(length, "--length"),  # type: ignore[arg-type]
        head_dim=hd,
        **_parse_params(param),
    )
    flags = megatron_rope_flags(choice, megatron) if megatron else None
    if json_out:
        print_json({"choice": choice, "megatron_flags": flags})
        return
    console.print(f"[bold]{choice.method}[/]: --rotary-base [bold green]{choice.base}[/]", highlight=False)
    console.print(choice.explanation, highlight=False, soft_wrap=True)
    d = choice.diagnostics
    if d is not None:
        console.print(
            f"first failing position {fmt_pos(d.first_failing_position, d.search_cap)}, min cos-sum below "
            f"{d.length:,}: {d.min_cos_sum:+.3f}; Men's exact bound {d.men_bound:,}",
            highlight=False,
        )
    print_findings(choice.findings)
    if flags is not None:
        console.print("megatron flags: " + " ".join(flags), highlight=False, soft_wrap=True)


@app.command("sweep")
@cli_errors
def sweep_cmd(
    plan: Plan,
    stage: str | None = typer.Option(
        None, "--stage", help="the stage (default: the first with a pending sweep)"
    ),
    run_dir: RunDir = None,
    backend: str = typer.Option("local", "--backend", help="local (embedded trainer) or megatron-lm"),
    launcher: str = typer.Option(
        "local", "--launcher", help="local (this host) or srun (inside a Slurm job)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the sweep and its cost; run nothing"),
    preflight: bool = typer.Option(
        True, "--preflight/--no-preflight", help="megatron-lm: check each argv first"
    ),
    branch_index: int | None = typer.Option(
        None,
        "--branch-index",
        min=0,
        help="train only this branch (0 = the smallest base) until done, and choose nothing: a task of a "
        "Slurm job array ($SLURM_ARRAY_TASK_ID)",
    ),
    json_out: Json = False,
) -> None:
    """Choose a stage's RoPE base from evidence: train a short branch at each candidate base from the stage's
    starting weights (resumable, one after another), evaluate each at the stage's length, choose by the
    worst depth, and record the candidates, the evidence and the choice (the stage then runs with it).

    The plan asks for it per stage: rope = { sweep = ["men", "men-safe", 16_000_000], tokens = 500_000 }.
    `stage run --until-done` runs the same steps inside the chain; on Slurm, `slurm submit` runs the branches
    as a job array. The cost (tokens, share of the stage, time at the measured pace) is shown first.

    Example: longctx rope sweep stages/tiny.toml --stage 4k
    """
    from longctx.stage.run_policy import RunOptions, run_steps
    from longctx.stage.sweep_choice import sweep_cost, sweep_stage

    rp = resolved_plan(plan, run_dir)
    st = sweep_stage(rp, stage)
    cost = sweep_cost(rp, st)
    if dry_run or not json_out:
        _print_sweep(rp, st, cost, json_out=json_out and dry_run)
    if dry_run:
        return
    branch = _branch_name(st, branch_index)
    options = RunOptions(
        backend, until_done=True, preflight=preflight, sweep_of=None if branch else st.name, branch=branch
    )
    with stdout_to_stderr(json_out):
        steps = run_steps(
            lambda: resolved_plan(plan, run_dir),
            options,
            launcher=lambda: launcher_named(launcher),
            facts=lambda r: device_facts(r, None),
            report=RunPrinter(),
        )
    after = resolved_plan(plan, run_dir).stage(st.name)
    if not json_out and steps.result.stop == "reached":
        console.print(steps.result.reason, highlight=False, soft_wrap=True, markup=False)
    if json_out:
        print_json(
            {
                "stage": st.name,
                "cost": cost.to_json(),
                "stop": steps.result.stop,
                "reason": steps.result.reason,
                "outcomes": steps.result.outcomes,
                "sweep": after.sweep.summary() if after.sweep else None,
            }
        )
    if steps.result.exit_code:
        raise typer.Exit(steps.result.exit_code)


def _print_sweep(rp: ResolvedPlan, st: ResolvedStage, cost: SweepCost, *, json_out: bool) -> None:
    from longctx.plan.rope_sweep import describe

    if json_out:
        print_json({"stage": st.name, "cost": cost.to_json(), "sweep": st.sweep.summary(), "dry_run": True})
        return
    for line in describe(st.sweep, st.branches[0].tokens_realized):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if cost.seconds is not None:
        console.print(
            f"time at the stage's estimated pace: branches {_minutes(cost.seconds)}, the stage "
            f"{_minutes(cost.stage_seconds or 0)}",
            highlight=False,
        )
    else:
        console.print(
            "time: no pace measured yet (the first launch of this plan measures one)", highlight=False
        )


def _branch_name(st: ResolvedStage, index: int | None) -> str | None:
    if index is None:
        return None
    if index >= len(st.branches):
        from longctx.errors import StageError

        raise StageError(
            f"--branch-index {index}: stage {st.name}'s sweep has {len(st.branches)} branches",
            fix=f"give 0 … {len(st.branches) - 1}",
        )
    return st.branches[index].name


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
