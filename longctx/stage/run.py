"""One step of a plan: decide from disk, check the ledger binding, repair, launch, record.

prepare_launch(rp, backend)  → LaunchPlan (what `--dry-run` prints)
execute(rp, launch, launcher) → LaunchOutcome (the ledger gets `launch` and `end` records)

A launch after which the stage's iteration did not advance and no new save appeared made no progress
(Megatron-LM exits 0 without training on "Unable to load rng state" and on --exit-on-missing-checkpoint):
`execute` says why in `LaunchOutcome.no_progress`, with the launch log's relevant lines, and records it
in the `end` record; `LaunchOutcome.verdict` is the one place that decides failed / interrupted / ok (the
until-done loop and the Slurm chain's job_end act on it). A resume whose plan changed the LR schedule of
the started stage is refused in `launch_plan` unless forced (see ledger.check_schedule).

Launching step after step until the plan is done is `longctx.stage.until_done`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Literal

from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.checkpoint.save_layout import (
    TRACKER,
    complete_iterations,
    iter_dir_name,
    partial_saves,
    read_tracker,
)
from longctx.checkpoint.unpickle import enums_pickled_by_name
from longctx.errors import CheckpointError, LongctxError, StageError
from longctx.launch.local import Launcher
from longctx.launch.stop import signals_received
from longctx.plan.derive import ResolvedPlan, ResolvedStage, scaling_summary
from longctx.plan.entry import UPSTREAM_SCRIPT
from longctx.plan.rope_sweep import require_chosen
from longctx.plan.stage_data import require_startable, stage_blend
from longctx.report import Findings
from longctx.stage import ledger
from longctx.stage.ledger_events import End, Launch
from longctx.stage.lock import run_lock
from longctx.stage.megatron_args import argv as megatron_argv
from longctx.stage.megatron_args import attention_backend_env, cpu_flags
from longctx.stage.run_files import check_run_file
from longctx.stage.saved_schedule import checkpoint_schedule
from longctx.stage.state import NextStep, Repair, next_step, plan_state, require_runnable, stage_state
from longctx.tokenizer import load_tokenizer, tokenizer_md5
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec
from longctx.util.disk import storage_problem
from longctx.util.oserrors import file_system_error

Backend = Literal["local", "megatron-lm"]
MEGATRON_ENV = "LONGCTX_MEGATRON_LM"
# "1": run Megatron-LM through the CPU runner, "0": never; unset: when this machine has no CUDA
MEGATRON_CPU_ENV = "LONGCTX_MEGATRON_CPU"
MEGATRON_CPU_RUNNER = "longctx.mcore.run_megatron_lm"
# "1" (`longctx rehearse` sets it): a megatron-lm launch goes through that runner, CUDA or not, and Megatron-LM's
# own measurements of each iteration go to the stage's metrics.jsonl, as the local trainer writes them; the
# runner reads the file and stage from the next two (longctx.mcore.run_megatron_lm.METRICS_ENV / STAGE_ENV)
RECORD_METRICS_ENV = "LONGCTX_RECORD_METRICS"
METRICS_FILE_ENV = "LONGCTX_METRICS_FILE"
METRICS_STAGE_ENV = "LONGCTX_METRICS_STAGE"


@dataclasses.dataclass
class LaunchPlan:
    step: NextStep
    stage: ResolvedStage
    backend: Backend
    argv: list[str]
    nproc: int
    env: dict[str, str]
    binding: ledger.Binding
    log: Path
    spec_path: Path | None = None
    train_spec: TrainSpec | None = None  # the local backend's, written to spec_path at launch
    # megatron-lm on a machine without CUDA: `argv` (the stage's, as on a GPU) runs through the CPU runner
    cpu: bool = False
    # a started stage resumed with another LR schedule (forced): field → (old, new); argv has the override
    schedule_override: dict[str, tuple[object, object]] | None = None
    # megatron-lm: Megatron-LM's measurements go to the stage's metrics.jsonl (through the runner, CUDA or not)
    metrics: bool = False

    @property
    def command(self) -> list[str]:
        """What the launcher starts: `argv`, or on CPU `python -m <runner> pretrain_gpt.py flags… CPU flags`
        (longctx.mcore.run_megatron_lm applies the shims of longctx.mcore.megatron_lm_cpu first); with
        `metrics` on a GPU, the runner without the CPU flags (it patches nothing there)."""
        if not self.cpu and not self.metrics:
            return list(self.argv)
        extra = cpu_flags(self.stage.cp, self.stage.seq_length) if self.cpu else []
        return [self.argv[0], "-m", MEGATRON_CPU_RUNNER, *self.argv[1:], *extra]

    def shell(self) -> str:
        return " ".join(shlex.quote(w) for w in self.command)


@dataclasses.dataclass
class LaunchOutcome:
    stage: str
    action: str
    exit_code: int
    start_iteration: int
    end_iteration: int
    status: str  # the stage's status on disk afterwards
    seconds: float
    new_saves: list[int] = dataclasses.field(default_factory=list)  # complete saves the launch added
    no_progress: str | None = None  # why the launch made no progress (execute: with the log's lines)
    log_lines: list[str] = dataclasses.field(default_factory=list)  # the log's lines that say why
    interrupted: bool = False  # a signal asked the launch to stop (time limit, cancel) while it ran
    discarded: list[str] = dataclasses.field(default_factory=list)  # unfinished saves a failed launch left
    storage: str | None = None  # a failed launch's file system that cannot take a save: what, where, fix
    stale_lock: dict[str, object] | None = None  # the run lock of a gone launcher this launch replaced

    @property
    def progressed(self) -> bool:
        return self.end_iteration > self.start_iteration or bool(self.new_saves) or self.status == "done"

    @property
    def verdict(self) -> Literal["ok", "failed", "interrupted"]:
        """failed: a non-zero exit, or an exit 0 without progress (no iteration, no new save: Megatron-LM's
        "Unable to load rng state", --exit-on-missing-checkpoint, a script that does not train);
        interrupted: no progress because a signal asked it to stop before its first save; else ok."""
        if self.exit_code != 0:
            return "failed"
        if self.progressed:
            return "ok"
        return "interrupted" if self.interrupted else "failed"


# -- a launch without progress: what its log says -----------------------------------------------------

# Megatron-LM's messages when it stops without training (checkpointing.py), and failures in general
_LOG_PATTERNS = (
    re.compile(r"Unable to load rng state", re.I),
    re.compile(r"exit-on-missing-checkpoint|missing checkpoint", re.I),
    re.compile(r"could not find the metadata file|will not load any checkpoints", re.I),
    re.compile(r"Traceback \(most recent call last\)"),
    re.compile(r"^\s*(?:\[[^\]]*\]\s*)?(?:[\w.]+(?:Error|Exception)|AssertionError|KeyboardInterrupt)\b"),
    re.compile(r"\bexiting\b.*\.\.\.|exiting program", re.I),
)
_LOG_TAIL_BYTES = 4 << 20
_LOG_SHOWN = 6
_HINTS = (
    (
        "Unable to load rng state",
        "the save has no RNG state this launch can load (written by the local backend, or TP/PP changed): "
        "add --no-load-rng to the stage's extra_args, or resume with the parallelism it was saved with",
    ),
    (
        "missing checkpoint",
        "Megatron-LM found no tracker in --load nor in --pretrained-checkpoint: check the stage's save dir "
        "and the previous stage's (`longctx stage status`, `longctx ckpt check`)",
    ),
)


def relevant_log_lines(log: Path, *, limit: int = _LOG_SHOWN) -> list[str]:
    """The last `limit` lines of a launch log that say why it stopped (deduplicated across ranks)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    hits: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if line and any(p.search(line) for p in _LOG_PATTERNS):
            if line in hits:
                hits.remove(line)
            hits.append(line)
    return hits[-limit:]


