"""`longctx demo`: the whole pipeline on CPU in about ten minutes."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from longctx.cli._common import cli_errors, console, print_json, stdout_to_stderr
from longctx.cli._params import Json
from longctx.util.table import narrow_table
from longctx.util.units import human_length

# The demo is imported inside the command: it loads torch and megatron-core, which `longctx --help` does
# not need.

HELP = (
    "Run the whole pipeline on CPU (~15 min on 2 cores, no GPU, no network) as a user extends a published "
    "base: adopt the tiny base shipped in longctx/resources/demo/ar (its archive and tokenizer md5s checked "
    "against its card first), check the tokenizer against the pinned manifest, build and check the stage "
    "data, extend the base through stages/tiny.toml (256 → 1K → 4K, CP = 2 in the last stage, that stage "
    "interrupted with SIGTERM and resumed), evaluate every checkpoint and print a summary. Rerunning in "
    "the same directory resumes. --to 16k carries it on through stages/tiny_16k.toml: a 16K stage at CP 4 "
    "(its RoPE base by a sweep) and every checkpoint evaluated up to 16K. --train-base rebuilds the "
    "published base (~20 min, once). "
    "--family mdm does the same with the published masked-diffusion base (longctx/resources/demo/mdm, "
    "stored in the layout of Ermine's predecessor code) through stages/tiny_mdm.toml, evaluated by "
    "infilling; --family udm likewise with the published uniform-state base (longctx/resources/demo/udm, the "
    "MDM adapted to the uniform-state objective) through stages/tiny_udm.toml.\n\n"
    "Examples:\n\n  longctx demo\n\n  longctx demo --to 16k --dir demo-run   (resumes a 4K demo's directory)\n\n"
    "  longctx demo --family mdm --dir /tmp/mdm-demo\n\n"
    "  longctx demo --dir /tmp/longctx-demo --json\n\n"
    "  longctx demo --train-base --dir runs/demo-base   (rebuild the published base)\n\n"
    "  longctx demo --train-base --family mdm --dir runs/demo-base-mdm\n\n"
    "  longctx demo --small --interrupt 512 --dir /tmp/longctx-smoke   (a fresh install's check, ~1 min)"
)


def stages_table(rows: list[dict]) -> Table:
    """The demo's stages in 100 columns: launches as `first → resume`, the rest in --json."""
    t = narrow_table("longctx demo: stages")
    for c in ("stage", "length", "RoPE base", "CP", "iters", "launches", "loss first → last", "tokens/s"):
        t.add_column(c, justify="left" if c in ("stage", "launches") else "right")
    for r in rows:
        loss = "—" if r["first_loss"] is None else f"{r['first_loss']:.3f} → {r['final_loss']:.3f}"
        tps = "—" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        launches = " → ".join(a.removesuffix("-launch") for a in r["launches"])
        t.add_row(
            r["stage"],
            human_length(r["seq_length"]),
            f"{r['rotary_base']:,}",
            str(r["cp"]),
            r["iterations"],
            launches,
            loss,
            tps,
        )
    return t


@cli_errors
def demo(
    dir: Path = typer.Option(Path("demo-run"), "--dir", help="working directory (created; reused to resume)"),
    plan: Path | None = typer.Option(None, "--plan", help="stage plan (default: the --family's)"),
    family: str = typer.Option(
        "ar",
        "--family",
        help="ar (stages/tiny.toml), mdm (tiny_mdm.toml: masked diffusion) or udm (tiny_udm.toml)",
    ),
    small: bool = typer.Option(
        False,
        "--small",
        help="a smaller corpus and base model; for ar the ~1-minute smoke plan stages/tiny_smoke.toml "
        "(128 → 256 → 512, CP 2) unless --plan gives one",
    ),
    interrupt: str | None = typer.Option(
        None,
        "--interrupt",
        help="stage to SIGTERM after its first save "
        "(default: the last stage of the full demo; none with --small)",
    ),
    to: str = typer.Option(
        "4k",
        "--to",
        help="the length the autoregressive demo reaches: 4k (stages/tiny.toml) or 16k "
        "(stages/tiny_16k.toml: a 16K stage at CP 4 after the 4K one, every checkpoint evaluated up to 16K)",
    ),
    train_base: bool = typer.Option(
        False,
        "--train-base",
        help="rebuild the --family's published demo base (longctx/resources/demo/ar, mdm or udm) from its "
        "seeded corpus with longctx's own trainer instead of running the demo (ar ~15 min on 2 cores; mdm "
        "adapts the published ar base, udm the published mdm one), run once; --dir is its work directory "
        "and a rerun resumes",
    ),
    json_out: Json = False,
) -> None:
    if train_base:
        _train_base(dir, family, json_out)
        return
    from longctx.demo.run import DemoConfig, run_demo

    cfg = DemoConfig.from_options(plan=plan, small=small, interrupt=interrupt, family=family, to=to)
    # with --json the progress and the trainers' output go to stderr: stdout is the report alone
    with stdout_to_stderr(json_out):
        report = run_demo(dir, cfg, echo=lambda s: console.print(s, highlight=False, soft_wrap=True))
    if json_out:
        print_json(report)
        return
    console.print(stages_table(report.stages))
    if report.interrupted and not report.interrupted.get("finished_first"):
        i = report.interrupted
        console.print(
            f"interrupted {i['stage']} with SIGTERM at iteration {i['stopped_at']}/{i['target']} "
            f"(exit {i['exit_code']}), then resumed from that save"
        )
    if report.evaluation is not None:
        from longctx.eval.runner import render_summary

        render_summary(report.evaluation, console)
    console.print(f"everything is under {report.run_dir} — wall time {report.wall_seconds / 60:.1f} min")


def _train_base(work: Path, family: str, json_out: bool) -> None:
    from longctx.demo.published import family_dir
    from longctx.demo.train_base import recipe_for, train_base

    recipe = recipe_for(family)
    with stdout_to_stderr(json_out):
        card = train_base(
            work,
            family_dir(family),
            recipe=recipe,
            echo=lambda s: console.print(s, highlight=False, soft_wrap=True),
        )
    if json_out:
        print_json(card.model_dump())
        return
    figures = ", ".join(f"{r.task} {human_length(r.length)} {100 * r.exact:.0f} %" for r in card.retrieval)
    console.print(
        f"published {card.name}: {recipe.iterations:,} iterations, {card.tokens:,} tokens, "
        f"{card.wall_seconds / 60:.1f} min of training; greedy retrieval {figures} → {family_dir(family)}",
        highlight=False,
        soft_wrap=True,
    )
