r"""DPPO: REINFORCE with a truncated detached ratio, masked outside a binary-divergence trust region
(Qi et al. 2026).

The trust region is on the sampled token's probability ``p`` itself (total variation ``|p - p_old|`` or the
binary KL), not on the ratio: a rare token may move far in ratio while moving little in probability.

    >>> import math, torch, rlzoo
    >>> lp = torch.log(torch.tensor([[0.9, 0.01]], dtype=torch.float64))
    >>> old = torch.log(torch.tensor([[0.5, 0.005]], dtype=torch.float64))  # p - p_old = 0.4 and 0.005
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> rlzoo.get_loss("dppo_tv", max_completion_length=2)(batch).metrics["dppo/masked_mean"].item()
    0.5
"""

import abc

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, preset
from rlzoo.registry import check_number

__all__ = ["DPPOBinaryKL", "DPPOBinaryTV", "dppo_kl", "dppo_tv"]


class _DPPO(Surrogate, abc.ABC):
    """Shared body of the DPPO binary-divergence masks: ``-A sg[min(w, C)] logp`` on the kept tokens."""

    on_policy = OnPolicy.MINUS_ADVANTAGE_LOGP
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    clip_ratio_c: float = 20.0

    def check(self) -> None:
        owner = self.label()
        check_number(owner, "epsilon_low", self.epsilon_low, low=0.0)
        check_number(owner, "epsilon_high", self.epsilon_high, low=0.0)
        check_number(owner, "clip_ratio_c", self.clip_ratio_c, low=0.0, low_open=True, allow_inf=True)

    @abc.abstractmethod
    def _valid(self, p: Float[Tensor, "B T"], old_p: Float[Tensor, "B T"], x: LossInputs) -> Bool[Tensor, "B T"]:
        """Tokens inside the trust region (in the direction of their advantage)."""

    def __call__(self, x: LossInputs) -> PartOutput:
        w = x.weight
        truncated = torch.clamp(w, max=self.clip_ratio_c).detach()
        with torch.no_grad():
            p = torch.exp(x.logprobs.detach())
            old_p = torch.exp(x.old_logprobs)
            valid = self._valid(p, old_p, x)
        dtype = x.logprobs.dtype
        loss = -x.advantages * truncated * x.logprobs * valid.to(dtype)
        metrics = {
            "dppo/masked_mean": x.mean((~valid).to(dtype)),
            "dppo/truncated_mean": x.mean(((w.detach() > self.clip_ratio_c) & valid).to(dtype)),
        }
        return PartOutput(loss, metrics)


class DPPOBinaryTV(_DPPO, name="dppo_tv"):
    r"""DPPO-Binary-TV: masked outside a total-variation trust region on ``p = exp(logp)`` (eq. 12-13, 23).

    .. math::
        \ell_t = -A\,\mathrm{sg}[\min(w, c)]\,\log\pi_\theta\;\cdot
        \mathbb{1}\big[A > 0:\ p - p_{old} \le \epsilon_{high};\ A \le 0:\ p - p_{old} \ge -\epsilon_{low}\big]

    Args:
        epsilon_low, epsilon_high: finite, >= 0, TV thresholds in probability units (default 0.2 / 0.2,
            verl's ``clip_ratio``; the paper and the ``dppo_tv`` preset use 0.15).
        clip_ratio_c: > 0 (inf: no truncation), truncation C of the detached IS ratio (default 20.0, verl's
            fallback; the paper's scaling runs and the preset use 5).

    Metrics: ``dppo/masked_mean`` (tokens outside the region), ``dppo/truncated_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number.
    """

    def _valid(self, p: Float[Tensor, "B T"], old_p: Float[Tensor, "B T"], x: LossInputs) -> Bool[Tensor, "B T"]:
        return torch.where(x.advantages > 0, (p - old_p) <= self.epsilon_high, (p - old_p) >= -self.epsilon_low)


