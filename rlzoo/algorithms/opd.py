r"""On-policy distillation (OPD): the student samples, a frozen teacher scores the sampled tokens, and the
per-token reverse KL to the teacher is the learning signal.

Notation: ``p_t = log pi_theta(o_t | q, o_<t)`` (the student, with gradient), ``q_t`` the teacher's log-prob of
the same token (``PolicyBatch.teacher_logprobs``, scored at generation time), ``w_t = exp(p_t - p^old_t)``.

With ``distillation_policy_gradient=True`` (the default) the per-token reverse-KL estimate
``d_t = k(p_t, q_t)`` (``k1``: ``d_t = p_t - q_t``, an unbiased one-sample estimate of
``KL(pi_theta || pi_teacher)`` at that token) becomes a per-token advantage ``-sg[d_t]`` (a reward for tokens
the teacher likes more than the student does) and is optimised with PPO's clipped surrogate, as Thinking
Machines' on-policy distillation and MiniLLM's policy-gradient view of the reverse KL do. On the first iteration
(``w = 1``) its gradient is ``sg[q_t - p_t] grad p_t`` per token: REINFORCE with the teacher's log-ratio as a
dense reward. With ``distillation_policy_gradient=False`` the estimate itself is the loss term (its gradient
flows through ``p_t``: GKD's supervised form; use ``k3`` / ``low_var_kl``, the gradient of ``k1`` does not
depend on the teacher).

The distillation term is a :class:`~rlzoo.losses.Penalty`, so it adds to any loss:
``rlzoo.get_loss("grpo", distillation_loss_coef=0.5)`` is GRPO plus half the OPD term (verl's
``use_task_rewards=True``). The ``opd`` preset is PPO's clip on the task advantages plus the OPD term with
coefficient 1; with task advantages 0 (``rlzoo train --algorithm opd --teacher MODEL --reward-weights 0``:
every group's rewards are equal, so every GRPO advantage is exactly 0) it is pure distillation (verl's
``use_task_rewards=False``).

A student that puts more probability than the teacher on its own token gets a negative advantage there:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-0.5, -2.0]], dtype=torch.float64, requires_grad=True)
    >>> teacher = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.zeros(1, dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool), teacher_logprobs=teacher)
    >>> out = rlzoo.get_loss("opd")(batch)
    >>> out.loss.backward()
    >>> lp.grad.tolist()  # sg[p - q] / N_tokens: push the first token down, the second up
    [[0.5, -0.5]]
    >>> round(out.metrics["distillation/kl"].item(), 4)  # mean of k1 = p - q
    0.0
"""

import dataclasses
from types import MappingProxyType

from rlzoo.losses import (
    LossInputs,
    PartOutput,
    Penalty,
    PolicyLoss,
    PPOClip,
    kl_estimate,
    kl_estimators,
    preset,
)
from rlzoo.losses.functional import require
from rlzoo.registry import check_number, choice

__all__ = ["Distillation", "opd"]


