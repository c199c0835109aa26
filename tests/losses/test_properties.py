"""Property tests: each statement of DESIGN.md section 3, and each part's definition, in float64.

Expected values and gradients are written from the papers' formulas (closed forms, not autograd of a
re-implementation), then compared with rlzoo's loss and its autograd gradient. ``c[b, t]`` are the
aggregation weights of tests/strategies.aggregation_weights (``loss = sum c * l``).
The GRPO-advantage statements of section 3 live with the advantage estimators' tests.
"""

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import (
    AGGREGATIONS,
    IS_MODES,
    KL_ESTIMATORS,
    aggregate,
    aggregation_weights,
    batch_options_for,
    budget,
    fresh,
    kl_closed_form,
    loss_and_grads,
    loss_options,
    masks,
    policy_batches,
    supported_options,
    with_garbage,
)
from tolerances import tol

import rlzoo
from rlzoo import Normalizer, PolicyBatch
from rlzoo.algorithms.sapo import SAPO
from rlzoo.losses import (
    LossInputs,
    PolicyLoss,
    aggregations,
    kl_estimate,
    masked_quantile,
)

F64 = tol(torch.float64)
NON_COUPLED = [n for n in rlzoo.list_losses() if not rlzoo.get_loss(n).batch_coupled]


# ------------------------------------------------------------------------------------------------ helpers
def _dense(batch: PolicyBatch) -> dict[str, torch.Tensor]:
    """Detached inputs with 0 at masked positions, advantages broadcast to [B, T], old = logprobs if None."""
    mask = batch.completion_mask
    zero = torch.zeros((), dtype=torch.float64)

    def clean(x):
        return None if x is None else torch.where(mask, x.detach(), zero)

    lp = clean(batch.logprobs)
    adv = batch.advantages.detach()
    adv = adv.unsqueeze(-1).expand_as(lp) if adv.ndim == 1 else adv
    old = lp if batch.old_logprobs is None else clean(batch.old_logprobs)
    return {
        "mask": mask,
        "lp": lp,
        "old": old,
        "lr": lp - old,
        "adv": clean(adv),
        "ref": clean(batch.ref_logprobs),
        "rollout": clean(batch.rollout_logprobs),
        "ent": clean(batch.entropies),
        "n": mask.sum(-1, keepdim=True).to(torch.float64),
    }


def _row_mean(x: torch.Tensor, d: dict) -> torch.Tensor:
    return torch.where(d["mask"], x, 0.0).sum(-1, keepdim=True) / d["n"].clamp(min=1)


def _weights(d: dict, aggregation: str, max_completion_length: int | None = None) -> torch.Tensor:
    return aggregation_weights(d["mask"], aggregation, max_completion_length=max_completion_length)


def _check(out, grad, d, aggregation, value, dvalue, max_completion_length=None):
    """loss == sum c * value and d loss / d logprobs == c * dvalue (for token-local values)."""
    c = _weights(d, aggregation, max_completion_length)
    torch.testing.assert_close(out.loss, (c * torch.where(d["mask"], value, 0.0)).sum(), **F64)
    torch.testing.assert_close(grad, c * torch.where(d["mask"], dvalue, 0.0), **F64)


def _ppo_token_loss(w, adv, el, eh, dual=None, delta=None):
    """Closed-form PPO clip per-token loss and its derivative w.r.t. log w (branch chosen by value)."""
    unclipped_w = w if delta is None else torch.clamp(w, max=delta)
    # torch.clamp passes the gradient at its bounds (inclusive), so does the closed form
    d_unclipped = w * (w <= delta) if delta is not None else w
    clipped_w = torch.clamp(w, 1 - el, 1 + eh)
    d_clipped = w * ((w >= 1 - el) & (w <= 1 + eh))
    u, k = unclipped_w * adv, clipped_w * adv
    du, dk = d_unclipped * adv, d_clipped * adv
    m = torch.minimum(u, k)
    dm = torch.where(u < k, du, torch.where(k < u, dk, 0.5 * (du + dk)))
    loss, dloss = -m, -dm
    if dual is not None:
        bound = -dual * adv
        hit = (adv < 0) & (loss > bound)
        loss = torch.where(hit, bound, loss)
        dloss = torch.where(hit, 0.0, dloss)
    return loss, dloss


def _part_output(loss_fn: PolicyLoss, batch: PolicyBatch):
    """(per-token surrogate loss, metrics) of loss_fn's ratio level + surrogate, for part-level checks."""
    x = LossInputs.from_batch(batch)
    x = x.with_weights(loss_fn.ratio(x).value)
    return loss_fn.surrogate(x)


def _ratio_batch(draw, log_r: st.SearchStrategy, *, adv_sign=None, **kw) -> PolicyBatch:
    """A batch whose token log-ratios are drawn from ``log_r`` (old = logprobs - log r, kept <= 0)."""
    batch = draw(policy_batches(old=False, **kw, advantage_sign=adv_sign))
    b, t = batch.shape
    lr = torch.tensor(draw(st.lists(log_r, min_size=b * t, max_size=b * t)), dtype=torch.float64).view(b, t)
    lp = batch.logprobs.detach()
    lp = torch.minimum(lp, lr.clamp(max=0))  # so that old = lp - lr <= 0
    return fresh(batch, logprobs=lp.clone().requires_grad_(True), old_logprobs=lp - lr)


# ------------------------------------------------------------------------------ section 3: PPO clipping
@given(data=st.data(), name=st.sampled_from(["ppo", "grpo"]))
def test_negative_advantage_above_the_clip_is_not_clipped(data, name):
    """A < 0 and r > 1 + eps: plain PPO/GRPO take the unclipped branch, l = -r A = |A| r, so the loss and
    its gradient d l / d logp = |A| r grow with r (no bound; that is what dual_clip and delta add)."""
    loss_fn = rlzoo.get_loss(name, beta=0.0)
    eps = loss_fn.surrogate.epsilon_high
    log_r = st.floats(math.log1p(eps) + 1e-3, math.log(50.0))
    batch = _ratio_batch(data.draw, log_r, adv_sign=-1)
    d = _dense(batch)
    agg = loss_fn.aggregation.registered_name()
    out, grad, _ = loss_and_grads(loss_fn, batch)
    w = torch.exp(d["lr"])
    _check(out, grad, d, agg, -w * d["adv"], -w * d["adv"])
    # and strictly larger for a larger ratio: multiply every r by k > 1
    k = data.draw(st.floats(1.01, 3.0), label="k")
    bigger = fresh(batch, old_logprobs=batch.old_logprobs - math.log(k))
    out2, grad2, _ = loss_and_grads(loss_fn, bigger)
    mask = batch.completion_mask
    if mask.any():
        assert out2.loss > out.loss
        assert (grad2[mask] > grad[mask]).all()
        assert (grad[mask] > 0).all()


