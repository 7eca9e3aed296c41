"""The local backend (longctx's own trainer) against the real Megatron-LM `pretrain_gpt.py`, on the CPU.

Both run one tiny stage through the path users run, `longctx stage run PLAN --backend local|megatron-lm`
(each in its own subprocess and run directory): the same plan, so the same model, tokenizer, data, base
checkpoint, micro and global batch, sequence length, process count and threads per process. Megatron-LM
runs through `python -m longctx.mcore.run_megatron_lm` with the CPU flags, as `stage run` does on a
machine without CUDA (the bench hides any GPU from both).

The figure per backend is the median tokens/s of the iterations after the warm-up ones: the local
trainer's metrics file (`tokens_per_s` of every iteration) and Megatron-LM's log (`elapsed time per
iteration (ms)`, logged every iteration: the plan's log_interval is 1). Start-up (imports, process
groups, dataset index, loading the base) is outside both. Nothing is asserted about speed; the target
the project cares about is local / Megatron-LM ≥ 1.0.

The inputs are built in the work directory: a SentencePiece tokenizer (HF layout) and its manifest, a
Megatron dataset of synthetic documents, the plan, and a base checkpoint (one iteration of the local
trainer from random weights, at the stage's length).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import tomli_w

from longctx.data.tokenize import tokenize_jsonl
from longctx.errors import PlanError, StageError
from longctx.plan.derive import ResolvedPlan, open_plan
from longctx.tokenizer import (
    fingerprint,
    load_tokenizer,
    synthetic_corpus,
    train_sentencepiece,
    write_manifest,
)
from longctx.util.machine import cpu_model

TARGET_RATIO = 1.0
MEGATRON_ENV = "LONGCTX_MEGATRON_LM"
# what Megatron-LM's training code imports besides torch and megatron-core (`longctx[megatron-lm]`)
MEGATRON_NEEDS = ("six", "einops", "regex", "transformers", "tensorboard")
STAGE = "bench"
VOCAB = 512
DOCUMENTS = 16  # about 0.1M tokens: Megatron's dataset repeats epochs as a stage needs
# every document trains: megatron-core's GPTDataset never returns from a split part without documents
# (2% of 16 is none), even when no sample of it is asked for
SPLIT = "100,0,0"
ROTARY_BASE = 10000
LAUNCH_TIMEOUT_S = 1800
# progress units besides the iterations: tokenizer + data, base checkpoint
INPUT_UNITS = 2

Backend = Literal["local", "megatron-lm"]
Advance = Callable[[float], None]

# Megatron-LM's training_log line: "iteration 3/ 12 | … | elapsed time per iteration (ms): 812.4 | …"
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")


@dataclasses.dataclass(frozen=True)
class TrainerBenchSettings:
    """What both backends train. The model is shaped like stages/tiny.toml's (2 of its 4 layers by
    default): SwiGLU with ffn = 3 × hidden, GQA with heads / 2 query groups (MHA for an odd head count),
    RMSNorm, QK-norm, untied embeddings, vocab 512. Small enough for a 2-core machine: bf16 on a CPU
    without native bf16 is slow, and Megatron-LM always runs bf16."""

    num_layers: int = 2
    hidden_size: int = 128
    num_attention_heads: int = 4
    seq_length: int = 256
    micro_batch_size: int = 1
    global_batch_size: int = 8
    iterations: int = 10
    warmup: int = 2  # iterations left out of the median (allocation, first-touch, autograd set-up)
    processes: int = 2  # data-parallel processes of both backends
    threads: int | None = None  # torch threads per process; None: cores / processes
    # Megatron-LM's argv always has --bf16 (bf16 weights and compute, fp32 main grads and params); the
    # local backend runs bf16 too unless told fp32 (its default on a CPU)
    local_bf16: bool = True

    @property
    def threads_per_process(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.processes)

    @property
    def ffn_hidden_size(self) -> int:
        return 3 * self.hidden_size

    @property
    def query_groups(self) -> int:
        return (
            self.num_attention_heads // 2 if self.num_attention_heads % 2 == 0 else self.num_attention_heads
        )

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    def validate(self) -> None:
        problems = []
        if self.warmup >= self.iterations:
            problems.append(
                f"warm-up {self.warmup} leaves none of the {self.iterations} iterations to measure"
            )
        if self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden {self.hidden_size} is not a multiple of heads {self.num_attention_heads}"
            )
        per_step = self.micro_batch_size * self.processes
        if self.global_batch_size % per_step:
            problems.append(
                f"global batch {self.global_batch_size} is not a multiple of micro batch × processes "
                f"({self.micro_batch_size} × {self.processes})"
            )
        if min(self.num_layers, self.hidden_size, self.seq_length, self.micro_batch_size, self.processes) < 1:
            problems.append("sizes must be positive")
        if problems:
            raise PlanError(
                "trainer bench settings that cannot run: " + "; ".join(problems),
                fix="change the options named above",
            )

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(
            threads=self.threads_per_process,
            ffn_hidden_size=self.ffn_hidden_size,
            num_query_groups=self.query_groups,
            vocab_size=VOCAB,
            tokens_per_iteration=self.tokens_per_iteration,
        )
        return d


@dataclasses.dataclass
class BackendRun:
    """One backend's launch: tokens/s of every iteration (warm-up included) and the median of the rest."""

    backend: Backend
    tokens_per_s: float  # median over the measured iterations
    tokens_per_iteration: int  # global batch × sequence length
    iteration_tokens_per_s: list[float]
    measured_iterations: int
    launch_seconds: float  # the whole `stage run`, start-up and the final save included
    command: list[str]
    log: str | None  # the launch log (None once the work dir is removed)

    @property
    def seconds_per_iteration(self) -> float:
        return self.tokens_per_iteration / self.tokens_per_s if self.tokens_per_s > 0 else 0.0


