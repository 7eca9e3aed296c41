"""Running exported models in transformers, as the benchmarks and vLLM users will."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from longctx.eval.score import ScoreFn, TokenScores, scores_from_logits


def load(directory: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=tokens.long()).logits.float()


def relative_difference(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got − ref| over the largest |ref|: scale-free, and defined where logits cross zero."""
    return float((got - ref).abs().max() / ref.abs().max())


def greedy(model: Any, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' own greedy generation (KV cache), never stopping early at EOS."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        do_sample=False, max_new_tokens=new_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=0
    )
    with torch.inference_mode():
        return model.generate(prompt.long(), generation_config=cfg)


def scorer(model: Any) -> ScoreFn:
    """longctx's ScoreFn contract (position t predicts token t + 1) on a transformers model."""

    def score(tokens: torch.Tensor) -> TokenScores:
        tokens = tokens.long()
        lp, am, mg = scores_from_logits(logits(model, tokens), torch.roll(tokens, -1, dims=1))
        return TokenScores(
            logprob=lp[:, :-1].double().numpy(),
            argmax=am[:, :-1].numpy().astype(np.int64),
            margin=mg[:, :-1].double().numpy(),
        )

    return score