@given(data=st.data(), c=st.floats(1.01, 10.0))
def test_dual_clip_bounds_the_loss_of_negative_advantages(data, c):
    """dual_clip = c: for A < 0, l = min(max(-r A, -clip(r) A), -c A) <= c |A|; where r > c the loss is exactly
    c |A| with zero gradient. A > 0 tokens are unaffected (Ye et al. 2020)."""
    loss_fn = rlzoo.get_loss("ppo", dual_clip=c)
    batch = _ratio_batch(data.draw, st.floats(-3.0, 3.5))
    d = _dense(batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    w = torch.exp(d["lr"])
    loss, dloss = _ppo_token_loss(w, d["adv"], 0.2, 0.2, dual=c)
    _check(out, grad, d, "token-mean", loss, dloss)
    neg = d["mask"] & (d["adv"] < 0)
    assert (loss[neg] <= c * d["adv"][neg].abs() + 1e-12).all()
    beyond = neg & (w > c)
    assert (grad[beyond] == 0).all()


@given(data=st.data(), delta=st.floats(1.3, 6.0))
def test_delta_caps_the_unclipped_ratio(data, delta):
    """delta (INTELLECT-2): l = -min(min(r, delta) A, clip(r) A); for A < 0 and r > delta the loss is exactly
    delta |A| with zero gradient (the ratio is capped at delta)."""
    loss_fn = rlzoo.get_loss("two_sided", delta=delta, beta=0.0)
    batch = _ratio_batch(data.draw, st.floats(-3.0, 3.0))
    d = _dense(batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    w = torch.exp(d["lr"])
    loss, dloss = _ppo_token_loss(w, d["adv"], 0.2, 0.2, delta=delta)
    _check(out, grad, d, "seq-mean-token-mean", loss, dloss)
    capped = d["mask"] & (d["adv"] < 0) & (w > delta)
    torch.testing.assert_close(loss[capped], delta * d["adv"][capped].abs(), **F64)
    assert (grad[capped] == 0).all()


@given(batch=policy_batches(log_ratio_scale=0.5), eps=st.floats(0.0, 0.6),
       aggregation=st.sampled_from(AGGREGATIONS), dual=st.sampled_from([None, 1.5, 3.0]),
       delta=st.sampled_from([None, 2.0, math.inf]))
def test_ppo_clip_by_definition(batch, eps, aggregation, dual, delta):
    """PPO clip (Schulman et al. eq. 7 with DAPO's asymmetric range, dual clip, delta): l = -min(min(r, delta) A,
    clip(r, 1-eps_low, 1+eps_high) A), bounded by c|A| for A < 0; the gradient follows the chosen branch."""
    el, eh = eps, eps * 1.4
    t = batch.shape[1]
    loss_fn = rlzoo.get_loss("ppo", epsilon_low=el, epsilon_high=eh, dual_clip=dual, delta=delta,
                             aggregation=aggregation, max_completion_length=t)
    d = _dense(batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    loss, dloss = _ppo_token_loss(torch.exp(d["lr"]), d["adv"], el, eh, dual=dual, delta=delta)
    _check(out, grad, d, aggregation, loss, dloss, max_completion_length=t)


@given(batch=policy_batches(log_ratio_scale=0.5), eps=st.floats(0.0, 0.6), dual=st.sampled_from([None, 2.0]))
def test_clip_metrics_by_definition(batch, eps, dual):
    """TRL's metrics: clip_ratio/low_mean = mean[(r < 1-eps_low) & (A < 0)], high_mean = mean[(r > 1+eps_high)
    & (A > 0)], region_mean = either; ratio/mean|min|max over counted tokens; dual_mean = mean[A < 0 and the
    loss hit c|A|] (verl's pg_clipfrac_lower). Means are over counted tokens."""
    el, eh = eps, eps + 0.08
    out = rlzoo.get_loss("ppo", epsilon_low=el, epsilon_high=eh, dual_clip=dual)(fresh(batch))
    d = _dense(batch)
    mask = d["mask"]
    w, adv = torch.exp(d["lr"]), d["adv"]
    n = max(int(mask.sum()), 1)

    def mean(flag):
        return (flag & mask).sum().to(torch.float64) / n

    low, high = (w < 1 - el) & (adv < 0), (w > 1 + eh) & (adv > 0)
    torch.testing.assert_close(out.metrics["clip_ratio/low_mean"], mean(low), **F64)
    torch.testing.assert_close(out.metrics["clip_ratio/high_mean"], mean(high), **F64)
    torch.testing.assert_close(out.metrics["clip_ratio/region_mean"], mean(low | high), **F64)
    if mask.any():
        torch.testing.assert_close(out.metrics["ratio/mean"], w[mask].mean(), **F64)
        torch.testing.assert_close(out.metrics["ratio/min"], w[mask].min(), **F64)
        torch.testing.assert_close(out.metrics["ratio/max"], w[mask].max(), **F64)
    if dual is not None:
        loss, _ = _ppo_token_loss(w, adv, el, eh)
        torch.testing.assert_close(out.metrics["clip_ratio/dual_mean"], mean((adv < 0) & (loss > -dual * adv)), **F64)


@given(batch=policy_batches(log_ratio_scale=0.5, per_token_advantages=False), eps=st.floats(0.0, 0.3),
       name=st.sampled_from(["gspo", "gspo_token", "luspo"]))
def test_sequence_level_clip_metrics_count_each_sequence_once(batch, eps, name):
    """A sequence-level ratio s_i with per-sequence advantages makes one clip decision per sequence, counted once
    (TRL's definition): clip_ratio/low_mean = #{i: s_i < 1 - eps_low, A_i < 0} / S, high_mean with
    s_i > 1 + eps_high and A_i > 0, region_mean either; S = sequences with a counted token (a long sequence does
    not weigh more than a short one)."""
    el, eh = eps, eps + 0.01
    out = rlzoo.get_loss(name, epsilon_low=el, epsilon_high=eh)(fresh(batch))
    d = _dense(batch)
    live = d["n"].squeeze(-1) > 0
    s = torch.exp(_row_mean(d["lr"], d)).squeeze(-1)
    adv = batch.advantages.detach()
    low, high = (s < 1 - el) & (adv < 0) & live, (s > 1 + eh) & (adv > 0) & live
    count = max(int(live.sum()), 1)
    for key, flag in (("low", low), ("high", high), ("region", low | high)):
        torch.testing.assert_close(out.metrics[f"clip_ratio/{key}_mean"],
                                   flag.sum().to(torch.float64) / count, **F64, msg=key)


@given(batch=policy_batches(log_ratio_scale=0.5, ref=True), beta=st.floats(0.0, 1.0), old=st.booleans(),
       aggregation=st.sampled_from(AGGREGATIONS))
def test_first_iteration_ppo_clip_at_the_edges(batch, beta, old, aggregation):
    """Ratio 1 (old None or == logprobs) with the tightest options (epsilon 0, dual_clip 1.01, delta 1: every
    bound touches r = 1) and any aggregation: loss == agg(-A + beta k3), gradient == agg-weighted
    (-A + beta (1 - e^-(logp - ref))). (Clamps pass the gradient at their bounds, torch.minimum splits ties.)"""
    batch = fresh(batch, old_logprobs=batch.logprobs.detach().clone() if old else None)
    with pytest.warns(UserWarning, match=r"delta=1.0 <= 1 \+ epsilon_high"):  # delta at the upper clip, here wanted
        loss_fn = rlzoo.get_loss("grpo", beta=beta, epsilon_low=0.0, epsilon_high=0.0, dual_clip=1.01, delta=1.0,
                                 aggregation=aggregation, max_completion_length=batch.shape[1])
    d = _dense(batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    kl, dkl = kl_closed_form(d["lp"], d["ref"], "k3")
    _check(out, grad, d, aggregation, -d["adv"] + beta * kl, -d["adv"] + beta * dkl,
           max_completion_length=batch.shape[1])


# ---------------------------------------------------------------------- section 3: equalities of presets
@budget(0.5)
@given(batch=policy_batches(), eps=st.floats(0.0, 0.5))
def test_dapo_with_equal_epsilons_is_ppo(batch, eps):
    """dapo(epsilon_low = epsilon_high) == ppo with the same epsilon (both token-mean), value and gradient;
    with dapo's own epsilon_low (0.2) that is the ppo preset itself."""
    pairs = [
        (rlzoo.get_loss("dapo", epsilon_high=0.2), rlzoo.get_loss("ppo")),
        (rlzoo.get_loss("dapo", epsilon_low=eps, epsilon_high=eps),
         rlzoo.get_loss("ppo", epsilon_low=eps, epsilon_high=eps)),
    ]
    for dapo, ppo in pairs:
        a, ga, _ = loss_and_grads(dapo, batch)
        b, gb, _ = loss_and_grads(ppo, batch)
        torch.testing.assert_close(a.loss, b.loss, **F64)
        torch.testing.assert_close(ga, gb, **F64)


@budget(0.5)
@given(batch=policy_batches(ref=True, log_ratio_scale=1.0))
def test_two_sided_with_infinite_delta_is_grpo(batch):
    """two_sided with delta -> inf (inf, or 1e6 above every ratio) == grpo's clip with two_sided's beta (0.001)."""
    grpo = rlzoo.get_loss("grpo", beta=0.001)
    ref, gref, _ = loss_and_grads(grpo, batch)
    for delta in (math.inf, 1e6):
        out, grad, _ = loss_and_grads(rlzoo.get_loss("two_sided", delta=delta), batch)
        torch.testing.assert_close(out.loss, ref.loss, **F64)
        torch.testing.assert_close(grad, gref, **F64)


@given(batch=policy_batches(t=1, log_ratio_scale=0.5), name=st.sampled_from(["gspo", "gspo_token", "luspo"]))
def test_gspo_with_one_token_is_token_level_ppo(batch, name):
    """T == 1: the sequence ratio exp(mean_t log r) is the token ratio, so gspo (and gspo_token, luspo) equal
    token-level PPO with the same epsilons and aggregation, in value and gradient."""
    seq = rlzoo.get_loss(name)
    tok = rlzoo.get_loss(name, importance_sampling_level="token")
    a, ga, _ = loss_and_grads(seq, batch)
    b, gb, _ = loss_and_grads(tok, batch)
    torch.testing.assert_close(a.loss, b.loss, **F64)
    torch.testing.assert_close(ga, gb, **F64)


@given(data=st.data())
def test_token_sum_norm_with_equal_lengths_is_seq_mean_token_mean_scaled(data):
    """Every row of length L: seq-mean-token-sum-norm(l) == seq-mean-token-mean(l) * L / max_completion_length
    (for any per-token loss l, and through dr_grpo's loss and gradient)."""
    mask = data.draw(masks(equal_lengths=True, min_len=1))
    length = int(mask[0].sum())
    mcl = data.draw(st.integers(length, 3 * length + 5), label="max_completion_length")
    b, t = mask.shape
    values = torch.tensor(data.draw(st.lists(st.floats(-10, 10), min_size=b * t, max_size=b * t)),
                          dtype=torch.float64).view(b, t)
    normalizer = Normalizer.from_masks(mask)
    norm = aggregations.get("seq-mean-token-sum-norm")()(values, mask, normalizer, mcl)
    mean = aggregations.get("seq-mean-token-mean")()(values, mask, normalizer, mcl)
    torch.testing.assert_close(norm, mean * length / mcl, **F64)

    batch = data.draw(policy_batches(mask=mask))
    a, ga, _ = loss_and_grads(rlzoo.get_loss("dr_grpo", max_completion_length=mcl), batch)
    m, gm, _ = loss_and_grads(rlzoo.get_loss("dr_grpo", aggregation="seq-mean-token-mean"), batch)
    torch.testing.assert_close(a.loss, m.loss * length / mcl, **F64)
    torch.testing.assert_close(ga, gm * length / mcl, **F64)


# ------------------------------------------------------------------- section 3: micro-batches, padding
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@given(data=st.data())
def test_aggregation_by_definition_with_global_counts(aggregation, data):
    """Each aggregation is sum c * l with c from its definition and the Normalizer's counts (N, S), and is
    additive over any partition of the rows when every part uses the full batch's counts."""
    mask = data.draw(masks())
    b, t = mask.shape
    values = torch.tensor(data.draw(st.lists(st.floats(-100, 100), min_size=b * t, max_size=b * t)),
                          dtype=torch.float64).view(b, t)
    n_tok = data.draw(st.integers(0, 60), label="num_tokens")
    n_seq = data.draw(st.integers(0, 10), label="num_sequences")
    mcl = data.draw(st.integers(1, 20), label="max_completion_length")
    agg = aggregations.get(aggregation)()
    got = agg(values, mask, Normalizer(num_tokens=n_tok, num_sequences=n_seq), mcl)
    expected = aggregate(values, mask, aggregation, num_tokens=n_tok, num_sequences=n_seq,
                         max_completion_length=mcl)
    torch.testing.assert_close(got, expected, **F64)

    part = torch.tensor(data.draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    full_norm = Normalizer.from_masks(mask)
    parts = [agg(values[sel], mask[sel], full_norm, mcl) for sel in (part, ~part) if sel.any()]
    torch.testing.assert_close(sum(parts), agg(values, mask, full_norm, mcl), **F64)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@budget(0.5)
@given(data=st.data())
def test_micro_batches_sum_to_full_batch_with_every_optional_part(aggregation, data):
    """For every aggregation, with a KL penalty, IS correction, OPSM and entropy bonus all on: summing the
    micro-batch losses computed with the full batch's Normalizer gives the full-batch loss, and the same
    gradients w.r.t. logprobs and entropies (the bug class of TRL #5619, verl #5625/#5798)."""
    name = data.draw(st.sampled_from(NON_COUPLED), label="preset")
    options = data.draw(loss_options(kl=True, is_correction=True, off_policy_mask=True, entropy_bonus=True))
    options = supported_options(name, options)
    t = data.draw(st.integers(1, 8), label="T")
    loss_fn = rlzoo.get_loss(name, aggregation=aggregation, max_completion_length=t, **options)
    batch = data.draw(policy_batches(t=t, **{"ref": True, "rollout": True, "entropies": True, "entropies_grad": True,
                                             "teacher": True,
                                             **batch_options_for(loss_fn)}))
    full, g_lp, g_ent = loss_and_grads(loss_fn, batch)

    whole = fresh(batch)
    size = data.draw(st.integers(1, batch.shape[0]), label="micro_batch_size")
    normalizer = Normalizer.from_batch(whole, loss=loss_fn)
    total = sum(loss_fn(mb, normalizer=normalizer).loss for mb in whole.split(size))
    got_lp, got_ent = torch.autograd.grad(total, [whole.logprobs, whole.entropies])
    torch.testing.assert_close(total, full.loss, **F64)
    torch.testing.assert_close(got_lp, g_lp, **F64)
    torch.testing.assert_close(got_ent, g_ent, **F64)


@budget(0.5)
@given(data=st.data())
def test_padding_is_inert_with_every_optional_part(data):
    """Garbage (NaN, +-inf, +-1e300) at masked positions, with every optional part on (KL of each estimator,
    IS correction, OPSM, entropy bonus and entropy mask) changes neither loss nor either gradient."""
    name = data.draw(st.sampled_from(rlzoo.list_losses()), label="preset")
    options = data.draw(loss_options(kl=True, is_correction=True, off_policy_mask=True, entropy_bonus=True))
    options = supported_options(name, options)
    options["top_entropy_quantile"] = data.draw(st.sampled_from([0.0, 0.2, 0.9]))
    t = data.draw(st.integers(1, 8), label="T")
    loss_fn = rlzoo.get_loss(name, max_completion_length=t, **options)
    batch = data.draw(policy_batches(t=t, **{"ref": True, "rollout": True, "entropies": True, "entropies_grad": True,
                                             "teacher": True,
                                             **batch_options_for(loss_fn)}))
    clean, g_lp, g_ent = loss_and_grads(loss_fn, batch, seed=3)
    dirty, d_lp, d_ent = loss_and_grads(loss_fn, with_garbage(batch, seed=5), seed=3)
    torch.testing.assert_close(dirty.loss, clean.loss, **F64)
    torch.testing.assert_close(d_lp, g_lp, **F64)
    torch.testing.assert_close(d_ent, g_ent, **F64)
    assert torch.isfinite(d_lp).all() and torch.isfinite(d_ent).all()


# --------------------------------------------------------------------------------------------------- KL
@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
@given(d=st.lists(st.floats(-8.0, 8.0), min_size=1, max_size=30), base=st.floats(-20.0, 0.0))
def test_kl_estimators_by_definition(estimator, d, base):
    """Per-token estimators of KL(pi || ref), delta = logp - ref: k1 = delta, k2 = delta^2 / 2,
    k3 = e^-delta + delta - 1, abs = |delta|; k1+ / k3+ = value of k1 / k3 with the gradient of k2 (delta)."""
    delta = torch.tensor(d, dtype=torch.float64)
    logp = torch.minimum(torch.full_like(delta, base), -delta.clamp(min=0)).requires_grad_(True)
    ref = logp.detach() - delta
    value = kl_estimate(logp.unsqueeze(0), ref.unsqueeze(0), estimator).squeeze(0)
    (grad,) = torch.autograd.grad(value.sum(), logp)
    expected_value, expected_grad = kl_closed_form(logp.detach(), ref, estimator)
    torch.testing.assert_close(value.detach(), expected_value, **F64)
    torch.testing.assert_close(grad, expected_grad, **F64)


@given(d=st.lists(st.floats(-30.0, 30.0), min_size=1, max_size=30))
def test_k3_and_k2_are_nonnegative_and_straight_through_matches(d):
    """k3 = e^-delta + delta - 1 >= 0 and k2 >= 0 for every delta (0 iff delta = 0); k1+ and k3+ have exactly
    the values of k1 and k3 and exactly the gradient of k2."""
    delta = torch.tensor(d, dtype=torch.float64).unsqueeze(0)
    logp = (-delta.clamp(min=0) - 0.1).requires_grad_(True)
    ref = logp.detach() - delta
    values, grads = {}, {}
    for name in KL_ESTIMATORS:
        v = kl_estimate(logp, ref, name)
        values[name] = v.detach()
        (grads[name],) = torch.autograd.grad(v.sum(), logp)
    assert (values["k3"] >= 0).all() and (values["k2"] >= 0).all()
    assert (values["k3"][delta == 0] == 0).all() and (values["k2"][delta == 0] == 0).all()
    assert torch.equal(values["k1+"], values["k1"]) and torch.equal(values["k3+"], values["k3"])
    assert torch.equal(grads["k1+"], grads["k2"]) and torch.equal(grads["k3+"], grads["k2"])


@given(batch=policy_batches(ref=True, log_ratio_scale=0.3), beta=st.floats(0.001, 2.0),
       estimator=st.sampled_from(KL_ESTIMATORS), bias_correction=st.booleans(),
       aggregation=st.sampled_from(AGGREGATIONS))
def test_kl_penalty_adds_beta_times_aggregated_estimate(batch, beta, estimator, bias_correction, aggregation):
    """loss(beta) - loss(0) == beta * agg(k) and the gradients differ by beta * c * dk/dlogp; with
    use_bias_correction_kl (DeepSeek-V3.2) k is multiplied by the token ratio w (gradient k' w + k w).
    The ``kl`` metric is the masked mean of the (corrected) estimate."""
    t = batch.shape[1]
    plain = rlzoo.get_loss("ppo", aggregation=aggregation, max_completion_length=t)
    with_kl = plain.with_options(beta=beta, kl_estimator=estimator, use_bias_correction_kl=bias_correction)
    a, ga, _ = loss_and_grads(plain, batch)
    b, gb, _ = loss_and_grads(with_kl, batch)
    d = _dense(batch)
    k, dk = kl_closed_form(d["lp"], d["ref"], estimator)
    if bias_correction:
        w = torch.exp(d["lr"])
        k, dk = k * w, dk * w + k * w
    c = _weights(d, aggregation, t)
    torch.testing.assert_close(b.loss - a.loss, beta * (c * k).sum(), **F64)
    torch.testing.assert_close(gb - ga, beta * c * dk * d["mask"], **F64)
    if d["mask"].any():
        torch.testing.assert_close(b.metrics["kl"], k[d["mask"]].mean(), **F64)


# ------------------------------------------------------------------------------------------ ratio levels
def _ppo_g(s, adv, el, eh):
    """d l / d log s for l = -min(s A, clip(s) A): -A s on the unclipped branch, else 0."""
    return _ppo_token_loss(s, adv, el, eh)[1]


@budget(0.5)
@given(batch=policy_batches(log_ratio_scale=0.5, per_token_advantages=True),
       aggregation=st.sampled_from(AGGREGATIONS))
def test_sequence_vs_sequence_token_ratio(batch, aggregation):
    """GSPO (eq. 7) and GSPO-token (eq. 13) have the same value s_i = exp(mean_t log r_it) at every token, so
    equal losses and ratio metrics; their gradients differ as documented: with g_it = d l_it / d log s,
    GSPO-token's d loss / d logp_iu = c_iu g_iu (only token u's own term), GSPO's = (1/n_i) sum_t c_it g_it
    (every token of the row, through the mean). Equal when A and c are constant within a row."""
    t = batch.shape[1]
    el, eh = 0.1, 0.15
    seq = rlzoo.get_loss("gspo", epsilon_low=el, epsilon_high=eh, aggregation=aggregation, max_completion_length=t)
    tok = seq.with_options(importance_sampling_level="sequence_token")
    a, ga, _ = loss_and_grads(seq, batch)
    b, gb, _ = loss_and_grads(tok, batch)
    torch.testing.assert_close(a.loss, b.loss, **F64)
    for key in ("ratio/mean", "ratio/min", "ratio/max"):
        torch.testing.assert_close(a.metrics[key], b.metrics[key], **F64)
    d = _dense(batch)
    s = torch.exp(_row_mean(d["lr"], d)).expand_as(d["lr"])
    value, g = _ppo_token_loss(s, d["adv"], el, eh)
    c = _weights(d, aggregation, t)
    torch.testing.assert_close(a.loss, (c * value * d["mask"]).sum(), **F64)
    torch.testing.assert_close(gb, c * g * d["mask"], **F64)
    row = (c * g * d["mask"]).sum(-1, keepdim=True) / d["n"].clamp(min=1)
    torch.testing.assert_close(ga, row * d["mask"], **F64)

    per_seq = fresh(batch, advantages=_row_mean(d["adv"], d).squeeze(-1))
    _, ga2, _ = loss_and_grads(seq, per_seq)
    _, gb2, _ = loss_and_grads(tok, per_seq)
    torch.testing.assert_close(ga2, gb2, **F64)


@given(batch=policy_batches(log_ratio_scale=0.6), el=st.floats(0.0, 0.8), eh=st.floats(0.0, 0.8))
def test_gmpo_clips_tokens_in_log_space(batch, el, eh):
    """GMPO (eq. 4-5): log w_i = mean_t sgn(A) min(sgn(A) l_it, sgn(A) clip(l_it, -eps_low, eps_high)) (token
    clipping in log space), loss = (1/S) sum_i -Abar_i w_i. d loss / d logp_iu = (1/S)(-Abar_i w_i)/n_i on the
    tokens whose unclipped log-ratio was kept (A > 0: l < eps_high; A < 0: l > -eps_low; A = 0: none).
    Metrics: clip_ratio/high_mean = mean[(l outside the range) & (A > 0)], low_mean with A < 0 (as verl)."""
    loss_fn = rlzoo.get_loss("gmpo", epsilon_low=el, epsilon_high=eh)
    d = _dense(batch)
    l, adv, mask = d["lr"], d["adv"], d["mask"]
    assume(not ((l == eh) | (l == -el)).any())
    out, grad, _ = loss_and_grads(loss_fn, batch)
    sgn = torch.sign(adv)
    clipped = torch.clamp(l, -el, eh)
    token = sgn * torch.minimum(sgn * l, sgn * clipped)
    w = torch.exp(_row_mean(token, d))
    abar = _row_mean(adv, d)
    s = max(int(mask.any(-1).sum()), 1)
    torch.testing.assert_close(out.loss, ((-abar * w).squeeze(-1) * mask.any(-1)).sum() / s, **F64)
    kept = ((adv > 0) & (l < eh)) | ((adv < 0) & (l > -el))
    expected = (-abar * w) / d["n"].clamp(min=1) / s * (kept & mask)
    torch.testing.assert_close(grad, expected, **F64)
    n = max(int(mask.sum()), 1)
    outside = (l != clipped) & mask
    high, low = (outside & (adv > 0)).to(torch.float64), (outside & (adv < 0)).to(torch.float64)
    torch.testing.assert_close(out.metrics["clip_ratio/high_mean"], high.sum() / n, **F64)
    torch.testing.assert_close(out.metrics["clip_ratio/low_mean"], low.sum() / n, **F64)


# -------------------------------------------------------------------------------------- token weights
@pytest.mark.parametrize("mode", IS_MODES)
@given(batch=policy_batches(rollout=True), bounds=st.sampled_from([(None, 2.0), (0.5, 1.5), (0.9, None), (0.2, 3.0)]))
def test_is_correction_by_definition(mode, batch, bounds):
    """rho_t = pi_old / pi_sampler = exp(old - rollout) (old = logprobs when None); sequence modes use
    rho_i = exp(sum_t (old - rollout)) at every token. *_truncate clamps rho to [is_min, is_max]; *_mask sets
    it to 0 outside. Detached multiplier: with GPG (l = -A logp), loss = agg(-A logp rho), grad = c(-A rho).
    Metrics: min/mean/max of rho over counted tokens (sequence modes: one per non-empty sequence)."""
    lo, hi = bounds
    if mode.endswith("truncate") and lo is None and hi is None:
        return
    loss_fn = rlzoo.get_loss("gpg", is_correction=mode, is_min=lo, is_max=hi)
    d = _dense(batch)
    mask = d["mask"]
    diff = torch.where(mask, d["old"] - d["rollout"], 0.0)
    sequence = mode.startswith("sequence")
    log_rho = diff.sum(-1, keepdim=True).expand_as(diff) if sequence else diff
    rho = torch.exp(log_rho)
    lo_v = -math.inf if lo is None else lo
    hi_v = math.inf if hi is None else hi
    if mode.endswith("truncate"):
        rho = rho.clamp(min=lo_v, max=hi_v)
    else:
        rho = torch.where((rho >= lo_v) & (rho <= hi_v), rho, 0.0)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "token-mean", -d["adv"] * d["lp"] * rho, -d["adv"] * rho)
    if mask.any():
        stats = rho[mask.any(-1), 0] if sequence else rho[mask]  # sequence rho is constant along its row
        torch.testing.assert_close(out.metrics["sampling/importance_sampling_ratio/min"], stats.min(), **F64)
        torch.testing.assert_close(out.metrics["sampling/importance_sampling_ratio/mean"], stats.mean(), **F64)
        torch.testing.assert_close(out.metrics["sampling/importance_sampling_ratio/max"], stats.max(), **F64)
        torch.testing.assert_close(out.metrics["sampling/sampling_logp_difference/max"], diff[mask].abs().max(), **F64)


@given(batch=policy_batches(log_ratio_scale=0.5), threshold=st.sampled_from([-0.1, 0.0, 0.02, 0.3]))
def test_off_policy_sequence_mask_by_definition(batch, threshold):
    """OPSM (DeepSeek-V3.2): keep token t of row i iff A_it >= 0 or mean_t(log pi_sampler - log pi_theta) <= delta,
    with pi_sampler = rollout_logprobs if given else old_logprobs. With GPG: loss = agg(-A logp M),
    grad = c(-A M); off_policy_mask/dropped_mean = mean of 1 - M over counted tokens."""
    loss_fn = rlzoo.get_loss("gpg", off_policy_mask_threshold=threshold)
    d = _dense(batch)
    sampler = d["rollout"] if d["rollout"] is not None else d["old"]
    drift = _row_mean(sampler - d["lp"], d)
    keep = ((d["adv"] >= 0) | (drift <= threshold)).to(torch.float64)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "token-mean", -d["adv"] * d["lp"] * keep, -d["adv"] * keep)
    n = max(int(d["mask"].sum()), 1)
    torch.testing.assert_close(out.metrics["off_policy_mask/dropped_mean"], ((1 - keep) * d["mask"]).sum() / n, **F64)


@given(data=st.data(), q=st.floats(0.0, 1.0))
def test_masked_quantile_is_torch_quantile(data, q):
    """masked_quantile(values, mask, q) == torch.quantile(values[mask], q) (linear interpolation), and 0 when
    nothing is counted; values at masked positions (even inf) are ignored."""
    mask = data.draw(masks())
    b, t = mask.shape
    values = torch.tensor(data.draw(st.lists(st.floats(-50, 50), min_size=b * t, max_size=b * t)),
                          dtype=torch.float64).view(b, t)
    values = torch.where(mask, values, math.inf)
    got = masked_quantile(values, mask, q)
    if mask.any():
        torch.testing.assert_close(got, torch.quantile(values[mask], q), **F64)
    else:
        assert got == 0


@given(batch=policy_batches(entropies=True, min_counted=1), q=st.sampled_from([0.0, 0.2, 0.5, 0.99]))
def test_entropy_mask_keeps_the_top_quantile(batch, q):
    """Top-entropy-quantile mask (Wang et al. 2025): keep counted tokens with H >= quantile(H[mask], 1 - q)
    (TRL's torch.quantile). With GPG: loss = agg(-A logp M), grad = c(-A M); entropy_mask/kept_mean = mean M."""
    loss_fn = rlzoo.get_loss("gpg", top_entropy_quantile=q)
    d = _dense(batch)
    threshold = torch.quantile(batch.entropies[d["mask"]], 1 - q)
    keep = (d["mask"] & (d["ent"] >= threshold)).to(torch.float64)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "token-mean", -d["adv"] * d["lp"] * keep, -d["adv"] * keep)
    torch.testing.assert_close(out.metrics["entropy_mask/kept_mean"], keep.sum() / d["mask"].sum(), **F64)
    assert keep.sum() >= 1


@given(batch=policy_batches(entropies=True, entropies_grad=True), coef=st.floats(-1.0, 1.0),
       aggregation=st.sampled_from(AGGREGATIONS))
def test_entropy_bonus_is_minus_coef_times_aggregated_entropy(batch, coef, aggregation):
    """Entropy bonus: loss(c) - loss(0) == -c agg(H); d loss / d H = -c c_bt; the logprobs gradient is unchanged."""
    t = batch.shape[1]
    plain = rlzoo.get_loss("dapo", aggregation=aggregation, max_completion_length=t)
    bonus = plain.with_options(entropy_coef=coef)
    a, ga, _ = loss_and_grads(plain, batch)
    b, gb, g_ent = loss_and_grads(bonus, batch)
    d = _dense(batch)
    c = _weights(d, aggregation, t)
    torch.testing.assert_close(b.loss - a.loss, -coef * (c * d["ent"]).sum(), **F64)
    torch.testing.assert_close(gb, ga, **F64)
    if coef != 0:
        torch.testing.assert_close(g_ent, -coef * c, **F64)


# ---------------------------------------------------------------------------------------- surrogates
@given(batch=policy_batches(log_ratio_scale=1.0), el=st.floats(0.0, 1.0), eh=st.floats(0.0, 5.0),
       aggregation=st.sampled_from(AGGREGATIONS))
def test_cispo_gradient_is_clipped_weight_times_reinforce(batch, el, eh, aggregation):
    """CISPO (MiniMax-M1 eq. 4-5): l = -sg[clip(w, 1-eps_low, 1+eps_high)] A logp, so
    d loss / d logp = c * (-clip(w) A): every token keeps a gradient, the weight is only scaled."""
    t = batch.shape[1]
    loss_fn = rlzoo.get_loss("cispo", epsilon_low=el, epsilon_high=eh, aggregation=aggregation,
                             max_completion_length=t)
    d = _dense(batch)
    cw = torch.exp(d["lr"]).clamp(1 - el, 1 + eh)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, aggregation, -cw * d["adv"] * d["lp"], -cw * d["adv"], max_completion_length=t)


@given(batch=policy_batches(log_ratio_scale=0.5), tau_pos=st.floats(0.1, 5.0), tau_neg=st.floats(0.1, 5.0))
def test_sapo_soft_gate_by_definition(batch, tau_pos, tau_neg):
    """SAPO (eq. 5-6): l = -f(w) A, f(w) = (4/tau) sigmoid(tau (w - 1)), tau = tau_pos if A > 0 else tau_neg;
    d l / d logp = -4 sigma (1 - sigma) w A. At w = 1 this is -A (f'(1) = 1: REINFORCE) and l = -2A/tau."""
    loss_fn = rlzoo.get_loss("sapo", tau_pos=tau_pos, tau_neg=tau_neg)
    d = _dense(batch)
    w, adv = torch.exp(d["lr"]), d["adv"]
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
    sig = torch.sigmoid(tau * (w - 1))
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "seq-mean-token-mean", -(4 / tau) * sig * adv, -4 * sig * (1 - sig) * w * adv)
    on_policy = fresh(batch, old_logprobs=None)
    out1, grad1, _ = loss_and_grads(loss_fn, on_policy)
    _check(out1, grad1, d, "seq-mean-token-mean", -2 * adv / tau, -adv)