@dataclasses.dataclass
class TrainerBenchResult:
    settings: dict[str, Any]
    local: BackendRun
    megatron_lm: BackendRun
    ratio: float  # local / Megatron-LM tokens/s
    machine: dict[str, Any]
    differences: list[str]
    megatron_lm_checkout: str
    work_dir: str | None  # kept inputs and run directories (None: removed)
    target_ratio: float = TARGET_RATIO

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("local", "megatron_lm"):
            d[key]["seconds_per_iteration"] = getattr(self, key).seconds_per_iteration
        d["ok"] = True
        return d


# -- the checkout ---------------------------------------------------------------------------------------


def megatron_lm_checkout(path: str | os.PathLike[str] | None = None) -> Path:
    """The Megatron-LM checkout to run: `path`, else $LONGCTX_MEGATRON_LM; a StageError when there is none
    or it cannot train here."""
    where = os.fspath(path) if path is not None else os.environ.get(MEGATRON_ENV)
    if not where:
        raise StageError(
            f"the trainer bench runs the real Megatron-LM: ${MEGATRON_ENV} is not set",
            fix=f"export {MEGATRON_ENV}=/path/to/Megatron-LM (the directory with pretrain_gpt.py) or pass "
            "--megatron-lm PATH",
        )
    root = Path(where).expanduser().resolve()
    if not (root / "pretrain_gpt.py").is_file() or not (root / "megatron" / "training").is_dir():
        raise StageError(
            f"{root} is not a Megatron-LM checkout (no pretrain_gpt.py and megatron/training)",
            where=str(root),
            fix="point --megatron-lm or $LONGCTX_MEGATRON_LM at a Megatron-LM checkout "
            "(the megatron-core wheel has no pretrain_gpt.py)",
        )
    missing = [m for m in MEGATRON_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise StageError(
            f"Megatron-LM's training code needs {', '.join(missing)}, not installed here",
            fix="pip install 'longctx[megatron-lm]'",
        )
    return root


# -- inputs ---------------------------------------------------------------------------------------------


def _documents(count: int, *, seed: int) -> Iterator[str]:
    """Documents of 20–400 synthetic lines (the tokenizer's own training text, shuffled)."""
    lines = synthetic_corpus(4000, seed=seed)
    rng = random.Random(seed)
    for _ in range(count):
        yield "\n".join(rng.choice(lines) for _ in range(rng.randint(20, 400)))


def build_data(root: Path) -> tuple[Path, Path]:
    """Tokenizer (HF layout, vocab 512) with its manifest, and a Megatron dataset; (tokenizer, prefix)."""
    tok = root / "tokenizer"
    train_sentencepiece(synthetic_corpus(2000, seed=0), tok, VOCAB, hf=True)
    write_manifest(fingerprint(tok, name="bench-trainer"), tok / "manifest.toml")
    corpus = root / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for text in _documents(DOCUMENTS, seed=1):
            f.write(json.dumps({"text": text}) + "\n")
    prefix = root / "data" / "corpus_text_document"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tokenize_jsonl([corpus], tok, prefix, progress=False)
    return tok, prefix


def plan_text(s: TrainerBenchSettings, *, inputs: Path, run_dir: Path) -> str:
    """One stage of `iterations` global batches from the base, both backends on the same settings."""
    iters = s.iterations
    plan = {
        "name": "bench-trainer",
        "description": "longctx bench trainer: the local backend vs Megatron-LM on one tiny stage",
        "run_dir": str(run_dir),
        "base": {
            "path": f"{inputs}/base/checkpoints",
            "seq_length": s.seq_length,
            "rotary_base": ROTARY_BASE,
        },
        "tokenizer": {
            "path": f"{inputs}/tokenizer",
            "manifest": f"{inputs}/tokenizer/manifest.toml",
            "megatron_type": "HuggingFaceTokenizer",
        },
        "model": {
            "num_layers": s.num_layers,
            "hidden_size": s.hidden_size,
            "ffn_hidden_size": s.ffn_hidden_size,
            "num_attention_heads": s.num_attention_heads,
            "num_query_groups": s.query_groups,
            "kv_channels": s.hidden_size // s.num_attention_heads,
            "normalization": "RMSNorm",
            "swiglu": True,
            "qk_layernorm": True,
            "untie_embeddings_and_output_weights": True,
            "add_bias_linear": False,
        },
        "cluster": {"profile": "local", "gpus_per_node": s.processes, "gpu_memory_gib": 80},
        "local": {
            "eval_after_stage": False,
            "threads_per_process": s.threads_per_process,
            "bf16": s.local_bf16,
        },
        "defaults": _plan_defaults(s, inputs=inputs),
        "stages": [
            {
                "name": STAGE,
                "seq_length": s.seq_length,
                "tokens": iters * s.tokens_per_iteration,
                "rope": {"base": ROTARY_BASE},
            }
        ],
    }
    return tomli_w.dumps(plan)


def _plan_defaults(s: TrainerBenchSettings, *, inputs: Path) -> dict[str, Any]:
    """The plan's [defaults]: parallelism, batch sizes, the LR schedule and the data."""
    return {
        "micro_batch_size": s.micro_batch_size,
        "global_batch_size": s.global_batch_size,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "context_parallel": 1,
        "sequence_parallel": False,
        "recompute": "none",
        "nodes": 1,
        "log_interval": 1,
        "save_interval": s.iterations,
        "lr": {"lr": 1e-4, "min_lr": 1e-5, "decay_style": "cosine", "warmup_iters": 0},
        "data": {"prefixes": [f"{inputs}/data/corpus_text_document"], "split": SPLIT},
    }


def _child_env(checkout: Path, threads: int) -> dict[str, str]:
    """Both backends on the CPU (no GPU visible, Megatron-LM through its CPU runner), no progress bars."""
    env = dict(os.environ)
    env.pop("LONGCTX_RUN_DIR", None)  # the run directory is passed explicitly
    env.update(
        {
            MEGATRON_ENV: str(checkout),
            "LONGCTX_MEGATRON_CPU": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "LONGCTX_NO_PROGRESS": "1",
            "OMP_NUM_THREADS": str(threads),
        }
    )
    return env


def build_base(rp: ResolvedPlan, root: Path, env: dict[str, str]) -> Path:
    """The base checkpoint: one iteration of the local trainer (`python -m longctx.train`) from random
    weights at the stage's length, fp32, one process."""
    st = rp.stages[0]
    tok_dir = rp.tokenizer.path
    tok = load_tokenizer(tok_dir)
    save = root / "base" / "checkpoints"
    spec = {  # longctx.train.spec.TrainSpec, with its defaults where they serve
        "stage": "base",
        "arch": rp.arch.model_dump(),
        "seq_length": st.seq_length,
        "max_position_embeddings": st.max_position_embeddings,
        "rotary_base": rp.base.rotary_base,
        "padded_vocab_size": st.padded_vocab_size,
        "make_vocab_size_divisible_by": rp.make_vocab_size_divisible_by,
        "tokenizer": {
            "path": str(tok_dir),
            "md5": tok.md5,
            "vocab_size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "pad_id": tok.pad_id,
        },
        "data": [[None, str(p)] for p in (st.data.prefixes or ())] if st.data else [],
        "split": SPLIT,
        "data_cache_path": str(root / "base" / "cache"),
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "train_iters": 1,
        "lr": {"lr": 1e-4, "min_lr": 1e-5, "decay_iters": 1},
        "bf16": False,
        "save": str(save),
        "save_interval": 1,
        "threads_per_process": int(env["OMP_NUM_THREADS"]),
    }
    spec_path = root / "base" / "train_spec.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    log = root / "base" / "train.log"
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "longctx.train", "--spec", str(spec_path)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=LAUNCH_TIMEOUT_S,
            check=False,
        )
    if proc.returncode != 0 or not (save / "latest_checkpointed_iteration.txt").is_file():
        raise StageError(
            f"the bench's base checkpoint was not written (local trainer exit {proc.returncode}):\n"
            + _tail(log),
            where=str(log),
            fix="run `python -m longctx.train --spec` on that spec by hand to see the failure",
        )
    return save


