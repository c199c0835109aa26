"""The statements of docs/grpo-explained.md, each as a property (float64; closed forms from the papers).

The statements about the trainer's generation cycle are tested end to end in tests/trainer/test_loop.py
(``test_one_iteration_never_computes_old_logprobs_and_never_clips``,
``test_two_iterations_generate_every_other_step_and_reuse_old_logprobs``); the unclipped negative branch's
loss and gradient in tests/losses/test_properties.py (``test_negative_advantage_above_the_clip_is_not_clipped``).
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import fresh, loss_and_grads, policy_batches
from tolerances import tol

import rlzoo
from rlzoo.trainer.config import RolloutConfig

F64 = tol(torch.float64)


@st.composite
def grpo_batches(draw, *, old: bool = False):
    """A batch of ``groups`` x ``G`` completions of any lengths >= 1 whose advantages are GRPO's (group-normalised
    rewards, computed in the test by :func:`_with_grpo_advantages`), ``ref_logprobs`` set; ``old_logprobs``
    None (first pass) unless ``old``."""
    groups, g = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    batch = draw(policy_batches(b=groups * g, min_len=1, old=old, ref=True, per_token_advantages=False))
    rewards = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=groups * g,
                                         max_size=groups * g)), dtype=torch.float64)
    return batch, rewards, g


def _with_grpo_advantages(data) -> rlzoo.PolicyBatch:
    batch, rewards, g = data
    return fresh(batch, advantages=rlzoo.get_advantage("grpo")(rewards, group_size=g))


@given(data=grpo_batches())
def test_first_pass_loss_is_beta_kl_but_the_gradient_is_reinforce(data):
    """num_iterations = 1 (DeepSeekMath eq. 3 with pi_old = pi): the value of GRPO's loss is
    (1/S) sum_i (1/|o_i|) sum_t -A_i + beta k3 = -(1/S) sum_i A_i + beta agg(k3) = beta agg(k3), because the
    group-normalised advantages sum to zero in each group; its gradient is REINFORCE's -A_i / (S |o_i|) plus the
    KL's, which is not zero unless every advantage is."""
    batch = _with_grpo_advantages(data)
    for beta in (0.0, 0.04):
        loss_fn = rlzoo.get_loss("grpo", beta=beta)
        out, grad, _ = loss_and_grads(loss_fn, batch)
        mask = batch.completion_mask
        lengths = mask.sum(-1, keepdim=True).to(torch.float64)
        s = batch.shape[0]
        lp, ref = batch.logprobs.detach(), batch.ref_logprobs
        k3 = torch.exp(ref - lp) - (ref - lp) - 1
        agg_k3 = ((k3 * mask).sum(-1, keepdim=True) / lengths).sum() / s
        torch.testing.assert_close(out.loss, beta * agg_k3, **F64)
        dk3 = 1 - torch.exp(ref - lp)
        expected = torch.where(mask, (-batch.advantages[:, None] + beta * dk3) / (s * lengths), 0.0)
        torch.testing.assert_close(grad, expected, **F64)
        if beta == 0.0:
            assert out.loss.abs() <= 1e-12
            assert bool((grad != 0).any()) == bool((batch.advantages != 0).any())


@given(data=grpo_batches())
def test_token_mean_first_pass_value_is_length_weighted(data):
    """With a token mean over the batch (dapo, bnpo) the first-pass value is not zero: it is
    -sum_i A_i |o_i| / sum_i |o_i| (longer completions weigh more), e.g. positive when wrong answers are longer."""
    batch = _with_grpo_advantages(data)
    out, _, _ = loss_and_grads(rlzoo.get_loss("dapo"), batch)
    lengths = batch.completion_mask.sum(-1).to(torch.float64)
    torch.testing.assert_close(out.loss, -(batch.advantages * lengths).sum() / lengths.sum(), **F64)


