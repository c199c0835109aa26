r"""Dr. GRPO: GRPO without the length and std normalisations (Liu et al. 2025).

The loss divides the token sum by the constant ``S * max_completion_length`` instead of each sequence's
length, so a long wrong answer is not penalised less per token than a short one:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([-1.0, -1.0], dtype=torch.float64),
    ...                           completion_mask=torch.tensor([[True, True, True], [True, False, False]]))
    >>> rlzoo.get_loss("dr_grpo", max_completion_length=4)(batch).loss.item()  # (3 + 1) / (2 * 4)
    0.5
"""

from rlzoo.losses import PolicyLoss, PPOClip, preset

__all__ = ["dr_grpo"]


@preset(
    "dr_grpo",
    title="Dr. GRPO (GRPO done right: no length or std normalisation)",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective",
    arxiv="2503.20783",
    matches="TRL 1.16 loss_type='dr_grpo' with scale_rewards='none'; verl loss_agg_mode='seq-mean-token-sum-norm' "
    "with loss_scale_factor=max_completion_length",
    advantage="dr_grpo",
    notes="Needs max_completion_length (the paper's constant MAX_TOKENS): get_loss('dr_grpo', max_completion_length=L).",
)
def dr_grpo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps, 1+eps) A) / (S * max_completion_length), A = r - mean_group(r)."""
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2),
        aggregation="seq-mean-token-sum-norm",
    )
