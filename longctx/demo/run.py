"""`longctx demo`: the whole pipeline on a laptop-sized problem, resumable.

Steps (each skipped when its output already exists, so a second `demo` in the same directory resumes):
 1. base      — the published base (`longctx.demo.published`): its archive and tokenizer checked against
                the md5s of its card, the tokenizer copied, the archive adopted as `ckpt adopt` does;
                without one (the smoke plan): a SentencePiece tokenizer with the OpenEuroLLM
                special-token layout and its manifest;
 2. corpus    — seeded documents with one pass key each (longctx.demo.corpus), one corpus per data prefix;
 3. data      — tokenized into Megatron .bin/.idx with a sidecar;
 4. checks    — tokenizer vs the plan's manifest, each stage's data vs its length and budget;
 5. pretrain  — only without a published base: a tiny model pretrained at the base length;
 6. stages    — the plan through the stage state machine and the local backend (the last stage with
                CP = 2); one stage is interrupted with SIGTERM once it has saved, then resumed;
 7. eval      — every checkpoint evaluated (passkey grid, loss by position) with the plan's [eval] settings;
 8. summary   — a table and the paths of everything written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longctx.checkpoint.save_layout import TRACKER
from longctx.data.check import check_datasets
from longctx.data.tokenize import tokenize_jsonl
from longctx.demo.corpus import documents, write_jsonl
from longctx.demo.published import family_dir, install_published
from longctx.demo.train_launch import reached, train_to_target
from longctx.errors import LongctxError, StageError
from longctx.eval.runner import demo_summary
from longctx.launch.stop import requested, spawn, wait
from longctx.mcore.parallel import visible_device_count
from longctx.plan.derive import ResolvedPlan, open_plan
from longctx.plan.stage_data import stage_blend
from longctx.stage import ledger
from longctx.stage.ledger_events import Launch
from longctx.stage.run import LaunchOutcome
from longctx.stage.state import NextStep, plan_state, stage_state
from longctx.stage.sweep_choice import record_choice
from longctx.stage.until_done import UntilDone, run_until_done
from longctx.tokenizer import (
    fingerprint,
    load_tokenizer,
    train_sentencepiece,
    verify_tokenizer,
    write_manifest,
)
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec
from longctx.util.shipped import plans_dir

# `longctx demo --family F`: the plan of each model family (the same model and ladder, its own objective),
# each extending the family's published base (longctx/resources/demo/FAMILY)
FAMILY_PLANS = {"ar": "tiny.toml", "mdm": "tiny_mdm.toml", "udm": "tiny_udm.toml"}
# `longctx demo --small`: the smoke plan of a family that has one (the others keep their full plan)
SMALL_PLANS = {"ar": "tiny_smoke.toml"}
# `longctx demo --to L`: the autoregressive demo's plan that reaches L (the first is the default demo's)
REACH_PLANS = {"4k": "tiny.toml", "16k": "tiny_16k.toml"}


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One seeded corpus of the demo: written to corpus/NAME.jsonl, tokenized to data/NAME_text_document."""

    name: str
    docs: int
    min_words: int
    max_words: int
    seed: int
    names: int = 1  # the most named keys in a document (`longctx.demo.corpus.document`)
    any_digit: float = 0.0  # the share of keys whose digits may repeat


