r"""KL in the reward: a per-token KL penalty to the reference policy folded into the rewards before the advantage,
with a fixed or adaptive coefficient (PPO for language models; verl ``algorithm.use_kl_in_reward``).

Notation: ``N`` completions, ``T`` completion tokens, ``m`` the completion mask, ``pi_old`` the policy that
sampled (scored at generation time), ``pi_ref`` the reference, ``beta`` the controller's current coefficient.

.. math::

    \mathrm{kl}_{i,t} = k(\log\pi_{old}(o_{i,t}), \log\pi_{ref}(o_{i,t}))\,m_{i,t},\qquad
    r_{i,t} = [t = \text{last}_i]\,R_i - \beta\,\mathrm{kl}_{i,t}

(``k`` = ``k1``: ``log pi_old - log pi_ref``, by default). A token-level estimator (``gae``, ``reinforce_pp``,
``remax``, ``optimal_token_baseline``: ``token_rewards`` in its ``accepts``) gets ``-beta kl`` as its
``token_rewards``; an outcome estimator (``grpo`` and its family) gets the sequence total
``R_i - beta sum_t kl_{i,t}`` as its reward, as verl's GRPO sums ``token_level_rewards`` over the tokens.

After each batch the controller sees ``current_kl`` = the mean over completions of each completion's mean
``kl`` and the batch size ``N`` (:meth:`AdaptiveKLController.update`).
"""

import abc
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.losses import kl_estimate, kl_estimators
from rlzoo.registry import check_choice, check_number

__all__ = ["AdaptiveKLController", "FixedKLController", "KLController", "get_kl_controller", "kl_in_reward"]


class KLController(abc.ABC):
    """The coefficient ``beta`` of the KL in the reward (``value``), and how a batch's KL updates it.

    Raises:
        ValueError: from the constructors, naming the option out of range.
    """

    value: float

    @abc.abstractmethod
    def update(self, current_kl: float, n_steps: int) -> None:
        """Update ``value`` after a batch of ``n_steps`` completions whose mean per-token KL is ``current_kl``."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the current coefficient."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the coefficient, exactly)."""
        self.value = float(state["value"])


