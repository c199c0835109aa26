r"""SAPO: a smooth sigmoid gate on the ratio instead of PPO's hard clip (Gao et al. 2025).

``f'(1) = 1``, so at ratio 1 the gradient is REINFORCE's while the value is ``-2A / tau``:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> out = rlzoo.get_loss("sapo")(batch)  # tau_pos = 1
    >>> out.loss.backward()
    >>> out.loss.item(), lp.grad.item()
    (-2.0, -1.0)
"""

import torch

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, preset
from rlzoo.registry import check_number

__all__ = ["SAPO", "sapo"]


class SAPO(Surrogate, name="sapo"):
    r"""SAPO's per-token loss: a sigmoid gate on the ratio, with a temperature per advantage sign (eq. 5-6).

    .. math::
        \ell = -f_\tau(w)\,A,\qquad f_\tau(w) = \frac{4}{\tau}\,\sigma\big(\tau (w - 1)\big),
        \qquad \tau = \tau_{pos}\ \text{if}\ A > 0\ \text{else}\ \tau_{neg}

    ``f'(1) = 1``, so at ``w = 1`` the gradient is REINFORCE's; the loss value there is ``-2A/tau``.

    Args:
        tau_pos: finite, > 0, gate temperature for ``A > 0`` tokens (default 1.0).
        tau_neg: finite, > 0, gate temperature for ``A <= 0`` tokens (default 1.05).

    Raises:
        ValueError: naming tau_pos or tau_neg when it is <= 0, NaN, inf, or not a number.
    """

    on_policy = OnPolicy.REINFORCE_GRADIENT
    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def check(self) -> None:
        check_number("sapo", "tau_pos", self.tau_pos, low=0.0, low_open=True)
        check_number("sapo", "tau_neg", self.tau_neg, low=0.0, low_open=True)

    def __call__(self, x: LossInputs) -> PartOutput:
        adv = x.advantages
        # in the batch's dtype: torch.where on two Python floats would round tau to float32
        tau = torch.where(adv > 0, adv.new_tensor(self.tau_pos), adv.new_tensor(self.tau_neg))
        gate = torch.sigmoid(tau * (x.weight - 1.0)) * (4.0 / tau)
        return PartOutput(-gate * adv, {})


@preset(
    "sapo",
    title="Soft Adaptive Policy Optimization",
    paper="Gao et al. 2025, Soft Adaptive Policy Optimization",
    arxiv="2511.20347",
    matches="TRL 1.16 loss_type='sapo' (sapo_temperature_pos=1.0, sapo_temperature_neg=1.05); verl loss_mode='sapo'",
    advantage="grpo",
    parts=(SAPO,),
)
def sapo() -> PolicyLoss:
    r"""loss = (1/S) sum_i (1/|o_i|) sum_t -(4/tau) sigmoid(tau (w - 1)) A, tau = tau_pos (A > 0) or tau_neg.

    Defaults: tau_pos = 1.0, tau_neg = 1.05 (TRL's sapo_temperature_pos/neg), token ratio w.
    """
    return PolicyLoss(surrogate=SAPO(tau_pos=1.0, tau_neg=1.05), aggregation="seq-mean-token-mean")
