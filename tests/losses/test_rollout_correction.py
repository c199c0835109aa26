"""Rollout correction against verl 0.9.1 (the oracle, called, never copied).

Decoupled mode: verl computes the IS weights and the rejection mask in the trainer before the update
(``rollout_corr_helper.compute_rollout_correction_and_rejection_mask(old_log_prob, rollout_log_prob,
response_mask, ...)``), replaces the response mask by the modified one (so the optimizer-step counts,
``global_batch_info``, count the kept tokens) and multiplies the policy loss by the weights
(``core_algos.compute_policy_loss_vanilla(..., rollout_is_weights=...)``). rlzoo's
``get_loss("ppo", dual_clip=3, rollout_is=..., rollout_rs=...)`` must give the same loss and gradient.

Bypass mode: verl's ``compute_policy_loss_bypass_mode`` (old log-probs = the sampler's; the correction compares
the current policy with the sampler; the modified mask enters the policy loss only, the counts are those of the
unmodified mask); ``loss_type="ppo_clip"`` (rlzoo ``ppo``) and ``"reinforce"`` (rlzoo ``gpg``).

Float64, tolerances.REFERENCE_ATOL. verl's sequence means divide by ``n + 1e-8``; the drawn statistics are
continuous, so a decision within 1e-8 of a bound has probability ~0.
"""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from oracles import verl_core_algos
from strategies import (
    AGGREGATIONS,
    RS_EXAMPLES,
    budget,
    loss_and_grads,
    policy_batches,
    runtime_type_checker_off,
)
from tolerances import REFERENCE_ATOL

import rlzoo
from rlzoo import Normalizer, PolicyBatch

ATOL = {"atol": REFERENCE_ATOL, "rtol": 0.0}
CLIP_C = 3.0  # verl's vanilla loss is always dual-clipped (clip_ratio_c); rlzoo's ppo takes it as dual_clip
IS_THRESHOLDS = (2.0, 1.3, "0.5_2.0", "0.8_1.25")  # a number: truncate (TIS); "lower_upper": IcePop


@pytest.fixture(scope="module")
def verl():
    return verl_core_algos()


@pytest.fixture(scope="module")
def helper(verl):
    """verl's rollout_corr_helper. Its diagnostic compute_is_metrics divides by zero (a Python float) when every
    IcePop weight of the batch is 0 (the effective sample size); that metric is not compared, so such calls
    report no IS metrics instead of crashing. Weights and masks are untouched."""
    from verl.trainer.ppo import rollout_corr_helper

    original = rollout_corr_helper.compute_is_metrics

    def is_metrics_or_empty(**kwargs):
        try:
            return original(**kwargs)
        except ZeroDivisionError:
            return {}

    rollout_corr_helper.compute_is_metrics = is_metrics_or_empty
    yield rollout_corr_helper
    rollout_corr_helper.compute_is_metrics = original


@st.composite
def corrections(draw) -> dict:
    """verl rollout-correction options: rollout_is (or None) with a threshold, batch_normalize, and 0-3 rs
    criteria comma-combined with one threshold each."""
    options: dict = {"rollout_is": draw(st.sampled_from([None, "token", "sequence"]), label="rollout_is")}
    options["rollout_is_threshold"] = draw(st.sampled_from(IS_THRESHOLDS), label="rollout_is_threshold")
    options["rollout_is_batch_normalize"] = draw(st.booleans(), label="batch_normalize")
    chosen = draw(st.lists(st.sampled_from(RS_EXAMPLES), max_size=3, unique_by=lambda c: c[0]), label="rollout_rs")
    options["rollout_rs"] = ",".join(c for c, _ in chosen) or None
    options["rollout_rs_threshold"] = ",".join(t for _, t in chosen) or None
    return options


