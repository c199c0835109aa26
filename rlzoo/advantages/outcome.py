r"""Outcome (one reward per completion) advantage estimators, relative to the other completions of the prompt.

Each returns ``Float[N]``: one advantage per completion, broadcast over its tokens by the loss.

Notation: ``r_i`` the reward of item ``i``; for its group ``k`` (the completions of one prompt): ``G`` its
size, ``mean`` and ``std`` (unbiased, Bessel-corrected) of the group's rewards.

Conventions shared by every estimator here (the frameworks disagree; see docs/advantages.md):

* **singleton groups** (``G = 1``) get advantage **0**: a lone completion carries no relative information.
  TRL agrees (``num_generations=1``: ``r - r = 0``); verl's ``grpo``/``rloo``/``opo``/``gpg``/
  ``reinforce_plus_plus_baseline`` use baseline 0 there, so ``A = r`` (grpo: ``r / (1 + eps)``); verl
  ``rloo_vectorized`` gives 0 and ``grpo_passk`` raises.
* **zero-variance groups** (all rewards exactly equal) get advantage exactly **0**. TRL computes
  ``(r - mean) / (0 + eps)``, which is 0 up to the rounding of ``mean`` (e.g. ``1e-13`` for three rewards of
  0.1); rlzoo returns an exact 0 and never divides by a zero std.
"""

import abc
from typing import ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.advantages.base import AdvantageEstimator, AdvantageInputs, EstimatorChoice
from rlzoo.advantages.groups import GroupIndex, whiten
from rlzoo.registry import Registry, check_choice, check_number, choice

__all__ = [
    "GPG",
    "GRPO",
    "OPO",
    "RLOO",
    "DrGRPO",
    "GRPOPassK",
    "MaxRL",
    "ReinforcePPBaseline",
    "advantage_scales",
    "baseline_whitenings",
    "gpg_alphas",
]

advantage_scales: Registry[type["AdvantageScale"]] = Registry("advantage scale (scale)")
gpg_alphas: Registry[type["GPGAlpha"]] = Registry("GPG alpha (alpha)")
baseline_whitenings: Registry[type["BaselineWhitening"]] = Registry("whitening (whiten)")


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _safe(denominator: Tensor, use: Tensor) -> Tensor:
    """``denominator`` where ``use``, else 1 (so a discarded branch never holds 0/0)."""
    return torch.where(use, denominator, torch.ones((), dtype=denominator.dtype, device=denominator.device))


def _batch_std(x: Tensor) -> Tensor:
    """Unbiased std over the whole batch; 0 for a single item (TRL)."""
    if x.shape[0] < 2:
        return _zero(x)
    return x.std(correction=1)


# ------------------------------------------------------------------------------- scale (GRPO's std)
class AdvantageScale(EstimatorChoice, abc.ABC):
    """What a group-relative advantage is divided by: an alternative of the ``scale`` option.

    ``per_group``: True when the alternative also divides one value per group (:meth:`divide_groups`, used by
    ``grpo_passk``).
    """

    registry: ClassVar[Registry[type["AdvantageScale"]]] = advantage_scales
    per_group: ClassVar[bool] = False

    @abc.abstractmethod
    def divide(self, centered: Float[Tensor, " N"], rewards: Float[Tensor, " N"], groups: GroupIndex,
               live: Bool[Tensor, " N"], eps: float) -> tuple[Float[Tensor, " N"], Bool[Tensor, " N"]]:
        """``(centered / scale, live)``: the scaled values and the items that keep them (the others get 0)."""

    def divide_groups(self, values: Float[Tensor, " K"], rewards: Float[Tensor, " N"], groups: GroupIndex,
                      live: Bool[Tensor, " K"], eps: float) -> Float[Tensor, " K"]:
        """One value per group divided by the group's scale (only where ``per_group``).

        Raises:
            NotImplementedError: the alternative has no per-group form.
        """
        raise NotImplementedError(f"scale {self.label()!r} has no per-group form")


class GroupStd(AdvantageScale, name="group"):
    """The unbiased std of the item's group plus ``eps`` (DeepSeekMath's GRPO)."""

    per_group = True

    def divide(self, centered: Float[Tensor, " N"], rewards: Float[Tensor, " N"], groups: GroupIndex,
               live: Bool[Tensor, " N"], eps: float) -> tuple[Float[Tensor, " N"], Bool[Tensor, " N"]]:
        denominator = groups.expand(groups.std(rewards)) + eps
        live = live & (denominator > 0)  # a spread so small that its std underflows counts as zero variance
        return centered / _safe(denominator, live), live

    def divide_groups(self, values: Float[Tensor, " K"], rewards: Float[Tensor, " N"], groups: GroupIndex,
                      live: Bool[Tensor, " K"], eps: float) -> Float[Tensor, " K"]:
        return values / _safe(groups.std(rewards) + eps, live)


