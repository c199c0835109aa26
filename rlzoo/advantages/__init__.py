"""Advantage estimators: rewards -> advantages, by name (``rlzoo.get_advantage("grpo", scale="group")``).

======================  ============================================  ======  ==========================================
name                    advantage                                     output  needs
======================  ============================================  ======  ==========================================
grpo                    (r - mean_g) / (std + eps); std: group/batch  [N]     groups
dr_grpo                 r - mean_g                                    [N]     groups
rloo                    r - mean of the other G - 1                   [N]     groups
opo                     r - length-weighted mean_g                    [N]     groups, mask
grpo_passk              best item: (r_max - r_2nd) / (std + eps)      [N]     groups
gpg                     alpha (r - mean_g)                            [N]     groups
maxrl                   (r - mean_g) / mean_g                         [N]     groups
reinforce_pp_baseline   whiten(r - mean_g)                            [N]     groups, mask
reward_norm             (r - mean) / (std + eps), AReaL's levels      [N]     groups
reinforce_pp            whiten(discounted return-to-go)               [N, T]  mask
remax                   return-to-go - greedy baseline reward         [N, T]  mask, baseline_rewards
gae                     GAE(gamma, lambda) from a critic, whitened    [N, T]  mask, values
optimal_token_baseline  G_t - variance-weighted group mean of G_t     [N, T]  groups, mask, old_logprobs, sum_pi_squared
======================  ============================================  ======  ==========================================

("groups": ``group_size`` or ``group_ids``; "mask": ``completion_mask``.)

Singleton and zero-variance groups get advantage 0 in every group-relative estimator (TRL's result; verl gives
``A = r`` to singletons in most estimators). ``combine_rewards`` merges several reward functions (TRL's
``multi_objective_aggregation``, GDPO); ``value_loss`` is the PPO critic's clipped loss; ``kl_in_reward`` and the
KL controllers (``FixedKLController``, ``AdaptiveKLController``) put a KL penalty into the rewards.
docs/advantages.md compares every convention with TRL, verl and AReaL.
"""

from rlzoo.advantages.base import (
    INPUTS,
    TOKEN_INPUTS,
    AdvantageEstimator,
    AdvantageInputs,
    EstimatorChoice,
    advantage_estimators,
    get_advantage,
    list_advantages,
)
from rlzoo.advantages.groups import WHITEN_EPS, GroupIds, GroupIndex, whiten
from rlzoo.advantages.kl_reward import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    get_kl_controller,
    kl_in_reward,
)
from rlzoo.advantages.multi import MULTI_REWARD_MODES, combine_rewards
from rlzoo.advantages.normalization import BatchLevel, GroupLevel, NoLevel, NormLevel, RewardNorm, norm_levels
from rlzoo.advantages.optimal_baseline import OptimalTokenBaseline
from rlzoo.advantages.outcome import (
    GPG,
    GRPO,
    OPO,
    RLOO,
    AdvantageScale,
    BaselineWhitening,
    DrGRPO,
    GPGAlpha,
    GRPOPassK,
    MaxRL,
    ReinforcePPBaseline,
    advantage_scales,
    baseline_whitenings,
    gpg_alphas,
)
from rlzoo.advantages.token import GAE, ReinforcePP, ReMax, token_level_rewards, value_loss

__all__ = [
    "GAE",
    "GPG",
    "GRPO",
    "INPUTS",
    "MULTI_REWARD_MODES",
    "OPO",
    "RLOO",
    "TOKEN_INPUTS",
    "WHITEN_EPS",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageScale",
    "BaselineWhitening",
    "BatchLevel",
    "DrGRPO",
    "EstimatorChoice",
    "FixedKLController",
    "GPGAlpha",
    "GRPOPassK",
    "GroupIds",
    "GroupIndex",
    "GroupLevel",
    "KLController",
    "MaxRL",
    "NoLevel",
    "NormLevel",
    "OptimalTokenBaseline",
    "ReMax",
    "ReinforcePP",
    "ReinforcePPBaseline",
    "RewardNorm",
    "advantage_estimators",
    "advantage_scales",
    "baseline_whitenings",
    "combine_rewards",
    "get_advantage",
    "get_kl_controller",
    "gpg_alphas",
    "kl_in_reward",
    "list_advantages",
    "norm_levels",
    "token_level_rewards",
    "value_loss",
    "whiten",
]