def _rlzoo_options(options: dict) -> dict:
    """The same options for rlzoo (rollout_is=None: no IS correction part, its other options dropped)."""
    out = {k: v for k, v in options.items() if v is not None}
    if options["rollout_is"] is None:
        out.pop("rollout_is_threshold", None)
        out.pop("rollout_is_batch_normalize", None)
    return out


def _config(global_batch_info: dict, rollout_correction: dict | None = None):
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    policy_loss = PolicyLossConfig(rollout_correction=RolloutCorrectionConfig(**(rollout_correction or {})))
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=CLIP_C,
                       global_batch_info=dict(global_batch_info))


def _info(mask: torch.Tensor, t: int) -> tuple[dict, Normalizer]:
    """Counts of ``mask`` for verl (global_batch_info, clamped to 1 as rlzoo's are) and for rlzoo."""
    n_tok, n_seq = int(mask.sum()), int(mask.any(-1).sum())
    return ({"batch_num_tokens": max(n_tok, 1), "global_batch_size": max(n_seq, 1), "loss_scale_factor": t},
            Normalizer(num_tokens=n_tok, num_sequences=n_seq))


def _token_adv(batch: PolicyBatch) -> torch.Tensor:
    adv = batch.advantages
    return (adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv).contiguous()


def _compare(out, grad, want_loss, want_grad):
    torch.testing.assert_close(out.loss.detach(), want_loss.detach().to(out.loss.dtype), **ATOL)
    torch.testing.assert_close(grad, want_grad, **ATOL)


# ----------------------------------------------------------------------------------------- decoupled mode
@budget(1.0)
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), options=corrections())
def test_decoupled_mode_equals_verl(verl, helper, data, agg, options):
    """rlzoo ppo(dual_clip=3, eps 0.2/0.28, rollout_is/rs options) == verl: weights and modified mask from
    compute_rollout_correction_and_rejection_mask(old, rollout, mask), then compute_policy_loss_vanilla with
    rollout_is_weights and the modified mask, counts of the modified mask (value and gradient); the loss mask
    rlzoo reports (PolicyLoss.loss_mask) is verl's modified response mask."""
    batch = data.draw(policy_batches(old=True, rollout=True, min_counted=1, certain_tokens=False,
                                     log_ratio_scale=data.draw(st.sampled_from((0.05, 0.3)))))
    t = batch.shape[1]
    mask = batch.completion_mask
    weights, modified, _ = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=batch.old_logprobs, rollout_log_prob=batch.rollout_logprobs, response_mask=mask.to(torch.float64),
        **options)
    modified = modified.bool() & mask
    rollout_is_weights = None if weights is None else weights.batch["rollout_is_weights"]
    info, normalizer = _info(modified, t)

    log_prob = batch.logprobs.detach().clone().requires_grad_(True)
    want, _ = verl.compute_policy_loss_vanilla(
        old_log_prob=batch.old_logprobs, log_prob=log_prob, advantages=_token_adv(batch),
        response_mask=modified.to(torch.float64), loss_agg_mode=agg, config=_config(info),
        rollout_is_weights=rollout_is_weights)
    (want_grad,) = torch.autograd.grad(want, log_prob)

    loss_fn = rlzoo.get_loss("ppo", epsilon_low=0.2, epsilon_high=0.28, dual_clip=CLIP_C, aggregation=agg,
                             max_completion_length=t, **_rlzoo_options(options))
    got_mask = loss_fn.loss_mask(mask, old_logprobs=batch.old_logprobs, rollout_logprobs=batch.rollout_logprobs)
    assert torch.equal(got_mask, modified)
    assert Normalizer.from_batch(batch, loss=loss_fn).num_tokens == normalizer.num_tokens
    out, grad, _ = loss_and_grads(loss_fn, batch)  # its own counts: over the kept tokens
    _compare(out, grad, want, want_grad)
    out, grad, _ = loss_and_grads(loss_fn, batch, normalizer)
    _compare(out, grad, want, want_grad)


