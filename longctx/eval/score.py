"""Per-token scores of a causal LM, and passkey scoring on top of them.

`ScoreFn` maps token ids `[b, S]` to `TokenScores` over the S − 1 predictions (position t predicts
token t + 1): the label's log-prob, the argmax token, and the margin of the label over the best
other token. `model_scorer(loaded)` is the megatron-core implementation (context-parallel: each CP
rank scores its zigzag shard and the per-token results are gathered back into sequence order);
tests plug in oracles with the same signature.

Passkey scoring (both methods from one set of forwards):

* greedy — the model's greedy continuation of the prompt is exactly the key. Computed from a single
  teacher-forced forward over prompt + key: greedy decoding reproduces the key if and only if the
  argmax at every answer position is the key's next token (by induction on the decoded prefix), so
  no token-by-token generation is needed;
* log-likelihood — the key's total log-prob is strictly higher than that of each of N distractor
  keys (same digit count and token count, one forward each). The margin log p(key) − max log
  p(distractor) is a graded signal even when greedy accuracy is 0.

Per item, the share of the key's digit tokens the model predicts right (teacher forced) and their
mean margin over the best other token are reported as well; they cost nothing extra. Tokens between
the digits (a lone space piece in some vocabularies) are left out of both: any model predicts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel

from longctx.attention.megatron_adapter import document_params, eod_document_bounds
from longctx.attention.zigzag import check_zigzag_len, zigzag_gather, zigzag_split
from longctx.eval.grid import PasskeyItem
from longctx.eval.load import LoadedModel

# logits → log-softmax in slices of this many positions (bounds float32 memory for large vocabularies)
_SLICE = 2048


@dataclasses.dataclass
class TokenScores:
    """Scores of the S − 1 next-token predictions of each sequence, `[b, S − 1]` arrays."""

    logprob: np.ndarray  # float64: log p(x[t+1] | x[..t])
    argmax: np.ndarray  # int64: the most likely token after x[..t]
    margin: np.ndarray  # float64: logprob − the best other token's log-prob (> 0 iff argmax is right)


ScoreFn = Callable[[torch.Tensor], TokenScores]


def scores_from_logits(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(label log-prob, argmax, margin) for logits `[b, s, V]` and labels `[b, s]`."""
    lp_out, am_out, mg_out = [], [], []
    for s0 in range(0, logits.shape[1], _SLICE):
        lg = logits[:, s0 : s0 + _SLICE].float().log_softmax(-1)
        lab = labels[:, s0 : s0 + _SLICE]
        lp = lg.gather(-1, lab.unsqueeze(-1)).squeeze(-1)
        top = lg.topk(2, dim=-1)
        am = top.indices[..., 0]
        other = torch.where(am == lab, top.values[..., 1], top.values[..., 0])
        lp_out.append(lp)
        am_out.append(am)
        mg_out.append(lp - other)
    return torch.cat(lp_out, 1), torch.cat(am_out, 1), torch.cat(mg_out, 1)


def model_scorer(loaded: LoadedModel, *, eod: int | None = None) -> ScoreFn:
    """A ScoreFn running `loaded.model`; every CP rank must call it with the same tokens, and every
    rank gets the full result.

    With `eod`, attention stays within documents: a document ends after each `eod` token, and the
    boundaries of the full sequences go to longctx's attention as packed_seq_params (the same on
    every CP rank). Position ids stay 0 … S − 1 either way, so the mask is the only difference."""
    par = loaded.parallel
    model = loaded.model

    def score(tokens: torch.Tensor) -> TokenScores:
        tokens = tokens.long()
        b, s = tokens.shape
        check_zigzag_len(s, par.cp)
        labels = torch.roll(tokens, -1, dims=1)  # the last column is dropped below
        positions = torch.arange(s).unsqueeze(0).expand(b, s)
        dev = par.device
        packed = None
        if eod is not None:
            packed = document_params(eod_document_bounds(tokens, eod).to(dev), s)
        if par.cp > 1:
            tokens, labels, positions = (
                zigzag_split(t, par.rank, par.cp, seq_dim=1).contiguous() for t in (tokens, labels, positions)
            )
        with torch.inference_mode():
            logits = model(tokens.to(dev), positions.to(dev), None, packed_seq_params=packed)
            lp, am, mg = scores_from_logits(logits, labels.to(dev))
            del logits
        parts = [lp.double(), am.double(), mg.double()]
        if par.cp > 1:
            gathered = []
            for t in parts:
                shards = [torch.empty_like(t) for _ in range(par.cp)]
                dist.all_gather(shards, t.contiguous(), group=par.group)
                gathered.append(zigzag_gather(shards, seq_dim=1))
            parts = gathered
        lp, am, mg = (t[:, :-1].cpu().numpy() for t in parts)
        return TokenScores(logprob=lp, argmax=am.astype(np.int64), margin=mg)

    return score


