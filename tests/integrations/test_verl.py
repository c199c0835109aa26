"""``rlzoo.integrations.verl.register`` against verl 0.9.1 (the oracle, imported with ``ray`` stubbed).

For every loss verl has, the rlzoo loss registered into verl's policy-loss registry and fetched back with
verl's own ``get_policy_loss_fn`` returns verl's loss and gradient (w.r.t. ``log_prob``) on random float64
micro-batches: with verl's global batch info (a micro-batch of a bigger mini-batch), any ``loss_agg_mode`` and
``rollout_is_weights`` (zeros included). Inputs stay where verl's stability clamps are inactive (|log r| < 20),
but for GSPO's log ratio (clamped at 10, which ``max_log_ratio=10.0`` gives rlzoo). Micro-batches with the global info sum to the whole batch, across data-parallel ranks
too. Last, verl's own actor loss (``verl.workers.utils.losses.ppo_loss``) picks the registered loss from
``ActorConfig.policy_loss.loss_mode``.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from oracles import verl_core_algos
from strategies import AGGREGATIONS, budget, policy_batches
from tolerances import REFERENCE_ATOL

import rlzoo
from rlzoo import BatchError, PolicyBatch
from rlzoo.integrations.verl import VerlPolicyLoss, register

ATOL = {"atol": REFERENCE_ATOL, "rtol": 0.0}
BUDGET = budget(0.5)
F64 = torch.float64


@pytest.fixture(scope="module")
def verl():
    """verl's core_algos; its policy-loss registry is restored after the module's registrations."""
    core_algos = verl_core_algos()
    saved = dict(core_algos.POLICY_LOSS_REGISTRY)
    yield core_algos
    core_algos.POLICY_LOSS_REGISTRY.clear()
    core_algos.POLICY_LOSS_REGISTRY.update(saved)


def actor_config(global_batch_info=None, **options):
    """verl's ActorConfig with clip ratios, SAPO taus, clip_ratio_c, policy_loss.* options and the batch info."""
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    policy = {k: options.pop(k) for k in list(options) if k in ("dro_beta", "loss_mode", "kl_cov_ratio", "ppo_kl_coef")}
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       policy_loss=PolicyLossConfig(**policy), global_batch_info=dict(global_batch_info or {}),
                       **options)


def call(fn, batch: PolicyBatch, mode: str, config, weights=None):
    """(loss, d loss / d log_prob, metrics) of a verl policy-loss function on ``batch``."""
    log_prob = batch.logprobs.detach().clone().requires_grad_(True)
    adv = batch.advantages
    adv = (adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv).contiguous()
    loss, metrics = fn(old_log_prob=batch.old_logprobs, log_prob=log_prob, advantages=adv,
                       response_mask=batch.completion_mask.to(F64), loss_agg_mode=mode, config=config,
                       rollout_is_weights=weights)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad, metrics


def rows(batch: PolicyBatch, keep: torch.Tensor) -> PolicyBatch:
    """The rows ``keep`` of ``batch`` (a micro-batch)."""
    return PolicyBatch(logprobs=batch.logprobs.detach()[keep], old_logprobs=batch.old_logprobs[keep],
                       advantages=batch.advantages[keep], completion_mask=batch.completion_mask[keep])


@st.composite
def weights_for(draw, batch: PolicyBatch):
    """None, or verl-style rollout_is_weights: exp(noise), truncated, some zeroed (masked IS)."""
    if not draw(st.booleans()):
        return None
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    w = torch.exp(0.3 * torch.randn(batch.shape, generator=g, dtype=F64)).clamp(max=1.5)
    return torch.where(torch.rand(batch.shape, generator=g, dtype=F64) < 0.1, 0.0, w)


