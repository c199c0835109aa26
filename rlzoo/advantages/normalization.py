r"""AReaL's reward normalisation as a group-relative advantage: independent mean and std levels.

``A_i = (r_i - mu_i) / (sigma_i + eps)``, where the baseline ``mu`` is taken over the item's group, the whole
batch, or not at all (``mean_level``), optionally leaving the item out (``mean_leave1out``), and the scale
``sigma`` over the group, the batch, or not at all (``std_level``), from the deviations ``r_j - mu_j`` (around
each item's own baseline), biased or unbiased (``std_unbiased``). The levels are registered alternatives
(:data:`norm_levels`): register a :class:`NormLevel` to add one.

Notation: ``N`` completions, ``g`` the group of item ``i`` (``G_g`` items), ``S`` the set the statistic runs
over (the group for "group", all ``N`` items for "batch").
"""

import abc
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.advantages.base import AdvantageEstimator, AdvantageInputs, EstimatorChoice
from rlzoo.advantages.groups import GroupIndex
from rlzoo.registry import Registry, check_number, choice

__all__ = ["BatchLevel", "GroupLevel", "NoLevel", "NormLevel", "RewardNorm", "norm_levels"]

norm_levels: Registry[type["NormLevel"]] = Registry("normalization level (mean_level / std_level)")


class NormLevel(EstimatorChoice, abc.ABC):
    """Over which items a normalisation statistic runs: an alternative of ``mean_level`` and ``std_level``."""

    registry: ClassVar[Registry[type["NormLevel"]]] = norm_levels

    @abc.abstractmethod
    def mean(self, x: Float[Tensor, " N"], groups: GroupIndex, *, leave_one_out: bool) -> Float[Tensor, " N"]:
        """Each item's baseline: the mean of ``x`` over its set (without the item itself when ``leave_one_out``;
        0 when that leaves nothing)."""

    @abc.abstractmethod
    def std(self, deviation: Float[Tensor, " N"], groups: GroupIndex, *,
            unbiased: bool) -> Float[Tensor, " N"] | None:
        """Each item's scale from the deviations ``x_j - mu_j``: ``sqrt(sum_S dev^2 / (|S| - 1))`` (unbiased; 1 when
        ``|S| <= 1``) or ``sqrt(sum_S dev^2 / |S|)``; None for no scaling."""


def _mean(total: Tensor, count: Tensor, x: Tensor, leave_one_out: bool) -> Tensor:
    if not leave_one_out:
        return total / count
    others = count - 1
    return torch.where(others > 0, (total - x) / others.clamp(min=1), torch.zeros_like(x))


def _std(sum_sq: Tensor, count: Tensor, unbiased: bool) -> Tensor:
    if not unbiased:
        return (sum_sq / count).sqrt()
    return torch.where(count > 1, (sum_sq / (count - 1).clamp(min=1)).sqrt(), torch.ones_like(sum_sq))


class GroupLevel(NormLevel, name="group"):
    """The statistic of the item's group (the completions of one prompt)."""

    def mean(self, x: Float[Tensor, " N"], groups: GroupIndex, *, leave_one_out: bool) -> Float[Tensor, " N"]:
        return _mean(groups.expand(groups.sum(x)), groups.expand(groups.size(x.dtype)), x, leave_one_out)

    def std(self, deviation: Float[Tensor, " N"], groups: GroupIndex, *,
            unbiased: bool) -> Float[Tensor, " N"] | None:
        sum_sq = groups.expand(groups.sum(deviation * deviation))
        return _std(sum_sq, groups.expand(groups.size(deviation.dtype)), unbiased)


class BatchLevel(NormLevel, name="batch"):
    """The statistic of the whole batch (all ``N`` completions, every rank's under torchrun)."""

    def mean(self, x: Float[Tensor, " N"], groups: GroupIndex, *, leave_one_out: bool) -> Float[Tensor, " N"]:
        count = torch.full_like(x, float(x.shape[0]))
        return _mean(x.sum().expand_as(x), count, x, leave_one_out)

    def std(self, deviation: Float[Tensor, " N"], groups: GroupIndex, *,
            unbiased: bool) -> Float[Tensor, " N"] | None:
        count = torch.full_like(deviation, float(deviation.shape[0]))
        return _std((deviation * deviation).sum().expand_as(deviation), count, unbiased)


