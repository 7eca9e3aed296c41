"""Evaluation of diffusion models (bidirectional, no next-token order).

* **Passkey by infilling.** The passkey grid's items (needle at a depth, filler, the question that
  restates the key, closed as the needle's sentence is: the key is infilled inside the text, with
  context on both sides, not at the sequence's end) with only the key's digit tokens of the
  restatement corrupted: replaced by the [MASK] id (MDM) or by uniformly drawn tokens (UDM).
  Greedy: the key decoded most confident digit first (`longctx.eval.unmask`) is the key; the key's
  digit accuracy is read from that decoding. From the first forward (every digit corrupted): each
  digit's margin, and likelihood against the distractors (the key positions are predicted jointly
  from the same input, so log p(key) is the sum of the per-position log-probs).
* **ELBO by context.** The bound of a target window of `window` tokens at the middle of a held-out
  document, as a function of how many clean tokens `c` surround it (c/2 on each side; the rest of the
  document is cut away). The window is corrupted at fixed noise levels t with mask draws fixed per
  (document, level), so every checkpoint and every c see the same corruption and the curves compare
  directly. Reported per token (nats), averaged over the levels (a midpoint rule for ∫ dt) and per
  level: low-noise levels isolate how much the model reads from the context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from longctx.attention.zigzag import check_zigzag_len, zigzag_split
from longctx.diffusion.loss import udlm_token_loss
from longctx.diffusion.noise import alpha, alpha_rate, generator
from longctx.eval.grid import PasskeyItem
from longctx.eval.load import LoadedModel
from longctx.eval.results import ContextElbo
from longctx.eval.score import ItemScore, TokenScores, score_item
from longctx.eval.unmask import Infilled, InfillFn, corrupt, infill_batched
from longctx.objective import Objective, ObjectiveKind

_TAG_PASSKEY, _TAG_ELBO = "longctx-eval-passkey", "longctx-eval-elbo"


def model_infiller(loaded: LoadedModel, vocab_size: int) -> InfillFn:
    """An InfillFn running `loaded.model` (bidirectional). Under CP every rank gets the same inputs,
    runs its zigzag shard, and the rows of the positions asked for are summed across ranks (each is
    held by one). Log-probs are over the first `vocab_size` rows (the [MASK] and padding rows are
    never a token of the text)."""
    par = loaded.parallel
    model = loaded.model

    def infill(tokens: torch.Tensor, positions: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        tokens = tokens.long()
        b, s = tokens.shape
        check_zigzag_len(s, par.cp)
        pos = torch.arange(s).unsqueeze(0).expand(b, s)
        local_tokens, local_pos = tokens, pos
        if par.cp > 1:
            local_tokens, local_pos = (
                zigzag_split(t, par.rank, par.cp, seq_dim=1).contiguous() for t in (tokens, pos)
            )
        with torch.inference_mode():
            logits = model(local_tokens.to(par.device), local_pos.to(par.device), None)
            out = []
            for row, want in enumerate(positions):
                local = torch.full((s,), -1, dtype=torch.long)  # global position → index in this shard
                local[local_pos[row]] = torch.arange(local_pos.shape[1])
                idx = local[want.long()]
                held = idx >= 0
                rows = torch.zeros(len(want), vocab_size, dtype=torch.float32, device=par.device)
                picked = logits[row, idx[held].to(par.device), :vocab_size].float()
                rows[held.to(par.device)] = picked.log_softmax(-1)
                if par.cp > 1:
                    dist.all_reduce(rows, group=par.group)
                out.append(rows.cpu())
        return out

    return infill


def score_infill(
    items: Sequence[PasskeyItem],
    infill: InfillFn,
    *,
    kind: ObjectiveKind,
    mask_id: int | None,
    vocab_size: int,
    seed: int,
    threshold: float,
    batch_size: int = 4,
    advance: Callable[[int], None] | None = None,
) -> list[ItemScore]:
    """Every item scored by infilling its key: greedy by decoding (`threshold`: `longctx.eval.unmask`),
    the distractors from the first forward's log-probs."""
    done = infill_batched(
        items,
        infill,
        positions=key_positions,
        noise_key=lambda it: f"{it.length}:{it.depth}:{it.index}",
        tag=_TAG_PASSKEY,
        kind=kind,
        mask_id=mask_id,
        vocab_size=vocab_size,
        seed=seed,
        threshold=threshold,
        batch_size=batch_size,
        advance=advance,
    )
    return [score_item(it, _as_next_token_scores(it, d)) for it, d in zip(items, done, strict=True)]


def key_positions(item: PasskeyItem) -> list[int]:
    """The positions infilling corrupts: the key's digit tokens. A tokenizer that writes the space before
    the key as a token of its own (SentencePiece's lone "▁") leaves it in place: it is the restatement's
    text, not the key, and masking it too would ask the model where the key starts."""
    return [item.answer_start + j for j, digit in enumerate(item.digit_mask) if digit]