def case(name: str, data: st.DataObject):
    """(verl loss_mode, the rlzoo loss, verl config options, follow_loss_agg_mode) for verl's ``name``."""
    el, eh = data.draw(st.floats(0.05, 0.4), label="el"), data.draw(st.floats(0.05, 0.4), label="eh")
    if name == "vanilla":
        c = data.draw(st.floats(1.5, 10.0), label="clip_ratio_c")
        return rlzoo.get_loss("ppo", epsilon_low=el, epsilon_high=eh, dual_clip=c), {
            "clip_ratio_low": el, "clip_ratio_high": eh, "clip_ratio_c": c}, True
    if name == "gspo":  # verl's gspo is the GSPO-token ratio, its log clamped at 10
        return rlzoo.get_loss("gspo_token", epsilon_low=el, epsilon_high=eh, max_log_ratio=10.0), {
            "clip_ratio_low": el, "clip_ratio_high": eh}, True
    if name == "gpg":
        return rlzoo.get_loss("gpg"), {}, True
    if name == "cispo":
        eh = data.draw(st.floats(0.0, 4.0), label="cispo eh")
        return rlzoo.get_loss("cispo", epsilon_low=el, epsilon_high=eh), {
            "clip_ratio_low": el, "clip_ratio_high": eh}, True
    if name == "sapo":  # verl always aggregates sapo with seq-mean-token-mean
        tp, tn = data.draw(st.floats(0.2, 3.0), label="tau_pos"), data.draw(st.floats(0.2, 3.0), label="tau_neg")
        return rlzoo.get_loss("sapo", tau_pos=tp, tau_neg=tn), {"tau_pos": tp, "tau_neg": tn}, False
    if name == "geo_mean":  # verl ignores loss_agg_mode (a row mean): gmpo keeps seq-mean-token-mean
        return rlzoo.get_loss("gmpo", epsilon_low=el, epsilon_high=el), {
            "clip_ratio": el, "clip_ratio_low": el, "clip_ratio_high": el}, False
    if name in ("dppo_tv", "dppo_kl"):
        c = data.draw(st.floats(0.5, 30.0), label="clip_ratio_c")
        return rlzoo.get_loss(name, epsilon_low=el, epsilon_high=eh, clip_ratio_c=c), {
            "clip_ratio_low": el, "clip_ratio_high": eh, "clip_ratio_c": c}, True
    if name == "dro":
        beta = data.draw(st.floats(0.001, 2.0), label="dro_beta")
        return rlzoo.get_loss("dro", dro_beta=beta), {"dro_beta": beta}, True
    raise AssertionError(name)


VERL_LOSSES = ["vanilla", "gspo", "gpg", "cispo", "sapo", "geo_mean", "dppo_tv", "dppo_kl", "dro"]