# -- passkey ---------------------------------------------------------------------------------------


class ItemScore(BaseModel):
    length: int
    depth: float
    index: int
    key: str
    needle_start: int
    greedy: bool  # greedy continuation == the key
    greedy_tokens: list[int]  # teacher-forced argmax at the answer positions
    digit_accuracy: float  # share of the key's digit tokens whose argmax is right (teacher forced)
    token_margin: float  # mean over the digit tokens of log p(true) − best other token
    logprob: float  # total log-prob of the key
    distractor_logprobs: list[float]
    loglik: bool | None  # key beats every distractor (None without distractors)
    loglik_margin: float | None  # log p(key) − max log p(distractor)


def score_item(item: PasskeyItem, scores: TokenScores) -> ItemScore:
    """Score one item from the TokenScores of its candidates (true key first, then distractors)."""
    a0, a1 = item.answer_start - 1, item.answer_end - 1  # predictions of the answer tokens
    hits = scores.argmax[0, a0:a1] == np.asarray(item.answer)
    digits = np.asarray(item.digit_mask, dtype=bool)  # spaces between digits are trivially right
    lp = scores.logprob[:, a0:a1].sum(axis=1)
    true_lp = float(lp[0])
    others = [float(x) for x in lp[1:]]
    best_other = max(others) if others else None
    return ItemScore(
        length=item.length,
        depth=item.depth,
        index=item.index,
        key=item.key,
        needle_start=item.needle_start,
        greedy=bool(hits.all()),
        greedy_tokens=[int(x) for x in scores.argmax[0, a0:a1]],
        digit_accuracy=float(hits[digits].mean()),
        token_margin=float(scores.margin[0, a0:a1][digits].mean()),
        logprob=true_lp,
        distractor_logprobs=others,
        loglik=None if best_other is None else bool(true_lp > best_other),
        loglik_margin=None if best_other is None else true_lp - best_other,
    )


def length_chunks(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices into `lengths`, grouped by equal length (first-seen order) and cut into batches of at
    most `batch_size`: sequences of one batch stack into one tensor."""
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    step = max(1, batch_size)
    for group in by_len.values():
        for k in range(0, len(group), step):
            yield group[k : k + step]


def score_passkey(
    items: Sequence[PasskeyItem],
    score: ScoreFn,
    *,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
) -> list[ItemScore]:
    """Score every item; candidate sequences of equal length are batched `batch_size` at a time."""
    flat: list[tuple[int, int, list[int]]] = [
        (i, c, seq) for i, it in enumerate(items) for c, seq in enumerate(it.candidates())
    ]
    per_item: dict[int, list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]] = {}
    for rows in length_chunks([len(seq) for _, _, seq in flat], batch_size):
        chunk = [flat[r] for r in rows]
        out = score(torch.tensor([seq for _, _, seq in chunk], dtype=torch.long))
        for row, (i, c, _) in enumerate(chunk):
            per_item.setdefault(i, []).append((c, out.logprob[row], out.argmax[row], out.margin[row]))
        if advance is not None:
            advance(len(chunk))
    results = []
    for i, it in enumerate(items):
        rows = sorted(per_item[i], key=lambda r: r[0])
        ts = TokenScores(
            logprob=np.stack([r[1] for r in rows]),
            argmax=np.stack([r[2] for r in rows]),
            margin=np.stack([r[3] for r in rows]),
        )
        results.append(score_item(it, ts))
    return results


def forwards_needed(items: Sequence[PasskeyItem]) -> int:
    return sum(1 + len(it.distractors) for it in items)