class FixedKLController(KLController):
    """A constant coefficient ``kl_coef`` (finite, >= 0).

    Source: verl 0.9.1 ``FixedKLController`` (``algorithm.kl_ctrl.type="fixed"``).
    """

    def __init__(self, kl_coef: float) -> None:
        check_number("kl controller", "kl_coef", kl_coef, low=0.0)
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No change."""


class AdaptiveKLController(KLController):
    r"""Ziegler et al.'s adaptive coefficient: proportional control of the KL towards ``target_kl``.

    .. math:: e = \mathrm{clip}\big(\tfrac{KL}{KL_{target}} - 1, -0.2, 0.2\big),\qquad
              \beta \leftarrow \beta\,\big(1 + e\,n / \text{horizon}\big)

    Args:
        init_kl_coef: the starting ``beta`` (finite, >= 0; verl ``kl_ctrl.kl_coef``, default 0.001 there).
        target_kl: ``KL_target`` > 0 (verl ``kl_ctrl.target_kl``, 0.1).
        horizon: > 0, in completions (verl ``kl_ctrl.horizon``, 10000).

    Source: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593 (the
    adaptive KL coefficient, there with the gain ``K_beta = 0.1`` per step; here ``n / horizon``). Matches verl 0.9.1 ``AdaptiveKLController`` (``kl_ctrl.type="adaptive"``;
    after OpenAI's lm-human-preferences and TRL's former PPOTrainer).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        check_number("kl controller", "kl_coef", init_kl_coef, low=0.0)
        check_number("kl controller", "target_kl", target_kl, low=0.0, low_open=True)
        check_number("kl controller", "horizon", horizon, low=0.0, low_open=True)
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """``value *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``.

        Raises:
            ValueError: ``current_kl`` NaN or inf (the coefficient would stay NaN for the rest of the run), or
                ``n_steps`` not an int >= 0 (each names the argument); the factor would be <= 0
                (``n_steps >= 5 * horizon`` with the KL below target): verl then turns ``beta`` negative, a reward
                for diverging from the reference; rlzoo names ``horizon``.
        """
        check_number("kl controller update", "current_kl", float(current_kl))
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
            raise ValueError(f"kl controller update: n_steps must be an int >= 0 (completions), got {n_steps!r}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        factor = 1.0 + error * n_steps / self.horizon
        if factor <= 0.0:
            raise ValueError(
                f"kl controller: horizon={self.horizon} is too short for batches of {n_steps} completions (the "
                f"adaptive update would make kl_coef <= 0); use horizon > {n_steps / 5:g}"
            )
        self.value *= factor


def get_kl_controller(kl_ctrl_type: str, *, kl_coef: float = 0.001, target_kl: float = 0.1,
                      horizon: int = 10000) -> KLController:
    """The controller verl's ``algorithm.kl_ctrl`` describes: ``"fixed"`` or ``"adaptive"``, with verl 0.9.1's
    ``KLControlConfig`` defaults (``target_kl`` and ``horizon`` are the adaptive controller's; a fixed one ignores
    them).

    Raises:
        ValueError: an unknown type (lists both), or an option out of range (names it).
    """
    check_choice("kl controller", "kl_ctrl_type", kl_ctrl_type, ("fixed", "adaptive"))
    if kl_ctrl_type == "fixed":
        return FixedKLController(kl_coef)
    return AdaptiveKLController(kl_coef, target_kl, horizon)


def kl_in_reward(
    old_logprobs: Float[Tensor, "N T"],
    ref_logprobs: Float[Tensor, "N T"],
    completion_mask: Bool[Tensor, "N T"],
    *,
    kl_coef: float,
    kl_penalty: str = "k1",
) -> tuple[Float[Tensor, "N T"], Float[Tensor, ""]]:
    """The per-token KL penalty ``-kl_coef * kl`` to add to the rewards, and the batch's ``current_kl``.

    Args:
        old_logprobs: ``Float[N, T]`` the sampling policy's log-probs (nats).
        ref_logprobs: ``Float[N, T]`` the reference's log-probs of the same tokens.
        completion_mask: ``Bool[N, T]``; values at masked positions are ignored (NaN included).
        kl_coef: ``beta``, finite, >= 0 (a controller's ``value``).
        kl_penalty: the estimator, one of ``rlzoo.losses.kl_estimators`` by rlzoo's names (default "k1"; verl's
            ``kl_penalty`` names differ: its "kl" is "k1", "mse" is "k2", and its "k3" is the clamped "low_var_kl",
            rlzoo's "k3" the unclamped one; ``rlzoo train --kl-penalty`` takes verl's names,
            ``rlzoo.trainer.config.VERL_KL_PENALTIES``).

    Returns:
        ``(token_rewards, current_kl)``: ``Float[N, T]`` equal to ``-kl_coef * kl`` (0 at masked positions), and the
        0-d mean over the ``N`` completions of each one's mean ``kl`` over its counted tokens (a completion
        without a counted token contributes 0).

    Raises:
        ValueError: ``kl_coef`` out of range, ``completion_mask`` not ``torch.bool``, NaN/inf at a counted position
            (names the input), shapes that differ from ``completion_mask``.
        UnknownNameError: an unknown estimator (lists them).

    Source: verl 0.9.1 ``apply_kl_penalty`` (``verl/trainer/ppo/ray_trainer.py``: ``token_level_rewards =
    token_level_scores - beta * kld``, ``current_kl = mean_i masked_mean_t(kld)``); verl divides each
    completion's sum by ``n_i + 1e-8``, rlzoo by ``max(n_i, 1)`` (a relative difference of 1e-8 / n_i).

    Example:
        >>> import torch
        >>> mask = torch.tensor([[True, True], [True, False]])
        >>> old = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]], dtype=torch.float64)
        >>> ref = torch.tensor([[-1.5, -0.5], [-1.0, 0.0]], dtype=torch.float64)
        >>> rewards, kl = kl_in_reward(old, ref, mask, kl_coef=0.25)
        >>> rewards.tolist(), kl.item()  # kl = old - ref: [[0.5, -0.5], [-1]]; current_kl = (0 + -1) / 2
        ([[-0.125, 0.125], [0.25, 0.0]], -0.5)
    """
    check_number("kl_in_reward", "kl_coef", kl_coef, low=0.0)
    kl_estimators.get(kl_penalty)
    if not isinstance(completion_mask, Tensor) or completion_mask.dtype != torch.bool:
        got = completion_mask.dtype if isinstance(completion_mask, Tensor) else type(completion_mask).__name__
        raise ValueError(f"kl_in_reward: completion_mask must be a torch.bool tensor (True = token counts), got {got}; "
                         "convert with .bool() (verl's response_mask is an int / float mask)")
    for name, x in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        if tuple(x.shape) != tuple(completion_mask.shape):
            raise ValueError(f"kl_in_reward: {name} must have shape {tuple(completion_mask.shape)} like "
                             f"completion_mask, got {tuple(x.shape)}")
        if bool((~torch.isfinite(x) & completion_mask).any()):
            raise ValueError(f"kl_in_reward: {name} holds NaN/inf at a counted position (completion_mask True)")
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)
    old = torch.where(completion_mask, old_logprobs, zero)
    ref = torch.where(completion_mask, ref_logprobs.to(old.dtype), zero)
    kl = torch.where(completion_mask, kl_estimate(old, ref, kl_penalty), zero)
    lengths = completion_mask.sum(-1).clamp(min=1).to(kl.dtype)
    current_kl = (kl.sum(-1) / lengths).mean()
    return torch.where(completion_mask, -kl_coef * kl, zero), current_kl