def no_progress_message(
    stage: str, exit_code: int, iteration: int, save_dir: Path, log: Path, lines: list[str]
) -> str:
    """Why a launch made no progress, quoting its log."""
    head = (
        f"stage {stage} made no progress: the launch exited {exit_code} at iteration {iteration} and "
        f"wrote no new save in {save_dir} (log: {log})"
    )
    if not lines:
        return head + "; the log does not say why"
    text = head + "; the log says:\n" + "\n".join(f"  {x}" for x in lines)
    for needle, hint in _HINTS:
        if any(needle.lower() in x.lower() for x in lines):
            text += f"\nfix: {hint}"
            break
    return text


# -- binding: what a stage launch depends on --------------------------------------------------------


def _content_digest(path: Path, h: hashlib._Hash) -> None:
    """Size, first and last MiB of a file: its content, wherever it lies (a .idx holds the document
    sizes up front and the document index at the end)."""
    size = path.stat().st_size
    h.update(f"{size}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))


def data_digest(rp: ResolvedPlan, st: ResolvedStage) -> str:
    """Blend weights + each prefix's .idx (size, first and last MiB) + .bin size, in blend order: changes
    when the data does, not when the run directory moves (no path is hashed)."""
    h = hashlib.sha256()
    for e in stage_blend(rp, st).entries:
        h.update(f"{e.weight}|".encode())
        for ext in (".idx", ".bin"):
            p = Path(e.prefix + ext)
            if not p.exists():
                h.update(b"missing")
            elif ext == ".idx":
                _content_digest(p, h)
            else:
                h.update(f"bin:{p.stat().st_size}".encode())
    return h.hexdigest()[:16]


def checkpoint_content(save_dir: Path, repair: Repair | None = None) -> str:
    """`iter_NNNNNNN:<digest of its .metadata>` (`none` without a tracker); with `repair` (a fix of this
    save dir's tracker, applied at launch) the iteration it will name. No path: a moved run keeps it."""
    if repair is not None and repair.new is not None and repair.tracker.parent == save_dir:
        dir_name = iter_dir_name(repair.new)
    else:
        t = read_tracker(save_dir)
        if t is None:
            return "none"
        dir_name = t.dir_name
    meta = save_dir / dir_name / ".metadata"
    digest = hashlib.sha256(meta.read_bytes()).hexdigest()[:16] if meta.exists() else "no-metadata"
    return f"{dir_name}:{digest}"


def checkpoint_identity(save_dir: Path, repair: Repair | None = None) -> str:
    """`save_dir@iter_NNNNNNN:<digest>`: where a save lies and what it holds (the binding keeps only the
    second part, `checkpoint_content`)."""
    return f"{save_dir}@{checkpoint_content(save_dir, repair)}"


def binding_for(rp: ResolvedPlan, st: ResolvedStage, load_repair: Repair | None = None) -> ledger.Binding:
    tok = rp.tokenizer.path
    base = checkpoint_content(st.load_from, load_repair) if st.load_from is not None else "none"
    return ledger.Binding(
        tokenizer_md5=tokenizer_md5(tok),
        data_digest=data_digest(rp, st),
        base_identity=base,
        rotary_base=st.rotary_base,
        seq_length=st.seq_length,
        schedule=schedule_for(st),
        rope_scaling=scaling_summary(st.rope_scaling),
        attention_scale=st.attention_scale,
    )


def schedule_for(st: ResolvedStage) -> dict[str, object]:
    """The stage's LR schedule as Megatron-LM's scheduler checks it on resume (ledger.SCHEDULE_FIELDS),
    from the same values as megatron_args.lr_flags."""
    return {
        "lr": float(st.lr.lr),
        "min_lr": float(st.lr.min_lr),
        "lr_warmup_iters": int(st.warmup_iters),
        "lr_decay_iters": int(st.train_iters),
        "lr_decay_style": str(st.lr.decay_style),
        "weight_decay": float(st.lr.weight_decay),
        "global_batch_size": int(st.global_batch_size),
    }


# -- backends ---------------------------------------------------------------------------------------


def _refuse_for_local(rp: ResolvedPlan, st: ResolvedStage) -> None:
    """What the local backend cannot train: TP or PP, several nodes, a RoPE scaling, documents without
    longctx's attention."""
    if st.tp != 1 or st.pp != 1:
        raise StageError(
            f"the local backend runs TP = PP = 1, stage {st.name} asks TP {st.tp}, PP {st.pp}",
            where=str(rp.source),
            fix="use the megatron-lm backend, or TP = PP = 1 in the plan",
        )
    if st.nodes != 1:
        raise StageError(
            f"the local backend runs on one host, stage {st.name} asks {st.nodes} nodes",
            where=str(rp.source),
            fix="set nodes = 1 for local runs",
        )
    if st.rope_scaling is not None:
        raise StageError(
            f"stage {st.name}: the local backend trains plain RoPE only, and this stage applies "
            f"{st.rope_scaling.type} (factor {st.rope_scaling.factor:g}) on top of base {st.rotary_base:,}",
            where=f"{rp.where}: stage {st.name} rope",
            fix="run the stage with --backend megatron-lm (Megatron-LM ≥ 0.19 trains YaRN), or give it a base "
            "method (fixed, abf, men, men-safe, liu, ntk)",
        )
    packing = st.data.packing if st.data else "concat"
    if packing == "documents" and rp.local.attention != "longctx":
        raise StageError(
            f'stage {st.name}: packing = "documents" on the local backend needs longctx\'s attention, '
            f"[local] attention is {rp.local.attention!r}",
            where=str(rp.source),
            fix='set [local] attention = "longctx" (it takes the document boundaries), or packing = "concat"',
        )


def local_spec(rp: ResolvedPlan, st: ResolvedStage) -> tuple[TrainSpec, int]:
    """The TrainSpec of a stage for the local backend, and its process count."""
    require_chosen(st.name, st.sweep)
    _refuse_for_local(rp, st)
    packing = st.data.packing if st.data else "concat"
    nproc = st.world
    tok_path = rp.tokenizer.path
    tok = load_tokenizer(tok_path)
    blend = stage_blend(rp, st)
    threads = rp.local.threads_per_process or max(1, (os.cpu_count() or 1) // nproc)
    stage_root = st.stage_dir
    spec = TrainSpec(
        stage=st.name,
        arch=rp.arch,
        seq_length=st.seq_length,
        max_position_embeddings=st.max_position_embeddings,
        rotary_base=st.rotary_base,
        padded_vocab_size=st.padded_vocab_size,
        output_vocab_size=st.output_vocab_size,
        make_vocab_size_divisible_by=rp.make_vocab_size_divisible_by,
        objective=rp.objective,
        tokenizer=TokenizerInfo(
            path=str(tok_path),
            md5=tok.md5,
            vocab_size=tok.vocab_size,
            eod_id=tok.eod_id,
            pad_id=tok.pad_id,
            megatron_type=rp.tokenizer.megatron_type or "HuggingFaceTokenizer",
        ),
        data=[(e.weight, e.prefix) for e in blend.entries],
        split=st.data.split if st.data else "99,1,0",
        data_cache_path=str(rp.run_dir / "cache"),
        packing=packing,
        reset_position_ids=bool(st.data and st.data.reset_position_ids),
        seed=st.seed,
        micro_batch_size=st.micro_batch_size,
        global_batch_size=st.global_batch_size,
        train_iters=st.train_iters,
        lr=LRSchedule(
            lr=st.lr.lr,
            min_lr=st.lr.min_lr,
            warmup_iters=st.warmup_iters,
            decay_iters=st.train_iters,
            decay_style=st.lr.decay_style,
            wsd_decay_iters=st.wsd_decay_iters,
            wsd_decay_style=st.lr.wsd_decay_style,
            weight_decay=st.lr.weight_decay,
            adam_beta1=st.lr.adam_beta1,
            adam_beta2=st.lr.adam_beta2,
            adam_eps=st.lr.adam_eps,
            clip_grad=st.lr.clip_grad,
        ),
        tensor_parallel=1,
        context_parallel=st.cp,
        attention=rp.local.attention,
        cp_comm=rp.local.cp_comm,
        bf16=rp.local.bf16,
        recompute="none" if st.recompute == "selective" else st.recompute,
        recompute_method=st.recompute_method or "uniform",
        recompute_num_layers=st.recompute_num_layers or 1,
        save=str(st.save_dir),
        pretrained=str(st.load_from) if st.load_from else None,
        attention_scale=st.attention_scale,
        save_interval=st.save_interval,
        exit_duration_in_mins=st.exit_duration_in_mins,
        log_interval=st.log_interval,
        threads_per_process=threads,
        metrics_file=str(stage_root / "metrics.jsonl"),
        tensorboard_dir=str(stage_root / "tensorboard"),
        wandb=st.wandb,
    )
    return spec, nproc


def megatron_lm_script(rp: ResolvedPlan | None = None) -> Path:
    """The plan's entry script ([megatron].entry_script, pretrain_gpt.py unless a fork's) in the Megatron-LM
    checkout: $LONGCTX_MEGATRON_LM, else the plan's [megatron].path. An absolute entry script is used as is."""
    name = rp.megatron.entry_script if rp is not None else UPSTREAM_SCRIPT
    if Path(name).is_absolute():
        root = str(Path(name).parent)
    else:
        root = os.environ.get(MEGATRON_ENV) or ""
        if not root and rp is not None and rp.megatron.path is not None:
            root = str(rp.megatron.path)
    if not root:
        raise StageError(
            f"the megatron-lm backend needs a Megatron-LM checkout: ${MEGATRON_ENV} is not set",
            where=f"${MEGATRON_ENV} / {rp.where if rp is not None else 'the plan'}: [megatron].path",
            fix=f"export {MEGATRON_ENV}=/path/to/Megatron-LM (the directory with {name}) "
            "or set [megatron].path in the plan",
        )
    script = Path(root) / name
    if not script.is_file():
        raise StageError(
            f"no entry script {script.name} in {root}",
            where=str(script),
            fix=f"point ${MEGATRON_ENV} (or [megatron].path) at the fork's checkout, or correct [megatron].entry_script"
            if name != UPSTREAM_SCRIPT
            else f"point ${MEGATRON_ENV} at a Megatron-LM checkout (the megatron-core wheel has no pretrain_gpt.py)",
        )
    return script


def megatron_on_cpu() -> bool:
    """Whether a megatron-lm launch from here runs on the CPU ($LONGCTX_MEGATRON_CPU, else: no CUDA)."""
    told = os.environ.get(MEGATRON_CPU_ENV, "").strip()
    if told in ("0", "1"):
        return told == "1"
    if told:
        raise StageError(f"${MEGATRON_CPU_ENV} = {told!r}: expected 0 or 1", fix=f"unset {MEGATRON_CPU_ENV}")
    import torch  # lazy: seconds to import, and only this backend asks (the local trainer decides itself)

    return not torch.cuda.is_available()


def prepare_launch(
    rp: ResolvedPlan, backend: Backend, *, check_megatron: bool = True, force: bool = False
) -> LaunchPlan | NextStep:
    """The next launch of the plan, or the NextStep when there is nothing to launch (all done)."""
    step = next_step(rp, plan_state(rp))
    if step.action == "all-done":
        return step
    require_runnable(step)
    return launch_plan(rp, step, backend, check_megatron=check_megatron, force=force)


def launch_plan(
    rp: ResolvedPlan, step: NextStep, backend: Backend, *, check_megatron: bool = True, force: bool = False
) -> LaunchPlan:
    """How to launch `step` (a first launch or a resume, from `next_step`) on `backend`.

    megatron-lm: a started stage (a tracker in its save dir, or a resume) whose LR schedule differs from
    the one its checkpoints carry is refused (StageError); with `force` the argv gets
    --override-opt_param-scheduler and `schedule_override` says what changed."""
    st = rp.stage(step.stage or "")
    stage_root = st.stage_dir
    log = (
        stage_root
        / "logs"
        / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.environ.get('SLURM_JOB_ID', os.getpid())}.log"
    )
    binding = binding_for(rp, st, step.load_repair)
    if step.action == "first-launch":
        refuse_contradicting_base(rp, st)
    require_startable(rp, st, backend)
    if backend == "local":
        spec, nproc = local_spec(rp, st)
        spec_path = stage_root / "train_spec.json"
        argv = [sys.executable, "-m", "longctx.train", "--spec", str(spec_path)]
        env = {"OMP_NUM_THREADS": str(spec.threads_per_process)}
        return LaunchPlan(step, st, backend, argv, nproc, env, binding, log, spec_path, spec)
    refuse_python_megatron_cannot_resume()
    if check_megatron:
        script = megatron_lm_script(rp)
    else:
        script = (
            Path(os.environ.get(MEGATRON_ENV) or rp.megatron.path or "Megatron-LM") / rp.megatron.entry_script
        )
    override: dict[str, tuple[object, object]] | None = None
    if step.action == "resume" or (st.save_dir / TRACKER).exists():
        saved = checkpoint_schedule(st.save_dir)
        run_dir = rp.run_dir
        override = ledger.check_schedule(run_dir, st.name, binding.schedule, force=force, saved=saved) or None
        _refuse_kept_rates(st.name, override)
    # one process per GPU with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*): the
    # local launcher on one node, srun + torchrun across nodes (longctx.launch.srun)
    words = [
        sys.executable,
        *megatron_argv(rp, st, script=str(script), override_scheduler=override is not None),
    ]
    env = {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "PYTHONPATH": str(script.parent),
        # the srun launcher starts one torchrun per node of this stage
        "LONGCTX_NODES": str(st.nodes),
        **attention_backend_env(st.attention_backend),
    }
    cpu = megatron_on_cpu()
    if cpu:
        # no CUDA here: the same argv through the runner that shims Megatron-LM for the CPU, plus the CPU
        # flags (LaunchPlan.command); one share of the cores per process
        threads = rp.local.threads_per_process or max(1, (os.cpu_count() or 1) // max(1, st.gpus_per_node))
        env["OMP_NUM_THREADS"] = str(threads)
    metrics = os.environ.get(RECORD_METRICS_ENV) == "1"
    if metrics:
        env.update({METRICS_FILE_ENV: str(stage_root / "metrics.jsonl"), METRICS_STAGE_ENV: st.name})
    return LaunchPlan(
        step,
        st,
        backend,
        words,
        st.gpus_per_node,
        env,
        binding,
        log,
        cpu=cpu,
        schedule_override=override,
        metrics=metrics,
    )


def refuse_python_megatron_cannot_resume() -> None:
    """Megatron-LM under a Python that pickles enum members by name (3.11.0-3.11.4) writes a common.pt
    that its own loader (torch's `weights_only`) refuses: the first resume of every stage would fail,
    after the queue wait on a cluster. Refused before the launch."""
    if enums_pickled_by_name():
        version = ".".join(map(str, sys.version_info[:3]))
        raise StageError(
            f"Megatron-LM cannot run under this Python ({version}, {sys.executable}): it pickles enum members "
            "by name, which megatron-core's checkpoint loader (torch weights_only) refuses, so no stage could "
            "resume from its own saves",
            where=sys.executable,
            fix="run the Megatron-LM backend with Python >= 3.11.5 (or 3.12+) in the job's environment; the "
            "local backend and longctx's readers work under this one",
        )


def refuse_contradicting_base(rp: ResolvedPlan, st: ResolvedStage) -> None:
    """A base whose family contradicts the plan's objective (a diffusion model under the autoregressive
    loss, a masked-diffusion plan without a [MASK] row, another mask id, other vocabulary rows, time
    conditioning) is refused (StageError) before the first launch writes anything. Read here, not when
    the plan is resolved, because reading a checkpoint's index imports torch, which plan commands
    otherwise never need."""
    if st.index != 0 or st.load_from is None or not Path(st.load_from).exists():
        return
    try:
        family = inspect_checkpoint(st.load_from).family
    except LongctxError:
        return  # not a readable checkpoint: the trainer's load says why
    findings = Findings()
    rp.check_base_family(family, findings)
    if not findings.ok:
        first = findings.errors[0]
        raise StageError(first.message, where=first.where, fix=first.fix)


# Megatron-LM reads the peak and minimum LR from the optimizer's param groups (max_lr/min_lr), which a
# resume restores from the checkpoint: --override-opt_param-scheduler changes warmup, decay iterations
# and style, but an edited lr or min_lr would be silently ignored.
KEPT_BY_PARAM_GROUPS = ("lr", "min_lr")


def _refuse_kept_rates(stage: str, override: dict[str, tuple[object, object]] | None) -> None:
    kept = {k: v for k, v in (override or {}).items() if k in KEPT_BY_PARAM_GROUPS}
    if not kept:
        return
    detail = "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in kept.items())
    raise StageError(
        f"stage {stage!r} cannot resume on Megatron-LM with another {' and '.join(kept)} ({detail}): Megatron-LM "
        "takes the peak and minimum LR from the optimizer's param groups, which it restores from the "
        "checkpoint, so --override-opt_param-scheduler would leave the old rates in force",
        where=stage,
        fix="revert " + ", ".join(f"{k} = {a!r}" for k, (a, _) in kept.items()) + " for this stage and put "
        "the new rates in a new stage (it starts from this one's save with a fresh optimizer), or continue "
        "this stage with --backend local, which follows the plan's rates",
    )


def execute(rp: ResolvedPlan, lp: LaunchPlan, launcher: Launcher, *, force: bool = False) -> LaunchOutcome:
    """Launch `lp` holding the run directory's lock (a second launcher is refused, nothing written)."""
    run_dir = rp.run_dir
    # a sweep's branches may train at once (a Slurm job array): each holds its own directory's lock
    held = lp.stage.stage_dir if lp.stage.branch_of is not None else run_dir
    with run_lock(held, lp.stage.name) as stale:
        return _execute_locked(rp, lp, launcher, run_dir, force=force, stale=stale)


def _execute_locked(
    rp: ResolvedPlan,
    lp: LaunchPlan,
    launcher: Launcher,
    run_dir: Path,
    *,
    force: bool,
    stale: dict[str, object] | None,
) -> LaunchOutcome:
    _refuse_moved_on(rp, lp)
    conflicts = ledger.check_binding(run_dir, lp.stage.name, lp.binding, force=force)
    check_run_file(lp.log, run_dir, "launch log")
    for r in lp.step.repairs():
        r.apply()
    if lp.spec_path is not None and lp.train_spec is not None:
        lp.spec_path.parent.mkdir(parents=True, exist_ok=True)
        lp.train_spec.dump(lp.spec_path)
    ledger.append(run_dir, _launch_record(lp, conflicts, stale))
    outcome = _run_launch(lp, launcher, stale)
    ledger.append(run_dir, _end_record(lp, outcome))
    return outcome


def _launch_record(
    lp: LaunchPlan, conflicts: dict[str, tuple[object, object]], stale: dict[str, object] | None
) -> Launch:
    """What the ledger records before the launch starts: the stage, its argv and binding, the repairs and
    overrides applied."""
    return Launch(
        stage=lp.stage.name,
        action=lp.step.action,
        backend=lp.backend,
        start_iteration=lp.step.start_iteration,
        target_iterations=lp.stage.train_iters,
        argv_digest=hashlib.sha256("\0".join(lp.argv[1:]).encode()).hexdigest()[:16],
        argv=lp.argv[1:],
        cpu={"runner": MEGATRON_CPU_RUNNER, "flags": cpu_flags(lp.stage.cp, lp.stage.seq_length)}
        if lp.cpu
        else None,
        binding=lp.binding.record(),
        log=str(lp.log),
        repair=_repair_record(lp.step.repair),
        load_repair=_repair_record(lp.step.load_repair),
        forced={k: list(v) for k, v in conflicts.items()} if conflicts else None,
        schedule_override={k: list(v) for k, v in lp.schedule_override.items()}
        if lp.schedule_override
        else None,
        stale_lock=stale,
    )


def _run_launch(lp: LaunchPlan, launcher: Launcher, stale: dict[str, object] | None) -> LaunchOutcome:
    """Run the launch and say what it did: the stage's iteration and saves before and after, the signals
    that came meanwhile; after a failure, the unfinished saves it left are removed (and named)."""
    saves_before = set(complete_iterations(lp.stage.save_dir))
    partial_before = set(partial_saves(lp.stage.save_dir))
    signals_before = len(signals_received())
    t0 = time.monotonic()
    code = launcher.run(lp.command, nproc=lp.nproc, env=lp.env, log=lp.log)
    # asked before the unfinished saves are removed: they are what filled the disk
    storage = storage_problem(lp.stage.save_dir) if code != 0 else None
    discarded = _discard_partial_saves(lp.stage.save_dir, partial_before) if code != 0 else []
    after = stage_state(lp.stage)
    outcome = LaunchOutcome(
        lp.stage.name,
        lp.step.action,
        code,
        lp.step.start_iteration,
        after.iteration,
        after.status,
        time.monotonic() - t0,
        new_saves=sorted(set(after.complete) - saves_before),
        interrupted=len(signals_received()) > signals_before,
        discarded=discarded,
        storage=None if storage is None else str(file_system_error(storage, f"stage {lp.stage.name}")),
        stale_lock=stale,
    )
    if not outcome.progressed and not outcome.interrupted:
        outcome.log_lines = relevant_log_lines(lp.log)
        outcome.no_progress = no_progress_message(
            lp.stage.name, code, lp.step.start_iteration, lp.stage.save_dir, lp.log, outcome.log_lines
        )
    return outcome


def _end_record(lp: LaunchPlan, outcome: LaunchOutcome) -> End:
    """What the ledger records after the launch exited."""
    return End(
        stage=lp.stage.name,
        exit_code=outcome.exit_code,
        start_iteration=outcome.start_iteration,
        end_iteration=outcome.end_iteration,
        status=outcome.status,
        seconds=round(outcome.seconds, 1),
        new_saves=outcome.new_saves,
        outcome=outcome.verdict,
        no_progress=outcome.no_progress,
        log_lines=outcome.log_lines or None,
        discarded=outcome.discarded or None,
        storage=outcome.storage,
    )


def _refuse_moved_on(rp: ResolvedPlan, lp: LaunchPlan) -> None:
    """Under the lock, the step must still be the one planned: another launcher may have trained between
    this one's planning and its taking the lock."""
    if lp.stage.branch_of is not None:  # branches run side by side: only this branch's own progress counts
        mine = stage_state(lp.stage)
        now = NextStep(
            "all-done" if mine.status == "done" else lp.step.action,
            lp.stage.name,
            "",
            start_iteration=mine.iteration,
        )
    else:
        now = next_step(rp, plan_state(rp))
    planned = (lp.step.action, lp.step.stage, lp.step.start_iteration)
    if (now.action, now.stage, now.start_iteration) != planned:
        raise StageError(
            f"the run moved on while this launch was being prepared: planned {planned[0]} of stage "
            f"{planned[1]!r} at iteration {planned[2]}, now {now.action} of {now.stage!r} at {now.start_iteration}",
            where=str(rp.run_dir),
            fix="run `longctx stage run` again; it plans from the disk as it is now",
        )


def _repair_record(r: Repair | None) -> dict[str, object] | None:
    return None if r is None else {"tracker": str(r.tracker), "old": r.old, "new": r.new, "reason": r.reason}


def _discard_partial_saves(save_dir: Path, before: set[int]) -> list[str]:
    """Remove the unfinished saves a failed launch started (a full disk, a kill mid-save): they hold
    space the next launch needs, and a save into a non-empty directory is refused. Saves that were
    already unfinished before the launch, and the one the tracker names, are left alone."""
    try:
        tracker = read_tracker(save_dir)
    except CheckpointError:
        return []  # a damaged tracker: the next launch's repair decides, nothing is removed blindly
    out: list[str] = []
    for it, d in sorted(partial_saves(save_dir).items()):
        if it in before or (tracker is not None and tracker.dir_name == d.name):
            continue
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            out.append(str(d))
    return out