@budget(0.5)
@given(data=st.data(), options=corrections())
def test_is_weights_and_rejection_mask_equal_verl_functions(helper, data, options):
    """The weight part equals compute_rollout_correction_weights (every level, threshold, batch_normalize)
    and the rejection part equals compute_rollout_rejection_mask, at every counted token; the metrics
    rollout_is_mean / _max / _min (token level) and rollout_rs_masked_fraction equal verl's."""
    batch = data.draw(policy_batches(old=True, rollout=True, min_counted=1))
    mask = batch.completion_mask
    log_ratio = batch.old_logprobs - batch.rollout_logprobs
    loss_fn = rlzoo.get_loss("ppo", **_rlzoo_options(options))
    x = rlzoo.losses.LossInputs.from_batch(batch)
    if options["rollout_is"] is not None:
        want, want_metrics = helper.compute_rollout_correction_weights(
            log_ratio=log_ratio, response_mask=mask.to(torch.float64), rollout_is=options["rollout_is"],
            rollout_is_threshold=options["rollout_is_threshold"],
            rollout_is_batch_normalize=options["rollout_is_batch_normalize"])
        got, metrics = loss_fn.is_correction(x)
        torch.testing.assert_close(torch.where(mask, got, 0.0), torch.where(mask, want, 0.0), **ATOL)
        if options["rollout_is"] == "token":
            compared = "rollout_is_mean" in want_metrics  # absent when verl's metrics crashed (helper fixture)
            for name in ("rollout_is_mean", "rollout_is_max", "rollout_is_min") if compared else ():
                assert metrics[f"rollout_corr/{name}"].item() == pytest.approx(want_metrics[name], abs=REFERENCE_ATOL)
    if options["rollout_rs"] is not None:
        want_mask, want_metrics = helper.compute_rollout_rejection_mask(
            log_ratio=log_ratio, response_mask=mask.to(torch.float64), rollout_rs=options["rollout_rs"],
            rollout_rs_threshold=options["rollout_rs_threshold"])
        (rejection,) = [p for p in loss_fn.rejections if p.active]
        keep, metrics = rejection(x)
        assert torch.equal(keep & mask, want_mask.bool() & mask)
        assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(
            want_metrics["rollout_rs_masked_fraction"], abs=REFERENCE_ATOL)


@budget(1.0)
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), options=corrections(), pieces=st.integers(2, 4))
def test_batch_normalized_weights_take_the_whole_batchs_mean_under_any_split(data, agg, options, pieces):
    """With rollout_is_batch_normalize, verl divides the IS weights by their mean over the whole training batch:
    split into micro-batches with Normalizer.from_batch(*micro_batches, loss=loss_fn) (which counts
    PolicyLoss.is_weight_sums), the micro-batch losses and gradients sum to the whole batch's, which equal verl's
    (test_decoupled_mode_equals_verl). Without the sums each micro-batch divides by its own mean."""
    options = {**options, "rollout_is": options["rollout_is"] or "token", "rollout_is_batch_normalize": True}
    batch = data.draw(policy_batches(old=True, rollout=True, min_counted=1, certain_tokens=False,
                                     log_ratio_scale=0.3))
    loss_fn = rlzoo.get_loss("ppo", epsilon_low=0.2, epsilon_high=0.28, dual_clip=CLIP_C, aggregation=agg,
                             max_completion_length=batch.shape[1], **_rlzoo_options(options))
    assert loss_fn.counts_is_weights and not loss_fn.batch_coupled
    micro_batches = batch.split(min(pieces, batch.shape[0]))
    normalizer = Normalizer.from_batch(*micro_batches, loss=loss_fn)
    whole = Normalizer.from_batch(batch, loss=loss_fn)
    torch.testing.assert_close(normalizer.is_weight_sum, whole.is_weight_sum, **ATOL)
    assert float(normalizer.num_is_weights) == float(whole.num_is_weights) > 0
    want, want_grad, _ = loss_and_grads(loss_fn, batch)
    outs = [loss_and_grads(loss_fn, mb, normalizer) for mb in micro_batches]
    torch.testing.assert_close(sum(o.loss.detach() for o, _, _ in outs), want.loss.detach(), **ATOL)
    torch.testing.assert_close(torch.cat([g for _, g, _ in outs]), want_grad, **ATOL)


