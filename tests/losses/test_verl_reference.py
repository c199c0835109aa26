"""rlzoo against verl 0.9.1 ``core_algos`` (the oracle, called, never copied), where rlzoo claims to match verl.

Loss values and gradients w.r.t. the log-probs agree within tolerances.REFERENCE_ATOL in float64. Inputs stay
where verl's stability clamps are inactive: |log r| < 20 (vanilla, sapo, cispo, dppo), log s < 10 (gspo),
|ref - logp| small enough for low_var_kl's [-10, 10] clamp. verl's seq-mean-token-mean divides by
n_i + 1e-8 (a relative difference below 1e-8). verl reads its options from an ``ActorConfig``; the
optimizer-step counts go in ``config.global_batch_info`` (batch_num_tokens, global_batch_size,
loss_scale_factor), as verl.workers.utils.losses.ppo_loss sets them; rlzoo gets the same counts as a
Normalizer and max_completion_length.
"""

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from oracles import verl_core_algos
from strategies import AGGREGATIONS, budget, fresh, loss_and_grads, policy_batches
from tolerances import REFERENCE_ATOL

import rlzoo
from rlzoo import Normalizer, PolicyBatch
from rlzoo.losses import aggregations, kl_estimate

ATOL = {"atol": REFERENCE_ATOL, "rtol": 0.0}
# Half the profile's examples per comparison (20 with ci); HYPOTHESIS_PROFILE=thorough scales it up.
REFERENCE_BUDGET = budget(0.5)
VERL_KL_NAMES = {"k1": ("kl", "k1"), "k2": ("mse", "k2"), "k3": ("low_var_kl", "k3"), "abs": ("abs",),
                 "k1+": ("k1+", "kl+"), "k3+": ("k3+", "low_var_kl+"), "low_var_kl": ("low_var_kl", "k3"),
                 "low_var_kl+": ("low_var_kl+", "k3+")}
_POLICY_LOSS_FIELDS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")


@pytest.fixture(scope="module")
def verl():
    return verl_core_algos()


def _config(global_batch_info=None, **options):
    """verl's ActorConfig with clip ratios, SAPO taus, clip_ratio_c and policy_loss.* options."""
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    policy_loss = PolicyLossConfig(**{k: options.pop(k) for k in list(options) if k in _POLICY_LOSS_FIELDS})
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss,
                       global_batch_info=dict(global_batch_info or {}), **options)


def _token_adv(batch: PolicyBatch) -> torch.Tensor:
    """Advantages as verl takes them: [B, T] (a per-sequence advantage repeated over the tokens)."""
    adv = batch.advantages
    return (adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv).contiguous()