# -- the launches -----------------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(f"  {x}" for x in text.splitlines()[-lines:])


def _stage_logs(rp: ResolvedPlan) -> list[Path]:
    return sorted((rp.stage(STAGE).stage_dir / "logs").glob("*.log"))


def _metrics_file(rp: ResolvedPlan) -> Path:
    return rp.stage(STAGE).stage_dir / "metrics.jsonl"


def local_tokens_per_s(metrics: Path) -> list[float]:
    """Tokens/s of each iteration, in order, from the local trainer's metrics file."""
    if not metrics.is_file():
        return []
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [float(r["tokens_per_s"]) for r in sorted(rows, key=lambda r: r["iteration"])]


def megatron_tokens_per_s(log_text: str, tokens_per_iteration: int) -> list[float]:
    """Tokens/s of each iteration, in order, from Megatron-LM's `elapsed time per iteration (ms)`."""
    by_iter: dict[int, float] = {}
    for m in _MEGATRON_ITER.finditer(log_text):
        ms = float(m.group(2))
        if ms > 0:
            by_iter[int(m.group(1))] = tokens_per_iteration / (ms / 1000.0)
    return [by_iter[i] for i in sorted(by_iter)]


def _iterations_so_far(backend: Backend, rp: ResolvedPlan, tokens_per_iteration: int) -> int:
    if backend == "local":
        metrics = _metrics_file(rp)
        if not metrics.is_file():
            return 0
        return sum(1 for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip())
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in _stage_logs(rp))
    return len(megatron_tokens_per_s(text, tokens_per_iteration))


