"""The advantage of a generation batch: what the estimator is given (the completion mask, the sampling policy's
log-probs and ``sum_pi_squared``, the KL in the reward as rewards or token rewards), gathered from every rank.

The estimator declares what it uses (``needs`` / ``accepts``, :mod:`rlzoo.advantages.base`); exactly those inputs
are passed, so an estimator never receives one it would drop (it raises on unused inputs).
"""

from typing import Any

import torch
from torch import Tensor

from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.reward_shaping import KLRewardShaping, scorable
from rlzoo.trainer.rollout import Rollout

__all__ = ["batch_advantages"]


def batch_advantages(estimator: Any, rollout: Rollout, sampling: dict[str, Tensor], *, group_size: int,
                     kl_reward: KLRewardShaping | None, dist: Distributed) -> tuple[Tensor, dict[str, float]]:
    """This rank's rows of the advantages of the global generation batch.

    Rewards and the estimator's inputs are gathered from every rank (batch-level scaling and the KL controller see
    the whole batch; each rank computes the same thing and keeps its rows). Unscorable completions (every reward
    function returned None) are left out of the estimator, so of their group's baseline and the batch's std, and
    get advantage 0, as TRL 1.16 does.

    Args:
        estimator: an advantage estimator (``rlzoo.get_advantage``).
        rollout: this rank's share of the generation batch (``reward``, ``rewards``, ``completion_mask``,
            ``ref_logprobs`` when ``kl_reward`` is given).
        sampling: the sampling policy's ``old_logprobs`` and ``sum_pi_squared`` scored at generation time (those
            the estimator or the KL in the reward use).
        group_size: completions per prompt.
        kl_reward: the KL-in-reward shaping (its controller is updated with this batch's KL), or None.
        dist: the process group.

    Returns:
        ``(advantages, metrics)``: ``Float[N]`` or ``Float[N, C]`` (float32, this rank's rows and width), and the
        KL in the reward's metrics (empty without it).
    """
    n, extra, gather = rollout.num_completions, {}, dist.all_gather
    wanted = estimator.needs | estimator.accepts
    reward, metrics = gather(rollout.reward), {}
    if "completion_mask" in wanted or kl_reward is not None:
        extra["completion_mask"] = gather(rollout.completion_mask, pad_value=False)
    for name, value in sampling.items():
        if name in wanted:
            extra[name] = gather(value, pad_value=0.0)
    if kl_reward is not None:
        assert rollout.ref_logprobs is not None  # the trainer scores the reference for the KL in the reward
        reward, token_rewards, metrics = kl_reward.apply(
            reward, gather(sampling["old_logprobs"], pad_value=0.0), gather(rollout.ref_logprobs, pad_value=0.0),
            extra["completion_mask"], token_level="token_rewards" in wanted)
        if token_rewards is not None:
            extra["token_rewards"] = token_rewards
        if "completion_mask" not in wanted:
            del extra["completion_mask"]
    scored = scorable(gather(rollout.rewards))
    if bool(scored.all()):
        advantages = estimator(reward, group_size=group_size, **extra).to(torch.float32)
    else:  # the scored rows, in their groups
        groups = torch.arange(reward.shape[0], device=reward.device) // group_size
        width = [extra["completion_mask"].shape[1]] if estimator.token_level else []  # token-level: need the mask
        part = estimator(reward[scored], group_ids=groups[scored], **{k: v[scored] for k, v in extra.items()}
                         ).to(torch.float32) if bool(scored.any()) else reward.new_zeros(0, *width, dtype=torch.float32)
        advantages = torch.zeros((reward.shape[0], *part.shape[1:]), dtype=torch.float32, device=reward.device)
        advantages[scored] = part
    advantages = advantages[dist.rank * n:(dist.rank + 1) * n]
    return (advantages[:, : rollout.completion_ids.shape[1]] if advantages.ndim == 2 else advantages), metrics
