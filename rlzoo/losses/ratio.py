"""Ratio levels: how the log importance weight ``log w`` is formed from token log-ratios.

``log_ratio[b, t] = logprobs[b, t] - old_logprobs[b, t]``. A ratio level maps it to ``log_weight`` of
shape ``[B, T]`` (sequence-level weights are broadcast over the sequence's tokens). The surrogate then
uses ``w = exp(log_weight)``. Selected by the loss option ``importance_sampling_level``.
"""

import dataclasses
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.losses._core import LossInputs, Metrics, Part, check_number, ratio_levels

__all__ = ["GeometricRatio", "SequenceRatio", "SequenceTokenRatio", "TokenRatio"]


@ratio_levels.register("token")
@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenRatio(Part):
    r"""Token-level ratio (PPO / GRPO): :math:`w_{i,t} = \pi_\theta(o_{i,t}) / \pi_{old}(o_{i,t})`.

    Returns ``log_ratio`` unchanged. References: Schulman et al. 2017, arXiv:1707.06347, eq. (6);
    matches TRL 1.16 ``importance_sampling_level="token"``.
    """

    registry: ClassVar = ratio_levels

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        return x.log_ratio, {}


@ratio_levels.register("sequence")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SequenceRatio(Part):
    r"""Sequence-level ratio (GSPO): the length-normalised sequence likelihood ratio.

    .. math:: s_i = \exp\Big(\frac{1}{|o_i|}\sum_t \log\frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}\Big)

    one value per sequence, broadcast over its tokens; the gradient flows to every token of the sequence
    through the mean. Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. (7);
    matches TRL 1.16 ``importance_sampling_level="sequence"`` (mean over ``mask.sum().clamp(min=1)``).
    """

    registry: ClassVar = ratio_levels

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        return x.seq_mean(x.log_ratio).expand_as(x.log_ratio), {}


@ratio_levels.register("sequence_token")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SequenceTokenRatio(Part):
    r"""GSPO-token: the value of the sequence ratio with a per-token gradient.

    .. math:: \log s_{i,t} = \log\pi_\theta(o_{i,t}) - \mathrm{sg}[\log\pi_\theta(o_{i,t})] + \mathrm{sg}[\log s_i]

    Equal in value to :class:`SequenceRatio`; its gradient at token t is that of ``logprobs[t]`` only,
    scaled by ``s_i`` (lets per-token advantages act per token). Zheng et al. 2025, arXiv:2507.18071,
    eq. (13); matches verl ``policy_loss.loss_mode="gspo"`` without its ``max=10`` clamp.
    """

    registry: ClassVar = ratio_levels

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        seq = x.seq_mean(x.log_ratio).detach()
        return x.logprobs - x.logprobs.detach() + seq, {}


@ratio_levels.register("geometric")
@dataclasses.dataclass(frozen=True, kw_only=True)
class GeometricRatio(Part):
    r"""GMPO: geometric mean of token ratios, each clipped in log space first (sign-aware).

    .. math::
        \log w_i = \frac{1}{|o_i|}\sum_t \mathrm{sgn}(A)\,\min\big(\mathrm{sgn}(A)\,\ell_{i,t},\;
        \mathrm{sgn}(A)\,\mathrm{clip}(\ell_{i,t}, -\epsilon_{low}, \epsilon_{high})\big),
        \qquad \ell_{i,t} = \log\frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}

    So for A > 0 a token log-ratio above ``epsilon_high`` stops contributing gradient, for A < 0 one below
    ``-epsilon_low`` does. Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673,
    eq. (5), which clips to ``(e^{-0.4}, e^{0.4})``; matches verl ``loss_mode="geo_mean"`` (per-sequence
    advantage = masked mean of the per-token advantages).

    Args:
        epsilon_low: finite, >= 0, lower clip of the token *log*-ratio (default 0.4).
        epsilon_high: finite, >= 0, upper clip of the token *log*-ratio (default 0.4).

    Metrics: ``clip_ratio/low_mean`` (A < 0 tokens whose log-ratio was clipped), ``clip_ratio/high_mean``
    (A > 0), ``clip_ratio/region_mean``.

    Raises:
        ValueError: naming epsilon_low or epsilon_high when it is < 0, NaN, inf, or not a number.
    """

    registry: ClassVar = ratio_levels
    epsilon_low: float = 0.4
    epsilon_high: float = 0.4

    def __post_init__(self) -> None:
        check_number("geometric ratio", "epsilon_low", self.epsilon_low, low=0.0)
        check_number("geometric ratio", "epsilon_high", self.epsilon_high, low=0.0)

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        sign = torch.sign(x.advantages)  # per token, as verl (equal to sgn(A_i) for sequence advantages)
        clamped = torch.clamp(x.log_ratio, -self.epsilon_low, self.epsilon_high)
        token = sign * torch.minimum(sign * x.log_ratio, sign * clamped)
        log_w = x.seq_mean(token).expand_as(x.log_ratio)
        clipped = (x.log_ratio != clamped).detach()
        low = clipped & (x.advantages < 0)
        high = clipped & (x.advantages > 0)
        metrics = {
            "clip_ratio/low_mean": x.mean(low.to(x.log_ratio.dtype)),
            "clip_ratio/high_mean": x.mean(high.to(x.log_ratio.dtype)),
            "clip_ratio/region_mean": x.mean((low | high).to(x.log_ratio.dtype)),
        }
        return log_w, metrics