def _verl_call(verl, mode, batch, loss_agg_mode, config, rollout_is_weights=None):
    """(loss, d loss / d log_prob, metrics) of verl's registered policy loss ``mode`` on ``batch``."""
    log_prob = batch.logprobs.detach().clone().requires_grad_(True)
    adv = _token_adv(batch)
    old = log_prob.detach() if batch.old_logprobs is None else batch.old_logprobs
    loss, metrics = verl.get_policy_loss_fn(mode)(
        old_log_prob=old, log_prob=log_prob, advantages=adv,
        response_mask=batch.completion_mask.to(torch.float64), loss_agg_mode=loss_agg_mode, config=config,
        rollout_is_weights=rollout_is_weights,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad, metrics


def _counts(full: PolicyBatch) -> tuple[dict, Normalizer]:
    """Optimizer-step counts of ``full``, for verl (global_batch_info) and for rlzoo (Normalizer)."""
    mask = full.completion_mask
    n_tok, n_seq = int(mask.sum()), int(mask.any(-1).sum())
    return ({"batch_num_tokens": n_tok, "global_batch_size": n_seq},
            Normalizer(num_tokens=n_tok, num_sequences=n_seq))


@st.composite
def micro_batches(draw, **kw):
    """(micro-batch, global counts for verl, Normalizer for rlzoo): a row subset of a bigger batch, with at least
    one counted token (verl divides 0 by 0 on an empty batch; rlzoo clamps the counts to 1 and returns 0)."""
    full = draw(policy_batches(old=True, log_ratio_scale=draw(st.sampled_from((0.05, 0.3, 1.0))),
                               certain_tokens=False, min_counted=1, **kw))
    info, normalizer = _counts(full)
    b = full.shape[0]
    keep = torch.tensor(draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    non_empty = full.completion_mask.any(-1).nonzero().flatten()
    keep[non_empty[draw(st.integers(0, len(non_empty) - 1))]] = True
    fields = {f: getattr(full, f) for f in ("advantages", "completion_mask", "old_logprobs", "ref_logprobs",
                                             "rollout_logprobs", "entropies")}
    fields = {k: (None if v is None else v[keep]) for k, v in fields.items()}
    micro = PolicyBatch(logprobs=full.logprobs.detach()[keep].clone().requires_grad_(True), **fields)
    return micro, info, normalizer


def _compare(out, grad, verl_loss, verl_grad):
    torch.testing.assert_close(out.loss.detach(), verl_loss, **ATOL)
    torch.testing.assert_close(grad, verl_grad, **ATOL)


# --------------------------------------------------------------------------------------------- aggregation
@pytest.mark.parametrize("mode", AGGREGATIONS)
@REFERENCE_BUDGET
@given(data=st.data())
def test_agg_loss(verl, mode, data):
    """Every aggregation equals verl's agg_loss(loss_mat, mask, mode, batch_num_tokens=N, global_batch_size=S,
    loss_scale_factor=L) with the optimizer-step counts, in value and in its gradient w.r.t. loss_mat; and
    with the micro-batch's own counts (no global info; seq-mean-token-sum-norm then uses L = T in verl)."""
    micro, info, normalizer = data.draw(micro_batches())
    b, t = micro.shape
    values = torch.randn(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(b * 31 + t))
    scale = data.draw(st.integers(t, 4 * t), label="max_completion_length")
    mask = micro.completion_mask
    for verl_info, rlzoo_norm, mcl in (({**info, "loss_scale_factor": scale}, normalizer, scale),
                                       ({}, Normalizer.from_masks(mask), t)):
        x = values.clone().requires_grad_(True)
        got = aggregations.get(mode)()(x, mask, rlzoo_norm, mcl)
        (g_got,) = torch.autograd.grad(got, x)
        y = values.clone().requires_grad_(True)
        want = verl.agg_loss(y, mask.to(torch.float64), mode, **verl_info)
        (g_want,) = torch.autograd.grad(want, y)
        torch.testing.assert_close(got, want.to(got.dtype), **ATOL)
        torch.testing.assert_close(g_got, g_want, **ATOL)


# ---------------------------------------------------------------------------------------------- vanilla PPO
@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), c=st.floats(1.01, 10.0),
       el=st.floats(0.0, 0.5), eh=st.floats(0.0, 0.5))
def test_vanilla_is_ppo_with_dual_clip(verl, data, agg, c, el, eh):
    """verl loss_mode='vanilla' (always dual-clipped with clip_ratio_c) == rlzoo ppo(dual_clip=clip_ratio_c) with
    the same clip range and aggregation; pg_clipfrac == clip_ratio/region_mean, pg_clipfrac_lower ==
    clip_ratio/dual_mean."""
    micro, info, normalizer = data.draw(micro_batches())
    t = micro.shape[1]
    config = _config({**info, "loss_scale_factor": t}, clip_ratio_low=el, clip_ratio_high=eh, clip_ratio_c=c)
    loss_fn = rlzoo.get_loss("ppo", epsilon_low=el, epsilon_high=eh, dual_clip=c, aggregation=agg,
                             max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    v_loss, v_grad, v_metrics = _verl_call(verl, "vanilla", micro, agg, config)
    _compare(out, grad, v_loss, v_grad)
    assert out.metrics["clip_ratio/region_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=REFERENCE_ATOL)
    assert out.metrics["clip_ratio/dual_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac_lower"],
                                                                       abs=REFERENCE_ATOL)


@REFERENCE_BUDGET
@given(data=st.data(), mode=st.sampled_from(["token_truncate", "token_mask"]))
def test_rollout_is_weights_multiply_the_policy_loss(verl, data, mode):
    """A token IS correction multiplies the per-token loss where verl multiplies rollout_is_weights:
    rlzoo ppo(dual_clip=3, is_correction=token_*) == verl vanilla with rollout_is_weights = rho (computed from
    the definition, rho = exp(old - rollout) truncated to <= 2 or masked outside [0.5, 2])."""
    micro, info, normalizer = data.draw(micro_batches(rollout=True))
    mask = micro.completion_mask
    rho = torch.exp(torch.where(mask, micro.old_logprobs - micro.rollout_logprobs, 0.0))
    if mode == "token_truncate":
        rho, opts = rho.clamp(max=2.0), {"is_max": 2.0}
    else:
        rho, opts = torch.where((rho >= 0.5) & (rho <= 2.0), rho, 0.0), {"is_min": 0.5, "is_max": 2.0}
    loss_fn = rlzoo.get_loss("ppo", dual_clip=3.0, is_correction=mode, **opts)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    v_loss, v_grad, _ = _verl_call(verl, "vanilla", micro, "token-mean", _config(info), rollout_is_weights=rho)
    _compare(out, grad, v_loss, v_grad)


@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), estimator=st.sampled_from(sorted(VERL_KL_NAMES)),
       beta=st.floats(0.001, 1.0), coeff=st.floats(-0.1, 0.1))
