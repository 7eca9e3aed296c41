"""`python -m longctx.mcore.run_megatron_lm /path/to/pretrain_gpt.py ARGS…`: a Megatron-LM script as __main__.

It runs the script the way `python pretrain_gpt.py ARGS…` would (its directory first on sys.path, so
the checkout's `megatron/training` joins the megatron-core wheel's `megatron/core` in the `megatron`
namespace package; `sys.argv` = [script, ARGS…]), after the CPU shims of
`longctx.mcore.megatron_lm_cpu` when this machine has no CUDA. With CUDA nothing is patched.
The stage launcher (`longctx stage run --backend megatron-lm`) uses it only on machines without CUDA,
and adds the CPU flags (`longctx.stage.megatron_args.cpu_flags`) to the stage's argv.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

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

    # imported only now: the shims import the checkout's megatron.training, found through sys.path above
    from longctx.mcore.megatron_lm_cpu import apply_shims

    shims = apply_shims()
    if shims:
        print(f"[longctx] no CUDA: Megatron-LM runs on the CPU with shims: {', '.join(shims)}", flush=True)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