class Distillation(Penalty, name="distillation"):
    r"""The on-policy distillation term: a per-token KL estimate to the teacher, as a reward or as a loss.

    With ``d_t = clamp(k(sg[p_t], q_t), -c_max, c_max)`` (``k`` = ``distillation_loss_mode``, ``c_max`` =
    ``distillation_loss_max_clamp``), per counted token:

    .. math::

        \ell_t = \lambda\,\mathrm{PPO}_{c}\big(w_t,\ A_t = -d_t\big)
        \quad\text{(policy gradient)},\qquad
        \ell_t = \lambda\,\mathrm{clamp}\big(k(p_t, q_t)\big) \quad\text{(direct)}

    where :math:`\mathrm{PPO}_c(w, A) = \max(-wA, -\mathrm{clip}(w, 1-\epsilon_l, 1+\epsilon_h)A)`, bounded for
    ``A < 0`` by ``-c A`` (dual clip), with the token-level ratio ``w_t = exp(p_t - p^old_t)`` whatever the
    loss's ``importance_sampling_level`` (verl's ``vanilla`` loss). The term is multiplied by the loss's IS
    correction weight when it has one (as verl passes ``rollout_is_weights``) and aggregated with the loss.

    Args:
        distillation_loss_coef: ``lambda``, finite, >= 0 (default 0.0: inactive, no ``teacher_logprobs``
            needed); the ``opd`` preset uses 1.0 (verl ``distillation_loss_coef``).
        distillation_loss_mode: the KL estimator ``k`` of ``KL(pi_theta || pi_teacher)`` at the sampled token,
            one of ``rlzoo.losses.kl_estimators`` (default "k1", the reverse KL as a reward; verl ``loss_mode``:
            verl's "kl"/"k1" is "k1", "mse"/"k2" is "k2", "low_var_kl"/"k3" is "low_var_kl").
        distillation_policy_gradient: True (default): ``-d_t`` is a per-token advantage for PPO's clip;
            False: ``k(p_t, q_t)`` is the loss term (verl ``use_policy_gradient``). "k1" and "k1+" are refused
            without the policy gradient (the gradient of ``p - q`` does not depend on the teacher; verl raises
            too).
        distillation_loss_max_clamp: None (default, verl's YAML default) or ``c_max > 0``: clamp ``d_t`` to
            ``[-c_max, c_max]`` (verl ``loss_max_clamp``).
        distillation_clip_ratio_low, distillation_clip_ratio_high: ``epsilon_l``, ``epsilon_h``, finite, >= 0
            (default 0.2 each: verl ``clip_ratio_low`` / ``clip_ratio_high`` of the distillation loss).
        distillation_clip_ratio_c: the dual-clip bound ``c > 1`` (default 3.0: verl's ``vanilla`` loss, which
            always applies it).

    Metrics, of the estimate before the clamp (as verl's): ``distillation/kl`` (masked mean of ``k(p_t, q_t)``,
    the reverse-KL estimate; with "k1" it can be < 0) and ``distillation/abs_loss`` (masked mean of its absolute
    value, verl's name and value); with the policy gradient,
    ``distillation/clip_ratio/low_mean``, ``/high_mean``, ``/region_mean`` of the distillation clip.

    Raises:
        ValueError: on construction, naming the option: out of the ranges above, NaN or not a number; an
            unknown estimator (lists them); "k1" / "k1+" without the policy gradient.
        BatchError: called without ``PolicyBatch.teacher_logprobs`` while active.

    References:
        Gu, Dong, Wei, Huang 2023, "MiniLLM: Knowledge Distillation of Large Language Models", arXiv:2306.08543,
        sec. 2.1-2.2 (the reverse KL to the teacher optimised by policy gradient over the student's own
        samples, per-token rewards ``log q - log p``); Lu and Thinking Machines Lab 2025, "On-Policy
        Distillation" (thinkingmachines.ai/blog/on-policy-distillation: per-token ``-(p - q)`` as the
        advantage, discount 0); Agarwal et al. 2023, "On-Policy Distillation of Language Models: Learning from
        Self-Generated Mistakes" (GKD), arXiv:2306.13649 (the direct form). Matches verl 0.9.1
        ``verl/trainer/distillation/losses.py`` ``distillation_loss`` with ``loss_mode`` a KL estimator and
        ``policy_loss_mode="vanilla"`` (its ``compute_policy_loss_vanilla`` clamps the log-ratio to [-20, 20]
        first; rlzoo does not).
    """

    example_options = MappingProxyType({"distillation_loss_coef": 1.0})
    distillation_loss_coef: float = 0.0
    distillation_loss_mode: str = choice("k1", kl_estimators)
    distillation_policy_gradient: bool = True
    distillation_loss_max_clamp: float | None = None
    distillation_clip_ratio_low: float = 0.2
    distillation_clip_ratio_high: float = 0.2
    distillation_clip_ratio_c: float = 3.0

    def check(self) -> None:
        owner = "distillation"
        check_number(owner, "distillation_loss_coef", self.distillation_loss_coef, low=0.0)
        if not isinstance(self.distillation_policy_gradient, bool):
            raise ValueError(f"{owner}: distillation_policy_gradient must be a bool, got "
                             f"{self.distillation_policy_gradient!r}")
        check_number(owner, "distillation_loss_max_clamp", self.distillation_loss_max_clamp, low=0.0,
                     low_open=True, allow_none=True)
        check_number(owner, "distillation_clip_ratio_low", self.distillation_clip_ratio_low, low=0.0)
        check_number(owner, "distillation_clip_ratio_high", self.distillation_clip_ratio_high, low=0.0)
        check_number(owner, "distillation_clip_ratio_c", self.distillation_clip_ratio_c, low=1.0, low_open=True)
        if not self.distillation_policy_gradient and self.distillation_loss_mode in ("k1", "k1+"):
            raise ValueError(
                f"{owner}: distillation_loss_mode={self.distillation_loss_mode!r} needs "
                "distillation_policy_gradient=True (the gradient of p - q does not depend on the teacher); "
                "use 'k3', 'low_var_kl' or 'k2' for the direct form"
            )

    @property
    def active(self) -> bool:
        return self.distillation_loss_coef != 0.0

    def required_fields(self) -> frozenset[str]:
        return frozenset({"teacher_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        teacher = require(x.teacher_logprobs, "teacher_logprobs",
                          f"the distillation term (distillation_loss_coef={self.distillation_loss_coef})")
        estimate = kl_estimate(x.logprobs, teacher, self.distillation_loss_mode)
        metrics = {"distillation/kl": x.mean(estimate.detach()), "distillation/abs_loss": x.mean(estimate.detach().abs())}
        if self.distillation_loss_max_clamp is not None:  # after the metrics, as verl
            estimate = estimate.clamp(-self.distillation_loss_max_clamp, self.distillation_loss_max_clamp)
        if not self.distillation_policy_gradient:
            term = estimate
        else:
            clip = PPOClip(epsilon_low=self.distillation_clip_ratio_low, epsilon_high=self.distillation_clip_ratio_high,
                           dual_clip=self.distillation_clip_ratio_c)
            reward = dataclasses.replace(x, advantages=-estimate.detach(), log_weight=x.log_ratio,
                                         advantages_per_sequence=False, weight_per_sequence=False)
            term, clip_metrics = clip(reward)
            metrics.update({f"distillation/{k}": v for k, v in clip_metrics.items() if not k.endswith("dual_mean")})
            if x.is_weight is not None:
                term = term * x.is_weight
        return PartOutput(self.distillation_loss_coef * term, metrics)


@preset(
    "opd",
    title="On-policy distillation (per-token reverse KL to a teacher as the reward)",
    paper="Gu, Dong, Wei, Huang 2023, MiniLLM: Knowledge Distillation of Large Language Models; Lu and Thinking "
    "Machines Lab 2025, On-Policy Distillation (blog)",
    arxiv="2306.08543",
    matches="verl 0.9.1 distillation (verl/trainer/distillation/losses.py distillation_ppo_loss) with "
    "distillation_loss.loss_mode='k1', use_policy_gradient=True, policy_loss_mode='vanilla', "
    "use_task_rewards=True, distillation_loss_coef=1.0, loss_max_clamp=null, and the actor's "
    "loss_mode='vanilla', loss_agg_mode='token-mean' (pass dual_clip=3.0 for verl's always-on dual clip of the "
    "task term); with zero task advantages, use_task_rewards=False",
    advantage="grpo",
    notes="Needs teacher_logprobs: the trainer scores the teacher (rlzoo train --teacher MODEL, a frozen model "
    "with the student's tokenizer) at generation time, like reference log-probs. The distillation term is the "
    "penalty part 'distillation' (options distillation_*): add it to any preset with "
    "distillation_loss_coef > 0. For pure distillation give the task term zero advantages (--reward-weights 0 "
    "makes every GRPO advantage exactly 0). Thinking Machines' recipe is the first iteration of this loss "
    "(num_iterations 1: w = 1, no clipping) with discount 0.",
    parts=(Distillation,),
)
def opd() -> PolicyLoss:
    r"""loss = sum_it [ -min(w A, clip(w, 1-eps, 1+eps) A) + lambda PPO_c(w, -sg[p - q]) ] / N_tokens,
    eps = 0.2, lambda = 1, p = student log-prob, q = teacher log-prob (k1: reverse KL to the teacher)."""
    return PolicyLoss(surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2), aggregation="token-mean",
                      penalties=(Distillation(distillation_loss_coef=1.0),))
