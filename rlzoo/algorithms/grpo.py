r"""GRPO (DeepSeekMath): PPO's clip per token, a per-sequence token mean, and a k3 KL penalty in the loss;
and TRL's ``bnpo``, the same clip with a token mean over the batch.

At the first iteration (``old_logprobs`` None, ratio 1) nothing is clipped: the value is the aggregated
``-A`` (zero when the advantages of a group sum to zero) but the gradient is REINFORCE's:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(2, 2, dtype=torch.bool), ref_logprobs=lp.detach())
    >>> out = rlzoo.get_loss("grpo")(batch)
    >>> out.loss.item(), out.metrics["clip_ratio/region_mean"].item()
    (0.0, 0.0)
    >>> out.loss.backward()
    >>> lp.grad.tolist()  # -A / (S n_i)
    [[-0.25, -0.25], [0.25, 0.25]]
"""

from rlzoo.losses import KLPenalty, PolicyLoss, PPOClip, preset

__all__ = ["bnpo", "grpo"]


@preset(
    "grpo",
    title="Group Relative Policy Optimization",
    paper="Shao et al. 2024, DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    arxiv="2402.03300",
    matches="TRL 1.16 loss_type='grpo' with beta=0.04 and use_bias_correction_kl=False (TRL's default True "
    "multiplies k3 by the ratio, DeepSeek-V3.2: pass use_bias_correction_kl=True); verl adv_estimator='grpo', "
    "loss_agg_mode='seq-mean-token-mean', use_kl_loss=True, kl_loss_type='k3' up to verl's clamp (verl's 'k3' and "
    "'low_var_kl' are one estimator, clamped to [-10, 10]: kl_estimator='low_var_kl' equals it)",
    advantage="grpo",
    notes="Paper eq. (3): per-sequence token mean, then mean over the group; KL (k3) in the loss with beta=0.04.",
)
def grpo() -> PolicyLoss:
    r"""loss = (1/S) sum_i (1/|o_i|) sum_t [ -min(w A, clip(w, 1-eps, 1+eps) A) + beta * k3 ], eps = 0.2."""
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2),
        aggregation="seq-mean-token-mean",
        penalties=(KLPenalty(beta=0.04, kl_estimator="k3"),),
    )


@preset(
    "bnpo",
    title="GRPO clip with batch token-level normalisation (TRL's loss_type='bnpo')",
    paper="TRL's 'batch-normalised per-token' GRPO loss (token-level normalisation as in DAPO sec. 3.3)",
    arxiv=None,
    matches="TRL 1.16 loss_type='bnpo'; Liger 'bnpo'; verl loss_agg_mode='token-mean'",
    advantage="grpo",
    notes="Despite the name, unrelated to the BNPO paper (Xiao et al. 2025, arXiv:2506.02864, a Beta "
    "normalisation of advantages). TRL normalises by the active tokens of the local batch; with a Normalizer "
    "this is the token-mean of the optimizer-step batch, i.e. 'dapo' with epsilon_high=0.2.",
)
def bnpo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps, 1+eps) A) / N_tokens, eps = 0.2."""
    return PolicyLoss(surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2), aggregation="token-mean")
