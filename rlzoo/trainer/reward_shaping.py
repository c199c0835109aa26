"""Reward shaping at generation time, before the advantage: the reward functions' values combined, with DAPO's soft
overlong punishment (:func:`shape_rewards`), and KL in the reward (:class:`KLRewardShaping`): the per-token KL
penalty to the reference folded into the rewards, with its fixed or adaptive coefficient (verl
``algorithm.use_kl_in_reward``, ``algorithm.kl_ctrl``).

The math is :func:`rlzoo.advantages.kl_in_reward` and the controllers of :mod:`rlzoo.advantages.kl_reward`
(equal to verl 0.9.1's ``apply_kl_penalty`` and ``AdaptiveKLController``: tests/advantages). This module decides
what the estimator gets: a token-level estimator (``token_rewards`` in its ``accepts``: gae, reinforce_pp, remax,
optimal_token_baseline) the penalty as ``token_rewards``, an outcome estimator (grpo and its family) the sequence
total ``R_i - beta sum_t kl_{i,t}`` as its reward (verl's GRPO sums ``token_level_rewards`` over the tokens).
"""

import logging
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.advantages import KLController, get_kl_controller, kl_in_reward
from rlzoo.trainer.config import VERL_KL_PENALTIES, RewardConfig, SignalConfig
from rlzoo.trainer.distributed import RANK_LOCAL

__all__ = ["KLRewardShaping", "overlong_penalty", "scorable", "shape_rewards"]

log = logging.getLogger("rlzoo.train")


def scorable(values: Float[Tensor, "N K"]) -> Bool[Tensor, " N"]:
    """The completions some reward function scored: not every one of ``values``' ``K`` functions returned None
    (NaN). TRL 1.16 calls the others unscorable: they count in no group's baseline and get advantage 0."""
    return ~torch.isnan(values).all(dim=1)


def shape_rewards(values: Float[Tensor, "N K"], completion_mask: Bool[Tensor, "N C"], *, config: RewardConfig,
                  weights: tuple[float, ...], group_size: int, max_completion_length: int) -> Float[Tensor, " N"]:
    """The combined reward ``[N]`` of per-function rewards ``[N, K]``, plus DAPO's soft overlong punishment.

    The functions combine as ``config.multi_reward_aggregation`` (:func:`rlzoo.advantages.combine_rewards`: a
    None, NaN here, as TRL's); a completion every function returned None for is unscorable (TRL): its reward is
    0 here, and the advantage leaves it out (:func:`scorable`; a warning says how many). Then
    :func:`overlong_penalty` is added.
    """
    from rlzoo.advantages import combine_rewards

    unscorable = ~scorable(values)
    if bool(unscorable.any()):
        log.warning("%d completions were unscorable (every reward function returned None): advantage 0, left out "
                    "of their group's baseline (TRL)", int(unscorable.sum()), extra=RANK_LOCAL)
    reward = combine_rewards(values, weights=weights, mode=config.multi_reward_aggregation, group_size=group_size)
    reward = torch.nan_to_num(reward, nan=0.0)
    if config.overlong_buffer > 0:
        reward = reward + overlong_penalty(completion_mask.sum(-1).to(reward.dtype), config=config,
                                           max_completion_length=max_completion_length)
    return reward


def overlong_penalty(lengths: Float[Tensor, " N"], *, config: RewardConfig,
                     max_completion_length: int) -> Float[Tensor, " N"]:
    """DAPO's soft overlong punishment of completions of ``lengths`` tokens: with ``config.overlong_buffer`` =
    L_cache, ``min(0, (L_max - L_cache - |o|) / L_cache)``, floored at -1, times ``overlong_penalty`` (DAPO
    arXiv:2503.14476 eq. 13, ``L_max = max_completion_length``; TRL's ``get_soft_overlong_punishment``); 0 without
    a buffer."""
    if config.overlong_buffer <= 0:
        return torch.zeros_like(lengths)
    start = max_completion_length - config.overlong_buffer
    return ((start - lengths) / config.overlong_buffer).clamp(max=0.0, min=-1.0) * config.overlong_penalty


class KLRewardShaping:
    """The KL-in-reward penalty and its controller, over a whole (global) generation batch.

    Args:
        config: the signal section (``kl_ctrl``, ``kl_coef``, ``target_kl``, ``kl_horizon``, ``kl_penalty``: verl's
            names and meanings, :data:`~rlzoo.trainer.config.VERL_KL_PENALTIES`).

    Raises:
        ValueError: an option out of range (names it).
    """

    def __init__(self, config: SignalConfig) -> None:
        self.kl_penalty = VERL_KL_PENALTIES[config.kl_penalty]  # verl's meaning of the name ("k3" clamps)
        self.controller: KLController = get_kl_controller(config.kl_ctrl, kl_coef=config.kl_coef,
                                                          target_kl=config.target_kl, horizon=config.kl_horizon)
        self._start = {"kl_ctrl": config.kl_ctrl, "kl_coef": config.kl_coef}  # what the coefficient started from

    def apply(self, reward: Float[Tensor, " N"], sampling_logprobs: Float[Tensor, "N C"],
              ref_logprobs: Float[Tensor, "N C"], completion_mask: Bool[Tensor, "N C"], *,
              token_level: bool) -> tuple[Float[Tensor, " N"], Float[Tensor, "N C"] | None, dict[str, float]]:
        """Fold the penalty in, then update the controller with this batch's KL.

        Args:
            reward: ``[N]`` the combined outcome rewards.
            sampling_logprobs, ref_logprobs: ``[N, C]`` the sampling policy's and the reference's log-probs.
            completion_mask: ``[N, C]`` the counted completion tokens.
            token_level: the estimator takes ``token_rewards``.

        Returns:
            ``(reward, token_rewards, metrics)``: for a token-level estimator the unchanged ``reward`` and the
            penalty ``-beta kl`` as ``token_rewards``; otherwise ``reward - beta sum_t kl`` and None. ``metrics``:
            ``reward_kl_penalty`` (the batch's mean per-completion KL) and ``reward_kl_penalty_coeff`` (the beta
            used), verl's ``actor/reward_kl_penalty`` and ``actor/reward_kl_penalty_coeff``.
        """
        beta = self.controller.value
        penalty, current_kl = kl_in_reward(sampling_logprobs, ref_logprobs, completion_mask, kl_coef=beta,
                                           kl_penalty=self.kl_penalty)
        kl = float(current_kl)
        self.controller.update(kl, int(reward.shape[0]))
        metrics = {"reward_kl_penalty": kl, "reward_kl_penalty_coeff": beta}
        if token_level:
            return reward, penalty, metrics
        return reward + penalty.sum(-1).to(reward.dtype), None, metrics

    def state_dict(self) -> dict[str, Any]:
        """The controller's coefficient (checkpoints: a resume continues with the same beta) and the ``kl_ctrl`` and
        ``kl_coef`` it started from."""
        return {**self.controller.state_dict(), "start": dict(self._start)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, unless this run's ``kl_ctrl`` or ``kl_coef`` differ from those the saved
        coefficient started from: a resume that changes them starts the coefficient anew from them (a fixed
        ``--kl-coef`` given on resume is the one used). Checkpoints that predate the record restore as they were."""
        if state.get("start", self._start) == self._start:
            self.controller.load_state_dict({k: v for k, v in state.items() if k != "start"})
