"""Write the committed interpreter samples: one tiny torch_dist checkpoint saved by megatron-core under the
interpreter that runs this script, into `samples/py<X.Y.Z>/save`.

Python's enum pickling differs between releases: early 3.11 releases (Debian 12's 3.11.2) pickle an enum
member as `getattr(EnumClass, "NAME")` and `signal.SIGTERM` as a module global; later ones as
`EnumClass(value)`. The fixtures the suite builds are pickled by whatever interpreter runs the suite, so
checkpoints written both ways are committed. Run from the repository root in an environment with
longctx and megatron-core installed:

    python -m tests.checkpoint.samples.make_samples
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = dict(
    arch=dict(
        num_layers=1,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=2,
        num_query_groups=None,
        kv_channels=16,
        qk_layernorm=False,
        swiglu=True,
        untie_embeddings_and_output_weights=False,
        normalization="RMSNorm",
    ),
    vocab=100,
    padded=128,
    iteration=3,
    optimizer=None,
    tp=1,
)


def main() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from longctx.mcore.checkpoint import save_checkpoint
    from longctx.mcore.cpu import apply_cpu_compat, seed_model_parallel_rng
    from tests.fixtures.checkpoint import _build_model, _megatron_args

    out = HERE / f"py{platform.python_version()}" / "save"
    shutil.rmtree(out.parent, ignore_errors=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    apply_cpu_compat()
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(tensor_model_parallel_size=1)
    seed_model_parallel_rng(1234)
    model = _build_model(SPEC, 1, bf16=False)
    args = _megatron_args("sample", SPEC, 1)
    save_checkpoint(out, SPEC["iteration"], model=model, args=args)
    (out.parent / "written_by.txt").write_text(f"Python {sys.version.split()[0]}\n")
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    print(out)


if __name__ == "__main__":
    main()
