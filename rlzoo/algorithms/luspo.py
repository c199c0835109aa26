r"""LUSPO: GSPO's sequence-ratio clip with each sequence's loss weighted by its length (Liu et al. 2026).

The aggregation is the mean over sequences of each sequence's token *sum*, so the loss grows with the
length (GSPO takes the token mean):

    >>> import torch, rlzoo
    >>> lp = torch.full((1, 3), -1.0, dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([-1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 3, dtype=torch.bool))
    >>> rlzoo.get_loss("luspo")(batch).loss.item(), rlzoo.get_loss("gspo")(batch).loss.item()
    (3.0, 1.0)
"""

from rlzoo.losses import PolicyLoss, PPOClip, SequenceRatio, preset

__all__ = ["luspo"]


@preset(
    "luspo",
    title="Length-Unbiased Sequence Policy Optimization",
    paper="Liu et al. 2026, Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response "
    "Length Variation in RLVR",
    arxiv="2602.05261",
    matches="TRL 1.16 loss_type='luspo' with importance_sampling_level='sequence' (TRL's default epsilon 0.2 is "
    "about 100x the paper's)",
    advantage="grpo",
)
def luspo() -> PolicyLoss:
    r"""loss = (1/S) sum_i |o_i| * -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i) (eq. 7), eps = (2e-3, 2.5e-3)."""
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=2e-3, epsilon_high=2.5e-3),
        ratio=SequenceRatio(),
        aggregation="seq-mean-token-sum",
    )