@given(log_w=st.lists(st.floats(-2.5, 2.0), min_size=2, max_size=12, unique=True),
       tau=st.floats(0.1, 4.0), sign=st.sampled_from([1.0, -1.0]))
def test_sapo_gate_is_monotone(log_w, tau, sign):
    """f_tau(w) = (4/tau) sigmoid(tau (w - 1)) is strictly increasing in w: for A > 0 the per-token loss
    -f(w) A strictly decreases as w grows, for A < 0 it strictly increases."""
    lr = torch.tensor(sorted(log_w), dtype=torch.float64).unsqueeze(0)
    lp = -0.5 + lr.clamp(max=0)  # <= min(0, log r), so old = lp - log r <= 0
    batch = PolicyBatch(logprobs=lp, old_logprobs=lp - lr, advantages=torch.tensor([sign], dtype=torch.float64),
                        completion_mask=torch.ones_like(lr, dtype=torch.bool))
    per_token, _ = _part_output(PolicyLoss(surrogate=SAPO(tau_pos=tau, tau_neg=tau)), batch)
    steps = torch.diff(per_token.squeeze(0))
    gaps = torch.diff(torch.exp(lr.squeeze(0)))
    assume(bool((tau * gaps > 1e-6).all()) and bool((torch.sigmoid(tau * (torch.exp(lr) - 1)) < 1 - 1e-9).all()))
    assert ((steps < 0) if sign > 0 else (steps > 0)).all()


