"""`longctx bench tokenize`: `data tokenize` against Megatron-LM's own `tools/preprocess_data.py`.

Both tokenize the same JSONL with the same tokenizer, tokenizer type and options and the same number
of worker processes; the figure of each is tokens written per second of its fastest of `repeats` runs
(other jobs on the machine slow single runs unevenly), and tokens per CPU-second (user + system time
of the process and all its workers), which other jobs on the machine disturb much less. Module imports
(torch, megatron-core, Megatron-LM's training package, transformers) are outside both clocks;
everything else is inside: building the tokenizer in the main process and in every worker, starting
the workers, reading, encoding and writing the .bin/.idx. Megatron-LM runs in a child process through
longctx's CPU shims (`longctx.mcore.megatron_lm_cpu`, as `stage run` runs it without CUDA), timed
around `runpy` of the script after its imports are warm; longctx runs in this process. The run also
compares the two outputs byte for byte. Nothing is asserted about speed; the target is ratio ≥ 1.0.

The same child runs any list of preprocess_data.py invocations (`run_preprocess_data`): one start-up
for many runs, which is how the tests compare longctx with Megatron-LM on many cases.

`python -m longctx.bench.tokenize CHECKOUT JOBS.json` is that child: JOBS.json is a list of argv lists;
it prints one JSON list of [wall seconds, CPU seconds] per run.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from longctx.bench.trainer import megatron_lm_checkout
from longctx.data.indexed import read_index
from longctx.data.tokenize import megatron_preprocess_flags, tokenize_jsonl
from longctx.errors import StageError
from longctx.tokenizer import (
    EncodingSpec,
    LoadedTokenizer,
    load_tokenizer,
    synthetic_corpus,
    train_sentencepiece,
)
from longctx.util.machine import cpu_model

TARGET_RATIO = 1.0
SCRIPT = Path("tools") / "preprocess_data.py"
# modules preprocess_data.py imports, imported before the clock starts
_WARM = (
    "torch",
    "numpy",
    "megatron.core.datasets.indexed_dataset",
    "megatron.core.tokenizers",
    "megatron.core.tokenizers.text.utils.build_tokenizer",
    "megatron.training.tokenizer",
    "megatron.training.arguments",
    "transformers",
    "sentencepiece",
    "tokenizers",
)


def megatron_outputs(prefix: str | os.PathLike[str], json_key: str = "text") -> tuple[Path, Path]:
    """The .bin and .idx preprocess_data.py writes for `--output-prefix prefix` (document level)."""
    base = f"{os.fspath(prefix)}_{json_key}_document"
    return Path(base + ".bin"), Path(base + ".idx")


def preprocess_argv(
    tokenizer: Any,
    input_path: str | os.PathLike[str],
    output_prefix: str | os.PathLike[str],
    *,
    workers: int = 1,
    json_key: str = "text",
    append_eod: bool = True,
) -> list[str]:
    """preprocess_data.py's argv that encodes `input_path` as `tokenizer` (a LoadedTokenizer) does."""
    return [
        "--input",
        os.fspath(input_path),
        "--output-prefix",
        os.fspath(output_prefix),
        "--workers",
        str(workers),
        "--log-interval",
        "1000000000",
        *megatron_preprocess_flags(tokenizer, json_key=json_key, append_eod=append_eod),
    ]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"  # a tokenizer directory never needs the network
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process on both sides
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_preprocess_data(
    checkout: str | os.PathLike[str], jobs: list[list[str]], *, timeout: float = 900.0
) -> list[tuple[float, float]]:
    """Run `tools/preprocess_data.py` of `checkout` once per argv in `jobs`, in one child process;
    (wall seconds, CPU seconds of the script's processes) of each run. A run that writes no output (the
    script exits 0 when its worker fails) raises `StageError` with the end of the child's output."""
    root = Path(checkout).resolve()
    with tempfile.TemporaryDirectory(prefix="longctx-preprocess-") as tmp:
        jobs_file = Path(tmp) / "jobs.json"
        jobs_file.write_text(json.dumps(jobs), encoding="utf-8")
        cmd = [sys.executable, "-m", "longctx.bench.tokenize", str(root), str(jobs_file)]
        proc = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=timeout)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    if proc.returncode != 0:
        raise StageError(
            f"Megatron-LM's preprocess_data.py failed (exit {proc.returncode}):\n{tail}",
            where=str(root / SCRIPT),
        )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        seconds = json.loads(last)
    except json.JSONDecodeError:
        raise StageError(
            f"preprocess_data.py child printed no result:\n{tail}", where=str(root / SCRIPT)
        ) from None
    for argv in jobs:
        prefix = argv[argv.index("--output-prefix") + 1]
        key = argv[argv.index("--json-keys") + 1] if "--json-keys" in argv else "text"
        if not all(p.is_file() for p in megatron_outputs(prefix, key)):
            raise StageError(
                f"preprocess_data.py wrote no {megatron_outputs(prefix, key)[1].name} for {' '.join(argv)}:\n{tail}",
                where=str(root / SCRIPT),
            )
    return [(float(wall), float(cpu)) for wall, cpu in seconds]