class BatchStd(AdvantageScale, name="batch"):
    """The unbiased std of all ``N`` rewards plus ``eps``, the mean staying per group (TRL
    ``scale_rewards="batch"``; 0 when ``N = 1``)."""

    def divide(self, centered: Float[Tensor, " N"], rewards: Float[Tensor, " N"], groups: GroupIndex,
               live: Bool[Tensor, " N"], eps: float) -> tuple[Float[Tensor, " N"], Bool[Tensor, " N"]]:
        denominator = _batch_std(rewards) + eps
        return centered / _safe(denominator, denominator > 0), live


class NoScale(AdvantageScale, name="none"):
    """No division: ``A = r - mean`` (Dr. GRPO)."""

    per_group = True

    def divide(self, centered: Float[Tensor, " N"], rewards: Float[Tensor, " N"], groups: GroupIndex,
               live: Bool[Tensor, " N"], eps: float) -> tuple[Float[Tensor, " N"], Bool[Tensor, " N"]]:
        return centered, live

    def divide_groups(self, values: Float[Tensor, " K"], rewards: Float[Tensor, " N"], groups: GroupIndex,
                      live: Bool[Tensor, " K"], eps: float) -> Float[Tensor, " K"]:
        return values


def group_normalized(
    rewards: Float[Tensor, " N"], groups: GroupIndex, *, scale: str, eps: float
) -> Float[Tensor, " N"]:
    """GRPO's normalisation ``(r - mean_g) / (std + eps)``; the shared core of grpo, dr_grpo and GDPO.

    Args:
        rewards: ``Float[N]``, finite.
        groups: the grouping of the ``N`` items.
        scale: a registered :class:`AdvantageScale` name: ``"group"`` (std of the item's group), ``"batch"``
            (std of all ``N`` rewards; 0 when ``N = 1``) or ``"none"`` (no division). Stds are unbiased.
        eps: ``>= 0`` added to the std.

    Returns:
        ``Float[N]``; exactly 0 for items of singleton or zero-variance groups (no division by a zero std;
        with ``eps = 0`` a group whose std underflows to 0, e.g. rewards differing by 1e-303, counts as
        zero-variance).

    Raises:
        UnknownNameError: ``scale`` is not registered (lists the valid names).
    """
    live = ~groups.expand(groups.degenerate(rewards))
    centered = rewards - groups.expand(groups.mean(rewards))
    centered, live = advantage_scales.get(scale)().divide(centered, rewards, groups, live, eps)
    return torch.where(live, centered, _zero(rewards))


class GRPO(AdvantageEstimator, name="grpo"):
    r"""GRPO's group-relative advantage ``A_i = (r_i - mean) / (std + eps)``.

    .. math:: A_i = \frac{r_i - \operatorname{mean}_g(r)}{\operatorname{std}_g(r) + \epsilon}

    Options:
        scale: what ``std`` is: ``"group"`` - the unbiased std of the group (DeepSeekMath); ``"batch"`` - the
            unbiased std of all ``N`` rewards, the mean staying per group (TRL ``scale_rewards="batch"``,
            after Hu et al., REINFORCE++); ``"none"`` - no division, ``A = r - mean`` (Dr. GRPO).
        eps: ``>= 0`` added to the std. Default 1e-4 (TRL); verl uses 1e-6. ``eps=0`` is allowed: zero-std
            groups are handled before dividing.

    Singleton and zero-variance groups get 0 (TRL's result; verl gives ``r / (1 + eps)`` to singletons).

    Source: Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, section 4.1.2 (outcome supervision);
    Dr. GRPO (``scale="none"``): Liu et al. 2025, arXiv:2503.20783, section 3.2.
    Matches TRL 1.16 ``GRPOTrainer`` (``scale_rewards`` group/batch/none, ``nanstd``, eps 1e-4) and verl 0.9.1
    ``adv_estimator="grpo"`` (``norm_adv_by_std_in_grpo`` True/False, ``epsilon``) on groups of two or more.

    Example:
        >>> import torch, rlzoo
        >>> rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
        >>> adv = rlzoo.get_advantage("grpo", eps=0.0)(rewards, group_size=3)
        >>> [round(a, 4) for a in adv.tolist()]
        [1.1547, -0.5774, -0.5774, 0.0, 0.0, 0.0]
    """

    scale: str = choice("group", advantage_scales)
    eps: float = 1e-4

    def check(self) -> None:
        check_number("grpo", "eps", self.eps, low=0.0)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        return group_normalized(rewards, groups, scale=self.scale, eps=self.eps)