@given(batch=policy_batches(old=False))
def test_exp_logp_minus_its_detached_copy_gives_the_paper_gradient(batch):
    """TRL's exp(logp - logp.detach()) is 1 in value and has gradient d/dlogp exp(logp - c) = exp(0) = 1, so
    A * exp(logp - logp.detach()) has value A and gradient A * grad logp = grad (A logp): the policy gradient of
    DeepSeekMath eq. 3 at pi_old = pi (grad pi / pi_old = grad log pi there). rlzoo's old_logprobs=None is the
    same thing: the loss is called with old = logprobs.detach()."""
    lp, adv = batch.logprobs, batch.advantages
    adv = adv[:, None].expand_as(lp) if adv.ndim == 1 else adv
    mask = batch.completion_mask
    ratio = torch.exp(lp - lp.detach())
    assert torch.equal(ratio.detach(), torch.ones_like(lp))
    (g_trick,) = torch.autograd.grad((ratio * adv * mask).sum(), lp)
    (g_reinforce,) = torch.autograd.grad((lp * adv * mask).sum(), lp)
    torch.testing.assert_close(g_trick, g_reinforce, **F64)
    torch.testing.assert_close(g_trick, torch.where(mask, adv, 0.0), **F64)
    loss_fn = rlzoo.get_loss("grpo", beta=0.0)
    _, g_none, _ = loss_and_grads(loss_fn, batch)
    _, g_detached, _ = loss_and_grads(loss_fn, fresh(batch, old_logprobs=batch.logprobs.detach().clone()))
    torch.testing.assert_close(g_none, g_detached, **F64)


@given(batch=policy_batches(log_ratio_scale=0.5), eps=st.floats(0.0, 0.5),
       name=st.sampled_from(["ppo", "grpo", "dapo", "gspo", "two_sided"]))
def test_high_neg_adv_metric_counts_the_open_side(batch, eps, name):
    """ratio/high_neg_adv_mean is the fraction of clip decisions with A < 0 and r > 1 + epsilon_high (the side
    PPO's clip leaves open), counted as TRL counts clip_ratio (per sequence for a sequence ratio with
    per-sequence advantages, else per token); 0 on a first pass (old None: r == 1)."""
    eh = eps + 0.01
    loss_fn = rlzoo.get_loss(name, epsilon_high=eh, beta=0.0, max_completion_length=batch.shape[1])
    out = loss_fn(fresh(batch))
    mask = batch.completion_mask
    adv = batch.advantages.detach()
    lr = (batch.logprobs.detach() - batch.old_logprobs) if batch.old_logprobs is not None else torch.zeros_like(mask,
                                                                                                  dtype=torch.float64)
    if name == "gspo" and adv.ndim == 1:  # one decision per sequence: s_i = exp(mean_t log r)
        n = mask.sum(-1)
        live = n > 0
        s = torch.exp(torch.where(mask, lr, 0.0).sum(-1) / n.clamp(min=1))
        expected = ((s > 1 + eh) & (adv < 0) & live).sum().to(torch.float64) / max(int(live.sum()), 1)
    else:
        if name == "gspo":
            n = mask.sum(-1, keepdim=True).clamp(min=1)
            lr = (torch.where(mask, lr, 0.0).sum(-1, keepdim=True) / n).expand_as(lr)
        a = adv[:, None].expand_as(lr) if adv.ndim == 1 else adv
        flag = (torch.exp(lr) > 1 + eh) & (a < 0) & mask
        expected = flag.sum().to(torch.float64) / max(int(mask.sum()), 1)
    torch.testing.assert_close(out.metrics["ratio/high_neg_adv_mean"], expected, **F64)
    first = loss_fn(fresh(batch, old_logprobs=None))
    assert float(first.metrics["ratio/high_neg_adv_mean"]) == 0.0


@pytest.mark.parametrize(("num_iterations", "steps_per_generation", "gradient_accumulation_steps", "needed"), [
    (1, None, 1, False),  # the built-in job: old == current at every use
    (2, None, 1, True),   # a second pass after an optimizer step
    (4, None, 1, True),
    (1, 4, 4, False),     # a generation batch consumed within one optimizer step
    (1, 4, 1, True),      # the buffer spans 4 optimizer steps
    (2, 2, 4, False),     # 2 passes x 2 micro-batches inside one optimizer step of 4
])
def test_when_old_logprobs_are_computed(num_iterations, steps_per_generation, gradient_accumulation_steps, needed):
    """TRL's rule (DESIGN section 4): old log-probs are computed once per generation batch, at generation time,
    exactly when the batch is used after an optimizer step: gradient_accumulation_steps is not a multiple of
    steps_per_generation x num_iterations (or an external sampler generated it)."""
    config = RolloutConfig(num_iterations=num_iterations, steps_per_generation=steps_per_generation,
                           gradient_accumulation_steps=gradient_accumulation_steps, per_device_train_batch_size=8,
                           num_generations=4)
    assert config.old_logprobs_needed is needed