@pytest.mark.parametrize("name", VERL_LOSSES)
@BUDGET
@given(data=st.data())
def test_registered_loss_is_verls_loss(verl, name, data):
    """get_policy_loss_fn(<registered rlzoo loss>) == get_policy_loss_fn(<verl's own>) in value and gradient, on a
    micro-batch with the mini-batch's global info (geo_mean: verl ignores it, so a whole batch without it), with
    and without rollout_is_weights; verl's metrics ppo_kl, pg_clipfrac, pg_clipfrac_lower agree where both
    report them."""
    loss, options, follow = case(name, data)
    geo = name == "geo_mean"
    scales = (0.05, 0.3, 1.0, 15.0) if name == "gspo" else (0.05, 0.3, 1.0)  # gspo: past verl's clamp at 10 too
    full = data.draw(policy_batches(old=True, log_ratio_scale=data.draw(st.sampled_from(scales)),
                                    certain_tokens=False, min_counted=1, per_token_advantages=None,
                                    min_len=1 if geo else 0), label="batch")
    mode = data.draw(st.sampled_from(AGGREGATIONS), label="loss_agg_mode")
    t = full.shape[1]
    if geo:
        micro, info = full, {}
    else:
        keep = torch.tensor(data.draw(st.lists(st.booleans(), min_size=full.shape[0], max_size=full.shape[0])))
        keep[full.completion_mask.any(-1).nonzero()[0]] = True
        micro = rows(full, keep)
        info = {"batch_num_tokens": int(full.completion_mask.sum()), "global_batch_size": full.shape[0],
                "loss_scale_factor": data.draw(st.integers(t, 3 * t), label="loss_scale_factor")}
    weights = data.draw(weights_for(micro), label="rollout_is_weights")
    config = actor_config(info, **options)

    fn = register("rlzoo_under_test", loss, follow_loss_agg_mode=follow, overwrite=True)
    assert verl.get_policy_loss_fn("rlzoo_under_test") is fn
    got, got_grad, got_metrics = call(fn, micro, mode, config, weights)
    want, want_grad, want_metrics = call(verl.get_policy_loss_fn(name), micro, mode, config, weights)
    # geo_mean: verl divides each sequence's sums by n + 1e-8 (the log-ratio mean inside exp, the advantage mean and
    # the log-weight mean), a relative 1e-8 each that an absolute tolerance alone fails on large losses (|A| ~ 5)
    # gspo past its clamp: losses of e^10 |A| meet verl's seq-mean-token-mean division by n + 1e-8 the same way
    tolerance = {**ATOL, "rtol": 1e-7} if geo or name == "gspo" else ATOL
    torch.testing.assert_close(got, want, **tolerance)
    torch.testing.assert_close(got_grad, want_grad, **tolerance)
    assert all(isinstance(v, float) for v in got_metrics.values())
    clipfrac = {"actor/pg_clipfrac", "actor/pg_clipfrac_lower"}
    shared = {"actor/ppo_kl"} | (clipfrac if name in ("vanilla", "gspo") else set())
    for key in shared & set(want_metrics) & set(got_metrics):  # (gspo has no dual clip: verl reports a 0)
        assert got_metrics[key] == pytest.approx(want_metrics[key], abs=REFERENCE_ATOL), key
    if name in ("vanilla", "gspo"):  # vanilla has a dual clip here: both names; gspo none: verl's lower is its 0
        assert got_metrics.keys() >= (clipfrac if name == "vanilla" else {"actor/pg_clipfrac"})
    else:  # verl's own meaning of the name (cispo's, clip_cov's, ...): not rlzoo's
        assert not clipfrac & set(got_metrics)


@pytest.mark.parametrize("name", ["vanilla", "sapo", "dppo_kl", "cispo"])
@BUDGET
@given(data=st.data())
def test_micro_batches_and_ranks_sum_to_the_mini_batch(verl, name, data):
    """Split a mini-batch into micro-batches over dp_size ranks; with verl's global batch info (dp_size,
    batch_num_tokens, global_batch_size = the mini-batch's counts) the micro-batch losses, summed and averaged
    over ranks as DDP does, equal the whole mini-batch's loss on one rank without global info; so do the
    gradients."""
    loss, options, follow = case(name, data)
    full = data.draw(policy_batches(old=True, log_ratio_scale=0.3, certain_tokens=False, min_counted=1,
                                    per_token_advantages=None, min_b=2), label="batch")
    mode = data.draw(st.sampled_from(AGGREGATIONS), label="loss_agg_mode")
    fn = register("rlzoo_under_test", loss, follow_loss_agg_mode=follow, overwrite=True)
    b, t = full.shape
    mask = full.completion_mask
    whole, whole_grad, _ = call(fn, full, mode, actor_config({"loss_scale_factor": t}, **options))

    dp_size = data.draw(st.sampled_from((1, 2)), label="dp_size")
    cuts = sorted(data.draw(st.sets(st.integers(1, b - 1), max_size=3), label="cuts"))
    bounds = list(zip([0, *cuts], [*cuts, b], strict=True))
    info = {"dp_size": dp_size, "batch_num_tokens": int(mask.sum()), "global_batch_size": int(mask.any(-1).sum()),
            "loss_scale_factor": t}
    total, grads = torch.zeros((), dtype=F64), []
    for lo, hi in bounds:
        keep = torch.zeros(b, dtype=torch.bool)
        keep[lo:hi] = True
        loss_value, grad, _ = call(fn, rows(full, keep), mode, actor_config(info, **options))
        total, grads = total + loss_value, [*grads, grad]
    torch.testing.assert_close(total / dp_size, whole, **ATOL)
    torch.testing.assert_close(torch.cat(grads) / dp_size, whole_grad, **ATOL)


