"""A diffusion model initialised from an autoregressive one (AR → MDM or UDM adaptation), or a uniform-state
model from a masked-diffusion one (MDM → UDM).

Masked diffusion learns in-context copying far more slowly than next-token prediction: a 3-layer demo
MDM trained from random weights on the demo corpus still got 10 % of restated digits right (chance)
after 28.7M tokens, where the autoregressive base retrieves whole keys after about 4M; adapted from that
base, the MDM copies 99.5 % of them after 2M. Diffusion LMs of every size are therefore
often adapted from an autoregressive checkpoint instead (DiffuLLaMA, Dream): the same transformer, its
weights kept, the attention made bidirectional and the objective switched. The circuits a copying model
needs — a head that moves each token's predecessor into its position, and a head that matches it
elsewhere — are already there; the diffusion training re-points them at the masked position.

The weights are copied by name. The vocabulary rows are the only shapes that differ: the autoregressive
model's padded rows (Megatron pads its vocabulary) are cut to the diffusion model's unpadded ones, and
a masked-diffusion model's [MASK] row, which no autoregressive model has, starts as the mean of the
token rows (a uniform-state model has none: its noise is the vocabulary's own tokens).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from longctx.arch import ModelArch
from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.errors import CheckpointError
from longctx.eval.load import checkpoint_info, load_model
from longctx.mcore.checkpoint import save_checkpoint
from longctx.mcore.model import ModelSettings, build_gpt_model
from longctx.mcore.parallel import eval_parallel

_EMBEDDING = "embedding.word_embeddings.weight"
_OUTPUT = "output_layer.weight"


def _rows(src: torch.Tensor, rows: int, *, mask_row: bool) -> torch.Tensor:
    """The first `rows` rows of `src` (its token ids), the last one the mean of the others when it is the
    [MASK] row."""
    tokens = rows - 1 if mask_row else rows
    if src.shape[0] < tokens:
        raise CheckpointError(f"the source model has {src.shape[0]} vocabulary rows, fewer than {tokens}")
    out = src[:tokens].clone()
    return torch.cat([out, out.mean(0, keepdim=True)]) if mask_row else out


def adapt_to_diffusion(
    source: Path,
    out: Path,
    *,
    kind: str = "mdm",
    arch: ModelArch,
    seq_length: int,
    input_rows: int,
    output_rows: int,
) -> int:
    """Write `out` (a save dir: tracker + iter_N, N = the source's iteration): the model of `source` (AR,
    or MDM for a UDM) as a bidirectional diffusion model of `kind` with `input_rows` (tokens, + [MASK]
    for "mdm") and `output_rows` (tokens) vocabulary rows. Returns N."""
    if kind not in ("mdm", "udm"):
        raise CheckpointError(f"no adaptation to a {kind!r} model", fix='adapt to "mdm" or "udm"')
    info = checkpoint_info(source)
    # a uniform-state model may also start from a masked-diffusion one: bidirectional already, its
    # [MASK] row (the last input row) dropped with the rest of the rows past `input_rows`
    sources = ("ar", "mdm") if kind == "udm" else ("ar",)
    if info.objective not in sources:
        raise CheckpointError(
            f"{source} holds a {info.objective} model, which a {kind} model cannot start from",
            where=str(source),
            fix=f"start from a {' or '.join(sources)} checkpoint",
        )
    if info.arch != arch:
        raise CheckpointError(
            f"the source model's shape is not the diffusion recipe's: {info.arch} vs {arch}",
            where=str(source),
        )
    args = argparse.Namespace(**inspect_checkpoint(source).args)
    args.padded_vocab_size, args.longctx_objective = input_rows, kind
    with eval_parallel(1) as par:
        src = load_model(info, par, max_length=seq_length).model.state_dict()
        settings = ModelSettings(
            seq_length=seq_length,
            rotary_base=info.rotary_base,
            padded_vocab_size=input_rows,
            causal=False,
            output_vocab_size=output_rows,
        )
        with torch.random.fork_rng(devices=[]):
            model = build_gpt_model(arch, settings)
        state = model.state_dict()
        for key, value in state.items():
            if key.endswith("_extra_state"):
                continue
            if key == _EMBEDDING:
                value.copy_(_rows(src[key], input_rows, mask_row=kind == "mdm"))
            elif key == _OUTPUT:
                value.copy_(_rows(src[key], output_rows, mask_row=False))
            else:
                value.copy_(src[key])
        iteration = info.iteration or 0
        save_checkpoint(out, iteration, model=model, args=args)
    return iteration


__all__ = ["adapt_to_diffusion"]
