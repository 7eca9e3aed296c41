"""`longctx eval …`: passkey grid, loss by position and short-context loss of checkpoints, with plots."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from longctx.cli._common import cli_errors, parse_int_list, print_json, resolved_plan
from longctx.cli._params import PLAN_HELP, Json, RunDir
from longctx.errors import EvalError

if TYPE_CHECKING:
    from longctx.eval.results import EvalReport
    from longctx.eval.settings import EvalSettings
    from longctx.plan.derive import ResolvedPlan

app = typer.Typer(
    help=(
        "Evaluate what a checkpoint does at long context: passkey retrieval over a grid of lengths × "
        "needle depths (greedy continuation and log-likelihood of the key vs distractor keys), mean "
        "loss by position on held-out documents, and loss on short documents vs the base model. "
        "Writes report.json, summary.md, niah.png and loss_by_position.png.\n\n"
        "Examples:\n\n"
        "  longctx eval run runs/tiny/stages/4k/checkpoints --plan stages/tiny.toml --stage 4k\n\n"
        "  longctx eval run CKPT --plan stages/tiny.toml --lengths 1K,4K --depths 0,0.5,1 --json\n\n"
        "  longctx eval run runs/tiny/base/checkpoints --plan stages/tiny.toml --extrapolate   # base beyond 256\n\n"
        "  longctx eval summary stages/tiny.toml        # base + every finished stage, every length"
    ),
    no_args_is_help=True,
)


# The library is imported inside the commands: the evaluator loads torch and megatron-core, which
# `longctx --help` and the other commands do not need.


SummaryPlan = Annotated[Path | None, typer.Argument(help=PLAN_HELP, show_default=False)]
RunPlan = Annotated[Path, typer.Option("--plan", help=f"{PLAN_HELP}: tokenizer, data, base, stage lengths")]
Checkpoint = Annotated[Path, typer.Argument(help="save dir (with its tracker) or iter_NNNNNNN directory")]
Stage = Annotated[
    str | None, typer.Option("--stage", help="the stage whose data and lengths to use (default: the last)")
]
Lengths = Annotated[
    str | None,
    typer.Option("--lengths", help="context lengths, e.g. 1K,4K (default: the plan's stage lengths)"),
]
# Every evaluation setting defaults to the plan's [eval] table (docs/evaluation.md), so `eval summary`
# after the demo or after `stage run` measures what they measured and re-uses their cached results;
# an option given overrides that one field.
_PLANS = "default: the plan's [eval]"
Depths = Annotated[
    str | None,
    typer.Option("--depths", help=f"needle depths as fractions, e.g. 0,0.25,0.5,0.75,1 ({_PLANS}.depths)"),
]
Keys = Annotated[
    int | None, typer.Option("--keys", help=f"pass keys per (length, depth) cell ({_PLANS}.keys_per_cell)")
]
Distractors = Annotated[
    int | None,
    typer.Option(
        "--distractors",
        help=f"distractor keys per item for the log-likelihood method, 0: greedy only ({_PLANS}.distractors)",
    ),
]
Digits = Annotated[
    int | None, typer.Option("--key-digits", help=f"digits per pass key ({_PLANS}.key_digits)")
]
Filler = Annotated[
    str | None,
    typer.Option(
        "--filler",
        help=f"synthetic (the demo corpus' sentences) or heldout (held-out tokens) ({_PLANS}.filler)",
    ),
]
LossDocs = Annotated[
    int | None,
    typer.Option(
        "--loss-docs", help=f"held-out documents per length for loss by position ({_PLANS}.loss_docs)"
    ),
]
ShortDocs = Annotated[
    int | None,
    typer.Option(
        "--short-docs",
        help=f"short held-out documents for the short-context loss, 0: skip ({_PLANS}.short_docs)",
    ),
]
Packed = Annotated[
    int | None,
    typer.Option(
        "--packed-windows",
        help="windows per length packed from several held-out documents, scored with attention across and "
        f"within documents, 0: skip ({_PLANS}.packed_windows)",
    ),
]
Tasks = Annotated[
    str | None,
    typer.Option(
        "--tasks",
        help="needle tasks, e.g. single,multikey-2,multivalue,multiquery,absent (single is always measured; "
        f"docs/evaluation.md) ({_PLANS}.tasks)",
    ),
]
AnyDigits = Annotated[
    bool | None,
    typer.Option(
        "--any-digit-keys/--distinct-digit-keys",
        help=f"keys of any digits, repeats allowed, or of distinct digits ({_PLANS}.any_digit_keys)",
    ),
]
Seed = Annotated[int | None, typer.Option("--seed", help=f"seed of keys, names and filler ({_PLANS}.seed)")]
Batch = Annotated[
    int | None, typer.Option("--batch-size", help=f"sequences per forward ({_PLANS}.batch_size)")
]
Data = Annotated[
    list[str] | None,
    typer.Option(
        "--data", help="unseen data prefix for the losses (repeatable; default: the plan's held-out split)"
    ),
]
Cp = Annotated[
    int | None,
    typer.Option(
        "--cp",
        help="context-parallel size = the number of processes (default: torchrun's world size, else 1)",
    ),
]
Threads = Annotated[int | None, typer.Option("--threads", help="torch CPU threads")]
Out = Annotated[Path | None, typer.Option("--out", help="output directory (default: under <run_dir>/eval/)")]
NoCache = Annotated[
    bool, typer.Option("--no-cache", help="recompute instead of re-using results under <run_dir>/eval/cache")
]
RotaryBase = Annotated[
    int | None, typer.Option("--rotary-base", help="evaluate with this RoPE base instead of the saved one")
]
AttentionScale = Annotated[
    float,
    typer.Option(
        "--attention-scale",
        min=0.25,
        max=4.0,
        help="evaluate with every layer's attention logits multiplied by this (folded into the query weights)",
    ),
]
Extrapolate = Annotated[
    bool, typer.Option("--extrapolate", help="allow lengths beyond the checkpoint's trained window")
]
BaseRef = Annotated[
    bool, typer.Option("--base/--no-base", help="also score the plan's base model on short documents")
]


@dataclasses.dataclass(frozen=True)
class SettingOptions:
    """The options that override single fields of the plan's [eval] (None: not given)."""

    depths: str | None = None
    keys: int | None = None
    distractors: int | None = None
    key_digits: int | None = None
    filler: str | None = None
    loss_docs: int | None = None
    short_docs: int | None = None
    packed_windows: int | None = None
    tasks: str | None = None
    any_digit_keys: bool | None = None
    seed: int | None = None
    batch_size: int | None = None

    def settings(self, rp: ResolvedPlan) -> EvalSettings:
        """The plan's [eval] settings, each option given overriding its field."""
        from longctx.eval.runner import plan_settings

        return plan_settings(
            rp,
            depths=_depths(self.depths),
            keys_per_cell=self.keys,
            distractors=self.distractors,
            key_digits=self.key_digits,
            filler=self.filler,
            loss_docs=self.loss_docs,
            short_docs=self.short_docs,
            seed=self.seed,
            batch_size=self.batch_size,
            packed_windows=self.packed_windows,
            tasks=_tasks(self.tasks),
            any_digit_keys=self.any_digit_keys,
        )