def test_verl_actor_loss_selects_the_registered_loss_by_loss_mode(verl):
    """verl's actor loss (verl.workers.utils.losses.ppo_loss) with policy_loss.loss_mode=<registered name> uses the
    rlzoo loss: the same loss and gradient as loss_mode='vanilla' for rlzoo ppo(dual_clip=3), on verl's unpadded
    model output, with rollout_is_weights and the global batch info verl's engine assigns."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    register("rlzoo_ppo_dual_clip", rlzoo.get_loss("ppo", dual_clip=3.0))
    g = torch.Generator().manual_seed(0)
    b, p, t = 3, 2, 5
    lengths = torch.tensor([5, 2, 4])
    response_mask = (torch.arange(t) < lengths[:, None]).to(torch.int64)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float32)
    old = (logp + 0.3 * torch.randn(b, t, generator=g)).clamp(max=0.0)
    weights = torch.exp(0.2 * torch.randn(b, t, generator=g))
    results = []
    for mode in ("vanilla", "rlzoo_ppo_dual_clip"):
        # verl's model output is unpadded: per sequence its prompt and response tokens; log_probs[k] scores
        # token k + 1, so the response's log-probs sit one position left of the response tokens
        flat = []
        for i in range(b):
            seq = torch.zeros(p + int(lengths[i]))
            seq[p - 1 : p - 1 + int(lengths[i])] = logp[i, : int(lengths[i])]
            flat.append(seq)
        log_probs = torch.cat(flat).requires_grad_(True)
        data = TensorDict({
            "prompts": torch.ones(b, p, dtype=torch.int64), "responses": torch.ones(b, t, dtype=torch.int64),
            "attention_mask": torch.cat([torch.ones(b, p, dtype=torch.int64), response_mask], dim=1),
            "response_mask": response_mask, "old_log_probs": old, "advantages": torch.randn(b, t, generator=torch.Generator().manual_seed(1)),
            "rollout_is_weights": weights,
        }, batch_size=[b])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(response_mask.sum()) + 3, global_batch_size=b + 1)
        config = actor_config(loss_mode=mode)
        loss, metrics = ppo_loss(config, {"log_probs": log_probs}, data)
        (grad,) = torch.autograd.grad(loss, log_probs)
        results.append((loss.detach(), grad, metrics))
    (want, want_grad, _), (got, got_grad, got_metrics) = results
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-6, rtol=0)
    assert "actor/pg_clipfrac" in got_metrics and "actor/ppo_kl" in got_metrics


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(("options", "verl_option"), [
    ({"beta": 0.04}, "use_kl_loss"),
    ({"entropy_coef": 0.01}, "entropy_coeff"),
    ({"is_correction": "token_truncate", "is_max": 2.0}, r"for its sampler/trainer IS correction .*rollout_is="),
    ({"rollout_rs": "token_k1", "rollout_rs_threshold": "0.8_1.25"}, r"for its rollout rejection .*rollout_rs="),
    ({"bypass_mode": True}, r"for bypass_mode=True .*verl's bypass_mode=True replaces policy_loss.loss_mode"),
])
def test_a_loss_needing_what_verl_does_not_pass_names_verls_option(verl, options, verl_option):
    """Each refusal names what in the loss needs the field and the verl option that does it instead."""
    with pytest.raises(ValueError, match=verl_option):
        register("rlzoo_refused", rlzoo.get_loss("dapo", **options))
    assert "rlzoo_refused" not in verl.POLICY_LOSS_REGISTRY
    with pytest.raises(ValueError, match=r"for its rollout rejection m2po.*rollout_rs="):
        register("rlzoo_refused", "m2po")
    prompt_mean = rlzoo.get_loss("dapo", aggregation="prompt-mean")  # its group_index: verl does not pass one
    with pytest.raises(ValueError, match=r"group_index \(for prompt-mean\(\)\)"):
        register("rlzoo_refused", prompt_mean, follow_loss_agg_mode=False)
    assert register("rlzoo_prompt_mean", prompt_mean).loss == prompt_mean  # loss_agg_mode replaces the aggregation
    composed = rlzoo.losses.PolicyLoss(surrogate="ppo_clip", penalties=(rlzoo.losses.KLPenalty(beta=0.04),))
    with pytest.raises(ValueError, match=r"^the loss given as 'rlzoo_refused' needs PolicyBatch.ref_logprobs \(for "):
        register("rlzoo_refused", composed)  # a composed loss has no name: it said "loss  needs"


def test_names_are_not_overwritten_silently(verl):
    first = register("rlzoo_dapo_once", "dapo")
    assert register("rlzoo_dapo_once", rlzoo.get_loss("dapo")) is first  # the same loss again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        register("rlzoo_dapo_once", "gpg")
    with pytest.raises(ValueError, match="already registered"):
        register("vanilla", "ppo")  # verl's own
    replaced = register("rlzoo_dapo_once", "gpg", overwrite=True)
    assert verl.get_policy_loss_fn("rlzoo_dapo_once") is replaced and replaced.loss.name == "gpg"


def test_bad_arguments(verl):
    with pytest.raises(KeyError, match="gmpo"):
        register("rlzoo_x", "no-such-loss")
    with pytest.raises(TypeError, match="PolicyLoss"):
        register("rlzoo_x", 3)
    with pytest.raises(ValueError, match=r"name must be a non-empty str \(verl's loss_mode\) without surrounding "
                                         r"spaces, got ''"):
        register("", "dapo")  # went into verl's registry, under a name no config can spell (so did 3)
    for blank in (" ", " rlzoo_x"):  # a YAML config's unquoted loss_mode is trimmed: neither could be selected
        with pytest.raises(ValueError, match="name must be a non-empty str"):
            register(blank, "dapo")
    fn = VerlPolicyLoss(loss=rlzoo.get_loss("dapo"))
    batch = {"old_log_prob": -torch.ones(2, 3, dtype=F64), "log_prob": -torch.ones(2, 3, dtype=F64),
             "advantages": torch.ones(2, 3, dtype=F64), "response_mask": torch.ones(2, 3, dtype=torch.bool)}
    with pytest.raises(ValueError, match="batch_num_tokens"):  # dp_size > 1 needs the global count, as in verl
        fn(**batch, config=actor_config({"dp_size": 2}))
    for key in ("batch_num_tokens", "global_batch_size"):  # 0 was read as 1 (a token sum where verl gives inf)
        with pytest.raises(ValueError, match=rf"^config\.global_batch_info\['{key}'\] is 0, fewer than this "
                                             r"micro-batch's own [0-9]+: it must count the whole mini-batch"):
            fn(**batch, config=actor_config({key: 0}))
    with pytest.raises(BatchError, match="rollout_is_weights"):
        fn(**batch, config=actor_config(), rollout_is_weights=torch.full((2, 3), float("nan"), dtype=F64))
    with pytest.raises(BatchError, match="logprobs"):
        fn(**{**batch, "log_prob": torch.ones(2, 3, dtype=F64)}, config=actor_config())
    for mode in ("token_mean", "TOKEN-MEAN", "prompt-mean"):  # verl's agg_loss raises for them: ran as token-mean
        with pytest.raises(ValueError, match=rf"^loss_agg_mode '{mode}' is not one of verl's: token-mean, token-sum, "):
            fn(**batch, loss_agg_mode=mode, config=actor_config())
        with pytest.raises(ValueError, match="Invalid loss_agg_mode"):  # verl's own refusal
            verl.agg_loss(batch["log_prob"], batch["response_mask"].float(), mode)


def test_an_off_policy_mask_with_rollout_is_weights_is_refused_and_without_them_measures_drift_from_old(verl):
    """The off-policy sequence mask needs the sampler's log-probs. The wrapper once rebuilt them from verl's
    ``rollout_is_weights`` as ``old - log(w)``: wrong under verl's sequence-level weights (the whole sequence's
    log-weight at every token: a drift of 0.05 per token read as 0.5, dropping an A < 0 sequence a true sampler
    keeps) and wherever verl truncated a weight. With weights it is refused, naming both ways out; without them
    the mask measures the drift from ``old_log_prob``, as rlzoo's own loss does without rollout_logprobs."""
    lp = torch.full((2, 10), -1.0, dtype=F64)
    old = lp + 0.3  # pi_theta fell by 0.3 nats per token from the old policy
    batch = PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.tensor([-1.0, 1.0], dtype=F64),
                        completion_mask=torch.ones(2, 10, dtype=torch.bool))
    loss = rlzoo.get_loss("dapo", off_policy_mask_threshold=0.1)
    fn = register("rlzoo_opsm", loss, overwrite=True)
    sequence_weights = torch.exp(torch.full((2, 1), -0.5, dtype=F64)).expand(2, 10)  # verl rollout_is="sequence"
    with pytest.raises(ValueError, match=r"^loss dapo: its off-policy sequence mask \(off_policy_mask_threshold\) "
                                         r"measures the drift from the sampler's log-probs, .* turn "
                                         r"algorithm\.rollout_correction\.rollout_is off"):
        call(fn, batch, "token-mean", actor_config(), sequence_weights.contiguous())
    got, got_grad, metrics = call(fn, batch, "token-mean", actor_config())
    out = loss(batch)
    assert metrics["actor/off_policy_mask/dropped_mean"] == 0.5  # drift old - lp = 0.3 > 0.1: the A < 0 row drops
    torch.testing.assert_close(got, out.loss.detach(), rtol=0, atol=0)
    assert (got_grad[0] == 0).all() and (got_grad[1] != 0).all()


