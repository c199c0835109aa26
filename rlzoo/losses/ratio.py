"""Ratio levels (slot :class:`RatioLevel`): how the log importance weight ``log w`` is formed from token log-ratios.

``log_ratio[b, t] = logprobs[b, t] - old_logprobs[b, t]``. A ratio level maps it to ``log_weight`` of
shape ``[B, T]`` (sequence-level weights are broadcast over the sequence's tokens). The surrogate then
uses ``w = exp(log_weight)``. Selected by the loss option ``importance_sampling_level``. GMPO's
``geometric`` level lives with GMPO (:mod:`rlzoo.algorithms.gmpo`).
"""

import abc
from typing import ClassVar

from rlzoo.losses.base import LossInputs, Part, PartOutput
from rlzoo.registry import Registry

__all__ = ["RatioLevel", "SequenceRatio", "SequenceTokenRatio", "TokenRatio", "ratio_levels"]

ratio_levels: Registry[type["RatioLevel"]] = Registry("ratio level (importance_sampling_level)")


class RatioLevel(Part, abc.ABC):
    """Slot 1: how the log importance weight ``log w`` is formed from the token log-ratios.

    ``mixes_tokens``: True when ``log w`` at one token depends on the other tokens of its sequence
    (sequence-level ratios), so a per-token advantage does not act on its own token only.
    ``per_sequence``: True when ``log w`` is one value per sequence (broadcast over its tokens), so clip
    decisions with per-sequence advantages are counted once per sequence (:meth:`LossInputs.fraction`).
    """

    registry: ClassVar[Registry[type["RatioLevel"]]] = ratio_levels
    mixes_tokens: ClassVar[bool] = False
    per_sequence: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """``log_weight`` ``Float[B, T]`` (sequence-level weights broadcast over the tokens) and metrics."""


class TokenRatio(RatioLevel, name="token"):
    r"""Token-level ratio (PPO / GRPO): :math:`w_{i,t} = \pi_\theta(o_{i,t}) / \pi_{old}(o_{i,t})`.

    Returns ``log_ratio`` unchanged. References: Schulman et al. 2017, arXiv:1707.06347, eq. (6);
    matches TRL 1.16 ``importance_sampling_level="token"``.
    """

    def __call__(self, x: LossInputs) -> PartOutput:
        return PartOutput(x.log_ratio, {})


class SequenceRatio(RatioLevel, name="sequence"):
    r"""Sequence-level ratio (GSPO): the length-normalised sequence likelihood ratio.

    .. math:: s_i = \exp\Big(\frac{1}{|o_i|}\sum_t \log\frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}\Big)

    one value per sequence, broadcast over its tokens; the gradient flows to every token of the sequence
    through the mean. Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. (7);
    matches TRL 1.16 ``importance_sampling_level="sequence"`` (mean over ``mask.sum().clamp(min=1)``).
    """

    mixes_tokens = True
    per_sequence = True

    def __call__(self, x: LossInputs) -> PartOutput:
        return PartOutput(x.seq_mean(x.log_ratio).expand_as(x.log_ratio), {})


class SequenceTokenRatio(RatioLevel, name="sequence_token"):
    r"""GSPO-token: the value of the sequence ratio with a per-token gradient.

    .. math:: \log s_{i,t} = \log\pi_\theta(o_{i,t}) - \mathrm{sg}[\log\pi_\theta(o_{i,t})] + \mathrm{sg}[\log s_i]

    Equal in value to :class:`SequenceRatio`; its gradient at token t is that of ``logprobs[t]`` only,
    scaled by ``s_i`` (lets per-token advantages act per token). Zheng et al. 2025, arXiv:2507.18071,
    eq. (13); matches verl ``policy_loss.loss_mode="gspo"`` without its ``max=10`` clamp.
    """

    per_sequence = True

    def __call__(self, x: LossInputs) -> PartOutput:
        seq = x.seq_mean(x.log_ratio).detach()
        return PartOutput(x.logprobs - x.logprobs.detach() + seq, {})