def cpu_seconds() -> float:
    """User + system CPU time of this process and of its children that have been waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _child(argv: list[str]) -> None:
    """Run preprocess_data.py for every argv list in a JOBS file, after warm imports; print seconds."""
    import importlib
    import runpy
    import warnings

    checkout, jobs_file = Path(argv[0]), Path(argv[1])
    sys.path.insert(0, str(checkout))  # the checkout's megatron/training joins the wheel's megatron/core
    warnings.simplefilter("ignore")
    from longctx.mcore.megatron_lm_cpu import apply_shims

    apply_shims()  # on a machine without CUDA, as `stage run` runs Megatron-LM; nothing with CUDA
    for name in _WARM:
        importlib.import_module(name)
    script = str(checkout / SCRIPT)
    seconds: list[tuple[float, float]] = []
    for job in json.loads(jobs_file.read_text(encoding="utf-8")):
        sys.argv = [script, *job]
        t0, c0 = time.perf_counter(), cpu_seconds()
        runpy.run_path(script, run_name="__main__")
        seconds.append((time.perf_counter() - t0, cpu_seconds() - c0))
    sys.stdout.flush()
    print(json.dumps(seconds), flush=True)


# -- the benchmark --------------------------------------------------------------------------------------
@dataclasses.dataclass
class TokenizeBenchResult:
    tokenizer: str
    encoding: str
    input: str
    input_bytes: int
    documents: int
    tokens: int
    workers: int
    repeats: int
    longctx_seconds: float  # the fastest run
    megatron_seconds: float
    longctx_runs: list[float]
    megatron_runs: list[float]
    longctx_cpu_seconds: float  # the least CPU time of a run
    megatron_cpu_seconds: float
    identical: bool
    megatron_lm_checkout: str
    machine: dict[str, Any]
    target_ratio: float = TARGET_RATIO

    @property
    def longctx_tokens_per_s(self) -> float:
        return self.tokens / self.longctx_seconds

    @property
    def megatron_tokens_per_s(self) -> float:
        return self.tokens / self.megatron_seconds

    @property
    def ratio(self) -> float:
        return self.megatron_seconds / self.longctx_seconds

    @property
    def cpu_ratio(self) -> float:
        """Tokens per CPU-second, longctx over Megatron-LM."""
        return self.megatron_cpu_seconds / self.longctx_cpu_seconds

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            longctx_tokens_per_s=self.longctx_tokens_per_s,
            megatron_tokens_per_s=self.megatron_tokens_per_s,
            ratio=self.ratio,
            longctx_tokens_per_cpu_s=self.tokens / self.longctx_cpu_seconds,
            megatron_tokens_per_cpu_s=self.tokens / self.megatron_cpu_seconds,
            cpu_ratio=self.cpu_ratio,
        )
        return out


def write_corpus(path: Path, documents: int, *, seed: int = 1) -> Path:
    """Synthetic multilingual documents of 20–400 lines, one JSON object per line."""
    lines = synthetic_corpus(4000, seed=seed)
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(documents):
            text = "\n".join(rng.choice(lines) for _ in range(rng.randint(20, 400)))
            fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _machine() -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": affinity,
        "python": platform.python_version(),
        "transformers": _version("transformers"),
        "sentencepiece": _version("sentencepiece"),
        "tokenizers": _version("tokenizers"),
        "megatron_core": _version("megatron-core"),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def _same_bytes(a: tuple[Path, Path], b: tuple[Path, Path]) -> bool:
    return all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))


def run_tokenize_bench(
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    input_path: str | os.PathLike[str] | None = None,
    spec: EncodingSpec | None = None,
    documents: int = 400,
    workers: int = 2,
    repeats: int = 2,
    json_key: str = "text",
    megatron_lm: str | os.PathLike[str] | None = None,
    work_dir: str | os.PathLike[str] | None = None,
) -> TokenizeBenchResult:
    """Tokenize one JSONL with longctx and with preprocess_data.py (see the module docstring).

    Without `tokenizer`, a demo-style one is trained (SentencePiece, OpenEuroLLM layout, HF directory
    with a LlamaTokenizer config); without `input_path`, `documents` synthetic documents are written.
    """
    checkout = _checkout_with_script(megatron_lm)
    root = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="longctx-bench-tok-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        tok_path = Path(tokenizer) if tokenizer is not None else root / "tokenizer"
        if tokenizer is None and not (tok_path / "tokenizer.model").is_file():
            train_sentencepiece(synthetic_corpus(2000, seed=0), tok_path, 512, hf=True)
        src = Path(input_path) if input_path is not None else write_corpus(root / "corpus.jsonl", documents)
        tok = load_tokenizer(tok_path, spec=spec)
        src.read_bytes()  # both read it from the page cache
        mega_prefix = root / "megatron" / "out"
        mega_prefix.parent.mkdir(parents=True, exist_ok=True)
        argv = preprocess_argv(tok, src, mega_prefix, workers=workers, json_key=json_key)
        megatron = run_preprocess_data(checkout, [argv] * repeats)
        ours = root / "longctx" / "out"
        longctx, tokens = _time_longctx(
            tok, tok_path, src, ours, json_key=json_key, workers=workers, repeats=repeats
        )
        info = read_index(ours)
        identical = _same_bytes(
            (Path(f"{ours}.bin"), Path(f"{ours}.idx")), megatron_outputs(mega_prefix, json_key)
        )
        return TokenizeBenchResult(
            tokenizer=str(tok_path),
            encoding=tok.encoding_fingerprint().describe(),
            input=str(src),
            input_bytes=src.stat().st_size,
            documents=info.documents,
            tokens=tokens,
            workers=workers,
            repeats=repeats,
            longctx_seconds=min(w for w, _ in longctx),
            megatron_seconds=min(w for w, _ in megatron),
            longctx_runs=[w for w, _ in longctx],
            megatron_runs=[w for w, _ in megatron],
            longctx_cpu_seconds=min(c for _, c in longctx),
            megatron_cpu_seconds=min(c for _, c in megatron),
            identical=identical,
            megatron_lm_checkout=str(checkout),
            machine=_machine(),
        )
    finally:
        if work_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _checkout_with_script(megatron_lm: str | os.PathLike[str] | None) -> Path:
    """The Megatron-LM checkout, refused unless it holds preprocess_data.py."""
    checkout = megatron_lm_checkout(megatron_lm)
    if not (checkout / SCRIPT).is_file():
        raise StageError(
            f"{checkout} has no {SCRIPT}",
            where=str(checkout),
            fix="point --megatron-lm or $LONGCTX_MEGATRON_LM at a full Megatron-LM checkout",
        )
    return checkout


def _time_longctx(
    tok: LoadedTokenizer, tok_path: Path, src: Path, ours: Path, *, json_key: str, workers: int, repeats: int
) -> tuple[list[tuple[float, float]], int]:
    """(wall, CPU) seconds of each of `repeats` longctx runs in this process, and the tokens written."""
    # imports warm as the child's were
    import transformers  # noqa: F401
    from megatron.core.datasets import indexed_dataset  # noqa: F401

    runs: list[tuple[float, float]] = []
    tokens = 0
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), cpu_seconds()
        sidecar = tokenize_jsonl(
            [src],
            tok_path,
            ours,
            json_key=json_key,
            workers=workers,
            spec=tok.spec,
            force=True,
            progress=False,
        )
        runs.append((time.perf_counter() - t0, cpu_seconds() - c0))
        tokens = sidecar.tokens
    return runs, tokens


if __name__ == "__main__":
    _child(sys.argv[1:])