@given(batch=policy_batches(log_ratio_scale=0.2), is_mode=st.sampled_from([None, "token_truncate", "token_mask"]))
def test_vespo_weight_by_definition(batch, is_mode):
    """VESPO (eq. 17, 20): l = -sg[phi(W_i)] A logp, phi(W) = exp(lambda + k log W - lambda W) (so phi(1) = 1),
    log W_i = clamp(sum_t clamp(l_it, -20, 20) [+ sum_t clamp(log rho_t, log 1e-8, 20)], log 1e-8, 20) with
    (k, lambda) = (2, 3) if A >= 0 else (3, 2). phi is detached: d loss / d logp = c * (-phi A)."""
    options = {} if is_mode is None else {"is_correction": is_mode, "is_min": 0.8, "is_max": 1.5}
    loss_fn = rlzoo.get_loss("vespo", **options)
    if is_mode is not None and batch.rollout_logprobs is None:
        batch = fresh(batch, rollout_logprobs=torch.clamp(batch.logprobs.detach() - 0.1, max=0.0))
    d = _dense(batch)
    lower = math.log(1e-8)
    log_w = torch.where(d["mask"], d["lr"].clamp(-20, 20), 0.0).sum(-1, keepdim=True)
    if is_mode is not None:
        rho = torch.exp(torch.where(d["mask"], d["old"] - d["rollout"], 0.0))
        rho = rho.clamp(0.8, 1.5) if is_mode == "token_truncate" else torch.where((rho >= 0.8) & (rho <= 1.5), rho, 0)
        log_w = log_w + torch.where(d["mask"], torch.log(rho).clamp(lower, 20), 0.0).sum(-1, keepdim=True)
    log_w = log_w.clamp(lower, 20).expand_as(d["lr"])
    nonneg = d["adv"] >= 0
    k = torch.where(nonneg, 2.0, 3.0)
    lam = torch.where(nonneg, 3.0, 2.0)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "token-mean", -phi * d["adv"] * d["lp"], -phi * d["adv"])