class DrGRPO(AdvantageEstimator, name="dr_grpo"):
    r"""Dr. GRPO's advantage ``A_i = r_i - mean(group)``: GRPO without the std (``grpo`` with
    ``scale="none"``).

    Removes GRPO's question-level difficulty bias (dividing by a small std up-weights easy and hard prompts).
    Equals the RLOO advantage times ``(G - 1) / G`` (paper, appendix A). No options. Singleton and
    zero-variance groups get 0.

    Source: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783,
    section 3.2 / Fig. 1. Matches TRL 1.16 ``scale_rewards="none"`` and verl ``adv_estimator="grpo"`` with
    ``norm_adv_by_std_in_grpo=False`` (groups of two or more).
    """

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        return group_normalized(rewards, groups, scale="none", eps=0.0)


class RLOO(AdvantageEstimator, name="rloo"):
    r"""REINFORCE leave-one-out: ``A_i = r_i - mean of the other G - 1 rewards of the group``.

    .. math:: A_i = r_i - \frac{1}{G-1}\sum_{j \ne i} r_j = \frac{G}{G-1}\,(r_i - \operatorname{mean})

    No options, no std. Singletons (no other sample) and zero-variance groups get 0.

    Source: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs", arXiv:2402.14740, section 3.2 (after Kool et al. 2019). Matches verl 0.9.1
    ``adv_estimator="rloo_vectorized"`` everywhere and ``"rloo"`` on groups of two or more (verl ``rloo``
    gives ``A = r`` to singletons).
    """

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        size = groups.expand(groups.size(rewards.dtype))
        total = groups.expand(groups.sum(rewards))
        advantage = (size * rewards - total) / (size - 1).clamp(min=1)
        live = ~groups.expand(groups.degenerate(rewards))
        return torch.where(live, advantage, _zero(rewards))


class OPO(AdvantageEstimator, name="opo"):
    r"""OPO's length-weighted baseline: ``A_i = r_i - sum_j |o_j| r_j / sum_j |o_j|`` over the group.

    The variance-optimal baseline, approximating ``||grad log pi(o)||^2`` by the length ``|o|`` of the
    completion (its counted tokens). Needs ``completion_mask`` (for ``|o|``). No std. Singleton and
    zero-variance groups get 0; so does a group whose completions have no counted token.

    Source: Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585. Matches verl 0.9.1
    ``adv_estimator="opo"`` on groups of two or more (verl gives ``A = r`` to singletons).
    """

    needs = frozenset({"completion_mask"})

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None and inputs.lengths is not None
        lengths = inputs.lengths
        total_length = groups.sum(lengths)
        has_tokens = total_length > 0
        baseline = groups.sum(lengths * rewards) / _safe(total_length, has_tokens)
        live = groups.expand(has_tokens & ~groups.degenerate(rewards))
        return torch.where(live, rewards - groups.expand(baseline), _zero(rewards))


class GRPOPassK(AdvantageEstimator, name="grpo_passk"):
    r"""Pass@k-style advantage: only the best completion of each group is credited, with ``r_max - r_second``.

    .. math:: A_i = [i = \arg\max_g r]\;\frac{r_{(1)} - r_{(2)}}{\operatorname{std}_g(r) + \epsilon}

    The leave-one-out estimate of the gradient of ``E[max_j r_j]`` over the group: every completion except the
    best has ``max`` unchanged when it is left out, so only the best one gets a non-zero signal. Ties for the
    maximum give 0 to every item (the first maximum is the argmax).

    Options:
        scale: ``"group"`` divides by the unbiased group std plus ``eps`` (verl
        ``norm_adv_by_std_in_grpo=True``,
            its default; not in the paper); ``"none"`` does not.
        eps: ``>= 0`` added to the std (default 1e-4 like ``grpo``; verl uses 1e-6).

    Singleton and zero-variance groups get 0 (verl raises on singletons).

    Source: Tang, Zheng, Synnaeve, Munos 2025, "Optimizing Language Models for Inference Time Objectives using
    Reinforcement Learning", arXiv:2503.19595 (leave-one-out pass@k estimator). Matches verl 0.9.1
    ``adv_estimator="grpo_passk"``.
    """

    scale: str = choice("group", advantage_scales)
    eps: float = 1e-4

    def check(self) -> None:
        per_group = [name for name, cls in advantage_scales.items() if cls.per_group]
        check_choice("grpo_passk", "scale", self.scale, per_group)
        check_number("grpo_passk", "eps", self.eps, low=0.0)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        n = rewards.shape[0]
        best = groups.max(rewards)
        position = torch.arange(n, device=rewards.device)
        at_max = rewards == groups.expand(best)
        first = torch.full((groups.num_groups,), n, dtype=torch.long, device=rewards.device)
        first = first.scatter_reduce(0, groups.index, torch.where(at_max, position, n), reduce="amin")
        chosen = position == groups.expand(first)
        live_k = ~groups.degenerate(rewards)
        second = groups.max(torch.where(chosen, torch.full_like(rewards, -torch.inf), rewards))
        gap = best - torch.where(live_k, second, best)
        gap = advantage_scales.get(self.scale)().divide_groups(gap, rewards, groups, live_k, self.eps)
        return torch.where(chosen & groups.expand(live_k), groups.expand(gap), _zero(rewards))


