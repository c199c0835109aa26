r"""DRO: REINFORCE with a quadratic penalty on the log-ratio to the sampling policy (Kimi k1.5, 2025).

On-policy the penalty is 0 and the loss is REINFORCE's; off-policy it pulls ``logp`` back to ``old``:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp - 2.0, advantages=torch.tensor([0.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> round(rlzoo.get_loss("dro")(batch).loss.item(), 9)  # dro_beta / 2 * (log w)^2 = 0.025 * 4
    0.1
"""

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, preset
from rlzoo.registry import check_number

__all__ = ["DRO", "dro"]


class DRO(Surrogate, name="dro"):
    r"""DRO's per-token loss: REINFORCE minus a quadratic penalty on the log-ratio.

    .. math:: \ell_t = -\big(A\,\log\pi_\theta(o_t) - \tfrac{\beta_{dro}}{2}\,\ell_t^2\big),
        \qquad \ell_t = \log\pi_\theta(o_t) - \log\pi_{old}(o_t)

    Args:
        dro_beta: finite, > 0, the penalty coefficient (default 0.05, the verl/Tinker example value; verl
            requires it, no paper value is confirmed).

    Metrics: ``ppo_kl`` (masked mean of ``-log_ratio``).

    Raises:
        ValueError: naming dro_beta when it is <= 0, NaN, inf, or not a number.
    """

    on_policy = OnPolicy.MINUS_ADVANTAGE_LOGP
    reads_ratio_level = False
    dro_beta: float = 0.05

    def check(self) -> None:
        check_number("dro", "dro_beta", self.dro_beta, low=0.0, low_open=True)

    def __call__(self, x: LossInputs) -> PartOutput:
        lr = x.log_ratio
        loss = -(x.advantages * x.logprobs - 0.5 * self.dro_beta * lr.square())
        return PartOutput(loss, {"ppo_kl": x.mean(-lr.detach())})


@preset(
    "dro",
    title="DRO: REINFORCE with a quadratic log-ratio penalty",
    paper="Kimi Team 2025, Kimi k1.5: Scaling Reinforcement Learning with LLMs (sec. 2.3.2, the online "
    "mirror-descent surrogate); named after Richemond et al. 2024, arXiv:2405.19107",
    arxiv="2501.12599",
    matches="verl loss_mode='dro' (policy_loss.dro_beta); Tinker's 'dro' loss",
    advantage="grpo",
    notes="No paper value for dro_beta is confirmed; 0.05 is the verl/Tinker example value.",
    parts=(DRO,),
)
def dro() -> PolicyLoss:
    r"""loss = sum_it -(A logp - dro_beta/2 (log w)^2) / N_tokens, log w = logp - logp_old."""
    return PolicyLoss(surrogate=DRO(dro_beta=0.05), aggregation="token-mean")
