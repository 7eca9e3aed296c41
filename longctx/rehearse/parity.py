"""The exported model against longctx's own at a stage's full length: the same tokens through the
Hugging Face export (transformers, SDPA attention) and through megatron-core with longctx's attention
(the model evaluation and training use), compared logit by logit."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict
from transformers import AutoModelForCausalLM

from longctx.eval.load import checkpoint_info, load_model
from longctx.mcore.parallel import eval_parallel

# fp32 on both sides: what tests/export measures for the same mapping at short lengths
PARITY_TOLERANCE = 1e-4


class Parity(BaseModel):
    """Logits of the export vs longctx's on one sequence of `length` tokens."""

    model_config = ConfigDict(extra="forbid")

    length: int
    relative_difference: float  # max |hf − longctx| / max |longctx|
    argmax_agreement: float  # share of positions whose most likely next token is the same
    tolerance: float = PARITY_TOLERANCE
    seconds_longctx: float
    seconds_hf: float

    @property
    def ok(self) -> bool:
        return self.relative_difference <= self.tolerance


def _tokens(length: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, length), generator=gen)


def _longctx_logits(save_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    length = tokens.shape[1]
    with eval_parallel(1) as par, torch.inference_mode():
        lm = load_model(checkpoint_info(save_dir), par, max_length=length, dtype=torch.float32)
        positions = torch.arange(length).unsqueeze(0)
        logits = lm.model(tokens, positions, None)
    return logits.float()


def _hf_logits(hf_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(
            str(hf_dir), dtype=torch.float32, attn_implementation="sdpa"
        )
    with torch.inference_mode():
        return model.eval()(input_ids=tokens).logits.float()


def export_parity(save_dir: Path, hf_dir: Path, *, length: int, vocab: int, seed: int = 0) -> Parity:
    """Both models on one sequence of `length` random token ids below `vocab`."""
    tokens = _tokens(length, vocab, seed)
    t0 = time.perf_counter()
    ref = _longctx_logits(save_dir, tokens)
    t1 = time.perf_counter()
    got = _hf_logits(hf_dir, tokens)
    t2 = time.perf_counter()
    n = min(ref.shape[-1], got.shape[-1], vocab)
    ref, got = ref[..., :n], got[..., :n]
    diff = float((got - ref).abs().max() / ref.abs().max())
    agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    return Parity(
        length=length,
        relative_difference=diff,
        argmax_agreement=agree,
        seconds_longctx=t1 - t0,
        seconds_hf=t2 - t1,
    )