def test_actor_loss_with_kl_and_entropy(verl, data, agg, estimator, beta, coeff):
    """verl's actor loss (workers/utils/losses.py ppo_loss): pg_loss - entropy_coeff * agg(H) +
    kl_loss_coef * agg(kl_penalty(logp, ref, kl_loss_type)), all with the same loss_agg_mode and global counts
    == rlzoo ppo(dual_clip=3, beta, kl_estimator, entropy_coef) (value and gradient w.r.t. logp)."""
    micro, info, normalizer = data.draw(micro_batches(ref=True, entropies=True))
    t = micro.shape[1]
    verl_info = {**info, "loss_scale_factor": t}
    loss_fn = rlzoo.get_loss("ppo", dual_clip=3.0, beta=beta, kl_estimator=estimator, entropy_coef=coeff,
                             aggregation=agg, max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)

    log_prob = micro.logprobs.detach().clone().requires_grad_(True)
    adv = _token_adv(micro)
    mask = micro.completion_mask.to(torch.float64)
    pg, _ = verl.compute_policy_loss_vanilla(micro.old_logprobs, log_prob, adv, mask, agg, _config(verl_info))
    kld = verl.kl_penalty(log_prob, micro.ref_logprobs, VERL_KL_NAMES[estimator][0])
    total = (pg - coeff * verl.agg_loss(micro.entropies, mask, agg, **verl_info)
             + beta * verl.agg_loss(kld, mask, agg, **verl_info))
    (v_grad,) = torch.autograd.grad(total, log_prob)
    _compare(out, grad, total.detach(), v_grad)


@REFERENCE_BUDGET
@given(d=st.lists(st.floats(-40.0, 40.0), min_size=1, max_size=40), base=st.floats(-5.0, 0.0),
       estimator=st.sampled_from(["low_var_kl", "low_var_kl+"]))
def test_low_var_kl_is_verls_clamped_k3(verl, d, base, estimator):
    """verl 0.9.1's kl_penalty "k3" and "low_var_kl" are one estimator, clamped (the log-ratio ref - logp to
    [-20, 20], the estimate to [-10, 10]); "k3+" / "low_var_kl+" take its value with k2's gradient. rlzoo's
    "low_var_kl" / "low_var_kl+" equal them in value and gradient, clamps active (|ref - logp| up to 40; k3
    beyond 10), while rlzoo's "k3" (TRL's) is not clamped."""
    delta = torch.tensor(d, dtype=torch.float64).unsqueeze(0)
    logp = torch.minimum(torch.full_like(delta, base), -delta.clamp(min=0)).requires_grad_(True)
    ref = logp.detach() - delta
    got = kl_estimate(logp, ref, estimator)
    (g_got,) = torch.autograd.grad(got.sum(), logp)
    for verl_name in ((estimator, estimator.replace("low_var_kl", "k3"))):
        lp = logp.detach().clone().requires_grad_(True)
        want = verl.kl_penalty(lp, ref, verl_name)
        (g_want,) = torch.autograd.grad(want.sum(), lp)
        torch.testing.assert_close(got.detach(), want.detach(), **ATOL)
        torch.testing.assert_close(g_got, g_want, **ATOL)
    unclamped = kl_estimate(logp.detach(), ref, "k3")
    clamped = (ref - logp.detach()).abs() > 20
    assert (got.detach() <= 10).all()
    if bool((unclamped > 10).any()) or bool(clamped.any()):
        assert not torch.allclose(unclamped, got.detach())


