r"""GPG: plain REINFORCE with group advantages, no ratio and no clip (Chu et al. 2025).

Off-policy data is not re-weighted: the loss is ``-A logp`` whatever ``old_logprobs`` are:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-2.0, -1.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp - 0.5, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> rlzoo.get_loss("gpg")(batch).loss.item()  # mean of -A logp
    1.5
"""

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, preset

__all__ = ["Reinforce", "gpg"]


class Reinforce(Surrogate, name="reinforce"):
    r"""REINFORCE: the plain policy gradient, no ratio and no clipping (Williams 1992, eq. 11; GPG eq. 6).

    .. math:: \ell = -A\,\log\pi_\theta(o_t)

    The ratio level is ignored (off-policy data is not re-weighted; ``uses_ratio`` False): in bypass mode a
    rollout IS weight multiplies it, verl's ``bypass_mode`` with ``loss_type="reinforce"``
    (``core_algos.compute_policy_loss_reinforce``). No options.
    """

    on_policy = OnPolicy.MINUS_ADVANTAGE_LOGP
    uses_ratio = False
    reads_ratio_level = False

    def __call__(self, x: LossInputs) -> PartOutput:
        return PartOutput(-x.advantages * x.logprobs, {})


@preset(
    "gpg",
    title="Group Policy Gradient (REINFORCE with group advantages)",
    paper="Chu et al. 2025, GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    arxiv="2504.02546",
    matches="verl loss_mode='gpg', adv_estimator='gpg'",
    advantage="gpg",
    parts=(Reinforce,),
)
def gpg() -> PolicyLoss:
    r"""loss = sum_it -A logp / N_tokens (no ratio, no clip)."""
    return PolicyLoss(surrogate=Reinforce(), aggregation="token-mean")
