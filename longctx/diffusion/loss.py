"""Per-token losses of the diffusion objectives (see `longctx.objective`), summed by the trainer and
divided by the number of loss tokens, as Megatron's per-token loss is.

Masked diffusion: −α'_t / (1 − α_t) · CE at the masked positions (1/t for α_t = 1 − t), 0 elsewhere.

Uniform state, the UDLM bound: with N the vocabulary, p_θ the model's distribution over it, x the
clean token, z the noisy one and κ = N·α_t / (1 − α_t), write λ_j = log(1 + κ·p_θ(j)) (the log of
x̄_θ = N·α_t·p_θ + 1 − α_t, less log(1 − α_t), which cancels). The bound at a position is

    α'_t / (N·α_t) · (T1 − T2)
    T1 = N / (1 − α_t) · ([x = z] / (1 + κ) + [x ≠ z] − 1 / (1 + κ·p_θ(z)))
    T2 = −w·(Σ_j λ_j − N·λ_z) − [x ≠ z]·κ·(λ_x − λ_z) + [x ≠ z]·(1 + κ)·log(1 + κ)
         − [x = z]·(N − 1)·log(1 + κ) / (1 + κ),        w = [x = z] / (1 + κ) + [x ≠ z],

zero when p_θ is the clean token and positive otherwise. In this form the large terms of order κ
(10⁷ at t = 10⁻³ for a 50K vocabulary) cancel analytically; the per-position scalars are computed in
float64 and only Σ_j λ_j runs over the vocabulary.

Uniform state, GIDD's form: with q_t(·|x) = α_t·x + (1 − α_t)/N and p_t = α_t·p_θ + (1 − α_t)/N, the
log-SNR λ_t = log(α_t / (1 − α_t)) and w = [x = z] / (1 + κ) + [x ≠ z],

    bound = −dλ_t/dt · w · (KL(q_t ‖ p_t) + r − log r − 1),      r = q_t(z|x) / p_t(z),

KL = α_t·(log(1 + κ) − λ_x) + (1 − α_t)/N·(log(1 + κ) − Σ_j λ_j). For uniform noise without time
conditioning this is the UDLM bound again, position by position (the tests check it). GIDD trains it
weighted by the density of λ_t, i.e. w·(KL + IS) without the −dλ/dt factor, which flattens the weight
of the smallest and largest t; `bound = "gidd"` trains that, and evaluation reports the bound.
"""

from __future__ import annotations

import dataclasses

import torch

from longctx.diffusion.noise import alpha, alpha_rate
from longctx.objective import Objective


def mdm_token_loss(
    obj: Objective, ce: torch.Tensor, corrupted: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """[b, s]: the masked-diffusion ELBO's per-token terms from the cross-entropy `ce` against the clean tokens."""
    weight = -alpha_rate(obj, t) / (1.0 - alpha(obj, t))
    return ce.float() * corrupted.to(ce.device, torch.float32) * weight.to(ce.device, torch.float32)


@dataclasses.dataclass(frozen=True)
class _Uniform:
    """The per-position scalars both uniform-state forms share (float64, [b, s]): α_t, κ = N·α_t/(1 − α_t),
    Σ_j λ_j over the vocabulary, λ at the clean and the noisy token, p_θ(z), and [x = z]."""

    a: torch.Tensor
    kappa: torch.Tensor
    lam_sum: torch.Tensor
    lam_x: torch.Tensor
    lam_z: torch.Tensor
    p_z: torch.Tensor
    same: torch.Tensor

    @property
    def w(self) -> torch.Tensor:
        return self.same / (1.0 + self.kappa) + (1.0 - self.same)


def _uniform(
    obj: Objective, logits: torch.Tensor, clean: torch.Tensor, noisy: torch.Tensor, t: torch.Tensor, n: int
) -> _Uniform:
    dev = logits.device
    a = alpha(obj, t).to(dev, torch.float64)
    kappa = n * a / (1.0 - a)
    logp = torch.log_softmax(logits[..., :n].float(), dim=-1)
    lam_sum = torch.log1p(kappa.float()[..., None] * logp.exp()).sum(-1).double()
    lp_x = logp.gather(-1, clean.to(dev)[..., None]).squeeze(-1).double()
    lp_z = logp.gather(-1, noisy.to(dev)[..., None]).squeeze(-1).double()
    same = (clean.to(dev) == noisy.to(dev)).double()
    return _Uniform(
        a, kappa, lam_sum, torch.log1p(kappa * lp_x.exp()), torch.log1p(kappa * lp_z.exp()), lp_z.exp(), same
    )


def udlm_token_loss(
    obj: Objective,
    logits: torch.Tensor,
    clean: torch.Tensor,
    noisy: torch.Tensor,
    t: torch.Tensor,
    vocab_size: int,
) -> torch.Tensor:
    """[b, s]: the UDLM bound at every position. `logits` [b, s, ≥N] (rows past N, Megatron's vocabulary
    padding, take no part), `clean`/`noisy` [b, s] ids, `t` [b, s]."""
    n = vocab_size
    u = _uniform(obj, logits, clean, noisy, t, n)
    a, kappa, same = u.a, u.kappa, u.same
    diff = 1.0 - same
    log1k = torch.log1p(kappa)
    t1 = n / (1.0 - a) * (same / (1.0 + kappa) + diff - 1.0 / (1.0 + kappa * u.p_z))
    t2 = (
        -u.w * (u.lam_sum - n * u.lam_z)
        - diff * kappa * (u.lam_x - u.lam_z)
        + diff * (1.0 + kappa) * log1k
        - same * (n - 1) * log1k / (1.0 + kappa)
    )
    rate = alpha_rate(obj, t).to(logits.device, torch.float64)
    return (rate / (n * a) * (t1 - t2)).float()


def gidd_token_loss(
    obj: Objective,
    logits: torch.Tensor,
    clean: torch.Tensor,
    noisy: torch.Tensor,
    t: torch.Tensor,
    vocab_size: int,
    *,
    elbo: bool = False,
) -> torch.Tensor:
    """[b, s]: GIDD's per-position loss w·(KL + IS) (its training weighting), or with `elbo` the bound
    itself (× −dλ/dt). Arguments as udlm_token_loss."""
    n = vocab_size
    u = _uniform(obj, logits, clean, noisy, t, n)
    a = u.a
    log1k = torch.log1p(u.kappa)
    kl = a * (log1k - u.lam_x) + (1.0 - a) / n * (log1k - u.lam_sum)
    log_r = u.same * log1k - u.lam_z
    loss = u.w * (kl + torch.expm1(log_r) - log_r)
    if elbo:
        # dλ/dt = α'/(α(1 − α)) (negative: the signal falls with t)
        loss = loss * (-alpha_rate(obj, t).to(logits.device, torch.float64) / (a * (1.0 - a)))
    return loss.float()


def udm_token_loss(
    obj: Objective,
    logits: torch.Tensor,
    clean: torch.Tensor,
    noisy: torch.Tensor,
    t: torch.Tensor,
    vocab_size: int,
) -> torch.Tensor:
    """[b, s]: what the trainer minimises for the uniform-state objective, by `obj.bound`."""
    if obj.bound == "gidd":
        return gidd_token_loss(obj, logits, clean, noisy, t, vocab_size)
    return udlm_token_loss(obj, logits, clean, noisy, t, vocab_size)


__all__ = ["gidd_token_loss", "mdm_token_loss", "udlm_token_loss", "udm_token_loss"]
