"""Short-context regression: loss on short held-out documents, compared with the base model.

Extending the context must not cost the model what it could do at its pretraining length. The
documents are held-out documents cut to the base model's sequence length; each is scored on its
own (no packing), and the loss is the token-weighted mean over every prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from pydantic import BaseModel, Field

from longctx.errors import EvalError
from longctx.eval.score import ScoreFn


class ShortLoss(BaseModel):
    length: int  # documents are cut to this many tokens
    docs: int
    tokens: int
    loss: float
    # per document, in scoring order (the same for every checkpoint): summed NLL and predictions, so a
    # difference between two checkpoints gets an interval over documents
    doc_nll: list[float] = Field(default_factory=list)
    doc_tokens: list[int] = Field(default_factory=list)


def short_context_loss(
    score: ScoreFn,
    docs: Sequence[np.ndarray],
    *,
    length: int,
    batch_size: int = 8,
    cp: int = 1,
    advance: Callable[[int], None] | None = None,
) -> ShortLoss:
    """Token-weighted mean loss over `docs` (documents of equal length are batched together).

    Under context parallelism a document is cut to a multiple of 2·CP tokens so it splits evenly."""
    if not docs:
        raise EvalError("no held-out documents for the short-context loss")
    step = 2 * cp if cp > 1 else 1
    groups: dict[int, list[np.ndarray]] = {}
    for d in docs:
        n = (len(d) // step) * step
        if n >= 2:
            groups.setdefault(n, []).append(d[:n])
    doc_nll: list[float] = []
    doc_tokens: list[int] = []
    for group in groups.values():
        for k in range(0, len(group), max(1, batch_size)):
            batch = torch.tensor(np.stack(group[k : k + batch_size]), dtype=torch.long)
            out = score(batch)
            doc_nll += [float(x) for x in -out.logprob.sum(axis=1)]
            doc_tokens += [int(out.logprob.shape[1])] * out.logprob.shape[0]
            if advance is not None:
                advance(len(batch))
    count = sum(doc_tokens)
    if count == 0:
        raise EvalError("the short documents are too short to score")
    return ShortLoss(
        length=length,
        docs=len(doc_nll),
        tokens=count,
        loss=sum(doc_nll) / count,
        doc_nll=doc_nll,
        doc_tokens=doc_tokens,
    )