@given(batch=policy_batches(old="equal", min_counted=1))
def test_vespo_phi_of_one_is_one(batch):
    """On-policy W = 1 and phi(1) = e^lambda 1^k e^-lambda = 1 exactly, for both advantage signs."""
    out = rlzoo.get_loss("vespo")(fresh(batch))
    assert out.metrics["vespo/phi_seq_mean"] == 1


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@given(batch=policy_batches(log_ratio_scale=0.5), eps=st.floats(0.0, 0.3), c=st.floats(0.5, 10.0))
def test_dppo_binary_trust_region_by_definition(name, batch, eps, c):
    """DPPO (eq. 12-14, 23): l = -A sg[min(w, C)] logp M, M = 0 where the token moved out of the trust region
    in the direction of A: TV: A > 0 and p - p_old > eps_high, or A <= 0 and p - p_old < -eps_low; KL:
    D = p_old log(p_old/p) + (1-p_old) log((1-p_old+1e-8)/(1-p+1e-8)) > eps and p moved with A.
    d loss / d logp = c * (-A min(w, C) M). Metrics: dppo/masked_mean = mean(1 - M),
    dppo/truncated_mean = mean(M & w > C)."""
    el, eh = eps, eps * 1.5
    loss_fn = rlzoo.get_loss(name, epsilon_low=el, epsilon_high=eh, clip_ratio_c=c, max_completion_length=8)
    d = _dense(batch)
    p, p_old, adv = torch.exp(d["lp"]), torch.exp(d["old"]), d["adv"]
    if name == "dppo_tv":
        keep = torch.where(adv > 0, p - p_old <= eh, p - p_old >= -el)
    else:
        kl = p_old * (d["old"] - d["lp"]) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        keep = torch.where(adv > 0, (kl <= eh) | (p <= p_old), (kl <= el) | (p >= p_old))
    keep = keep.to(torch.float64)
    w = torch.exp(d["lr"])
    tw = w.clamp(max=c)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "seq-mean-token-sum-norm", -adv * tw * d["lp"] * keep, -adv * tw * keep,
           max_completion_length=8)
    n = max(int(d["mask"].sum()), 1)
    torch.testing.assert_close(out.metrics["dppo/masked_mean"], ((1 - keep) * d["mask"]).sum() / n, **F64)
    torch.testing.assert_close(out.metrics["dppo/truncated_mean"], ((w > c) * keep * d["mask"]).sum() / n, **F64)


