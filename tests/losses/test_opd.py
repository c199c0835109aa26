"""On-policy distillation (rlzoo/algorithms/opd.py) against verl 0.9.1's distillation loss, called as the oracle.

verl's ``verl/trainer/distillation/losses.py`` ``distillation_ppo_loss`` (final-loss branch) is called with a
padded TensorDict: its ``no_padding_2_padding`` (which slices packed model outputs) is replaced by the identity,
the only adaptation; everything else (the KL estimator, the clamp, the policy-gradient or direct form, the
``use_task_rewards`` combination with the actor's vanilla PPO loss, aggregation with the global counts) is
verl's own code. The task term of verl's actor loss always applies the dual clip (``clip_ratio_c=3``), so the
rlzoo side passes ``dual_clip=3.0``; ``use_task_rewards=False`` is rlzoo's opd with zero task advantages.
"""

import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from oracles import verl_core_algos
from strategies import budget, fresh, loss_and_grads, policy_batches
from tolerances import REFERENCE_ATOL, tol

import rlzoo
from rlzoo import Normalizer
from rlzoo.batch import BatchError

ATOL = {"atol": REFERENCE_ATOL, "rtol": 0.0}
F64 = tol(torch.float64)
# rlzoo estimator -> verl loss_mode (verl's "k3" is rlzoo's clamped "low_var_kl")
VERL_MODES = {"k1": "k1", "k2": "k2", "abs": "abs", "low_var_kl": "k3"}
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@pytest.fixture(scope="module")
def verl_opd():
    verl_core_algos()  # skips without verl; stubs ray
    import verl.trainer.distillation.losses as distillation
    import verl.workers.utils.losses as worker_losses

    mp = pytest.MonkeyPatch()
    for module in (distillation, worker_losses):
        mp.setattr(module, "no_padding_2_padding", lambda tensor, data: tensor)
    yield distillation
    mp.undo()


def _verl_loss(distillation, batch, *, mode, policy_gradient, use_task_rewards, coef, clamp, aggregation, mcl):
    """(loss, d loss / d logprobs, its ``distillation/abs_loss`` metric) of verl's distillation_ppo_loss on
    ``batch`` (global counts = the batch's)."""
    from tensordict import TensorDict
    from verl.workers.config import DistillationLossConfig
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    b, t = batch.shape
    mask = batch.completion_mask
    adv = batch.advantages.unsqueeze(-1).expand(b, t) if batch.advantages.ndim == 1 else batch.advantages
    actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(),
                        global_batch_info={}, loss_agg_mode=aggregation, use_kl_loss=False, loss_scale_factor=mcl)
    loss_config = DistillationLossConfig(loss_mode=mode, use_policy_gradient=policy_gradient,
                                         use_task_rewards=use_task_rewards, distillation_loss_coef=coef,
                                         loss_max_clamp=clamp)
    data = TensorDict({"response_mask": mask, "old_log_probs": batch.old_logprobs, "advantages": adv.contiguous(),
                       "teacher_logprobs": batch.teacher_logprobs.unsqueeze(-1)}, batch_size=[b])
    for key, value in {"dp_size": 1, "batch_num_tokens": int(mask.sum()),
                       "global_batch_size": int(mask.any(-1).sum())}.items():
        data.set_non_tensor(key, value)
    log_prob = batch.logprobs.detach().clone().requires_grad_(True)
    loss, metrics = distillation.distillation_ppo_loss(actor, types.SimpleNamespace(distillation_loss=loss_config),
                                                 model_output={"log_probs": log_prob}, data=data)
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad, torch.as_tensor(metrics["distillation/abs_loss"].aggregate(), dtype=loss.dtype)


@budget(0.5)
@given(batch=policy_batches(old=True, teacher=True, min_len=1, min_counted=1, certain_tokens=False,
                            log_ratio_scale=0.3),
       mode=st.sampled_from(sorted(VERL_MODES)), policy_gradient=st.booleans(), use_task_rewards=st.booleans(),
       coef=st.sampled_from((0.3, 1.0, 2.5)), clamp=st.sampled_from((None, 0.2, 10.0)),
       aggregation=st.sampled_from(AGGREGATIONS))
def test_opd_matches_verl_distillation(verl_opd, batch, mode, policy_gradient, use_task_rewards, coef, clamp,
                                       aggregation):
    """rlzoo's opd (task PPO clip + the distillation penalty) == verl's distillation_ppo_loss in value and in the
    gradient w.r.t. the student log-probs: both forms (policy gradient / direct), every KL estimator verl
    registers, the clamp, the coefficient, with and without task rewards, every aggregation verl shares; and the
    ``distillation/abs_loss`` metric (of the estimate before the clamp, as verl's)."""
    if not policy_gradient and mode == "k1":
        return  # refused by both (tested below)
    mcl = batch.shape[1] + 2
    if not use_task_rewards:  # verl drops the task term and forces the coefficient to 1
        batch = fresh(batch, advantages=torch.zeros_like(batch.advantages))
    loss_fn = rlzoo.get_loss("opd", dual_clip=3.0, distillation_loss_mode=mode,
                             distillation_policy_gradient=policy_gradient, distillation_loss_max_clamp=clamp,
                             distillation_loss_coef=coef if use_task_rewards else 1.0, aggregation=aggregation,
                             max_completion_length=mcl)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    want, want_grad, want_abs = _verl_loss(verl_opd, batch, mode=VERL_MODES[mode], policy_gradient=policy_gradient,
                                 use_task_rewards=use_task_rewards, coef=coef, clamp=clamp, aggregation=aggregation,
                                 mcl=mcl)
    torch.testing.assert_close(out.loss.detach(), want, **ATOL)
    torch.testing.assert_close(grad, want_grad, **ATOL)
    torch.testing.assert_close(out.metrics["distillation/abs_loss"], want_abs, **ATOL)


