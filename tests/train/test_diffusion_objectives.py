"""The diffusion objectives' noise and per-token losses (pure torch, no process group)."""

from __future__ import annotations

import math

import pytest
import torch

from longctx.attention.zigzag import zigzag_split
from longctx.diffusion.loss import gidd_token_loss, mdm_token_loss, udlm_token_loss, udm_token_loss
from longctx.diffusion.noise import alpha, corrupt, noise_levels
from longctx.objective import Objective

MDM = Objective(kind="mdm", mask_id=50)
UDM = Objective(kind="udm")


def test_noise_depends_only_on_the_sample_index() -> None:
    clean = torch.arange(4 * 64).reshape(4, 64) % 40
    whole = corrupt(MDM, clean, [8, 9, 10, 11], seed=3, global_batch_size=8, vocab_size=40)
    alone = corrupt(MDM, clean[2:3], [10], seed=3, global_batch_size=8, vocab_size=40)
    assert torch.equal(whole.inputs[2:3], alone.inputs) and torch.equal(whole.t[2:3], alone.t)
    other_seed = corrupt(MDM, clean, [8, 9, 10, 11], seed=4, global_batch_size=8, vocab_size=40)
    assert not torch.equal(whole.corrupted, other_seed.corrupted)
    # different samples (other DP ranks) draw differently
    assert not torch.equal(whole.corrupted[0], whole.corrupted[1])


def test_noise_levels_are_stratified_over_the_global_batch() -> None:
    t = noise_levels(MDM, 1, list(range(16, 32)), 16)  # the second global batch
    bins = sorted(int((x - 1e-6) / (1 - 1e-6) * 16) for x in t.tolist())
    assert bins == list(range(16)), "one sequence in each sixteenth of [t_min, 1]"
    assert not torch.equal(t, noise_levels(MDM, 1, list(range(16)), 16)), "each batch draws its own offset"
    plain = noise_levels(MDM.model_copy(update={"antithetic": False}), 1, list(range(16)), 16)
    assert plain.min() >= 1e-6 and plain.max() <= 1


def test_corruption_rates_and_tokens() -> None:
    clean = torch.randint(0, 40, (8, 4096), generator=torch.Generator().manual_seed(0))
    m = corrupt(MDM, clean, list(range(8)), seed=1, global_batch_size=8, vocab_size=40)
    rate = m.corrupted.double().mean(1)
    assert torch.allclose(rate, 1 - alpha(MDM, m.t[:, 0]), atol=0.03)
    assert torch.equal(m.inputs[m.corrupted], torch.full_like(m.inputs[m.corrupted], 50))
    assert torch.equal(m.inputs[~m.corrupted], clean[~m.corrupted])
    u = corrupt(UDM, clean, list(range(8)), seed=1, global_batch_size=8, vocab_size=40)
    assert int(u.inputs.max()) < 40 and int(u.inputs.min()) >= 0
    assert torch.equal(u.inputs[~u.corrupted], clean[~u.corrupted])
    # a resampled token is uniform over the vocabulary: it keeps its value 1/40 of the time
    kept = (u.inputs[u.corrupted] == clean[u.corrupted]).double().mean()
    assert abs(float(kept) - 1 / 40) < 0.01


def test_each_context_parallel_chunk_gets_its_own_mask_pattern() -> None:
    """Drawn over the full sequence, then split: the CP shards are of one corruption, not one
    pattern repeated per chunk (what drawing after the split would give)."""
    clean = torch.randint(0, 40, (2, 1024), generator=torch.Generator().manual_seed(1))
    c = corrupt(MDM, clean, [0, 1], seed=5, global_batch_size=2, vocab_size=40)
    shards = [zigzag_split(c.corrupted, r, 2, seq_dim=1) for r in range(2)]
    assert not torch.equal(shards[0], shards[1])
    quarter = 1024 // 4
    chunks = c.corrupted.view(2, 4, quarter)
    assert all(not torch.equal(chunks[:, 0], chunks[:, k]) for k in (1, 2, 3))


def test_mdm_loss_is_ce_over_t_at_masked_positions() -> None:
    ce = torch.rand(2, 8) + 0.5
    corrupted = torch.rand(2, 8) < 0.5
    t = torch.tensor([[0.25], [0.8]], dtype=torch.float64).expand(2, 8)
    got = mdm_token_loss(MDM, ce, corrupted, t)
    assert torch.allclose(got, ce * corrupted / t.float(), rtol=1e-6)
    log_linear = MDM.model_copy(update={"schedule": "log-linear"})
    # −α'/(1 − α) is 1/t for both schedules (the slope cancels): only the masking rate differs
    assert torch.allclose(mdm_token_loss(log_linear, ce, corrupted, t), got, rtol=1e-6)


def _posterior(z: int, x: torch.Tensor, a_s: float, a_t: float, n: int) -> torch.Tensor:
    """q(z_s | z_t = z, x) of uniform-state diffusion, `x` a distribution over the vocabulary (a one-hot
    clean token, or the model's prediction for its approximate posterior)."""
    a_ts = a_t / a_s
    to_z = torch.full((n,), (1 - a_ts) / n, dtype=torch.float64)
    to_z[z] += a_ts
    unnorm = to_z * (a_s * x + (1 - a_s) / n)
    return unnorm / unnorm.sum()


