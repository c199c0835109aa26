r"""VESPO: REINFORCE weighted by a detached gamma-shaped function of the sequence IS ratio (Shen et al. 2026).

``phi(W) = e^lambda W^k e^(-lambda W)`` peaks at ``W = k / lambda`` and is 1 at ``W = 1``, so on-policy data
gets REINFORCE exactly; stale sequences (``W`` far from 1) are softly down-weighted:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> rlzoo.get_loss("vespo")(batch).metrics["vespo/phi_seq_mean"].item()
    1.0
    >>> stale = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp - 0.25, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> round(rlzoo.get_loss("vespo")(stale).metrics["vespo/phi_seq_mean"].item(), 6)  # W = e^0.5: e^(3 + 1 - 3 W)
    0.388227
"""

import math

import torch

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, preset
from rlzoo.registry import check_number

__all__ = ["VESPO", "vespo"]


def _phi_mean(x: LossInputs, phi: torch.Tensor) -> torch.Tensor:
    """TRL 1.16's ``vespo/phi_seq_mean``: with one advantage per sequence, the mean over every sequence of its phi (1
    for a sequence without a counted token: ``log W = 0``); with per-token advantages, the mean over counted tokens."""
    if not x.advantages_per_sequence:
        return x.mean(phi)
    return torch.where(x.lengths > 0, x.seq_mean(phi).squeeze(-1), torch.ones_like(x.lengths)).mean()


class VESPO(Surrogate, name="vespo"):
    r"""VESPO's per-token loss: REINFORCE times a detached function of the sequence IS ratio (eq. 17, 20).

    .. math::
        \ell_t = -\mathrm{sg}[\varphi(W_i)]\,A\,\log\pi_\theta(o_t),\qquad
        \varphi(W) = e^{\lambda} W^{k} e^{-\lambda W},\qquad
        \log W_i = \sum_t \mathrm{clip}(\ell_{i,t}, -20, 20)\ (+\textstyle\sum_t \log \text{is\_weight})

    (a *sum*, not a mean, of token log-ratios; ``log W`` clamped to ``[log 1e-8, 20]``; ``phi(1) = 1``),
    with ``(k, lambda) = (k_pos, lambda_pos)`` for ``A >= 0`` and ``(k_neg, lambda_neg)`` otherwise. It
    reads the token log-ratio itself (the ratio level does not change it) and folds the sampler IS
    weight into ``W`` instead of multiplying by it.

    Args:
        k_pos, lambda_pos: any finite values, shape and rate for ``A >= 0`` (defaults 2.0, 3.0).
        k_neg, lambda_neg: any finite values, for ``A < 0`` (defaults 3.0, 2.0).

    As in TRL, which does not range-check them either: ``k`` sets how strongly ``W < 1`` is down-weighted,
    ``lambda`` how strongly ``W > 1`` is; a lambda below 1e-4 is used as 1e-4 (clamped at call time).

    Only token-level IS corrections combine with VESPO (``sequence_is_weight = False``):
    :class:`~rlzoo.losses.PolicyLoss` raises a ValueError naming is_correction for a sequence mode (TRL
    rejects them too: a sequence weight broadcast over n tokens would count n times in ``W``).

    Metrics: ``vespo/phi_seq_mean``.

    Raises:
        ValueError: naming the option when it is NaN, inf, or not a number.
    """

    folds_is_weight = True
    sequence_is_weight = False
    on_policy = OnPolicy.MINUS_ADVANTAGE_LOGP
    reads_ratio_level = False
    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0

    def check(self) -> None:
        for name in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
            check_number("vespo", name, getattr(self, name))

    def __call__(self, x: LossInputs) -> PartOutput:
        lower = math.log(1e-8)
        with torch.no_grad():
            log_w = x.seq_sum(torch.clamp(x.log_ratio, -20.0, 20.0))
            if x.is_weight is not None:
                log_w = log_w + x.seq_sum(torch.clamp(torch.log(x.is_weight), lower, 20.0))
            log_w = torch.clamp(log_w, lower, 20.0).expand_as(x.log_ratio)
            nonneg = x.advantages >= 0
            k = torch.where(nonneg, log_w.new_tensor(self.k_pos), log_w.new_tensor(self.k_neg))
            lam = torch.where(nonneg, log_w.new_tensor(self.lambda_pos), log_w.new_tensor(self.lambda_neg))
            lam = lam.clamp(min=1e-4)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        loss = -phi * x.advantages * x.logprobs
        return PartOutput(loss, {"vespo/phi_seq_mean": _phi_mean(x, phi)})


@preset(
    "vespo",
    title="VESPO (gamma-weighted sequence-level soft IS)",
    paper="Shen et al. 2026, VESPO: Variational Sequence-level Soft Policy Optimization for (Stable) Off-Policy "
    "LLM Training",
    arxiv="2602.10693",
    matches="TRL 1.16 loss_type='vespo' (vespo_k_pos=2, vespo_lambda_pos=3, vespo_k_neg=3, vespo_lambda_neg=2)",
    advantage="grpo",
    parts=(VESPO,),
)
def vespo() -> PolicyLoss:
    r"""loss = sum_it -sg[phi(W_i)] A logp / N_tokens, phi(W) = e^lambda W^k e^(-lambda W) (eq. 17), W_i = prod_t w_it.

    Defaults: (k_pos, lambda_pos) = (2, 3) for A >= 0, (k_neg, lambda_neg) = (3, 2) for A < 0.
    """
    return PolicyLoss(surrogate=VESPO(), aggregation="token-mean")
