"""decoupled_ppo, m2po and vapo against their definitions, stated independently of any library.

VAPO has no public code; AReaL (decoupled PPO, the log-linear proximal policy, M2PO) is also called as the oracle
in test_areal_losses.py (a test dependency installed with --no-deps). Here each test states the formula
independently, in float64, from the paper and from AReaL's semantics (areal/utils/functional/functional.py ``ppo_actor_loss_fn``; areal/trainer/ppo/actor.py
``compute_prox_logp_approximations``, ``_apply_m2po_masking``), and checks rlzoo's loss value and gradient
against it, plus the key identities: decoupled PPO with the proximal policy equal to the behaviour policy is
PPO; the log-linear proximal policy of a one-update-stale token is the behaviour policy; M2PO masks exactly the
largest-M2 tokens that bring the kept mean under its threshold.
"""

import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import fresh, loss_and_grads, policy_batches
from tolerances import assert_grad_close, tol

import rlzoo
from rlzoo import Normalizer

F64 = tol(torch.float64)


def _token_adv(batch) -> torch.Tensor:
    adv = batch.advantages
    return adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv


def _value_and_grad(fn, batch):
    """(value, d value / d logprobs) of a float64 oracle ``fn(logprobs)``."""
    lp = batch.logprobs.detach().clone().requires_grad_(True)
    value = fn(lp)
    (grad,) = torch.autograd.grad(value, lp)
    return value.detach(), grad


def _decoupled_oracle(lp, prox, behav, adv, mask, *, eps_low=0.2, eps_high=0.2, cap=5.0):
    """AReaL's decoupled loss: -w_behav min(u A, clip(u) A), u = pi/pi_prox, w_behav = pi_prox/pi_behav set to 0
    above ``cap`` (the token still counts), summed over counted tokens / their number. ``cap=None``: no cap."""
    u = torch.exp(lp - prox)
    per_token = torch.maximum(-adv * u, -adv * torch.clamp(u, 1 - eps_low, 1 + eps_high))
    w = torch.exp(prox - behav)
    if cap is not None:
        w = torch.where(w <= cap, w, torch.zeros_like(w))
    return torch.where(mask, per_token * w, torch.zeros_like(lp)).sum() / mask.sum().clamp(min=1)


# ------------------------------------------------------------------------------------------ decoupled_ppo
@given(batch=policy_batches(old=True, rollout=True, log_ratio_scale=0.5))
def test_decoupled_ppo_is_areal_decoupled_loss(batch):
    """decoupled_ppo == AReaL's ppo_actor_loss_fn(use_decoupled_loss, eps_clip=0.2, behav_imp_weight_cap=5) with
    proximal = old_logprobs and behaviour = rollout_logprobs (value and gradient)."""
    mask, adv = batch.completion_mask, _token_adv(batch)
    want, want_grad = _value_and_grad(
        lambda lp: _decoupled_oracle(lp, batch.old_logprobs, batch.rollout_logprobs, adv, mask), batch)
    out, grad, _ = loss_and_grads(rlzoo.get_loss("decoupled_ppo"), batch)
    torch.testing.assert_close(out.loss.detach(), want, **F64)
    assert_grad_close(grad, want_grad)


@given(batch=policy_batches(old=True, rollout=True, log_ratio_scale=0.5))
def test_decoupled_ppo_with_behaviour_as_proximal_is_ppo(batch):
    """pi_prox = pi_behav (rollout_logprobs = old_logprobs): every behaviour weight is 1, so decoupled_ppo is
    ppo (clip 0.2, token-mean) in value and gradient."""
    same = fresh(batch, rollout_logprobs=batch.old_logprobs)
    a, ga, _ = loss_and_grads(rlzoo.get_loss("decoupled_ppo"), same)
    b, gb, _ = loss_and_grads(rlzoo.get_loss("ppo"), same)
    torch.testing.assert_close(a.loss, b.loss, **F64)
    assert_grad_close(ga, gb)


def _loglinear_oracle(behav, lp, versions, current):
    """A-3PO: log pi_prox = log pi_behav + alpha (log pi_theta - log pi_behav), alpha = clip((v_theta - 1 - v) /
    (v_theta - v), 0, 1), alpha = 0 where v_theta <= v or v < 0; token by token, in Python."""
    b, t = lp.shape
    out = behav.clone()
    for i in range(b):
        for j in range(t):
            v = int(versions[i, j] if versions.ndim == 2 else versions[i])
            alpha = 0.0
            if v >= 0 and current > v:
                alpha = min(max((current - 1 - v) / (current - v), 0.0), 1.0)
            out[i, j] = behav[i, j] + alpha * (lp[i, j] - behav[i, j])
    return out