def test_batch_normalization_in_bypass_mode_is_per_micro_batch_and_said_so():
    """In bypass mode the weights compare the current policy with the sampler, unknown before the forward pass:
    nothing is counted (each call takes its own batch's mean, as verl's bypass policy loss) and the loss says
    it is batch-coupled; the decoupled loss counts the sums and is not."""
    decoupled = rlzoo.get_loss("ppo", rollout_is="sequence", rollout_is_batch_normalize=True)
    bypass = rlzoo.get_loss("ppo", rollout_is="sequence", rollout_is_batch_normalize=True, bypass_mode=True)
    loglinear = rlzoo.get_loss("ppo", rollout_is="sequence", rollout_is_batch_normalize=True,
                               prox_logp_method="loglinear")  # the proximal policy needs the current one too
    mask = torch.ones(2, 3, dtype=torch.bool)
    lp = torch.full((2, 3), -0.5, dtype=torch.float64)
    for loss_fn in (bypass, loglinear):
        assert loss_fn.is_weight_sums(mask, rollout_logprobs=lp) is None and loss_fn.batch_coupled
        assert not loss_fn.counts_is_weights
        assert [p.registered_name() for p in loss_fn.coupled_parts()] == ["rollout_is"]
    assert decoupled.coupled_parts() == [] and len(decoupled.coupled_parts(is_weight_sums=False)) == 1
    sums = decoupled.is_weight_sums(mask, old_logprobs=lp, rollout_logprobs=lp - 0.1)
    torch.testing.assert_close(sums, torch.tensor([2 * torch.exp(torch.tensor(0.3)).item(), 2.0], dtype=torch.float64))
    with pytest.raises(rlzoo.BatchError, match="old_logprobs"):
        decoupled.is_weight_sums(mask, rollout_logprobs=lp)
    with pytest.raises(rlzoo.BatchError, match="is_weight_sum and Normalizer.num_is_weights go together"):
        Normalizer(num_tokens=6, num_sequences=2, is_weight_sum=2.0)
    # sums handed to a bypass-mode or loglinear loss are not used: its weights need the current policy
    batch = PolicyBatch(logprobs=lp, rollout_logprobs=lp - 0.1, advantages=torch.ones(2, dtype=torch.float64),
                        completion_mask=mask)
    odd = Normalizer(num_tokens=6, num_sequences=2, is_weight_sum=100.0, num_is_weights=1.0)
    assert torch.equal(bypass(batch, normalizer=odd).loss, bypass(batch, normalizer=Normalizer.from_batch(batch)).loss)
    versioned = dataclasses.replace(batch, versions=torch.zeros(2, dtype=torch.long), current_version=1)
    assert torch.equal(loglinear(versioned, normalizer=odd).loss,
                       loglinear(versioned, normalizer=Normalizer.from_batch(versioned)).loss)
    assert not torch.equal(decoupled(dataclasses.replace(batch, old_logprobs=lp), normalizer=odd).loss,
                           decoupled(dataclasses.replace(batch, old_logprobs=lp)).loss)