class DPPOBinaryKL(_DPPO, name="dppo_kl"):
    r"""DPPO-Binary-KL: as :class:`DPPOBinaryTV` with the binary KL divergence as the trust region (eq. 12, 14).

    .. math::
        D = p_{old}\log\frac{p_{old}}{p} + (1-p_{old})\log\frac{1-p_{old}+10^{-8}}{1-p+10^{-8}}

    kept if ``A > 0`` and (``D <= epsilon_high`` or ``p <= p_old``), or ``A <= 0`` and
    (``D <= epsilon_low`` or ``p >= p_old``).

    Args:
        epsilon_low, epsilon_high: finite, >= 0, KL thresholds in nats (default 0.2 / 0.2 as verl; the
            paper and the ``dppo_kl`` preset use 0.05).
        clip_ratio_c: > 0 (inf: no truncation), truncation C of the detached IS ratio (default 20.0;
            preset 5).

    Metrics: ``dppo/masked_mean`` (tokens outside the region), ``dppo/truncated_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number.
    """

    def _valid(self, p: Float[Tensor, "B T"], old_p: Float[Tensor, "B T"], x: LossInputs) -> Bool[Tensor, "B T"]:
        kl = old_p * (x.old_logprobs - x.logprobs.detach()) + (1 - old_p) * torch.log(
            (1.0 - old_p + 1e-8) / (1.0 - p + 1e-8)
        )
        pos = (kl <= self.epsilon_high) | (p <= old_p)
        neg = (kl <= self.epsilon_low) | (p >= old_p)
        return torch.where(x.advantages > 0, pos, neg)


_PAPER = "Qi et al. 2026, Rethinking the Trust Region in LLM Reinforcement Learning"


@preset(
    "dppo_tv",
    title="Divergence PPO, binary total-variation trust region",
    paper=_PAPER,
    arxiv="2602.04879",
    matches="verl loss_mode='dppo_tv' with clip_ratio_low=clip_ratio_high=0.15, clip_ratio_c=5, "
    "loss_agg_mode='seq-mean-token-sum-norm' (verl's recipe)",
    advantage="dr_grpo",
    notes="Thresholds and C=5 are the paper's (App. C, E); r and the divergence are meant w.r.t. the sampling "
    "policy: pass the sampler's log-probs as old_logprobs (verl's bypass_mode). Needs max_completion_length.",
    parts=(DPPOBinaryTV,),
)
def dppo_tv() -> PolicyLoss:
    r"""loss = -A sg[min(w, C)] logp * M_t (eq. 12-13), M_t = 0 where |p - p_old| > delta_TV in the direction of A.

    Defaults: delta_TV = epsilon_low = epsilon_high = 0.15, C = clip_ratio_c = 5; seq-mean-token-sum-norm.
    """
    return PolicyLoss(
        surrogate=DPPOBinaryTV(epsilon_low=0.15, epsilon_high=0.15, clip_ratio_c=5.0),
        aggregation="seq-mean-token-sum-norm",
    )


@preset(
    "dppo_kl",
    title="Divergence PPO, binary KL trust region",
    paper=_PAPER,
    arxiv="2602.04879",
    matches="verl loss_mode='dppo_kl' with clip_ratio_low=clip_ratio_high=0.05, clip_ratio_c=5, "
    "loss_agg_mode='seq-mean-token-sum-norm' (verl's recipe)",
    advantage="dr_grpo",
    notes="As dppo_tv with the binary KL (eq. 14) and delta_KL = 0.05. Needs max_completion_length.",
    parts=(DPPOBinaryKL,),
)
def dppo_kl() -> PolicyLoss:
    r"""loss = -A sg[min(w, C)] logp * M_t (eq. 12, 14), M_t = 0 where binary KL(p_old, p) > delta_KL in the direction of A.

    Defaults: delta_KL = epsilon_low = epsilon_high = 0.05, C = clip_ratio_c = 5; seq-mean-token-sum-norm.
    """
    return PolicyLoss(
        surrogate=DPPOBinaryKL(epsilon_low=0.05, epsilon_high=0.05, clip_ratio_c=5.0),
        aggregation="seq-mean-token-sum-norm",
    )