class NoLevel(NormLevel, name="none"):
    """No statistic: baseline 0 (``mean_level``), no division (``std_level``, and ``eps`` is not added)."""

    def mean(self, x: Float[Tensor, " N"], groups: GroupIndex, *, leave_one_out: bool) -> Float[Tensor, " N"]:
        return torch.zeros_like(x)

    def std(self, deviation: Float[Tensor, " N"], groups: GroupIndex, *,
            unbiased: bool) -> Float[Tensor, " N"] | None:
        return None


class RewardNorm(AdvantageEstimator, name="reward_norm"):
    r"""AReaL's normalisation: ``A_i = (r_i - mu_i) / (sigma_i + eps)`` with independent mean and std levels.

    .. math::

        \mu_i = \frac{1}{|S_i|}\sum_{j \in S_i} r_j \ \Big(\text{leave-one-out: } \frac{1}{|S_i| - 1}
        \sum_{j \in S_i, j \ne i} r_j\Big),\qquad
        \sigma_i = \sqrt{\frac{1}{|S'_i| - [\text{unbiased}]}\sum_{j \in S'_i} (r_j - \mu_j)^2}

    with ``S_i`` the item's group, the whole batch or nothing (``mu = 0``) by ``mean_level``, and ``S'_i`` likewise
    by ``std_level`` (nothing: ``sigma = 1`` and ``eps = 0``). Special cases: ``mean_level="group"``,
    ``std_level="group"`` is GRPO (``grpo`` with this ``eps``); ``std_level="none"`` is Dr. GRPO; with
    ``mean_leave1out`` and no std it is RLOO; ``mean_level="group"``, ``std_level="batch"`` is LitePPO's (Liu et
    al. 2025, arXiv:2508.08221: group-level mean, batch-level std) as AReaL configures it: the batch std of the
    group-centred rewards, which differs from TRL's ``scale_rewards="batch"`` (the std of the raw rewards).

    Options:
        mean_level, std_level: registered alternatives (:data:`norm_levels`): "group" (default), "batch" or
            "none".
        mean_leave1out: bool (default False): the baseline leaves the item out (0 for an item alone in its set).
        std_unbiased: bool (default True): Bessel's ``|S| - 1`` (a set of one then has ``sigma = 1``), else
            ``|S|``.
        eps: finite, >= 0, added to ``sigma`` (default 1e-5, AReaL's).

    Conventions (docs/advantages.md): with ``mean_level="group"``, items of singleton or zero-variance groups get
    exactly 0 (AReaL: ``(r - mu) / (sigma + eps)``, i.e. the rounding of ``mu``, and ``r / (sigma + eps)`` for a
    singleton with ``mean_leave1out``); with ``mean_level="batch"`` a batch of one item, or of equal rewards,
    gets 0. Statistics run over completions (one reward each); AReaL's ``adv_norm`` on per-token advantages
    weighs each completion by its length instead.

    Source: AReaL ``areal/utils/data.py`` ``Normalization`` (``NormConfig``: ``mean_level``, ``mean_leave1out``,
    ``std_level``, ``std_unbiased``, ``eps``; its ``reward_norm`` / ``adv_norm``), at commit 4aef98d of
    inclusionAI/AReaL; AReaL: Fu et al. 2025, arXiv:2505.24298. It matches AReaL's result (computed in float64,
    before AReaL's final cast to float32) on groups of two or more that are not degenerate. No verl or TRL
    equivalent beyond the special cases above.

    Example:
        >>> import torch, rlzoo
        >>> rewards = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=torch.float64)
        >>> loo = rlzoo.get_advantage("reward_norm", mean_leave1out=True, std_level="none")
        >>> loo(rewards, group_size=2).tolist()  # RLOO
        [1.0, -1.0, -2.0, 2.0]
    """

    mean_level: str = choice("group", norm_levels)
    std_level: str = choice("group", norm_levels)
    mean_leave1out: bool = False
    std_unbiased: bool = True
    eps: float = 1e-5

    def check(self) -> None:
        for name in ("mean_leave1out", "std_unbiased"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"reward_norm: {name} must be True or False, got {getattr(self, name)!r}")
        check_number("reward_norm", "eps", self.eps, low=0.0)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        mean = norm_levels.get(self.mean_level)().mean(rewards, groups, leave_one_out=self.mean_leave1out)
        centered = rewards - mean
        std = norm_levels.get(self.std_level)().std(centered, groups, unbiased=self.std_unbiased)
        advantages = centered if std is None else centered / (std + self.eps)
        zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
        if self.mean_level == "group":
            return torch.where(groups.expand(groups.degenerate(rewards)), zero, advantages)
        if self.mean_level == "batch" and bool(rewards.max() == rewards.min()):
            return torch.zeros_like(rewards)
        return advantages