def test_from_batch_counts_on_policy_batches_with_the_current_logprobs():
    """Without old_logprobs (on-policy) the loss reads the current log-probs, detached, as the old policy; so does
    Normalizer.from_batch(loss=) when it counts the IS weights: the split losses sum to the whole batch's."""
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(6, 4, generator=g, dtype=torch.float64) - 0.1
    batch = PolicyBatch(logprobs=lp, rollout_logprobs=lp - 0.3 * torch.rand(6, 4, generator=g, dtype=torch.float64),
                        advantages=torch.randn(6, generator=g, dtype=torch.float64),
                        completion_mask=torch.rand(6, 4, generator=g) > 0.3)
    loss_fn = rlzoo.get_loss("ppo", rollout_is="token", rollout_is_batch_normalize=True)
    micro_batches = batch.split(3)
    normalizer = Normalizer.from_batch(*micro_batches, loss=loss_fn)
    assert normalizer.is_weight_sum is not None
    got = sum(loss_and_grads(loss_fn, mb, normalizer)[0].loss for mb in micro_batches)
    torch.testing.assert_close(got, loss_and_grads(loss_fn, batch)[0].loss, **ATOL)


# -------------------------------------------------------------------------------------------- bypass mode
@budget(1.0)
@given(data=st.data(), agg=st.sampled_from(AGGREGATIONS), options=corrections(),
       loss_type=st.sampled_from(["ppo_clip", "reinforce"]))
def test_bypass_mode_equals_verl(verl, helper, data, agg, options, loss_type):
    """rlzoo get_loss("ppo" | "gpg", bypass_mode=True, rollout options) with old_logprobs None ==
    verl compute_policy_loss_bypass_mode(old_log_prob=rollout_log_prob, ...) with loss_type "ppo_clip" (IS
    weights reported, not applied) or "reinforce" (-A logp times the IS weight), the counts those of the
    unmodified mask (value and gradient)."""
    batch = data.draw(policy_batches(old=False, rollout=True, min_counted=1, certain_tokens=False))
    t = batch.shape[1]
    mask = batch.completion_mask
    info, normalizer = _info(mask, t)
    verl_options = {**options, "bypass_mode": True, "loss_type": loss_type}
    if options["rollout_is"] is None:
        verl_options["rollout_is_threshold"] = 2.0
    log_prob = batch.logprobs.detach().clone().requires_grad_(True)
    want, _ = verl.compute_policy_loss_bypass_mode(
        old_log_prob=batch.rollout_logprobs, log_prob=log_prob, advantages=_token_adv(batch),
        response_mask=mask.to(torch.float64), loss_agg_mode=agg, config=_config(info, verl_options))
    (want_grad,) = torch.autograd.grad(want, log_prob)

    name = "ppo" if loss_type == "ppo_clip" else "gpg"
    clip = {"epsilon_low": 0.2, "epsilon_high": 0.28, "dual_clip": CLIP_C} if name == "ppo" else {}
    loss_fn = rlzoo.get_loss(name, bypass_mode=True, aggregation=agg, max_completion_length=t, **clip,
                             **_rlzoo_options(options))
    assert torch.equal(loss_fn.loss_mask(mask, logprobs=batch.logprobs, rollout_logprobs=batch.rollout_logprobs),
                       mask)  # bypass: the counts keep every token
    out, grad, _ = loss_and_grads(loss_fn, batch)
    _compare(out, grad, want, want_grad)
    out, grad, _ = loss_and_grads(loss_fn, batch, normalizer)
    _compare(out, grad, want, want_grad)