# ------------------------------------------------------------------------------------------ other losses
@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), el=st.floats(0.0, 0.3), eh=st.floats(0.0, 0.3))
def test_gspo_is_gspo_token(verl, data, agg, el, eh):
    """verl loss_mode='gspo' builds the GSPO-token ratio sg[s_i] pi / sg[pi] (log clamp at 10, inactive here):
    == rlzoo gspo_token with the same clip range and aggregation, for per-token advantages too. With
    per-sequence advantages it also equals rlzoo gspo (sequence ratio): same value and gradient."""
    micro, info, normalizer = data.draw(micro_batches(per_token_advantages=False))
    t = micro.shape[1]
    config = _config({**info, "loss_scale_factor": t}, clip_ratio_low=el, clip_ratio_high=eh)
    v_loss, v_grad, _ = _verl_call(verl, "gspo", micro, agg, config)
    for name in ("gspo_token", "gspo"):
        loss_fn = rlzoo.get_loss(name, epsilon_low=el, epsilon_high=eh, aggregation=agg, max_completion_length=t)
        out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
        _compare(out, grad, v_loss, v_grad)
    token_adv = fresh(micro, advantages=_token_adv(micro) * torch.linspace(0.5, 1.5, t, dtype=torch.float64))
    v_loss, v_grad, _ = _verl_call(verl, "gspo", token_adv, agg, config)
    loss_fn = rlzoo.get_loss("gspo_token", epsilon_low=el, epsilon_high=eh, aggregation=agg, max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, token_adv, normalizer)
    _compare(out, grad, v_loss, v_grad)


@REFERENCE_BUDGET
@given(data=st.data(), tau_pos=st.floats(0.2, 3.0), tau_neg=st.floats(0.2, 3.0))
def test_sapo(verl, data, tau_pos, tau_neg):
    """verl loss_mode='sapo' (forces seq-mean-token-mean) == rlzoo sapo(tau_pos, tau_neg)."""
    micro, info, normalizer = data.draw(micro_batches(per_token_advantages=None))
    out, grad, _ = loss_and_grads(rlzoo.get_loss("sapo", tau_pos=tau_pos, tau_neg=tau_neg), micro, normalizer)
    config = _config(info, tau_pos=tau_pos, tau_neg=tau_neg)
    v_loss, v_grad, _ = _verl_call(verl, "sapo", micro, "token-mean", config)  # the mode argument is ignored
    _compare(out, grad, v_loss, v_grad)


@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS))
def test_gpg(verl, data, agg):
    """verl loss_mode='gpg' (-log_prob * A, aggregated) == rlzoo gpg with the same aggregation."""
    micro, info, normalizer = data.draw(micro_batches(per_token_advantages=None))
    t = micro.shape[1]
    out, grad, _ = loss_and_grads(rlzoo.get_loss("gpg", aggregation=agg, max_completion_length=t), micro, normalizer)
    v_loss, v_grad, _ = _verl_call(verl, "gpg", micro, agg, _config({**info, "loss_scale_factor": t}))
    _compare(out, grad, v_loss, v_grad)


@REFERENCE_BUDGET
@given(batch=policy_batches(old=True, min_len=1, log_ratio_scale=0.5, per_token_advantages=None,
                            certain_tokens=False),
       eps=st.floats(0.05, 0.6), is_mode=st.sampled_from([None, "token_truncate"]))
def test_geo_mean_is_gmpo(verl, batch, eps, is_mode):
    """verl loss_mode='geo_mean' == rlzoo gmpo (clip_ratio = epsilon in log space), per-token advantages
    included; verl averages with torch.mean over the rows of its micro-batch, so every row is non-empty here.
    With rollout_is_weights both weight a sequence by the geometric mean of its token IS weights.
    Metrics: pg_clipfrac == clip_ratio/high_mean, pg_clipfrac_lower == clip_ratio/low_mean."""
    options, rho = {}, None
    if is_mode is not None:
        rollout = torch.clamp(batch.old_logprobs - 0.3 * torch.sin(torch.arange(batch.shape[1], dtype=torch.float64)),
                              max=0.0)
        batch = fresh(batch, rollout_logprobs=rollout)
        rho = torch.exp(torch.where(batch.completion_mask, batch.old_logprobs - rollout, 0.0)).clamp(max=1.5)
        options = {"is_correction": is_mode, "is_max": 1.5}
    out, grad, _ = loss_and_grads(rlzoo.get_loss("gmpo", epsilon_low=eps, epsilon_high=eps, **options), batch)
    config = _config(clip_ratio=eps, clip_ratio_low=eps, clip_ratio_high=eps)
    v_loss, v_grad, v_metrics = _verl_call(verl, "geo_mean", batch, "token-mean", config, rollout_is_weights=rho)
    _compare(out, grad, v_loss, v_grad)
    assert out.metrics["clip_ratio/high_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=REFERENCE_ATOL)
    assert out.metrics["clip_ratio/low_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac_lower"], abs=REFERENCE_ATOL)


