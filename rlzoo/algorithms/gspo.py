r"""GSPO: PPO's clip on the sequence likelihood ratio (Zheng et al. 2025), and GSPO-token.

The ratio is one value per sequence, the geometric mean of its token ratios; GSPO-token has the same value
with a per-token gradient (``importance_sampling_level="sequence_token"``):

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    >>> old = lp - torch.tensor([[0.1, -0.1]], dtype=torch.float64)  # token ratios e^0.1, e^-0.1
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> rlzoo.get_loss("gspo")(batch).metrics["ratio/max"].item()  # s = exp(mean(0.1, -0.1))
    1.0
"""

from rlzoo.losses import PolicyLoss, PPOClip, SequenceRatio, SequenceTokenRatio, preset

__all__ = ["gspo", "gspo_token"]


@preset(
    "gspo",
    title="Group Sequence Policy Optimization",
    paper="Zheng et al. 2025, Group Sequence Policy Optimization",
    arxiv="2507.18071",
    matches="TRL 1.16 loss_type='grpo', importance_sampling_level='sequence', epsilon=3e-4, epsilon_high=4e-4; "
    "verl loss_mode='gspo' (which uses the GSPO-token ratio, see gspo_token)",
    advantage="grpo",
)
def gspo() -> PolicyLoss:
    r"""loss = (1/S) sum_i -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i), s_i = exp(mean_t log w_it), eps = (3e-4, 4e-4)."""
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=3e-4, epsilon_high=4e-4),
        ratio=SequenceRatio(),
        aggregation="seq-mean-token-mean",
    )


@preset(
    "gspo_token",
    title="GSPO-token (sequence ratio value, per-token gradient)",
    paper="Zheng et al. 2025, Group Sequence Policy Optimization (sec. 4.3)",
    arxiv="2507.18071",
    matches="verl loss_mode='gspo' with max_log_ratio=10.0 (verl's clamp of the log-ratio; off by default)",
    advantage="grpo",
)
def gspo_token() -> PolicyLoss:
    r"""As gspo with s_it = sg[s_i] * pi_theta(o_it) / sg[pi_theta(o_it)]: same value, per-token gradient."""
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=3e-4, epsilon_high=4e-4),
        ratio=SequenceTokenRatio(),
        aggregation="seq-mean-token-mean",
    )