def stage_run_command(plan: Path, run_dir: Path, backend: Backend) -> list[str]:
    """`longctx stage run` as a user types it; no evaluation (local) and no preflight (megatron-lm: the
    plan's "local" cluster profile has no TransformerEngine, which the GPU argv's rope fusion needs)."""
    extra = ["--no-eval"] if backend == "local" else ["--no-preflight"]
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
        backend,
        *extra,
    ]


def run_backend(
    backend: Backend,
    s: TrainerBenchSettings,
    plan: Path,
    run_dir: Path,
    env: dict[str, str],
    *,
    advance: Advance | None = None,
) -> BackendRun:
    """One `longctx stage run` of the bench stage on `backend`; its per-iteration tokens/s."""
    rp = open_plan(plan, run_dir)
    cmd = stage_run_command(plan, run_dir, backend)
    out_path = run_dir.parent / f"stage-run-{backend}.out"
    run_dir.mkdir(parents=True, exist_ok=True)
    shown = 0
    t0 = time.monotonic()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > LAUNCH_TIMEOUT_S:
                    proc.kill()
                    break
                time.sleep(0.5)
                if advance is not None:
                    done = min(s.iterations, _iterations_so_far(backend, rp, s.tokens_per_iteration))
                    if done > shown:
                        advance(done - shown)
                        shown = done
        finally:
            if proc.poll() is None:
                proc.kill()
            code = proc.wait()
    seconds = time.monotonic() - t0
    if advance is not None and shown < s.iterations:
        advance(s.iterations - shown)
    logs = _stage_logs(rp)
    log = logs[-1] if logs else out_path
    if backend == "local":
        per_iter = local_tokens_per_s(_metrics_file(rp))
    else:
        per_iter = megatron_tokens_per_s(
            log.read_text(encoding="utf-8", errors="replace"), s.tokens_per_iteration
        )
    if code != 0 or len(per_iter) < s.iterations:
        raise StageError(
            f"`longctx stage run --backend {backend}` exited {code} after {len(per_iter)} of {s.iterations} "
            f"timed iterations:\n" + _tail(log),
            where=str(log),
            fix=f"read the launch log (and {out_path}); rerun with --work-dir DIR to keep the run directory",
        )
    measured = per_iter[s.warmup : s.iterations]
    return BackendRun(
        backend=backend,
        tokens_per_s=statistics.median(measured),
        tokens_per_iteration=s.tokens_per_iteration,
        iteration_tokens_per_s=per_iter,
        measured_iterations=len(measured),
        launch_seconds=seconds,
        command=cmd,
        log=str(log),
    )