@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), beta=st.floats(0.001, 2.0))
def test_dro(verl, data, agg, beta):
    """verl loss_mode='dro' (policy_loss.dro_beta) == rlzoo dro(dro_beta); actor/ppo_kl == ppo_kl."""
    micro, info, normalizer = data.draw(micro_batches(per_token_advantages=None))
    t = micro.shape[1]
    loss_fn = rlzoo.get_loss("dro", dro_beta=beta, aggregation=agg, max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    v_loss, v_grad, v_metrics = _verl_call(verl, "dro", micro, agg,
                                           _config({**info, "loss_scale_factor": t}, dro_beta=beta))
    _compare(out, grad, v_loss, v_grad)
    assert out.metrics["ppo_kl"].item() == pytest.approx(v_metrics["actor/ppo_kl"], abs=REFERENCE_ATOL)


@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), el=st.floats(0.0, 1.0), eh=st.floats(0.0, 5.0))
def test_cispo(verl, data, agg, el, eh):
    """verl loss_mode='cispo' (sg[clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] A logp) == rlzoo cispo."""
    micro, info, normalizer = data.draw(micro_batches(per_token_advantages=None))
    t = micro.shape[1]
    loss_fn = rlzoo.get_loss("cispo", epsilon_low=el, epsilon_high=eh, aggregation=agg, max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    config = _config({**info, "loss_scale_factor": t}, clip_ratio_low=el, clip_ratio_high=eh)
    v_loss, v_grad, _ = _verl_call(verl, "cispo", micro, agg, config)
    _compare(out, grad, v_loss, v_grad)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), eps=st.floats(0.0, 0.3), c=st.floats(0.5, 30.0))
def test_dppo(verl, name, data, agg, eps, c):
    """verl loss_mode='dppo_tv' / 'dppo_kl' (clip_ratio_low/high = divergence thresholds, clip_ratio_c = the IS
    truncation, set explicitly) == rlzoo's; pg_clipfrac == dppo/masked_mean, pg_clipfrac_lower ==
    dppo/truncated_mean."""
    micro, info, normalizer = data.draw(micro_batches(per_token_advantages=None))
    t = micro.shape[1]
    el, eh = eps, 0.7 * eps
    loss_fn = rlzoo.get_loss(name, epsilon_low=el, epsilon_high=eh, clip_ratio_c=c, aggregation=agg,
                             max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    config = _config({**info, "loss_scale_factor": t}, clip_ratio_low=el, clip_ratio_high=eh, clip_ratio_c=c)
    v_loss, v_grad, v_metrics = _verl_call(verl, name, micro, agg, config)
    _compare(out, grad, v_loss, v_grad)
    assert out.metrics["dppo/masked_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=REFERENCE_ATOL)
    assert out.metrics["dppo/truncated_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac_lower"],
                                                                      abs=REFERENCE_ATOL)


@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), ratio=st.floats(1e-3, 1.0), coef=st.floats(0.0, 2.0))
def test_kl_cov(verl, data, agg, ratio, coef):
    """verl loss_mode='kl_cov' (top max(1, int(kl_cov_ratio N)) covariance tokens of the micro-batch get
    ppo_kl_coef |log r|) == rlzoo kl_cov on the same micro-batch (deterministic; no tied covariances here)."""
    micro, info, normalizer = data.draw(micro_batches())
    mask = micro.completion_mask
    adv, lp = _token_adv(micro)[mask], micro.logprobs.detach()[mask]
    cov = ((adv - adv.mean()) * (lp - lp.mean())).sort().values
    assume(bool((cov.diff() > 1e-12).all()))  # ties (e.g. one advantage for the whole batch) have no set order
    t = micro.shape[1]
    loss_fn = rlzoo.get_loss("kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef, aggregation=agg,
                             max_completion_length=t)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    config = _config({**info, "loss_scale_factor": t}, kl_cov_ratio=ratio, ppo_kl_coef=coef)
    v_loss, v_grad, v_metrics = _verl_call(verl, "kl_cov", micro, agg, config)
    _compare(out, grad, v_loss, v_grad)
    assert out.metrics["ppo_kl_abs"].item() == pytest.approx(v_metrics["actor/ppo_kl"], abs=REFERENCE_ATOL)


