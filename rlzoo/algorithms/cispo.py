r"""CISPO: clip the detached importance weight, not the update (MiniMax-M1, 2025).

Every token keeps a gradient: the clipped weight only scales REINFORCE's. A token with ``A > 0`` at
``r = 10`` (PPO would stop its gradient) gets ``-5 A`` per unit weight with the default cap ``1 + 4 = 5``:

    >>> import math, torch, rlzoo
    >>> lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp.detach() - math.log(10.0),
    ...                           advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> rlzoo.get_loss("cispo")(batch).loss.backward()
    >>> lp.grad.item()
    -5.0
"""

import torch

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, clip_metrics, preset
from rlzoo.registry import check_number

__all__ = ["CISPO", "cispo"]


class CISPO(Surrogate, name="cispo"):
    r"""CISPO's per-token loss: a clipped, detached importance weight times the REINFORCE term (eq. 4-5).

    .. math:: \ell = -\mathrm{sg}\big[\mathrm{clip}(w, 1-\epsilon_{low}, 1+\epsilon_{high})\big]\,A\,\log\pi_\theta

    Args:
        epsilon_low: finite, >= 0 (default 1.0: lower bound 0, i.e. no lower clip, as the paper).
        epsilon_high: finite, >= -1 (default 4.0: upper bound 5, ScaleRL's ``epsilon_max = 5``), with
            ``1 + epsilon_high >= 1 - epsilon_low``. TRL's ``epsilon_high`` for cispo is the absolute cap,
            i.e. ``1 + epsilon_high`` here; a cap below 1 (``epsilon_high < 0``, e.g. TRL's fallback cap 0.2)
            down-weights every token.

    Metrics: ``clip_ratio/low_mean``, ``clip_ratio/high_mean`` (TRL's ``cispo_clip_ratio``),
    ``clip_ratio/region_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number, or naming
            epsilon_high when the upper bound ``1 + epsilon_high`` is below the lower bound
            ``1 - epsilon_low``.
    """

    on_policy = OnPolicy.MINUS_ADVANTAGE_LOGP
    epsilon_low: float = 1.0
    epsilon_high: float = 4.0

    def check(self) -> None:
        check_number("cispo", "epsilon_low", self.epsilon_low, low=0.0)
        check_number("cispo", "epsilon_high", self.epsilon_high, low=-1.0)
        if 1.0 + self.epsilon_high < 1.0 - self.epsilon_low:
            raise ValueError(
                f"cispo: the upper bound 1 + epsilon_high ({1.0 + self.epsilon_high:.6g}) must be >= the lower bound "
                f"1 - epsilon_low ({1.0 - self.epsilon_low:.6g})"
            )

    def __call__(self, x: LossInputs) -> PartOutput:
        w = x.weight.detach()
        weight = torch.clamp(w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        loss = -weight * x.advantages * x.logprobs
        return PartOutput(loss, clip_metrics(x, w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high))


@preset(
    "cispo",
    title="Clipped IS-weight Policy Optimization",
    paper="MiniMax 2025, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention",
    arxiv="2506.13585",
    matches="TRL 1.16 loss_type='cispo' with epsilon_high=5.0 (TRL's cap is absolute: 1 + epsilon_high here); "
    "verl loss_mode='cispo' with clip_ratio_low=1.0, clip_ratio_high=4.0",
    advantage="grpo",
    notes="The paper sets no lower bound and tunes only the upper one; the default clip(w, 0, 5) is TRL's "
    "recommendation for ScaleRL (Khatri et al. 2025, arXiv:2510.13786). verl's defaults (0.2/0.2) would clip to "
    "[0.8, 1.2].",
    parts=(CISPO,),
)
def cispo() -> PolicyLoss:
    r"""loss = sum_it -sg[clip(w, 1-eps_low, 1+eps_high)] A logp / N_tokens, eps_low = 1, eps_high = 4."""
    return PolicyLoss(surrogate=CISPO(epsilon_low=1.0, epsilon_high=4.0), aggregation="token-mean")