# -- the machine and what differs ---------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(s: TrainerBenchSettings) -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": affinity,
        "processes": s.processes,
        "torch_threads_per_process": s.threads_per_process,
        "python": platform.python_version(),
        "torch": _version("torch"),
        "megatron_core": _version("megatron-core"),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def differences(s: TrainerBenchSettings) -> list[str]:
    """What the two launches do differently although the plan is the same (unavoidable on this machine)."""
    precision = (
        "precision: both bf16 weights and compute with fp32 gradients and fp32 master params; Megatron-LM "
        "in its distributed optimizer (--bf16 --accumulate-allreduce-grads-in-fp32), the local backend "
        "through torch AdamW on the masters after one fp32 all-reduce"
        if s.local_bf16
        else "precision: Megatron-LM bf16 (its argv always has --bf16), the local backend fp32 (its CPU "
        "default)"
    )
    return [
        "Megatron-LM runs on the CPU under longctx's shims (python -m longctx.mcore.run_megatron_lm: a pretend "
        "CUDA device, CPU-backed RNG) with the CPU flags: gloo, --transformer-impl local, no fused kernels",
        "attention: Megatron-LM's local DotProductAttention (s × s scores) vs longctx's core attention "
        '(the local backend\'s default, attention = "longctx")',
        "optimizer: Megatron-LM's distributed optimizer (reduce-scatter of grads, all-gather of params over "
        "gloo) vs torch AdamW on every rank after one flat all-reduce",
        precision,
        "timing: Megatron-LM's interval timer between log lines (barrier on every rank), the local trainer's "
        "time between steps on rank 0",
    ]


# -- the bench ----------------------------------------------------------------------------------------------


def progress_total(s: TrainerBenchSettings) -> int:
    """The units `run_trainer_bench` advances: the inputs, then every iteration of each backend."""
    return INPUT_UNITS + 2 * s.iterations


def run_trainer_bench(
    s: TrainerBenchSettings,
    *,
    megatron_lm: str | os.PathLike[str] | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    advance: Advance | None = None,
) -> TrainerBenchResult:
    """Build the inputs, run the stage on the local backend and on Megatron-LM, compare tokens/s.

    `work_dir` keeps everything there (it must be empty or absent); without it a temp dir is removed
    afterwards. `advance(n)` is called as inputs are built and iterations complete."""
    s.validate()
    checkout = megatron_lm_checkout(megatron_lm)
    keep = work_dir is not None
    root = Path(work_dir).resolve() if keep else Path(tempfile.mkdtemp(prefix="longctx-bench-trainer-"))
    if keep and root.exists() and any(root.iterdir()):
        raise StageError(
            f"work dir {root} is not empty", where=str(root), fix="give an empty or new directory"
        )
    root.mkdir(parents=True, exist_ok=True)
    step = advance or (lambda _n: None)
    ok = False
    try:
        env = _child_env(checkout, s.threads_per_process)
        inputs = root / "inputs"
        build_data(inputs)
        step(1)
        plan = root / "plan.toml"
        plan.write_text(plan_text(s, inputs=inputs, run_dir=root / "run-local"), encoding="utf-8")
        build_base(open_plan(plan), inputs, env)
        step(1)
        local = run_backend("local", s, plan, root / "run-local", env, advance=advance)
        mlm = run_backend("megatron-lm", s, plan, root / "run-megatron-lm", env, advance=advance)
        ok = True
    finally:
        # a failed run keeps its logs (the error names them)
        if ok and not keep:
            shutil.rmtree(root, ignore_errors=True)
            local.log = mlm.log = None
    return TrainerBenchResult(
        settings=s.to_json(),
        local=local,
        megatron_lm=mlm,
        ratio=local.tokens_per_s / mlm.tokens_per_s,
        machine=machine(s),
        differences=differences(s),
        megatron_lm_checkout=str(checkout),
        work_dir=str(root) if keep else None,
    )


__all__ = [
    "TARGET_RATIO",
    "BackendRun",
    "TrainerBenchResult",
    "TrainerBenchSettings",
    "megatron_lm_checkout",
    "run_trainer_bench",
]