# ------------------------------------------------------------------------------------------ GPG's alpha
class GPGAlpha(EstimatorChoice, abc.ABC):
    """GPG's batch rescaling factor ``alpha``: an alternative of the ``alpha`` option."""

    registry: ClassVar[Registry[type["GPGAlpha"]]] = gpg_alphas

    @abc.abstractmethod
    def __call__(self, rewards: Float[Tensor, " N"], live: Bool[Tensor, " N"]) -> Float[Tensor, ""]:
        """``alpha`` for ``N`` rewards, ``live`` marking the items of informative groups."""


class NonzeroRewards(GPGAlpha, name="nonzero_rewards"):
    """``N / #{i: r_i != 0}`` (1 when no reward is non-zero), as verl computes it."""

    def __call__(self, rewards: Float[Tensor, " N"], live: Bool[Tensor, " N"]) -> Float[Tensor, ""]:
        return float(rewards.shape[0]) / (rewards != 0).sum().clamp(min=1).to(rewards.dtype)


class Informative(GPGAlpha, name="informative"):
    """``N / (N - M)``, ``M`` the items of singleton or zero-variance groups (1 when ``M = N``)."""

    def __call__(self, rewards: Float[Tensor, " N"], live: Bool[Tensor, " N"]) -> Float[Tensor, ""]:
        return float(rewards.shape[0]) / live.sum().clamp(min=1).to(rewards.dtype)


class One(GPGAlpha, name="one"):
    """``alpha = 1``: Dr. GRPO's advantage."""

    def __call__(self, rewards: Float[Tensor, " N"], live: Bool[Tensor, " N"]) -> Float[Tensor, ""]:
        return torch.ones((), dtype=rewards.dtype, device=rewards.device)


class GPG(AdvantageEstimator, name="gpg"):
    r"""GPG's corrected group advantage ``A_i = alpha (r_i - mean(group))`` (``F_norm = 1``, no std).

    ``alpha`` rescales the batch so that completions without a learning signal do not dilute the gradient
    (the paper's "accurate gradient estimation"):

    ``alpha`` is a registered alternative (``rlzoo.advantages.gpg_alphas``):

    * ``"nonzero_rewards"`` (default): ``alpha = N / #{i: r_i != 0}`` (1 when no reward is non-zero), as verl
      computes it. For 0/1 rewards this counts the *correct* completions.
    * ``"informative"``: ``alpha = N / (N - M)`` with ``M`` the items of singleton or zero-variance groups
      (whose advantage is 0), 1 when ``M = N``. The paper's ``alpha = B / (B - M)`` as its summaries describe
      ``M`` (the paper's own definition of ``M`` could not be checked here).
    * ``"one"``: ``alpha = 1``: Dr. GRPO's advantage.

    Singleton and zero-variance groups get 0 (verl gives ``alpha * r`` to singletons).

    Source: Chu, Huang, Zhang, Wei, Wang 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning", arXiv:2504.02546 (ICLR 2026). Matches verl 0.9.1 ``adv_estimator="gpg"`` with the
    default ``alpha`` on groups of two or more.
    """

    alpha: str = choice("nonzero_rewards", gpg_alphas)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        live = ~groups.expand(groups.degenerate(rewards))
        alpha = gpg_alphas.get(self.alpha)()(rewards, live)
        advantage = alpha * (rewards - groups.expand(groups.mean(rewards)))
        return torch.where(live, advantage, _zero(rewards))