def _depths(text: str | None) -> list[float] | None:
    if text is None or not text.strip():
        return None
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"depths must be numbers in [0, 1], got {text!r}") from None


def _tasks(text: str | None) -> list[str] | None:
    if text is None or not text.strip():
        return None
    return [t for t in text.replace(" ", "").split(",") if t]


def _cp(cp: int | None) -> int:
    """--cp, else the launcher's WORLD_SIZE (torchrun / srun set it), else 1; RANK and LOCAL_RANK checked."""
    raw = os.environ.get("WORLD_SIZE", "1")
    _check_ranks(int(raw) if raw.strip().isdigit() and len(raw.strip()) <= 9 else None)
    if cp is not None:
        return cp
    if not raw.strip().isdigit() or len(raw.strip()) > 9 or int(raw) < 1:
        raise EvalError(
            f"WORLD_SIZE is {raw!r}, not a positive number of ranks",
            where="the WORLD_SIZE environment variable",
            fix="unset it for one process, or launch `eval run` with torchrun/srun (which set it), or pass --cp N",
        )
    return int(raw)


def _check_ranks(world: int | None) -> None:
    """RANK and LOCAL_RANK, where a launcher set them, must be ranks of the world (torchrun's meaning)."""
    for name in ("RANK", "LOCAL_RANK"):
        raw = os.environ.get(name)
        if raw is None:
            continue
        if not raw.strip().isdigit() or len(raw.strip()) > 9 or (world is not None and int(raw) >= world):
            below = f" below WORLD_SIZE {world}" if world is not None else ""
            raise EvalError(
                f"{name} is {raw!r}, not a rank{below} (a whole number from 0)",
                where=f"the {name} environment variable",
                fix=f"unset {name} for one process, or launch `eval run` with torchrun/srun (which set it)",
            )


def _threads(n: int | None) -> None:
    if n is None:
        return
    if n < 1:
        raise EvalError(
            f"--threads must be at least 1, got {n}",
            where="--threads",
            fix="give a thread count such as 2, or leave it out for torch's default",
        )
    import torch

    torch.set_num_threads(n)


def _show(report: EvalReport, json_out: bool) -> None:
    from longctx.mcore.parallel import is_main_process

    if not is_main_process():
        return
    if json_out:
        print_json(report.model_dump(mode="json"))
    else:
        from longctx.eval.report_tables import print_report

        print_report(report)


