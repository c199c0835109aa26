r"""PPO: the clipped surrogate (Schulman et al. 2017), per token, with a token-mean.

Without ``dual_clip`` or ``delta``, a token with ``A < 0`` and ``r > 1 + epsilon`` is *not* clipped: its loss
grows with ``r``. ``dual_clip = c`` bounds it at ``c |A|``:

    >>> import math, torch, rlzoo
    >>> lp = torch.tensor([[-1.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp - math.log(1.5),  # r = 1.5
    ...                           advantages=torch.tensor([-1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> round(rlzoo.get_loss("ppo")(batch).loss.item(), 9)
    1.5
    >>> round(rlzoo.get_loss("ppo", dual_clip=1.3)(batch).loss.item(), 9)
    1.3
"""

from rlzoo.losses import PolicyLoss, PPOClip, preset

__all__ = ["ppo"]


@preset(
    "ppo",
    title="Proximal Policy Optimization (clipped surrogate)",
    paper="Schulman et al. 2017, Proximal Policy Optimization Algorithms",
    arxiv="1707.06347",
    matches="verl loss_mode='vanilla' with loss_agg_mode='token-mean' (verl also applies dual clip c=3: "
    "pass dual_clip=3.0); TRL PPOTrainer's policy term",
    advantage="grpo",
    notes="The paper pairs PPO with GAE from a learned critic (rlzoo.get_advantage('gae') and "
    "rlzoo.advantages.value_loss); rlzoo's trainer has no critic, so it uses group-normalised advantages.",
)
def ppo() -> PolicyLoss:
    r"""loss = -min(w A, clip(w, 1 - eps_low, 1 + eps_high) A), token ratio w, token-mean.

    Defaults: eps_low = eps_high = 0.2, no dual clip (dual_clip=None), no delta cap, no KL term (beta = 0).
    """
    return PolicyLoss(surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2), aggregation="token-mean")