@pytest.mark.parametrize("t", [0.05, 0.4, 0.9])
@pytest.mark.parametrize("same", [True, False])
def test_udlm_bound_is_the_continuous_limit_of_the_posterior_kl(t: float, same: bool) -> None:
    """The per-token bound equals lim KL(q(z_s | z_t, x) ‖ p_θ(z_s | z_t)) / (t − s), computed here from
    the forward process directly, for a clean token equal to or different from the noisy one."""
    n, x, z = 7, 2, 2 if same else 5
    logits = torch.randn(
        1, 1, n, generator=torch.Generator().manual_seed(int(t * 100) + same), dtype=torch.float64
    )
    p = torch.softmax(logits[0, 0], -1)
    dt = 1e-6
    a = float(alpha(UDM, torch.tensor(t, dtype=torch.float64)))
    a_s = float(alpha(UDM, torch.tensor(t - dt, dtype=torch.float64)))
    q = _posterior(z, torch.nn.functional.one_hot(torch.tensor(x), n).double(), a_s, a, n)
    pt = _posterior(z, p, a_s, a, n)
    limit = float((q * (q.clamp_min(1e-300).log() - pt.log())).sum()) / dt
    got = float(
        udlm_token_loss(
            UDM,
            logits.float(),
            torch.tensor([[x]]),
            torch.tensor([[z]]),
            torch.tensor([[t]], dtype=torch.float64),
            n,
        )
    )
    assert got == pytest.approx(limit, rel=1e-4)
    assert got > 0


def test_udlm_bound_vanishes_at_the_clean_token_and_ignores_padding_rows() -> None:
    n = 50
    clean = torch.tensor([[3, 7, 9]])
    noisy = torch.tensor([[3, 11, 9]])
    t = torch.full((1, 3), 0.3, dtype=torch.float64)
    perfect = torch.full((1, 3, n + 14), -1e4)
    perfect[0, torch.arange(3), clean[0]] = 30.0
    perfect[..., n:] = 50.0  # Megatron's padding rows: outside the vocabulary, never counted
    got = udlm_token_loss(UDM, perfect, clean, noisy, t, n)
    assert got.abs().max() < 1e-3
    wrong = torch.zeros(1, 3, n)
    assert (udlm_token_loss(UDM, wrong, clean, noisy, t, n) > 0.1).all()


def test_udlm_bound_is_finite_at_the_smallest_t_of_a_large_vocabulary() -> None:
    n = 50257
    logits = torch.randn(1, 4, n, generator=torch.Generator().manual_seed(0))
    clean = torch.tensor([[1, 2, 3, 4]])
    t = torch.full((1, 4), 1e-3, dtype=torch.float64)
    got = udlm_token_loss(UDM, logits, clean, torch.tensor([[1, 2, 9, 4]]), t, n)
    assert torch.isfinite(got).all() and (got > 0).all()
    assert math.isfinite(float(got.sum()))


def test_objective_table_refuses_contradictions() -> None:
    with pytest.raises(ValueError, match="mask_id is for kind = 'mdm'"):
        Objective(kind="udm", mask_id=3)
    with pytest.raises(ValueError, match="diffusion objective"):
        Objective(kind="ar", schedule="linear")
    with pytest.raises(ValueError, match="uniform-state bound"):
        Objective(kind="mdm", bound="gidd")
    with pytest.raises(ValueError, match="diverges at t = 0"):
        Objective(kind="udm", schedule="linear", t_min=0)
    assert Objective(kind="udm").describe().startswith("udm (log-linear schedule, t in [0.001, 1]")


@pytest.mark.parametrize("t", [0.002, 0.05, 0.4, 0.9, 0.999])
def test_gidd_form_is_the_udlm_bound_at_every_position(t: float) -> None:
    """GIDD's KL + importance-sampling form of the uniform-noise ELBO is the UDLM bound position by
    position, for every noisy token; its training loss is that bound over −dλ/dt."""
    n = 9
    gen = torch.Generator().manual_seed(int(t * 1000))
    logits = torch.randn(1, 2 * n, n, generator=gen, dtype=torch.float64) * 3
    clean = torch.full((1, 2 * n), 4)
    noisy = torch.arange(2 * n)[None] % n  # every token, twice, with different predictions
    tt = torch.full((1, 2 * n), t, dtype=torch.float64)
    udlm = udlm_token_loss(UDM, logits.float(), clean, noisy, tt, n).double()
    bound = gidd_token_loss(UDM, logits.float(), clean, noisy, tt, n, elbo=True).double()
    assert torch.allclose(bound, udlm, rtol=2e-4, atol=1e-6)
    a = alpha(UDM, tt)
    weighted = gidd_token_loss(UDM, logits.float(), clean, noisy, tt, n).double()
    assert torch.allclose(weighted, udlm * a * (1 - a) / (1 - UDM.eps), rtol=2e-4, atol=1e-7)
    gidd = UDM.model_copy(update={"bound": "gidd"})
    assert torch.equal(udm_token_loss(gidd, logits.float(), clean, noisy, tt, n), weighted.float())
    assert torch.equal(udm_token_loss(UDM, logits.float(), clean, noisy, tt, n), udlm.float())


def test_gidd_loss_is_finite_for_a_large_vocabulary() -> None:
    n = 50257
    logits = torch.randn(1, 4, n, generator=torch.Generator().manual_seed(0))
    clean = torch.tensor([[1, 2, 3, 4]])
    for t in (1e-3, 0.5, 1.0 - 1e-9):
        tt = torch.full((1, 4), t, dtype=torch.float64)
        got = gidd_token_loss(UDM, logits, clean, torch.tensor([[1, 2, 9, 4]]), tt, n)
        assert torch.isfinite(got).all() and (got >= 0).all()