@pytest.mark.parametrize("window", ["empty", "everything"])
@REFERENCE_BUDGET
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), el=st.floats(0.0, 0.4), eh=st.floats(0.0, 0.4))
def test_clip_cov_deterministic(verl, window, data, agg, el, eh):
    """verl loss_mode='clip_cov' draws the removed tokens at random, so only draws with one outcome compare:
    an empty covariance window (nothing removed: plain PPO clip) and clip_cov_ratio = 1 with a window holding
    every covariance (every candidate removed). pg_clipfrac == clip_cov/removed_mean."""
    micro, info, normalizer = data.draw(micro_batches())
    t = micro.shape[1]
    bounds = {"clip_cov_lb": 1e8, "clip_cov_ub": 2e8} if window == "empty" else {"clip_cov_lb": -1e8,
                                                                                  "clip_cov_ub": 1e8}
    ratio = data.draw(st.floats(1e-3, 1.0), label="clip_cov_ratio") if window == "empty" else 1.0
    loss_fn = rlzoo.get_loss("clip_cov", epsilon_low=el, epsilon_high=eh, clip_cov_ratio=ratio, aggregation=agg,
                             max_completion_length=t, **bounds)
    out, grad, _ = loss_and_grads(loss_fn, micro, normalizer)
    config = _config({**info, "loss_scale_factor": t}, clip_ratio_low=el, clip_ratio_high=eh, clip_cov_ratio=ratio,
                     **bounds)
    v_loss, v_grad, v_metrics = _verl_call(verl, "clip_cov", micro, agg, config)
    _compare(out, grad, v_loss, v_grad)
    assert out.metrics["clip_cov/removed_mean"].item() == pytest.approx(v_metrics["actor/pg_clipfrac"], abs=REFERENCE_ATOL)


# ------------------------------------------------------------------------------------------------------ KL
@pytest.mark.parametrize("estimator", sorted(VERL_KL_NAMES))
@REFERENCE_BUDGET
@given(d=st.lists(st.floats(-2.0, 2.0), min_size=1, max_size=24), base=st.floats(-10.0, 0.0))
def test_kl_penalty(verl, estimator, d, base):
    """rlzoo's kl_estimate(logp, ref, k) == verl's kl_penalty(logp, ref, name) for each of verl's spellings
    (kl/k1, mse/k2, low_var_kl/k3 (its clamps inactive for |delta| <= 2), abs, and the '+' straight-through
    variants), in value and gradient w.r.t. logp."""
    delta = torch.tensor(d, dtype=torch.float64).unsqueeze(0)
    logp = torch.minimum(torch.full_like(delta, base), delta.clamp(max=0))
    ref = logp - delta
    x = logp.clone().requires_grad_(True)
    ours = kl_estimate(x, ref, estimator)
    (g_ours,) = torch.autograd.grad(ours.sum(), x)
    for name in VERL_KL_NAMES[estimator]:
        y = logp.clone().requires_grad_(True)
        theirs = verl.kl_penalty(y, ref, name)
        (g_theirs,) = torch.autograd.grad(theirs.sum(), y)
        torch.testing.assert_close(ours.detach(), theirs.detach(), **ATOL)
        torch.testing.assert_close(g_ours, g_theirs, **ATOL)


def test_verl_is_the_oracle_we_think(verl):
    """Guard: the oracle is verl 0.9.1 and has every loss mode compared above (a renamed mode fails loudly)."""
    import verl as verl_pkg

    assert verl_pkg.__version__.startswith("0.9.1")
    for mode in ("vanilla", "gspo", "sapo", "gpg", "geo_mean", "dro", "cispo", "dppo_tv", "dppo_kl", "kl_cov",
                 "clip_cov"):
        assert callable(verl.get_policy_loss_fn(mode))
    assert math.isclose(_config().clip_ratio_c, 3.0)  # why vanilla is compared with dual_clip set