@pytest.mark.parametrize(("surrogate_options", "reported"), [({}, True), ({"surrogate": "reinforce"}, False)])
def test_explain_says_when_bypass_mode_reports_the_is_correction_only(surrogate_options, reported):
    """In bypass mode a ratio surrogate's ratio already is pi_theta / pi_sampler (verl's bypass ppo_clip): an IS
    correction (TRL's token_mask, verl's IcePop) is then metrics only, and `rlzoo explain` listed it as if it
    applied. The line says so; for REINFORCE, which applies it, it does not."""
    from rlzoo.losses import PolicyLoss

    base = rlzoo.get_loss("dapo", bypass_mode=True, is_correction="token_mask")
    loss = base if not surrogate_options else dataclasses.replace(base, **surrogate_options)
    assert isinstance(loss, PolicyLoss)
    line = next(x for x in loss.describe().splitlines() if x.startswith("IS correction:"))
    assert line.endswith("(metrics only: in bypass mode the ratio already is pi_theta / pi_sampler, as verl)") is reported
    lp = -torch.rand(2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batch = PolicyBatch(logprobs=lp.requires_grad_(), rollout_logprobs=lp.detach() - 2.0,  # weights e^2 > is_max
                        advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
                        completion_mask=torch.ones(2, 3, dtype=torch.bool))
    without = dataclasses.replace(loss, is_correction=None)
    assert torch.equal(loss(batch).loss, without(batch).loss) is reported  # what the line says


def test_bypass_mode_rejects_old_logprobs():
    """bypass_mode uses the sampler's log-probs as the old ones: a batch that also has old_logprobs is ambiguous
    and raises, naming old_logprobs; rollout_logprobs are required."""
    lp = torch.full((1, 2), -0.5, dtype=torch.float64)
    loss_fn = rlzoo.get_loss("ppo", bypass_mode=True)
    common = {"logprobs": lp, "advantages": torch.ones(1, dtype=torch.float64),
              "completion_mask": torch.ones(1, 2, dtype=torch.bool)}
    with pytest.raises(rlzoo.BatchError, match="old_logprobs"):
        loss_fn(PolicyBatch(**common, old_logprobs=lp, rollout_logprobs=lp))
    with pytest.raises(rlzoo.BatchError, match="rollout_logprobs"):
        loss_fn(PolicyBatch(**common))


@pytest.mark.parametrize(("option", "value", "match"), [
    ("rollout_is", "tokens", "rollout_is"), ("rollout_is_threshold", "2_1", "rollout_is_threshold"),
    ("rollout_is_threshold", -1.0, "rollout_is_threshold"), ("rollout_is_threshold", "a_b", "rollout_is_threshold"),
    ("rollout_rs", "token_k4", "rollout_rs"), ("rollout_is_batch_normalize", 1, "rollout_is_batch_normalize"),
])
def test_invalid_rollout_options_name_the_option(option, value, match):
    """A bad rollout-correction option raises a ValueError naming it (valid choices listed for names)."""
    extra = {"rollout_is": "token"} if option.startswith("rollout_is_") else {}
    if option == "rollout_rs":
        extra = {"rollout_rs_threshold": 0.1}
    with runtime_type_checker_off(), pytest.raises(ValueError, match=match):  # the error users see
        rlzoo.get_loss("ppo", **extra, **{option: value})


@pytest.mark.parametrize("preset", ["decoupled_ppo", "m2po"])
def test_rollout_is_replaces_a_presets_is_correction_switched_off_in_the_same_call(preset):
    """decoupled_ppo and m2po hold AReaL's behaviour weight in the IS slot: verl's rollout_is next to it is refused
    (one slot, two parts), but with is_correction=None in the same call it takes the slot (it was refused too:
    the switched-off part's is_max counted as configured); the loss then equals the preset's parts with that IS."""
    with pytest.raises(ValueError, match=r"PolicyLoss.is_correction holds one part.*pass is_correction=None in the "
                                         r"same call \(and none of its other options\)$"):
        rlzoo.get_loss(preset, rollout_is="token", rollout_is_threshold=2.0)
    with pytest.raises(ValueError, match=r"holds one part"):  # is_max=7 would be dropped without a word
        rlzoo.get_loss(preset, is_correction=None, is_max=7.0, rollout_is="token")
    swapped = rlzoo.get_loss(preset, is_correction=None, rollout_is="token", rollout_is_threshold=2.0)
    assert swapped.is_correction == rlzoo.get_loss("ppo", rollout_is="token", rollout_is_threshold=2.0).is_correction
    assert swapped.surrogate == rlzoo.get_loss(preset).surrogate
    assert swapped.rejections == rlzoo.get_loss(preset).rejections


def test_rollout_rs_needs_its_threshold():
    """verl raises when rollout_rs is set without rollout_rs_threshold; so does rlzoo, naming the option."""
    with pytest.raises(ValueError, match=r"rollout_rs_threshold must be given when rollout_rs is set: for a \*_k1 "
                                         r"criterion 'lower_upper' or one u >= 1 meaning 1/u\.\.u"):
        rlzoo.get_loss("ppo", rollout_rs="token_k1")
    # user trial: following the old example (0.01) for a k1 criterion failed with a bare "needs lower <= upper"
    with pytest.raises(ValueError, match=r"for token_k1 needs lower <= upper \(one u stands for 1/u\.\.u, so it "
                                         r"needs u >= 1\), got '0.01'"):
        rlzoo.get_loss("ppo", rollout_rs="token_k1", rollout_rs_threshold=0.01)
    with pytest.raises(ValueError, match=r"rollout_is_threshold \('rollout_is'\) and 'is' configure the same slot"):
        rlzoo.get_loss("dapo", rollout_is_threshold=3.0, is_max=2.0)  # 'is' read as a verb unquoted


# ------------------------------------------------------------------------------------------ SkyRL's masks
@budget(0.5)
@given(batch=policy_batches(old=True, rollout=True, min_counted=1),
       bounds=st.sampled_from([(None, 1.1), (0.9, None), (0.9, 1.1), (0.5, 2.0), (0.0, 1.3)]))
def test_skyrl_outlier_veto_and_geometric_mask_by_definition(batch, bounds):
    """SkyRL's masks (SkyRL itself is called in test_skyrl_losses.py; here its definitions per sequence, in
    Python): the outlier veto zeroes a sequence if any counted token's rho = exp(old - rollout) is outside
    [low, high]; the geometric mask if exp(mean_t log rho) is. Both are weights of the policy term (the counts keep the tokens): the loss
    is ppo's per-token loss times the weight, token-mean over every counted token."""
    low, high = bounds
    mask = batch.completion_mask
    log_rho = batch.old_logprobs - batch.rollout_logprobs

    def outside(value: float) -> bool:
        return (low is not None and value < low) or (high is not None and value > high)

    veto, geo = torch.ones(batch.shape[0]), torch.ones(batch.shape[0])
    for i in range(batch.shape[0]):
        tokens = [float(log_rho[i, t]) for t in range(batch.shape[1]) if mask[i, t]]
        if tokens and any(outside(float(torch.tensor(v).exp())) for v in tokens):
            veto[i] = 0.0
        if tokens and outside(float(torch.tensor(sum(tokens) / len(tokens)).exp())):
            geo[i] = 0.0
    for options, weight in (({"outlier_token_is_threshold_low": low, "outlier_token_is_threshold_high": high}, veto),
                            ({"geo_mask_low": low, "geo_mask_high": high}, geo)):
        loss_fn = rlzoo.get_loss("ppo", **{k: v for k, v in options.items() if v is not None})
        x = rlzoo.losses.LossInputs.from_batch(batch)
        (part,) = [p for p in loss_fn.weights if p.active]
        got, _ = part(x)
        rows = mask.any(-1)
        torch.testing.assert_close(got[rows, 0], weight.to(got.dtype)[rows], **ATOL)
        lp = batch.logprobs.detach()
        u = torch.exp(lp - batch.old_logprobs)
        adv = _token_adv(batch)
        per_token = torch.maximum(-adv * u, -adv * u.clamp(0.8, 1.2)) * weight.to(lp.dtype).unsqueeze(-1)
        want = torch.where(mask, per_token, 0.0).sum() / mask.sum()
        out, _, _ = loss_and_grads(loss_fn, batch)
        torch.testing.assert_close(out.loss.detach(), want, **ATOL)