def _as_next_token_scores(item: PasskeyItem, infilled: Infilled) -> TokenScores:
    """The infilled key positions in `score_item`'s layout (column t scores token t + 1), one row per
    candidate: the true key, then each distractor, all read from the same first-forward log-probs
    [n, V] of the corrupted positions; the greedy tokens are the decoded ones. Answer tokens left in
    place (not digits) are given: right, log-prob 0."""
    n_cand = 1 + len(item.distractors)
    width = item.length - 1
    logprob = np.zeros((n_cand, width))
    argmax = np.zeros((n_cand, width), dtype=np.int64)
    margin = np.zeros((n_cand, width))
    a0 = item.answer_start - 1
    cols = np.asarray(key_positions(item)) - 1
    lpn = infilled.logprobs.double().numpy()
    best = np.asarray(infilled.tokens, dtype=np.int64)
    for c, answer in enumerate([item.answer] + [d for _, d in item.distractors]):
        argmax[c, a0 : a0 + len(answer)] = answer  # the given tokens; the corrupted ones are set below
        lab = np.asarray(answer)[cols - a0]
        idx = np.arange(len(cols))
        chosen = lpn[idx, lab]
        masked = lpn.copy()
        masked[idx, lab] = -np.inf
        logprob[c, cols] = chosen
        argmax[c, cols] = best
        margin[c, cols] = chosen - masked.max(-1)
    return TokenScores(logprob=logprob, argmax=argmax, margin=margin)


def elbo_contexts(length: int, window: int) -> list[int]:
    """The clean-context sizes measured at sequence length `length`: 0, then window·4^k, then all that
    fits (length − window), each a multiple of the window (so window + c splits into 2·CP chunks
    whenever the window does)."""
    widest = (length - window) // window * window
    out, c = [0], window
    while c < widest:
        out.append(c)
        c *= 4
    if widest > 0:
        out.append(widest)
    return out


def _window_bound(
    obj: Objective,
    lp: torch.Tensor,
    clean: torch.Tensor,
    noisy: torch.Tensor,
    corrupted: torch.Tensor,
    t: float,
    vocab_size: int,
) -> float:
    """Σ over the window of the objective's per-token bound, from the log-probs `lp` [w, V] at its positions."""
    tt = torch.full((len(clean),), t, dtype=torch.float64)
    if obj.kind == "mdm":
        ce = -lp.gather(-1, clean[:, None]).squeeze(-1).double()
        weight = -alpha_rate(obj, tt) / (1.0 - alpha(obj, tt))
        return float((ce * corrupted.double() * weight).sum())
    per = udlm_token_loss(obj, lp[None], clean[None], noisy[None], tt[None], vocab_size)
    return float(per.sum())


def context_elbo(
    docs: Sequence[np.ndarray],
    infill: InfillFn,
    *,
    objective: Objective,
    vocab_size: int,
    window: int,
    contexts: Sequence[int],
    t_levels: Sequence[float],
    seed: int,
    advance: Callable[[int], None] | None = None,
) -> ContextElbo:
    """ELBO of the middle `window` tokens of each document given `c` clean tokens around it, for every c.

    Documents must hold window + max(contexts) tokens. Under CP, window + c must split into 2·CP."""
    need = window + max(contexts)
    per = np.zeros((len(contexts), len(docs), len(t_levels)))
    for d, doc in enumerate(docs):
        if len(doc) < need:
            raise ValueError(f"document {d} has {len(doc)} tokens, the widest context needs {need}")
        mid = len(doc) // 2
        w0 = mid - window // 2
        clean_w = torch.as_tensor(doc[w0 : w0 + window], dtype=torch.long)
        draws = []
        for k, t in enumerate(t_levels):  # one corruption per (document, level), shared by every context
            g = generator(_TAG_ELBO, seed, f"{d}:{k}")
            u = torch.rand(window, generator=g, dtype=torch.float64)
            corrupted = u >= float(alpha(objective, torch.tensor(t, dtype=torch.float64)))
            noisy = torch.tensor(
                corrupt(
                    objective.kind,
                    clean_w.tolist(),
                    corrupted.nonzero().flatten().tolist(),
                    mask_id=objective.mask_id,
                    vocab_size=vocab_size,
                    generator=g,
                )
            )
            draws.append((corrupted, noisy))
        for ci, c in enumerate(contexts):
            left = c // 2
            start = w0 - left
            seq = np.asarray(doc[start : start + window + c])
            inputs, wants = [], []
            for _, noisy in draws:
                row = seq.copy()
                row[left : left + window] = noisy.numpy()
                inputs.append(row)
                wants.append(torch.arange(left, left + window))
            lps = infill(torch.as_tensor(np.stack(inputs), dtype=torch.long), wants)
            for k, (lp, (corrupted, noisy)) in enumerate(zip(lps, draws, strict=True)):
                bound = _window_bound(objective, lp, clean_w, noisy, corrupted, t_levels[k], vocab_size)
                per[ci, d, k] = bound / window
            if advance is not None:
                advance(1)
    return ContextElbo(
        window=window,
        contexts=list(contexts),
        t_levels=list(t_levels),
        elbo=[float(x) for x in per.mean(axis=(1, 2))],
        elbo_by_t=[[float(x) for x in row] for row in per.mean(axis=1)],
        per_doc=[[float(x) for x in row] for row in per.mean(axis=2)],
        documents=len(docs),
    )


__all__ = [
    "InfillFn",
    "context_elbo",
    "corrupt",
    "elbo_contexts",
    "key_positions",
    "model_infiller",
    "score_infill",
]
