"""Worker: load a local-backend checkpoint into a fresh megatron-core GPTModel at TP = world size
and write the loss of a fixed batch (rank 0). Run under LocalLauncher with 1 or 2 processes."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main(ckpt: str, out: str) -> None:
    from megatron.core import parallel_state as ps

    from longctx.arch import ModelArch
    from longctx.checkpoint import inspect_checkpoint
    from longctx.mcore.checkpoint import load_model_weights
    from longctx.mcore.cpu import apply_cpu_compat, seed_model_parallel_rng
    from longctx.mcore.model import ModelSettings, build_gpt_model

    apply_cpu_compat()
    dist.init_process_group("gloo")
    tp = dist.get_world_size()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    seed_model_parallel_rng(99)  # different init: only the checkpoint can make the losses agree
    rep = inspect_checkpoint(ckpt)
    a = rep.args
    arch = ModelArch(**{k: a[k] for k in ModelArch.model_fields if k in a and a[k] is not None})
    model = build_gpt_model(
        arch,
        ModelSettings(
            seq_length=a["seq_length"],
            rotary_base=a["rotary_base"],
            padded_vocab_size=a["padded_vocab_size"],
            tensor_model_parallel_size=tp,
        ),
    )
    load_model_weights(model, rep.resolved.path)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, 300, (2, 64), generator=g)
    pos = torch.arange(64).expand(2, 64)
    with torch.no_grad():
        loss = model(tokens, pos, None, labels=tokens.roll(-1, 1)).float().mean().item()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"loss": loss, "tp": tp}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
