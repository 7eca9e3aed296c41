"""A tiny end-to-end run of the local trainer on this machine's device, with a save and a resume.

The paths a GPU breaks first that the smoke test does not reach: the dataset build and its barrier,
a save of device tensors, a resume restoring device RNG states and (in bf16, the GPU default) the
fp32 masters. Two launches of one stage through the
launcher the stage runner uses: the first stops at the exit interval (after its save), the second
resumes there and finishes; the loss must fall.

    python -m longctx.bench.device_run --work DIR [--device cuda|cpu] [--iterations N]

Prints one JSON document (`ok`, `checks`: one row per launch and the loss check, `losses`) and exits
1 when a check fails, 2 when the inputs cannot be built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from longctx.arch import ModelArch
from longctx.bench.trainer import build_data
from longctx.checkpoint.save_layout import read_tracker
from longctx.errors import LongctxError
from longctx.launch.local import LocalLauncher
from longctx.tokenizer import load_tokenizer, padded_vocab_size
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec

ARCH = ModelArch(
    num_layers=2,
    hidden_size=128,
    ffn_hidden_size=256,
    num_attention_heads=8,
    num_query_groups=2,
    kv_channels=16,
    qk_layernorm=True,
)
SEQ = 256


def run_spec(work: Path, iterations: int) -> TrainSpec:
    tok_dir, prefix = build_data(work / "inputs")
    tok = load_tokenizer(tok_dir)
    half = iterations // 2
    return TrainSpec(
        stage="device-run",
        arch=ARCH,
        seq_length=SEQ,
        max_position_embeddings=SEQ,
        rotary_base=10000,
        padded_vocab_size=padded_vocab_size(tok.vocab_size, 128, 1),
        tokenizer=TokenizerInfo(
            path=str(tok_dir), md5=tok.md5, vocab_size=tok.vocab_size, eod_id=tok.eod_id, pad_id=tok.pad_id
        ),
        data=[(None, str(prefix))],
        split="100,0,0",
        data_cache_path=str(work / "cache"),
        global_batch_size=8,
        micro_batch_size=2,
        train_iters=iterations,
        lr=LRSchedule(lr=3e-3, min_lr=3e-4, warmup_iters=1, decay_iters=iterations),
        save=str(work / "ckpt"),
        save_interval=half,
        exit_interval=half,
        log_interval=1,
        threads_per_process=2,
        metrics_file=str(work / "metrics.jsonl"),
    )


def _launch(spec_path: Path, env: dict[str, str], log: Path) -> tuple[int, float]:
    t0 = time.monotonic()
    rc = LocalLauncher(echo=False, grace_s=10).run(
        [sys.executable, "-m", "longctx.train", "--spec", str(spec_path)], nproc=1, env=env, log=log
    )
    return rc, time.monotonic() - t0


def _row(name: str, ok: bool, detail: str, seconds: float = 0.0) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, "seconds": round(seconds, 2)}


def run(work: Path, device: str, iterations: int) -> dict[str, Any]:
    spec = run_spec(work, iterations)
    spec_path = work / "spec.json"
    spec.dump(spec_path)
    env = {"OMP_NUM_THREADS": "2", **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    half = iterations // 2
    rows = []
    for name, want in (
        (f"first launch: stop at {half} after a save", half),
        (f"resume {half} → {iterations}", iterations),
    ):
        log = work / f"launch{len(rows)}.log"
        rc, secs = _launch(spec_path, env, log)
        tracker = read_tracker(Path(spec.save))
        got = tracker.iteration if tracker else None
        text = log.read_text(errors="replace") if log.exists() else ""
        ok = rc == 0 and got == want and (len(rows) == 0 or f"resumed from {spec.save}" in text)
        rows.append(
            _row(name, ok, f"exit {rc}, saved iteration {got}" + ("" if ok else f"\n{text[-1500:]}"), secs)
        )
        if not ok:
            break
    losses = _losses(Path(spec.metrics_file or ""))
    if len(losses) == iterations:
        first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        rows.append(
            _row("loss falls", last < first - 0.05, f"mean of the first 3 {first:.3f} → last 3 {last:.3f}")
        )
    else:
        rows.append(_row("loss falls", False, f"{len(losses)} of {iterations} iterations logged"))
    return {"device": device, "ok": all(r["ok"] for r in rows), "checks": rows, "losses": losses}


def _losses(metrics: Path) -> list[float]:
    if not metrics.is_file():
        return []
    return [float(json.loads(line)["loss"]) for line in metrics.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longctx.bench.device_run", description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, required=True, help="an empty or new directory for the run")
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--iterations", type=int, default=12, help="even, ≥ 6 (the resume is at half)")
    ns = p.parse_args(argv)
    if ns.iterations < 6 or ns.iterations % 2 or (ns.work.exists() and any(ns.work.iterdir())):
        print(
            json.dumps(
                {
                    "ok": False,
                    "error": "--iterations must be even and ≥ 6, and --work new or empty",
                    "fix": "pass a new directory and e.g. --iterations 12",
                }
            )
        )
        return 2
    ns.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LONGCTX_NO_PROGRESS", "1")
    try:
        report = run(ns.work, ns.device, ns.iterations)
    except LongctxError as err:
        print(json.dumps({"ok": False, "error": str(err)}))
        return 2
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