class MaxRL(AdvantageEstimator, name="maxrl"):
    r"""MaxRL's advantage ``A_i = (r_i - mean) / mean``: the group mean replaces the std as normaliser.

    .. math:: A_i = \frac{r_i - \bar r}{\bar r}

    With 0/1 rewards ``mean`` is the empirical pass rate ``p``, so a success gets ``1/p - 1``: the truncated
    expansion ``grad log p = sum_k (1/k) grad pass@k`` of the maximum-likelihood objective. Rewards must be
    ``>= 0`` (success indicators or probabilities); groups with mean 0 (no success), singletons and
    zero-variance groups get 0. No options.

    Source: Tajwar, Zeng et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv:2602.02710 (equation
    number unconfirmed; formula as in prime-rl's ``max_rl`` advantage). Not in verl 0.9.1 or TRL 1.16.

    Raises:
        ValueError: if a reward is negative (the call raises, naming ``rewards``).
    """

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        if bool((rewards < 0).any()):
            raise ValueError(
                "advantage estimator 'maxrl': rewards must be >= 0 (success indicators or "
                f"probabilities); got a minimum of {rewards.min().item()}"
            )
        mean = groups.mean(rewards)
        live_k = (mean > 0) & ~groups.degenerate(rewards)
        live = groups.expand(live_k)
        advantage = (rewards - groups.expand(mean)) / groups.expand(_safe(mean, live_k))
        return torch.where(live, advantage, _zero(rewards))


class ReinforcePPBaseline(AdvantageEstimator, name="reinforce_pp_baseline"):
    r"""REINFORCE++-baseline: subtract the group mean, then whiten over the whole batch.

    .. math:: A_i = \operatorname{whiten}(r_i - \operatorname{mean}(r_{\text{group}}))

    ``whiten(x) = (x - mean) / sqrt(var + 1e-8)`` with the unbiased variance over the batch: the global batch
    normalisation REINFORCE++ uses instead of GRPO's per-group std.

    Options:
        whiten: a registered alternative (``rlzoo.advantages.baseline_whitenings``). ``"token"`` (default):
            statistics over every counted token, as verl does (each completion's
            value repeated over its tokens, so long completions weigh more); needs ``completion_mask``.
            ``"sequence"``: statistics over the ``N`` completions, each counted once (unlike ``grpo`` with
            ``scale="batch"``, the std is that of the group-centred rewards, not of the raw rewards).

    Returns ``Float[N]`` (constant over each completion's tokens; 0 for a completion with no counted token
    with ``whiten="token"``). Singleton and zero-variance groups have ``r - mean = 0`` before whitening (verl
    uses baseline 0 for singletons, i.e. ``r``).

    Source: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    arXiv:2501.03262. Matches verl 0.9.1 ``adv_estimator="reinforce_plus_plus_baseline"`` (``whiten="token"``)
    on groups of two or more, at counted tokens.
    """

    whiten: str = choice("token", baseline_whitenings)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None
        centered = group_normalized(rewards, groups, scale="none", eps=0.0)
        return baseline_whitenings.get(self.whiten)()(centered, inputs)


# ------------------------------------------------------------------------ REINFORCE++-baseline's whitening
class BaselineWhitening(EstimatorChoice, abc.ABC):
    """Over what ``reinforce_pp_baseline`` whitens the group-centred rewards: an alternative of ``whiten``."""

    registry: ClassVar[Registry[type["BaselineWhitening"]]] = baseline_whitenings

    @abc.abstractmethod
    def __call__(self, centered: Float[Tensor, " N"], inputs: AdvantageInputs) -> Float[Tensor, " N"]:
        """The whitened ``centered`` values."""


class TokenWhitening(BaselineWhitening, name="token"):
    """Statistics over every counted token (each value weighted by its completion's length; verl); 0 for a
    completion with no counted token. Needs ``completion_mask``."""

    needs = frozenset({"completion_mask"})

    def __call__(self, centered: Float[Tensor, " N"], inputs: AdvantageInputs) -> Float[Tensor, " N"]:
        assert inputs.lengths is not None  # completion_mask is in `needs`
        lengths = inputs.lengths
        return torch.where(lengths > 0, whiten(centered, lengths), _zero(centered))


class SequenceWhitening(BaselineWhitening, name="sequence"):
    """Statistics over the ``N`` completions, each counted once."""

    def __call__(self, centered: Float[Tensor, " N"], inputs: AdvantageInputs) -> Float[Tensor, " N"]:
        return whiten(centered, torch.ones_like(centered))
