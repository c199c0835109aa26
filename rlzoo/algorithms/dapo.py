r"""DAPO: PPO's clip with a higher upper bound ("clip-higher") and a token mean over the batch (Yu et al. 2025).

A token with ``A > 0`` may raise its probability up to ``r = 1.28`` before the clip stops its gradient (PPO's
symmetric clip stops it at 1.2):

    >>> import math, torch, rlzoo
    >>> lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp.detach() - math.log(1.25),  # r = 1.25
    ...                           advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> out = rlzoo.get_loss("dapo")(batch)
    >>> out.loss.backward()
    >>> round(lp.grad.item(), 9), out.metrics["clip_ratio/high_mean"].item()  # -r A: not clipped
    (-1.25, 0.0)
    >>> rlzoo.get_loss("ppo")(batch).metrics["clip_ratio/high_mean"].item()
    1.0
"""

from rlzoo.losses import PolicyLoss, PPOClip, preset

__all__ = ["dapo"]


@preset(
    "dapo",
    title="Decoupled Clip and Dynamic sAmpling Policy Optimization",
    paper="Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    arxiv="2503.14476",
    matches="TRL 1.16 loss_type='dapo', epsilon=0.2, epsilon_high=0.28; verl clip_ratio_low=0.2, "
    "clip_ratio_high=0.28, loss_agg_mode='token-mean'",
    advantage="grpo",
    notes="Dynamic sampling, overlong reward shaping and mask_truncated_completions are trainer options "
    "(rlzoo train --dynamic-sampling --overlong-buffer ...), not part of the loss.",
)
def dapo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps_low, 1+eps_high) A) / N_tokens, eps_low = 0.2, eps_high = 0.28 (sec. 3.1, 3.3)."""
    return PolicyLoss(surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.28), aggregation="token-mean")
