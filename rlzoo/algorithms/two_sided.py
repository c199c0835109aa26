r"""INTELLECT-2's two-sided clipping: GRPO with the unclipped ratio capped at ``delta`` (Prime Intellect 2025).

For ``A < 0`` plain GRPO does not clip ``r > 1 + epsilon`` (the loss grows with ``r``); the ``delta`` cap
bounds it at ``delta |A|`` with zero gradient:

    >>> import math, torch, rlzoo
    >>> lp = torch.tensor([[-1.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp - math.log(6.0),  # r = 6
    ...                           advantages=torch.tensor([-1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> round(rlzoo.get_loss("two_sided", beta=0.0)(batch).loss.item(), 9)  # min(6, delta = 4) |A|
    4.0
    >>> round(rlzoo.get_loss("grpo", beta=0.0)(batch).loss.item(), 9)
    6.0
"""

from rlzoo.losses import KLPenalty, PolicyLoss, PPOClip, preset

__all__ = ["two_sided"]


@preset(
    "two_sided",
    title="INTELLECT-2 two-sided clipping (delta cap on the unclipped ratio)",
    paper="Prime Intellect Team 2025, INTELLECT-2: A Reasoning Model Trained Through Globally Decentralized RL",
    arxiv="2505.07291",
    matches="TRL 1.16 loss_type='grpo' with delta=4.0, beta=0.001 and use_bias_correction_kl=False (TRL's "
    "default True multiplies k3 by the ratio: pass use_bias_correction_kl=True)",
    advantage="grpo",
    notes="delta=4, epsilon=0.2 and beta=0.001 as TRL's paper index reports from the paper's sec. 4.1; the "
    "paper's loss normalisation is unconfirmed, GRPO's per-sequence mean is used.",
)
def two_sided() -> PolicyLoss:
    r"""loss = (1/S) sum_i (1/|o_i|) sum_t [-min(min(w, delta) A, clip(w, 1-eps, 1+eps) A) + beta k3], delta = 4."""
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2, delta=4.0),
        aggregation="seq-mean-token-mean",
        penalties=(KLPenalty(beta=0.001, kl_estimator="k3"),),
    )