@app.command("run")
@cli_errors
def run(
    checkpoint: Checkpoint,
    plan: RunPlan,
    stage: Stage = None,
    lengths: Lengths = None,
    depths: Depths = None,
    keys: Keys = None,
    distractors: Distractors = None,
    key_digits: Digits = None,
    filler: Filler = None,
    loss_docs: LossDocs = None,
    short_docs: ShortDocs = None,
    packed_windows: Packed = None,
    tasks: Tasks = None,
    any_digit_keys: AnyDigits = None,
    seed: Seed = None,
    batch_size: Batch = None,
    rotary_base: RotaryBase = None,
    attention_scale: AttentionScale = 1.0,
    extrapolate: Extrapolate = False,
    base_ref: BaseRef = True,
    data: Data = None,
    cp: Cp = None,
    threads: Threads = None,
    out: Out = None,
    no_cache: NoCache = False,
    run_dir: RunDir = None,
    json_out: Json = False,
) -> None:
    """Evaluate CHECKPOINT with the plan's tokenizer and held-out data.

    Lengths default to the base's and the stages' (up to --stage) within the checkpoint's trained
    window; longer ones need --extrapolate. Exit 2 on bad input (missing checkpoint, unknown stage,
    length beyond the window, length not divisible by 2·CP, tokenizer mismatch)."""
    from longctx.eval.runner import evaluate_path
    from longctx.rope.base_bound import check_base

    _threads(threads)
    ranks = _cp(cp)  # a bad WORLD_SIZE is refused before anything is loaded
    if rotary_base is not None:  # the bound every base is held to
        check_base(rotary_base, what="--rotary-base: the rotary base", where="--rotary-base")
    rp = resolved_plan(plan, run_dir)
    options = SettingOptions(
        depths=depths,
        keys=keys,
        distractors=distractors,
        key_digits=key_digits,
        filler=filler,
        loss_docs=loss_docs,
        short_docs=short_docs,
        packed_windows=packed_windows,
        tasks=tasks,
        any_digit_keys=any_digit_keys,
        seed=seed,
        batch_size=batch_size,
    )
    report = evaluate_path(
        rp,
        checkpoint,
        stage=stage,
        lengths=parse_int_list(lengths),
        settings=options.settings(rp),
        rotary_base=rotary_base,
        attention_scale=attention_scale,
        extrapolate=extrapolate,
        base_reference=base_ref,
        data=data or None,
        out_dir=out,
        cp=ranks,
        use_cache=not no_cache,
    )
    _show(report, json_out)


@app.command("summary")
@cli_errors
def summary(
    plan: SummaryPlan = None,
    lengths: Lengths = None,
    depths: Depths = None,
    keys: Keys = None,
    distractors: Distractors = None,
    key_digits: Digits = None,
    filler: Filler = None,
    loss_docs: LossDocs = None,
    short_docs: ShortDocs = None,
    packed_windows: Packed = None,
    tasks: Tasks = None,
    any_digit_keys: AnyDigits = None,
    seed: Seed = None,
    batch_size: Batch = None,
    data: Data = None,
    cp: Cp = None,
    threads: Threads = None,
    out: Out = None,
    no_cache: NoCache = False,
    run_dir: RunDir = None,
    json_out: Json = False,
) -> None:
    """The base and every stage with a finished checkpoint, at every stage's length (the base and
    earlier stages beyond their windows): the table of passkey accuracy, long-position loss and
    short-context loss, one NIAH panel per checkpoint, one loss-by-position line per checkpoint.

    Measures what the plan's [eval] says (what the stages and the demo measured), each option given
    overriding one field; re-uses their results (<run_dir>/eval/cache) and writes <run_dir>/eval/summary/.
    A summary there made with other settings is kept as <run_dir>/eval/summary-<digest>/, and a note
    says what changed."""
    from longctx.eval.runner import summarize_plan

    the_plan = _summary_plan(plan)
    _threads(threads)
    rp = resolved_plan(the_plan, run_dir)
    options = SettingOptions(
        depths=depths,
        keys=keys,
        distractors=distractors,
        key_digits=key_digits,
        filler=filler,
        loss_docs=loss_docs,
        short_docs=short_docs,
        packed_windows=packed_windows,
        tasks=tasks,
        any_digit_keys=any_digit_keys,
        seed=seed,
        batch_size=batch_size,
    )
    report = summarize_plan(
        rp,
        lengths=parse_int_list(lengths),
        settings=options.settings(rp),
        out_dir=out,
        data=data or None,
        cp=_cp(cp),
        use_cache=not no_cache,
    )
    _show(report, json_out)


def _summary_plan(plan: Path | None) -> Path:
    """PLAN, refused with a usage message when missing."""
    if plan is None:
        raise typer.BadParameter("missing: longctx eval summary PLAN", param_hint="PLAN")
    return plan
