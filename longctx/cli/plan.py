"""`longctx plan …`: check a stage plan and show what it will do."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from longctx.cli._common import cli_errors, console, exit_for, print_findings, print_json
from longctx.cli._params import Json, Plan, RunDir
from longctx.plan.rope_sweep import describe as describe_sweep
from longctx.util.table import narrow_table
from longctx.util.units import human_length

if TYPE_CHECKING:
    from longctx.plan.derive import ResolvedPlan

app = typer.Typer(
    help=(
        "Stage plans (stages/*.toml): checks and the derived numbers.\n\n"
        "Examples:\n\n"
        "  longctx plan show stages/baby_9b_dense.toml\n\n"
        "  longctx plan check stages/tiny.toml --check-data\n\n"
        "  longctx plan show stages/baby_9b_dense.toml --json"
    ),
    no_args_is_help=True,
)

# The library is imported inside the commands: `longctx --help` need not load the plan machinery.


def _gib(x: float) -> str:
    return f"{x / 1024**3:.1f}"


def _human(n: int) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _print_blends(rp: ResolvedPlan) -> None:
    """Each tier-mix stage's exact blend: tier weights and the tempered language weights."""
    from longctx.errors import LongctxError

    for s in rp.stages:
        if s.data is None or s.data.tier_mix is None:
            continue
        try:
            from longctx.plan.stage_artifact import stage_tier_blend_info

            summary = stage_tier_blend_info(rp, s).summary()
        except LongctxError as err:
            console.print(f"[bold]{s.name}[/] data: {escape(err.what)}", soft_wrap=True)
            continue
        parts = []
        for t in summary["tiers"]:
            langs = sorted(t["languages"].items(), key=lambda kv: -kv[1])
            top = ", ".join(f"{k} {v:.3f}" for k, v in langs[:4]) + (" …" if len(langs) > 4 else "")
            parts.append(f"{t['tier']} {t['weight']:.2f} ({t['chunks']} chunks; {top})")
        missing = summary["missing_bin"]
        console.print(
            f"[bold]{s.name}[/] data ({summary['prefixes']} prefixes, α {summary['alpha']}, floor "
            f"{summary['floor']}{f', {missing} .bin not downloaded' if missing else ''}): "
            + escape("; ".join(parts)),
            soft_wrap=True,
        )


def plan_table(rp: ResolvedPlan) -> Table:
    t = narrow_table(f"{rp.name}: {rp.description}" if rp.description else rp.name)
    # short headers keep eleven columns inside 100; `plan show --json` has every number in full
    for col in (
        "stage",
        "length",
        "RoPE base",
        "method",
        "TP/CP/PP/DP",
        "nodes",
        "batch",
        "iters",
        "tokens",
        "GiB/GPU",
        "fits?",
    ):
        t.add_column(col, justify="right" if col not in ("stage", "method", "fits?") else "left")
    for s in rp.stages:
        m = s.memory
        fits = "[green]yes[/]" if m.fits else f"[red]no[/]: CP {s.smallest_fitting_cp or '—'}"
        t.add_row(
            s.name,
            human_length(s.seq_length),
            f"{s.rotary_base:,}",
            s.rope_method,
            f"{s.tp}/{s.cp}/{s.pp}/{s.dp}",
            str(s.nodes),
            f"{s.global_batch_size}×{human_length(s.seq_length)}",
            f"{s.train_iters:,}",
            _human(s.tokens_realized),
            f"{_gib(m.total)}/{_gib(m.budget)}",
            fits,
        )
    return t


MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "logits", "overhead", "total", "budget")


def memory_table(rp: ResolvedPlan) -> Table:
    t = narrow_table("memory per GPU (GiB) — formula in longctx/plan/memory.py")
    for col in ("stage", *MEMORY_PARTS):
        t.add_column(col, justify="right")
    for s in rp.stages:
        g = s.memory.to_gib()
        t.add_row(s.name, *(f"{g[k]:.1f}" for k in MEMORY_PARTS))
    return t


def _uses_artifact(rp: ResolvedPlan) -> bool:
    return any(s.data is not None and s.data.tier_mix is not None for s in rp.stages)


def _report(rp: ResolvedPlan) -> dict[str, Any]:
    return {
        "plan": rp.name,
        "run_dir": str(rp.run_dir),
        "vocab_size": rp.vocab_size,
        "arch": rp.arch.model_dump(),
        "objective": {**rp.objective.model_dump(), "causal": rp.objective.causal},
        "stages": [s.summary() for s in rp.stages],
        "eval": rp.eval.model_dump(),
        "findings": rp.findings,
        "ok": rp.findings.ok,
    }