@given(batch=policy_batches(log_ratio_scale=0.5), beta=st.floats(0.001, 3.0))
def test_dro_by_definition(batch, beta):
    """DRO (Kimi k1.5 sec. 2.3.2, verl 'dro'): l = -(A logp - beta/2 (logp - logp_old)^2),
    d l / d logp = -(A - beta (logp - logp_old)); metric ppo_kl = mean(old - logp)."""
    loss_fn = rlzoo.get_loss("dro", dro_beta=beta)
    d = _dense(batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "token-mean", -(d["adv"] * d["lp"] - 0.5 * beta * d["lr"] ** 2),
           -(d["adv"] - beta * d["lr"]))


@given(batch=policy_batches(log_ratio_scale=1.0))
def test_gpg_ignores_the_ratio(batch):
    """GPG / REINFORCE: l = -A logp whatever old_logprobs are; d loss / d logp = c * (-A)."""
    loss_fn = rlzoo.get_loss("gpg")
    d = _dense(batch)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _check(out, grad, d, "token-mean", -d["adv"] * d["lp"], -d["adv"])


def _top_k_by_position(cov: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """The k counted entries with the largest cov; ties go to the earlier (row-major) position."""
    flat = [(float(v), -i) for i, (v, m) in enumerate(zip(cov.flatten().tolist(), mask.flatten().tolist())) if m]
    chosen = sorted(flat, reverse=True)[:k]
    out = torch.zeros(cov.numel(), dtype=torch.bool)
    for _, neg_i in chosen:
        out[-neg_i] = True
    return out.view(cov.shape)


@given(batch=policy_batches(log_ratio_scale=0.3), ratio=st.floats(0.01, 1.0), coef=st.floats(0.0, 2.0))
def test_kl_cov_by_definition(batch, ratio, coef):
    """KL-Cov (Cui et al. eq. 13-14): cov_t = (A_t - mean A)(logp_t - mean logp) over counted tokens; the
    k = max(1, floor(ratio N)) largest get kappa |log w|: l = -w A + kappa |l| 1[top-k],
    d l / d logp = -w A + kappa sgn(l) 1[top-k]; kl_cov/penalized_mean = k / N."""
    loss_fn = rlzoo.get_loss("kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef)
    d = _dense(batch)
    mask = d["mask"]
    n = int(mask.sum())
    out, grad, _ = loss_and_grads(loss_fn, batch)
    if n == 0:
        assert out.loss == 0
        return
    cov = (d["adv"] - d["adv"][mask].mean()) * (d["lp"] - d["lp"][mask].mean())
    # The order must not hinge on rounding: covariances either tie exactly (same A and logp: broken by
    # position) or differ clearly; all-zero covariances (one advantage for every token) have no order at all.
    values = cov[mask].sort().values
    gaps = values.diff()
    assume(float(values.abs().max()) > 1e-9 and bool(((gaps == 0) | (gaps > 1e-9)).all()))
    k = max(1, math.floor(ratio * n))
    top = _top_k_by_position(cov, mask, k)
    w, lr = torch.exp(d["lr"]), d["lr"]
    _check(out, grad, d, "token-mean", -w * d["adv"] + coef * lr.abs() * top,
           -w * d["adv"] + coef * torch.sign(lr) * top)
    torch.testing.assert_close(out.metrics["kl_cov/penalized_mean"], torch.tensor(k / n, dtype=torch.float64), **F64)


@given(batch=policy_batches(log_ratio_scale=0.5), ratio=st.floats(0.01, 1.0))
def test_clip_cov_deterministic_cases(batch, ratio):
    """Clip-Cov (Cui et al. eq. 11-12): candidates = counted tokens not clipped by PPO with lb < cov < ub.
    With an empty covariance window nothing is removed: the loss is PPO clip's. With clip_cov_ratio = 1 every
    candidate is removed (count = N >= #candidates): loss and gradient are PPO clip's on the other tokens."""
    d = _dense(batch)
    mask = d["mask"]
    w, adv = torch.exp(d["lr"]), d["adv"]
    ppo, dppo = _ppo_token_loss(w, adv, 0.2, 0.2)
    none = rlzoo.get_loss("clip_cov", clip_cov_lb=1e8, clip_cov_ub=2e8, clip_cov_ratio=ratio)
    out, grad, _ = loss_and_grads(none, batch)
    _check(out, grad, d, "token-mean", ppo, dppo)
    assert out.metrics["clip_cov/removed_mean"] == 0

    every = rlzoo.get_loss("clip_cov", clip_cov_lb=-1e8, clip_cov_ub=1e8, clip_cov_ratio=1.0)
    n = int(mask.sum())
    mean_a = d["adv"][mask].mean() if n else 0.0
    mean_lp = d["lp"][mask].mean() if n else 0.0
    cov = (adv - mean_a) * (d["lp"] - mean_lp)
    clipped_by_ppo = -adv * w.clamp(0.8, 1.2) > -adv * w
    candidates = mask & ~clipped_by_ppo & (cov > -1e8) & (cov < 1e8)
    out, grad, _ = loss_and_grads(every, batch)
    _check(out, grad, d, "token-mean", ppo * ~candidates, dppo * ~candidates)
    removed = candidates.to(torch.float64).sum() / max(n, 1)
    torch.testing.assert_close(out.metrics["clip_cov/removed_mean"], removed, **F64)


@given(batch=policy_batches(old="equal", min_counted=1), ratio=st.floats(0.01, 1.0), seed=st.integers(0, 2**16))
def test_clip_cov_first_iteration_removes_a_random_subset(batch, ratio, seed):
    """Clip-Cov at r = 1 with a window holding every covariance: nothing is PPO-clipped, so every counted token
    is a candidate and exactly k = max(1, floor(ratio N)) of them, drawn with torch's RNG, lose their loss and
    gradient (clip_cov/removed_mean = k / N); every other token keeps REINFORCE's value -A and gradient."""
    loss_fn = rlzoo.get_loss("clip_cov", clip_cov_lb=-1e8, clip_cov_ub=1e8, clip_cov_ratio=ratio)
    d = _dense(batch)
    mask, adv = d["mask"], d["adv"]
    n = int(mask.sum())
    k = max(1, math.floor(ratio * n))
    out, grad, _ = loss_and_grads(loss_fn, batch, seed=seed)
    torch.testing.assert_close(out.metrics["clip_cov/removed_mean"], torch.tensor(k / n, dtype=torch.float64), **F64)
    removed = mask & (grad == 0) & (adv != 0)  # tokens with A = 0 contribute nothing either way
    assert int(removed.sum()) <= k
    kept = mask & ~removed
    _check(out, grad, d, "token-mean", -adv * kept, -adv * kept)


def _distinct_low_precision(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``n`` distinct positive values exactly representable in ``dtype`` (consecutive bit patterns), shuffled."""
    base = 0x3C00 if dtype == torch.bfloat16 else 0x2000  # 2^-7 (bf16), 2^-7 (fp16)
    bits = (base + torch.randperm(n, generator=torch.Generator().manual_seed(seed))).to(torch.int16)
    return bits.view(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [257, 300, 1000, 2500])
@pytest.mark.parametrize("q", [0.0, 0.2, 0.5, 0.8, 1.0])
def test_masked_quantile_of_low_precision_values_is_the_float32_quantile(dtype, n, q):
    """bf16 / fp16 entropies (more than 256 / 2048 counted tokens: N - 1 is not representable there): the
    quantile is computed in float32, as TRL upcasts (``entropies[mask].float()``, then ``torch.quantile``), so
    the index is right and the value is torch.quantile's (not NaN, not an index error at q = 1)."""
    values = _distinct_low_precision(n, dtype, seed=n).view(1, n)
    values = torch.cat([values, torch.full((1, 5), 7.0, dtype=dtype)], dim=1)  # padding
    mask = torch.ones(values.shape, dtype=torch.bool)
    mask[0, -5:] = False
    got = masked_quantile(values, mask, q)
    expected = torch.quantile(values[mask].float(), q)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, **tol(torch.float32))


@pytest.mark.parametrize("q", [0.0, 0.2, 0.5])
def test_entropy_mask_with_bf16_entropies_keeps_trls_tokens(q):
    """top_entropy_quantile on a bf16 loss with 600 counted tokens keeps exactly TRL's tokens: entropies (as
    float32) >= torch.quantile(entropies[mask].float(), 1 - q); q = 0 keeps the single highest-entropy token."""
    n = 600
    ent = _distinct_low_precision(n, torch.bfloat16, seed=3).view(2, n // 2)
    mask = torch.ones(2, n // 2, dtype=torch.bool)
    lp = torch.full((2, n // 2), -0.5, dtype=torch.bfloat16, requires_grad=True)
    batch = PolicyBatch(logprobs=lp, advantages=torch.ones(2, dtype=torch.bfloat16), completion_mask=mask,
                        entropies=ent)
    rlzoo.get_loss("gpg", top_entropy_quantile=q)(batch).loss.backward()
    threshold = torch.quantile(ent[mask].float(), 1 - q)
    kept = (ent.float() >= threshold) & mask
    assert torch.equal(lp.grad != 0, kept)  # GPG: d loss / d logp = -A M / N, 0 exactly where M = 0
    if q == 0.0:
        assert int(kept.sum()) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_batches_are_summed_in_float32(dtype):
    """fp16 log-probs of 65536 counted tokens (32 x 2048, an ordinary batch) gave dapo a loss of -inf and every loss
    a ratio/mean of inf: the sums ran in fp16, which ends at 65504 (bf16 kept 8 bits of them). Every loss now
    computes in float32 at least (its loss and metrics in float32, dr_grpo's too, whose count made it float32
    alone), and the gradient reaches the half-precision log-probs."""
    b, t = 32, 2048
    lp = torch.full((b, t), -0.5, dtype=dtype, requires_grad=True)
    batch = PolicyBatch(logprobs=lp, advantages=torch.ones(b, dtype=dtype),
                        completion_mask=torch.ones(b, t, dtype=torch.bool))
    for name, expected in (("dapo", -1.0), ("cispo", 0.5), ("dr_grpo", -1.0), ("gspo", -1.0)):
        out = rlzoo.get_loss(name, max_completion_length=t)(batch)
        assert out.loss.dtype == torch.float32 and float(out.loss) == expected, name
        assert float(out.metrics["ratio/mean"]) == 1.0
        (grad,) = torch.autograd.grad(out.loss, lp)
        assert grad.dtype == dtype and bool(torch.isfinite(grad).all())


@pytest.mark.parametrize(("rollout_rs", "threshold"), [("token_k1", "0.9_1.1"), ("seq_mean_k1", "0.99_1.01"),
                                                       ("token_k2", "0.005")])
def test_a_half_precision_batch_counts_the_tokens_its_loss_keeps(rollout_rs, threshold):
    """bf16 log-probs with float32 sampler log-probs (TRL's inputs beside vLLM's): loss_mask judged the rejection in
    bf16 (the sampler's log-probs cast down) while the loss judged it in float32, so a Normalizer from loss_mask
    counted other tokens than the loss kept (7-12 % of them) and micro-batch losses no longer summed to the
    full-batch loss. Both judge in float32 now: the same mask, and the sum is the full-batch loss."""
    g = torch.Generator().manual_seed(5)
    b, t = 16, 64
    old = (-3 * torch.rand(b, t, generator=g)).bfloat16()
    lp = (old.float() + 0.05 * torch.randn(b, t, generator=g)).clamp(max=0).bfloat16().requires_grad_()
    rollout = old.float() + 0.1 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.9
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, rollout_logprobs=rollout.clamp(max=0),
                        advantages=torch.randn(b, generator=g).bfloat16(), completion_mask=mask)
    loss_fn = rlzoo.get_loss("dapo", rollout_rs=rollout_rs, rollout_rs_threshold=threshold)
    counted = loss_fn.loss_mask(mask, old_logprobs=old, rollout_logprobs=batch.rollout_logprobs)
    assert 0 < int(counted.sum()) < int(mask.sum())  # some tokens rejected, some kept
    normalizer = rlzoo.Normalizer.from_batch(batch, loss=loss_fn)
    assert float(normalizer.num_tokens) == float(counted.sum())
    whole = loss_fn(batch)
    parts = sum(loss_fn(micro, normalizer=normalizer).loss for micro in batch.split(4))
    torch.testing.assert_close(parts, whole.loss, rtol=1e-6, atol=1e-7)