@given(batch=policy_batches(old=False, rollout=True, versions=True, log_ratio_scale=0.5))
def test_loglinear_proximal_policy(batch):
    """prox_logp_method="loglinear" == decoupled_ppo with old_logprobs = the A-3PO interpolation (detached),
    in value and gradient; and tokens one update stale (v = current - 1) have pi_prox = pi_behav."""
    lp = batch.logprobs.detach()
    prox = _loglinear_oracle(batch.rollout_logprobs, lp, batch.versions, batch.current_version)
    got = rlzoo.losses.loglinear_proximal_logprobs(batch.rollout_logprobs, lp, batch.versions, batch.current_version)
    torch.testing.assert_close(got, prox, **F64)
    out, grad, _ = loss_and_grads(rlzoo.get_loss("decoupled_ppo", prox_logp_method="loglinear"), batch)
    mask, adv = batch.completion_mask, _token_adv(batch)
    want, want_grad = _value_and_grad(lambda x: _decoupled_oracle(x, prox, batch.rollout_logprobs, adv, mask), batch)
    torch.testing.assert_close(out.loss.detach(), want, **F64)
    assert_grad_close(grad, want_grad)

    one_behind = torch.full_like(batch.versions, batch.current_version - 1)
    same = rlzoo.losses.loglinear_proximal_logprobs(batch.rollout_logprobs, lp, one_behind, batch.current_version)
    torch.testing.assert_close(same, batch.rollout_logprobs, **F64)


# ----------------------------------------------------------------------------------------------------- m2po
def _m2po_keep_oracle(m2: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """Drop the k largest M2 of the counted tokens, k the least with mean(rest) < tau (n - 1 if none): a loop
    over k, positions as tie-break (AReaL's sort order is unspecified; ties have probability 0 here)."""
    positions = [p for p in range(mask.numel()) if bool(mask.flatten()[p])]
    ranked = sorted(positions, key=lambda p: -float(m2.flatten()[p]))
    n = len(ranked)
    k = n - 1 if n else 0
    for cut in range(n):
        rest = [float(m2.flatten()[p]) for p in ranked[cut:]]
        if sum(rest) / len(rest) < tau:
            k = cut
            break
    keep = torch.zeros(mask.numel(), dtype=torch.bool)
    for p in ranked[k:]:
        keep[p] = True
    return keep.view_as(mask)


@given(batch=policy_batches(old=True, rollout=True, log_ratio_scale=0.5, min_counted=1),
       tau=st.sampled_from([0.001, 0.01, 0.04, 0.2]))
def test_m2po_mask_and_loss(batch, tau):
    """M2PO's kept tokens: exactly the oracle's; their mean M2 < tau when some cut achieves it; every rejected
    M2 >= every kept M2; putting back the smallest rejected token lifts the mean to >= tau (minimal). The loss
    is the unclipped decoupled loss (behaviour weight masked above 5) over the kept tokens, divided by their
    number, and the Normalizer built with loss=... counts them."""
    mask = batch.completion_mask
    m2 = (batch.old_logprobs - batch.rollout_logprobs).square()
    loss_fn = rlzoo.get_loss("m2po", m2_threshold=tau)
    keep = loss_fn.loss_mask(mask, old_logprobs=batch.old_logprobs, rollout_logprobs=batch.rollout_logprobs)
    assert torch.equal(keep, _m2po_keep_oracle(m2, mask, tau))
    rejected = mask & ~keep
    if rejected.any():
        assert m2[rejected].min() >= m2[keep].max()
        back = keep.clone()
        back[rejected & (m2 == m2[rejected].min())] = True
        assert float(m2[back].mean()) >= tau
    if float(m2[keep].mean()) >= tau:  # no cut works: only the smallest M2 is kept
        assert int(keep.sum()) == 1
    assert int(Normalizer.from_batch(batch, loss=loss_fn).num_tokens) == int(keep.sum())

    adv = _token_adv(batch)
    want, want_grad = _value_and_grad(
        lambda lp: _decoupled_oracle(lp, batch.old_logprobs, batch.rollout_logprobs, adv, keep,
                                     eps_low=float("inf"), eps_high=float("inf")), batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    torch.testing.assert_close(out.loss.detach(), want, **F64)
    assert_grad_close(grad, want_grad)


# ----------------------------------------------------------------------------------------------------- vapo
@given(batch=policy_batches(old=True, rewards=True, log_ratio_scale=0.5), mu=st.sampled_from([0.0, 0.1, 1.5]))
def test_vapo_loss(batch, mu):
    """vapo == PPO clip (0.2, 0.28) token-mean + mu * (NLL summed over the tokens of sequences with reward > 0)
    / their number (0 without one), value and gradient; under micro-batching with Normalizer.from_batch(*mbs)
    (which counts the positive tokens) the micro-batch losses sum to it."""
    mask, adv = batch.completion_mask, _token_adv(batch)
    positive = mask & (batch.rewards > 0).unsqueeze(-1)

    def oracle(lp):
        u = torch.exp(lp - batch.old_logprobs)
        ppo = torch.maximum(-adv * u, -adv * torch.clamp(u, 0.8, 1.28))
        policy = torch.where(mask, ppo, torch.zeros_like(lp)).sum() / mask.sum().clamp(min=1)
        nll = torch.where(positive, -lp, torch.zeros_like(lp)).sum() / positive.sum().clamp(min=1)
        return policy + mu * nll

    want, want_grad = _value_and_grad(oracle, batch)
    loss_fn = rlzoo.get_loss("vapo", positive_nll_coef=mu)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    torch.testing.assert_close(out.loss.detach(), want, **F64)
    assert_grad_close(grad, want_grad)

    whole = fresh(batch)
    micro = whole.split(max(1, batch.shape[0] // 2))
    normalizer = Normalizer.from_batch(*micro, loss=loss_fn)
    total = sum(loss_fn(mb, normalizer=normalizer).loss for mb in micro)
    torch.testing.assert_close(total.detach(), want, **F64)