@app.command("show")
@cli_errors
def show(plan: Plan, run_dir: RunDir = None, json_out: Json = False) -> None:
    """Render the plan: stage, length, base, TP/CP/PP/DP, nodes, batch, iterations, tokens, memory, fits?"""
    from longctx.plan.derive import validate_plan
    from longctx.plan.load import load_plan

    rp = validate_plan(load_plan(plan, run_dir=run_dir))
    if json_out:
        print_json(_report(rp))
    else:
        console.print(plan_table(rp))
        console.print(memory_table(rp))
        console.print(f"objective: {escape(rp.objective.describe())}", soft_wrap=True, highlight=False)
        console.print(f"evaluation (\\[eval]): {escape(rp.eval.describe())}", soft_wrap=True, highlight=False)
        for s in rp.stages:
            sharper = (
                f"; attention logits × {s.attention_scale:.4g} at its start" if s.attention_scale != 1 else ""
            )
            console.print(
                f"[bold]{s.name}[/]: rotary base {s.rotary_base:,} — {escape(s.rope_explanation)}{sharper}",
                soft_wrap=True,
            )
            if s.sweep is not None:
                for line in describe_sweep(s.sweep, s.branches[0].tokens_realized):
                    console.print(escape(line), soft_wrap=True, highlight=False)
        _print_blends(rp)
        print_findings(rp.findings)
    exit_for(rp.findings)


@app.command("check")
@cli_errors
def validate(
    plan: Plan,
    run_dir: RunDir = None,
    check_data: bool = typer.Option(
        False, "--check-data", help="also run `data check` on each stage's blend"
    ),
    full_scan: bool = typer.Option(
        False,
        "--full-scan",
        help="with --check-data on an artifact: scan every token "
        "(hours at 670 GiB) instead of reading the indexes and spot-checking tokens",
    ),
    check_paths: bool = typer.Option(
        False, "--check-paths", help="require base checkpoint and tokenizer to exist"
    ),
    strict: bool = typer.Option(False, "--strict", help="warnings are errors"),
    json_out: Json = False,
) -> None:
    """Check a plan: schema, divisibility, bases, batch, memory; optionally its data and paths. Exit 2 on error."""
    from longctx.plan.derive import validate_plan
    from longctx.plan.inputs import check_paths as _check_paths
    from longctx.plan.load import load_plan

    rp = validate_plan(load_plan(plan, run_dir=run_dir))
    findings = rp.findings
    if check_paths:
        _check_paths(rp, findings)
    data_reports = {}
    if check_data and findings.ok:
        from longctx.plan.stage_data import check_plan_data

        tok = rp.tokenizer.path
        data_reports = check_plan_data(
            rp,
            tokenizer=tok if tok.exists() else None,
            strict=strict,
            scan=full_scan or not _uses_artifact(rp),
        )
        for name, rep in data_reports.items():
            for f in rep.all_findings():
                # the supply line (sequences needed vs what the blend holds) and the distance coverage
                # are shown even when fine
                if f.level != "info" or f.code in ("supply", "distance-coverage"):
                    f.where = f"stage {name}: {f.where or ''}".rstrip(": ")
                    findings.append(f)
    if strict:
        findings.escalate_warnings()
    if json_out:
        out = _report(rp)
        out["data"] = {k: v for k, v in data_reports.items()}
        print_json(out)
    else:
        console.print(plan_table(rp))
        print_findings(findings)
        if findings.ok:
            console.print(f"[green]plan {rp.name} is valid[/] ({len(rp.stages)} stages)")
    exit_for(findings)


@app.command("list")
@cli_errors
def list_cmd(json_out: Json = False) -> None:
    """The plans shipped with longctx; any command takes one by name (`longctx plan show baby_9b_dense`)."""
    from longctx.util.shipped import list_plans

    plans = list_plans()
    if json_out:
        print_json({"plans": [{"name": p.name, "path": str(p.path), "summary": p.summary} for p in plans]})
        return
    t = narrow_table("shipped plans")
    for col in ("name", "what it is"):
        t.add_column(col)
    for p in plans:
        t.add_row(p.name, escape(p.summary))
    console.print(t)
    console.print("copy one to edit it: longctx plan copy NAME DIR", highlight=False)


@app.command("copy")
@cli_errors
def copy_cmd(
    name: str = typer.Argument(..., help="a shipped plan's name (`longctx plan list`)"),
    dest: Path = typer.Argument(
        ..., help="directory to copy into (DIR/stages/NAME.toml, DIR/tokenization/…)"
    ),
    json_out: Json = False,
) -> None:
    """Copy a shipped plan, with the tokenizer manifests it names, into DIR to edit; nothing is overwritten."""
    from longctx.util.shipped import copy_plan

    written = copy_plan(name, dest)
    if json_out:
        print_json({"ok": True, "written": [str(p) for p in written]})
        return
    for p in written:
        console.print(f"wrote {escape(str(p))}", highlight=False)