# the published base's stages: the base's short documents, and pass-key documents at each new length
# (1K: 1,000–2,000 words ≈ 1,400–2,800 tokens; 4K: 4,000–8,000 words ≈ 5,700–11,400 tokens). Packed by
# document, a window trains only the distances its document pieces span, so whole windows must often lie
# inside one document: with 2,200–3,300 words (3,100–4,700 tokens) 0.09 % of the 4K stage's tokens saw
# a distance in the top 1/64 of the window (whole windows: 3.1 %), and the tiny MDM at RoPE base 28M
# read no key at 4,096 tokens and every key at 4,064; the 1K corpus had the same gap (350–700 words).
# Mixed 70/30 with the short documents, each stage's window top is now trained at over a third of what
# whole windows give (`plan check --check-data`; tests/demo/test_stage_corpora.py). Every corpus holds
# one to four named keys per document, half of them of any digits, as the published bases' last phase
# does: a restatement is predictable only by looking its name up, so each stage extends lookup by name
# (RULER's multi-key needles), not just the copy of the one key in sight
STAGE_CORPORA = (
    Corpus("short", 10_000, 80, 170, 11, names=4, any_digit=0.5),
    Corpus("long1k", 1_400, 1_000, 2_000, 12, names=4, any_digit=0.5),
    Corpus("long4k", 700, 4_000, 8_000, 13, names=4, any_digit=0.5),
)
# and at 16K (`--to 16k`): 12,000–24,000 words ≈ 17,000–34,000 tokens, so most 16K windows lie whole
# inside one document; 600 documents hold 16.4M tokens, so the 16K stage and its sweep (9.8M tokens
# of it) read no document twice
REACH_CORPORA = {
    "4k": STAGE_CORPORA,
    "16k": (*STAGE_CORPORA, Corpus("long16k", 600, 12_000, 24_000, 14, names=4, any_digit=0.5)),
}


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo. `small()` is the same pipeline scaled down for tests.

    `published`: the family whose published base (longctx/resources/demo/FAMILY) the demo adopts, with
    its tokenizer, instead of building a tokenizer and pretraining a base itself."""

    plan: Path = dataclasses.field(default_factory=lambda: plans_dir() / "tiny.toml")
    published: str | None = "ar"
    corpora: tuple[Corpus, ...] = STAGE_CORPORA
    vocab_size: int = 512
    base_global_batch: int = 32
    base_iters: int = 150
    processes: int = 2
    interrupt_stage: str | None = "4k"  # SIGTERM once it has saved, then resume

    @classmethod
    def small(cls, plan: Path, interrupt_stage: str | None = None) -> DemoConfig:
        """The same pipeline on a smaller corpus and base model (pair it with a small plan)."""
        return cls(
            plan=plan,
            published=None,
            corpora=(Corpus("corpus", 160, 60, 1500, 1),),
            vocab_size=320,
            base_global_batch=8,
            base_iters=12,
            interrupt_stage=interrupt_stage,
        )

    @classmethod
    def from_options(
        cls,
        *,
        plan: Path | None = None,
        small: bool = False,
        interrupt: str | None = None,
        family: str = "ar",
        to: str = "4k",
    ) -> DemoConfig:
        """`longctx demo [--family F] [--plan P] [--small] [--interrupt S] [--to L]`: --family picks the
        plan (stages/tiny.toml, tiny_mdm.toml, tiny_udm.toml) unless --plan gives one; --small keeps only
        the plan (or the family's smoke plan, stages/tiny_smoke.toml for ar) and interrupts nothing
        unless told; otherwise --interrupt replaces the default stage. --to 16k carries the
        autoregressive demo on to 16K (stages/tiny_16k.toml, its 16K corpus, the 16K stage interrupted)."""
        if family not in FAMILY_PLANS:
            raise StageError(
                f"unknown model family {family!r}",
                where="--family",
                fix=f"use one of: {', '.join(FAMILY_PLANS)}",
            )
        if to not in REACH_PLANS:
            raise StageError(
                f"the demo reaches no length {to!r}",
                where="--to",
                fix=f"use one of: {', '.join(REACH_PLANS)}",
            )
        if to != "4k":
            return cls._reach(to, family=family, plan=plan, small=small, interrupt=interrupt)
        if small:
            if family not in SMALL_PLANS and plan is None:
                raise StageError(
                    f"the {family} demo has no small plan: it extends its published base through "
                    f"stages/{FAMILY_PLANS[family]}, whose data the small corpus does not hold",
                    where="--small",
                    fix=f"run `longctx demo --family {family}` without --small, or give --plan",
                )
            plan = plan or plans_dir() / SMALL_PLANS.get(family, FAMILY_PLANS[family])
            return cls.small(plan, interrupt_stage=interrupt)
        cfg = cls(plan=plan or plans_dir() / FAMILY_PLANS[family], published=family)
        if interrupt is not None:
            return dataclasses.replace(cfg, interrupt_stage=interrupt)
        return cfg

    @classmethod
    def _reach(
        cls, to: str, *, family: str, plan: Path | None, small: bool, interrupt: str | None
    ) -> DemoConfig:
        """The autoregressive demo carried on to `to`: its plan, its corpora, its last stage interrupted."""
        if family != "ar" or small or plan is not None:
            raise StageError(
                f"--to {to} carries the autoregressive demo's own plan (stages/{REACH_PLANS[to]}) to {to}",
                where="--to",
                fix="drop --family, --small and --plan (or drop --to)",
            )
        return cls(
            plan=plans_dir() / REACH_PLANS[to],
            corpora=REACH_CORPORA[to],
            interrupt_stage=interrupt or to,
        )


@dataclasses.dataclass
class StepRecord:
    step: str
    seconds: float
    detail: str
    skipped: bool = False


@dataclasses.dataclass
class DemoReport:
    run_dir: Path
    steps: list[StepRecord]
    stages: list[dict[str, Any]]
    evaluation: dict[str, Any] | None
    interrupted: dict[str, Any] | None
    wall_seconds: float


Echo = Callable[[str], None]


def device_choice(gpus: int | None, ranks: int) -> tuple[dict[str, str], str]:
    """Where the demo trains: on the GPUs when each of its `ranks` processes gets one, else on CPU ranks
    (a CP 2 stage on a one-GPU machine would be refused); the environment that says so, and a line."""
    if gpus is None or gpus == 0:
        return {}, f"devices: CPU ({ranks} process(es), no GPU visible)"
    if gpus >= ranks:
        return {}, f"devices: GPU ({ranks} process(es), one GPU each, of {gpus})"
    return {"CUDA_VISIBLE_DEVICES": ""}, (
        f"devices: CPU ranks — the demo runs up to {ranks} processes at once (the CP stage) and this machine "
        f"shows {gpus} GPU(s), one short of a GPU per rank; every step trains on CPU (CUDA_VISIBLE_DEVICES='')"
    )


def _timed(steps: list[StepRecord], name: str, echo: Echo, fn: Callable[[], tuple[str, bool]]) -> None:
    echo(f"==> {name}")
    t0 = time.monotonic()
    detail, skipped = fn()
    rec = StepRecord(name, time.monotonic() - t0, detail, skipped)
    steps.append(rec)
    echo(f"    {'(already done) ' if skipped else ''}{detail} [{rec.seconds:.1f} s]")


def _tokenizer(run_dir: Path, cfg: DemoConfig) -> tuple[str, bool]:
    tok_dir = run_dir / "tokenizer"
    manifest = tok_dir / "manifest.toml"
    if manifest.exists():
        return f"{tok_dir}", True
    sample = [line for d in documents(80, seed=7, min_words=50, max_words=400) for line in d.split(" . ")]
    train_sentencepiece(sample, tok_dir, cfg.vocab_size, layout="oellm", hf=True, tokenizer_json=True)
    m = fingerprint(tok_dir, name="demo-tokenizer")
    write_manifest(
        m, manifest, header="Demo tokenizer (OpenEuroLLM special-token layout), written by `longctx demo`."
    )
    return f"SentencePiece vocab {m.vocab_size} (md5 {m.md5}) → {tok_dir}", False


def _published(run_dir: Path, family: str) -> tuple[str, bool]:
    """Adopt the published base as a user adopts a downloaded one: md5s checked against its card first."""
    card, wrote = install_published(
        family_dir(family), run_dir / "tokenizer", run_dir / "base" / "checkpoints"
    )
    return (
        f"{card.name}: archive md5 {card.archive_md5} and tokenizer md5 {card.tokenizer_md5} match the card; "
        f"iteration {card.iteration:,} adopted → {run_dir / 'base' / 'checkpoints'}",
        not wrote,
    )


def _corpus(run_dir: Path, cfg: DemoConfig) -> tuple[str, bool]:
    done = [c for c in cfg.corpora if (run_dir / "corpus" / f"{c.name}.jsonl").exists()]
    for c in cfg.corpora:
        path = run_dir / "corpus" / f"{c.name}.jsonl"
        if c in done:
            continue
        write_jsonl(
            path.with_suffix(".tmp"),
            documents(
                c.docs,
                seed=c.seed,
                min_words=c.min_words,
                max_words=c.max_words,
                names=c.names,
                any_digit=c.any_digit,
            ),
        )
        path.with_suffix(".tmp").rename(path)
    sizes = ", ".join(
        f"{c.name}: {c.docs:,} documents of {c.min_words}–{c.max_words} words" for c in cfg.corpora
    )
    return sizes, len(done) == len(cfg.corpora)


def _data(run_dir: Path, cfg: DemoConfig) -> tuple[str, bool]:
    parts, kept = [], 0
    for c in cfg.corpora:
        prefix = run_dir / "data" / f"{c.name}_text_document"
        if Path(str(prefix) + ".idx").exists():
            kept += 1
            continue
        prefix.parent.mkdir(parents=True, exist_ok=True)
        side = tokenize_jsonl(
            [run_dir / "corpus" / f"{c.name}.jsonl"], run_dir / "tokenizer", prefix, workers=cfg.processes
        )
        parts.append(f"{c.name}: {side.documents:,} documents, {side.tokens:,} tokens")
    return "; ".join(parts) or f"{run_dir / 'data'}", kept == len(cfg.corpora)


def _checks(run_dir: Path, rp: ResolvedPlan) -> tuple[str, bool]:
    rep = verify_tokenizer(
        run_dir / "tokenizer",
        rp.tokenizer.manifest,
    )
    if not rep.ok:
        raise StageError(
            "the demo tokenizer does not match its manifest", fix="delete the demo directory and rerun"
        )
    lengths = [rp.base.seq_length] + [s.seq_length for s in rp.stages]
    for st in rp.stages:  # each stage's data at its own length and budget (blends differ by stage)
        data = check_datasets(
            stage_blend(rp, st),
            tokenizer=run_dir / "tokenizer",
            lengths=[st.seq_length],
            budgets={st.name: st.tokens_realized},
            progress=False,
        )
        if not data.ok:
            msgs = "; ".join(f.message for f in data.all_findings().errors)
            raise StageError(f"the demo data of stage {st.name} fails its checks: {msgs}")
    return f"tokenizer matches its manifest; data passes its checks at lengths {lengths}", False


def _base(
    run_dir: Path, rp: ResolvedPlan, cfg: DemoConfig, echo: Echo, devices: dict[str, str]
) -> tuple[str, bool]:
    save = run_dir / "base" / "checkpoints"
    done = reached(save)
    if done >= cfg.base_iters:
        return f"{save} (iteration {done})", True
    tok = load_tokenizer(run_dir / "tokenizer")
    # the base model is what the plan says it is: its length, rotary base, objective and vocabulary rows
    seq, rotary_base = rp.base.seq_length, rp.base.rotary_base
    first = rp.stages[0]
    spec = TrainSpec(
        stage="base",
        arch=rp.arch,
        seq_length=seq,
        max_position_embeddings=seq,
        rotary_base=rotary_base,
        padded_vocab_size=first.padded_vocab_size,
        output_vocab_size=first.output_vocab_size,
        objective=rp.objective,
        tokenizer=TokenizerInfo(
            path=str(run_dir / "tokenizer"),
            md5=tok.md5,
            vocab_size=tok.vocab_size,
            eod_id=tok.eod_id,
            pad_id=tok.pad_id,
        ),
        data=[(e.weight, e.prefix) for e in stage_blend(rp, rp.stages[0]).entries],
        split="98,2,0",
        data_cache_path=str(run_dir / "cache"),
        global_batch_size=cfg.base_global_batch,
        train_iters=cfg.base_iters,
        lr=LRSchedule(
            lr=2e-3, min_lr=2e-4, warmup_iters=max(1, cfg.base_iters // 10), decay_iters=cfg.base_iters
        ),
        save=str(save),
        save_interval=max(1, cfg.base_iters // 3),
        log_interval=max(1, cfg.base_iters // 10),
        threads_per_process=max(1, (os.cpu_count() or 1) // cfg.processes),
        metrics_file=str(run_dir / "base" / "metrics.jsonl"),
    )
    spec_path = run_dir / "base" / "train_spec.json"
    spec.dump(spec_path)
    # the stages train from this base: a launch that stopped short of base_iters (a signal) is not it
    train_to_target(
        spec_path,
        nproc=cfg.processes,
        env={"OMP_NUM_THREADS": str(spec.threads_per_process), **devices},
        log=run_dir / "base" / "train.log",
        save_dir=save,
        target=cfg.base_iters,
        what="base pretraining",
    )
    return (
        f"{cfg.base_iters} iterations at {seq} tokens, rotary base {rotary_base:,}, "
        f"{rp.objective.describe()} → {save}",
        False,
    )


def _stage_command(plan: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "longctx",
        "stage",
        "run",
        str(plan),
        "--run-dir",
        str(run_dir),
        "--backend",
        "local",
    ]


class _Stages:
    """Every stage through `run_until_done`, one `longctx stage run` subprocess per step (as a cluster job
    would run it); `cfg.interrupt_stage` gets SIGTERM after its first save and is then resumed."""

    def __init__(self, run_dir: Path, cfg: DemoConfig, echo: Echo, devices: dict[str, str]) -> None:
        self.run_dir, self.cfg, self.echo = run_dir, cfg, echo
        self.interrupted: dict[str, Any] | None = None
        self._interrupted_launch: LaunchOutcome | None = None
        self.env = dict(os.environ, LONGCTX_NO_PROGRESS="1", **devices)

    def resolve(self) -> ResolvedPlan:
        return open_plan(self.cfg.plan, self.run_dir)

    def run(self) -> dict[str, Any] | None:
        result = run_until_done(self.resolve, self.launch, choose=self.choose)
        if result.stop == "failed" and self._was_interrupted(result):
            result = run_until_done(
                self.resolve, self.launch, choose=self.choose
            )  # the SIGTERM's exit code: resume
        if result.stop == "failed":
            last = result.outcomes[-1]
            raise StageError(
                f"stage {last.stage} failed (exit {last.exit_code})",
                where=str(paths_stage_logs(self.resolve(), last.stage)),
            )
        if not result.done:
            raise StageError(f"the demo's stages did not finish: {result.reason}")
        return self.interrupted

    def choose(self, rp: ResolvedPlan, step: NextStep) -> bool:
        """A RoPE sweep's branches are done: evaluate them at the stage's length and record the choice."""
        st = rp.stage(step.stage or "")
        t0 = time.monotonic()
        choice = record_choice(rp, st)
        for e in choice.evidence:
            self.echo(
                f"    {st.name} branch base {e['base']:,}: greedy {e['greedy_hits']} of {e['keys']} per depth "
                f"at {e['length']:,}"
                + (f", far-end loss {e['far_loss']:.4f}" if e["far_loss"] is not None else "")
            )
        self.echo(f"    {st.name}: RoPE {choice.reason} [{time.monotonic() - t0:.1f} s]")
        return True

    def _was_interrupted(self, result: UntilDone) -> bool:
        """The failed launch is the one the demo sent SIGTERM to (its exit code is not a failure)."""
        return result.outcomes[-1] is self._interrupted_launch

    def launch(self, rp: ResolvedPlan, step: NextStep) -> LaunchOutcome:
        st = rp.stage(step.stage or "")
        want_interrupt = (
            self.cfg.interrupt_stage == st.name and step.action == "first-launch" and self.interrupted is None
        )
        t0 = time.monotonic()
        # under this process's signal discipline: a signal to the demo reaches the step once, a second
        # one kills it with its workers (`longctx.launch.stop`)
        proc = spawn(_stage_command(self.cfg.plan, self.run_dir), env=self.env)
        if want_interrupt:
            self._interrupt_after_first_save(proc, st.name, st.save_dir / TRACKER)
        code = wait(proc)
        after = stage_state(self.resolve().stage(st.name))
        outcome = LaunchOutcome(
            st.name,
            step.action,
            code,
            step.start_iteration,
            after.iteration,
            after.status,
            time.monotonic() - t0,
        )
        if want_interrupt:
            self._interrupted_launch = outcome
            self._record_interruption(st.name, code, after.iteration, after.target_iterations, after.status)
        return outcome

    def _interrupt_after_first_save(self, proc: subprocess.Popen[bytes], stage: str, tracker: Path) -> None:
        while proc.poll() is None and not tracker.exists():
            time.sleep(0.05)
        if proc.poll() is None and requested() is None:  # the demo's own test of a stop, not the user's
            self.echo(f"    sending SIGTERM to stage {stage} after its first save (then resuming)")
            proc.send_signal(signal.SIGTERM)

    def _record_interruption(self, stage: str, code: int, iteration: int, target: int, status: str) -> None:
        self.interrupted = {
            "stage": stage,
            "stopped_at": iteration,
            "target": target,
            "exit_code": code,
            "finished_first": status == "done",
        }
        if status == "done":
            self.echo(f"    stage {stage} finished before the SIGTERM took effect")
        else:
            self.echo(
                f"    stage {stage} stopped at iteration {iteration}/{target} (exit {code}); relaunching resumes it"
            )


def _run_stages(run_dir: Path, cfg: DemoConfig, echo: Echo, devices: dict[str, str]) -> dict[str, Any] | None:
    """Run every stage; interrupt `cfg.interrupt_stage` with SIGTERM after its first save, then resume."""
    return _Stages(run_dir, cfg, echo, devices).run()


def paths_stage_logs(rp: ResolvedPlan, stage: str) -> Path:
    return rp.stage(stage).stage_dir / "logs"


def _stage_rows(rp: ResolvedPlan, run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    records = ledger.read(run_dir)
    for st, s in zip(rp.stages, plan_state(rp), strict=True):
        metrics_file = st.stage_dir / "metrics.jsonl"
        metrics = (
            [json.loads(x) for x in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
        )
        launches = [r for r in records if isinstance(r, Launch) and r.stage == st.name]
        rows.append(
            {
                "stage": st.name,
                "seq_length": st.seq_length,
                "rotary_base": st.rotary_base,
                "cp": st.cp,
                "iterations": f"{s.iteration}/{s.target_iterations}",
                "status": s.status,
                "launches": [r.action for r in launches],
                "first_loss": metrics[0]["loss"] if metrics else None,
                "final_loss": metrics[-1]["loss"] if metrics else None,
                "tokens_per_s": (sum(m["tokens_per_s"] for m in metrics[-5:]) / min(5, len(metrics)))
                if metrics
                else None,
            }
        )
    return rows


def run_demo(run_dir: Path, cfg: DemoConfig | None = None, *, echo: Echo = print) -> DemoReport:
    cfg = cfg or DemoConfig()
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    steps: list[StepRecord] = []
    published = cfg.published
    if published is not None:
        _timed(steps, "published base", echo, lambda: _published(run_dir, published))
    else:
        _timed(steps, "tokenizer", echo, lambda: _tokenizer(run_dir, cfg))
    _timed(steps, "corpus", echo, lambda: _corpus(run_dir, cfg))
    _timed(steps, "data", echo, lambda: _data(run_dir, cfg))
    rp = open_plan(cfg.plan, run_dir)
    _timed(steps, "checks", echo, lambda: _checks(run_dir, rp))
    devices, line = device_choice(
        visible_device_count(), max([cfg.processes, *(st.world for st in rp.stages)])
    )
    echo(line)
    if published is None:
        _timed(steps, "base model", echo, lambda: _base(run_dir, rp, cfg, echo, devices))
    interrupted: dict[str, Any] | None = None

    def stages() -> tuple[str, bool]:
        nonlocal interrupted
        interrupted = _run_stages(run_dir, cfg, echo, devices)
        return f"{len(rp.stages)} stages done", False

    _timed(steps, "stages", echo, stages)
    rp = open_plan(cfg.plan, run_dir)  # again: a RoPE sweep's choice is part of the plan from now on
    evaluation = None

    def evaluate() -> tuple[str, bool]:
        nonlocal evaluation
        # what the plan's [eval] says: `eval summary PLAN` afterwards prints the same table from the cache
        evaluation = demo_summary(rp, base=run_dir / "base" / "checkpoints")
        return f"base and every stage evaluated ({rp.eval.describe()}) → {evaluation['out_dir']}", False

    _timed(steps, "evaluation", echo, evaluate)
    return DemoReport(
        run_dir, steps, _stage_rows(rp, run_dir), evaluation, interrupted, time.monotonic() - t0
    )


__all__ = ["DemoConfig", "DemoReport", "LongctxError", "run_demo"]
