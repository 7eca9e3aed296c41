"""`python -m longctx.mcore.run_megatron_lm /path/to/pretrain_gpt.py ARGS…`: a Megatron-LM script as __main__.

It runs the script the way `python pretrain_gpt.py ARGS…` would (its directory first on sys.path, so
the checkout's `megatron/training` joins the megatron-core wheel's `megatron/core` in the `megatron`
namespace package; `sys.argv` = [script, ARGS…]), after the CPU shims of
`longctx.mcore.megatron_lm_cpu` when this machine has no CUDA. With CUDA nothing is patched.
The stage launcher (`longctx stage run --backend megatron-lm`) uses it on machines without CUDA, and adds
the CPU flags (`longctx.stage.megatron_args.cpu_flags`) to the stage's argv; and wherever a launch asks
for the stage's metrics ($LONGCTX_METRICS_FILE, `longctx rehearse`): then Megatron-LM's own loss, step
time, peak memory, built RoPE base and largest position go there (`longctx.mcore.megatron_lm_metrics`).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from pathlib import Path

import torch

from longctx.mcore.deferred_compile import compile_on_first_call

# set by `stage run` when a launch asks for the stage's metrics (longctx.stage.run.METRICS_FILE_ENV)
METRICS_ENV = "LONGCTX_METRICS_FILE"
STAGE_ENV = "LONGCTX_METRICS_STAGE"
USAGE = "usage: python -m longctx.mcore.run_megatron_lm PRETRAIN_SCRIPT.py [ARGS...]"


def main(argv: list[str] | None = None) -> None:
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or words[0] in ("-h", "--help") or not words[0].endswith(".py"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    script = Path(words[0]).resolve()
    if not script.is_file():
        print(f"no such script: {script}", file=sys.stderr)
        raise SystemExit(2)
    # `python -m` put the working directory first; `python script.py` would put the script's directory
    sys.path[0] = str(script.parent)
    sys.argv = [str(script), *words[1:]]

    # on the CPU, megatron's imports need not load TorchDynamo and Inductor for kernels a CPU run never
    # calls (seconds at every rank's start); with CUDA nothing is patched
    with contextlib.nullcontext() if torch.cuda.is_available() else compile_on_first_call():
        _run(script)


def _run(script: Path) -> None:
    # imported only now: the shims import the checkout's megatron.training, found through sys.path above
    from longctx.mcore.megatron_lm_cpu import apply_shims

    shims = apply_shims()
    if shims:
        print(f"[longctx] no CUDA: Megatron-LM runs on the CPU with shims: {', '.join(shims)}", flush=True)
    metrics = os.environ.get(METRICS_ENV)
    if metrics:
        # imported after the shims: it loads megatron-core's GPT model (and its dist_checkpointing)
        from longctx.mcore.megatron_lm_metrics import record_metrics

        record_metrics(Path(metrics), os.environ.get(STAGE_ENV) or Path(metrics).parent.name)
        print(f"[longctx] Megatron-LM's measurements of each iteration go to {metrics}", flush=True)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