def test_kl_cov_reports_ppo_kl_as_verls_kl_cov(verl):
    """verl's kl_cov reports the mean |log-ratio| as actor/ppo_kl (its other losses the signed mean); the
    registered kl_cov reported the signed mean under that name. Loss, gradient and ppo_kl are verl's."""
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(3, 6, generator=g, dtype=F64)
    batch = PolicyBatch(logprobs=lp, old_logprobs=(lp + 0.3 * torch.randn(3, 6, generator=g, dtype=F64)).clamp(max=0),
                        advantages=torch.randn(3, generator=g, dtype=F64),
                        completion_mask=torch.ones(3, 6, dtype=torch.bool))
    fn = register("rlzoo_kl_cov", rlzoo.get_loss("kl_cov", kl_cov_ratio=0.2, ppo_kl_coef=0.1), overwrite=True)
    config = actor_config(kl_cov_ratio=0.2, ppo_kl_coef=0.1)
    got, got_grad, got_metrics = call(fn, batch, "token-mean", config)
    want, want_grad, want_metrics = call(verl.get_policy_loss_fn("kl_cov"), batch, "token-mean", config)
    torch.testing.assert_close(got, want, atol=REFERENCE_ATOL, rtol=0)
    torch.testing.assert_close(got_grad, want_grad, atol=REFERENCE_ATOL, rtol=0)
    assert got_metrics["actor/ppo_kl"] == pytest.approx(want_metrics["actor/ppo_kl"], abs=REFERENCE_ATOL)
    signed = (batch.old_logprobs - lp).mean().item()
    assert abs(want_metrics["actor/ppo_kl"] - signed) > 0.05  # the two meanings differ here