@budget(0.5)
@given(batch=policy_batches(old=False, teacher=True, min_counted=1), coef=st.floats(0.1, 3.0))
def test_first_iteration_is_reinforce_with_the_teachers_log_ratio(batch, coef):
    """On-policy (ratio 1) with zero task advantages, the gradient is REINFORCE's with the dense per-token reward
    log q - log p: d loss / d p_t = coef (p_t - q_t) / N_tokens (token-mean), and the value is coef * mean(p - q)."""
    batch = fresh(batch, advantages=torch.zeros_like(batch.advantages))
    out, grad, _ = loss_and_grads(rlzoo.get_loss("opd", distillation_loss_coef=coef), batch)
    mask = batch.completion_mask
    d = torch.where(mask, batch.logprobs.detach() - batch.teacher_logprobs, 0.0)
    n = mask.sum().clamp(min=1)
    torch.testing.assert_close(grad, coef * d / n, **F64)
    torch.testing.assert_close(out.loss.detach(), coef * d.sum() / n, **F64)


@budget(0.5)
@given(batch=policy_batches(old=True, teacher=True, ref=True, min_counted=1), data=st.data())
def test_the_distillation_term_adds_to_any_preset(batch, data):
    """get_loss(name, distillation_loss_coef=c) is the preset's loss plus c times the distillation term aggregated
    the same way (the penalty is linear in its coefficient), in value and gradient."""
    name = data.draw(st.sampled_from(["grpo", "dapo", "dr_grpo", "cispo", "gspo"]))
    c = data.draw(st.sampled_from((0.5, 2.0)))
    mcl = batch.shape[1]
    base = rlzoo.get_loss(name, max_completion_length=mcl)
    with_opd = rlzoo.get_loss(name, distillation_loss_coef=c, max_completion_length=mcl)
    one = rlzoo.get_loss(name, distillation_loss_coef=1.0, max_completion_length=mcl)
    out_b, g_b, _ = loss_and_grads(base, batch)
    out_c, g_c, _ = loss_and_grads(with_opd, batch)
    out_1, g_1, _ = loss_and_grads(one, batch)
    torch.testing.assert_close(out_c.loss - out_b.loss, c * (out_1.loss - out_b.loss), **F64)
    torch.testing.assert_close(g_c - g_b, c * (g_1 - g_b), **F64)


@budget(0.5)
@given(batch=policy_batches(old=True, teacher=True, min_counted=1), size=st.integers(1, 6))
def test_micro_batches_sum_to_the_full_batch(batch, size):
    """The distillation term is per token: micro-batch losses with the full batch's Normalizer sum to it."""
    loss_fn = rlzoo.get_loss("opd", aggregation="seq-mean-token-mean")
    full, g_full, _ = loss_and_grads(loss_fn, batch)
    whole = fresh(batch)
    normalizer = Normalizer.from_batch(whole)
    total = sum(loss_fn(mb, normalizer=normalizer).loss for mb in whole.split(size))
    (grad,) = torch.autograd.grad(total, whole.logprobs)
    torch.testing.assert_close(total, full.loss, **F64)
    torch.testing.assert_close(grad, g_full, **F64)


def test_errors_name_the_field():
    with pytest.raises(ValueError, match="distillation_policy_gradient=True"):
        rlzoo.get_loss("opd", distillation_policy_gradient=False)  # k1 without the policy gradient
    with pytest.raises(ValueError, match="distillation_loss_coef"):
        rlzoo.get_loss("opd", distillation_loss_coef=-1.0)
    with pytest.raises(ValueError, match="distillation_clip_ratio_c"):
        rlzoo.get_loss("opd", distillation_clip_ratio_c=1.0)
    lp = -torch.rand(2, 3, dtype=torch.float64)
    batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.zeros(2, dtype=torch.float64),
                              completion_mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(BatchError, match="teacher_logprobs"):
        rlzoo.get_loss("opd")(batch)
    assert rlzoo.get_loss("grpo", distillation_loss_coef=0.0).required_fields() == {"ref_logprobs"}
    with pytest.raises(BatchError, match="teacher_logprobs"):  # NaN at a counted position
        rlzoo.PolicyBatch(logprobs=lp, advantages=torch.zeros(2, dtype=torch.float64),
                          completion_mask=torch.ones(2, 3, dtype=torch.bool),
                          teacher_logprobs=torch.full((2, 3), float("nan"), dtype=torch.float64))
