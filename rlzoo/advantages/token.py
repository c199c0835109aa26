r"""Token-level advantage estimators (``Float[N, T]``) and the PPO critic's clipped value loss.

Rewards per token are built the same way for every estimator here (as verl builds ``token_level_rewards``):
the outcome reward ``rewards[i]`` sits on the **last counted token** of completion ``i``, plus the optional
dense ``token_rewards`` (e.g. ``-beta * KL`` when the KL penalty is in the reward). Rewards at masked
positions are
dropped, and the recursions skip masked positions: a hole in ``completion_mask`` (tool output or observation
tokens of a multi-turn rollout) is stepped over, so the recursion runs over the counted tokens only, as in
verl. Outputs are 0 at masked positions (verl leaves whitened values there).

Notation: ``N`` completions, ``T`` completion tokens (right padded), ``r_t`` the reward at token ``t``,
``V_t`` the critic's value, ``gamma`` the discount and ``lambda`` the GAE parameter.
"""

import math

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.advantages.base import AdvantageEstimator, AdvantageInputs, build_inputs, check_rewards
from rlzoo.advantages.groups import GroupIndex, whiten
from rlzoo.batch import LossOutput, Normalizer
from rlzoo.losses import aggregations, masked_mean
from rlzoo.losses.functional import working_dtype
from rlzoo.registry import check_number

__all__ = ["GAE", "ReMax", "ReinforcePP", "token_level_rewards", "value_loss"]


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def token_level_rewards(
    rewards: Float[Tensor, " N"],
    completion_mask: Bool[Tensor, "N T"],
    token_rewards: Float[Tensor, "N T"] | None = None,
) -> Float[Tensor, "N T"]:
    """Per-token rewards: ``token_rewards`` plus the outcome ``rewards`` on each row's last counted token.

    Args:
        rewards: ``Float[N]`` outcome reward per completion.
        completion_mask: ``Bool[N, T]``.
        token_rewards: ``Float[N, T]`` or None; values at masked positions are ignored.

    Returns:
        ``Float[N, T]``, 0 at masked positions. A row with no counted token is all 0 (its reward has nowhere
        to go).

    Example:
        >>> import torch
        >>> mask = torch.tensor([[True, True, False], [True, False, True]])
        >>> token_level_rewards(torch.tensor([1.0, 2.0]), mask).tolist()
        [[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]]
    """
    t = completion_mask.shape[1]
    last = (t - 1) - completion_mask.flip(-1).to(torch.int32).argmax(dim=-1)
    dense = torch.zeros_like(completion_mask, dtype=rewards.dtype) if token_rewards is None else token_rewards
    dense = torch.where(completion_mask, dense, _zero(rewards))
    dense = dense.scatter_add(1, last.unsqueeze(-1), rewards.unsqueeze(-1))
    return torch.where(completion_mask, dense, _zero(rewards))


def _discounted_returns(r: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + gamma G_{t'}`` with ``t'`` the next counted token (0 past the last); 0 at masked
    positions."""
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    out = []
    for t in reversed(range(r.shape[1])):
        m = mask[:, t]
        running = torch.where(m, r[:, t] + gamma * running, running)
        out.append(torch.where(m, running, _zero(r)))
    return torch.stack(out[::-1], dim=1)


def _gae(r: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float | Tensor) -> Tensor:
    """Un-whitened GAE over the counted tokens of each row (terminal value 0); 0 at masked positions. ``lam``: one
    number, or one per row (``Float[N]``)."""
    next_value = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    running = torch.zeros_like(next_value)
    out = []
    for t in reversed(range(r.shape[1])):
        m = mask[:, t]
        delta = r[:, t] + gamma * next_value - values[:, t]
        running = torch.where(m, delta + gamma * lam * running, running)
        next_value = torch.where(m, values[:, t], next_value)
        out.append(torch.where(m, running, _zero(r)))
    return torch.stack(out[::-1], dim=1)


class ReinforcePP(AdvantageEstimator, name="reinforce_pp"):
    r"""REINFORCE++: the discounted return-to-go of each token, whitened over every counted token of the
    batch.

    .. math:: G_t = \sum_{t' \ge t} \gamma^{t' - t} r_{t'}, \qquad A_t = \operatorname{whiten}(G)_t

    (``t' - t`` counts counted tokens only.) ``whiten`` is ``(x - mean) / sqrt(var + 1e-8)`` with the unbiased
    variance over all counted tokens: the global batch normalisation that replaces a critic. No groups. Needs
    ``completion_mask``; accepts ``token_rewards`` (put the KL penalty there, as REINFORCE++ does).

    Options:
        gamma: discount in ``[0, 1]`` (default 1.0, verl ``algorithm.gamma``).

    Source: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    arXiv:2501.03262. Matches verl 0.9.1 ``adv_estimator="reinforce_plus_plus"`` at counted tokens.
    """

    gamma: float = 1.0

    needs = frozenset({"completion_mask"})
    accepts = frozenset({"token_rewards"})
    uses_groups = False
    token_level = True

    def check(self) -> None:
        check_number("reinforce_pp", "gamma", self.gamma, low=0.0, high=1.0)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        mask = inputs.mask
        returns = _discounted_returns(
            token_level_rewards(rewards, mask, inputs.token_rewards), mask, self.gamma
        )
        return torch.where(mask, whiten(returns, mask.to(rewards.dtype)), _zero(rewards))


class ReMax(AdvantageEstimator, name="remax"):
    r"""ReMax: return-to-go minus the reward of the greedy response, ``A_t = sum_{t' >= t} r_{t'} - b``.

    The baseline ``b`` is the reward of the greedy-decoded (argmax) response to the same prompt, passed as
    ``baseline_rewards`` ``Float[N]`` (one per item; repeat it over the prompt's samples). With outcome
    rewards only, ``A_t = r - b`` at every counted token. No discount, no whitening, no groups. Needs
    ``completion_mask`` and ``baseline_rewards``; accepts ``token_rewards``.

    Source: Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models", arXiv:2310.10505, Algorithm 1. Matches verl 0.9.1
    ``adv_estimator="remax"``
    at counted tokens.
    """

    needs = frozenset({"completion_mask", "baseline_rewards"})
    accepts = frozenset({"token_rewards"})
    uses_groups = False
    token_level = True

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        mask = inputs.mask
        assert inputs.baseline_rewards is not None
        dense = token_level_rewards(rewards, mask, inputs.token_rewards)
        returns = dense.flip(-1).cumsum(-1).flip(-1)
        return torch.where(mask, returns - inputs.baseline_rewards.unsqueeze(-1), _zero(rewards))


class GAE(AdvantageEstimator, name="gae"):
    r"""Generalized Advantage Estimation from a critic's values (PPO).

    .. math:: \delta_t = r_t + \gamma V_{t+1} - V_t, \quad A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l}

    over the counted tokens of each completion (``t + 1`` is the next counted token; ``V`` past the last one
    is 0, the episode ends). Returns (the critic's targets) are ``A_t + V_t`` before whitening:
    :meth:`with_returns` gives both, for :func:`value_loss`. No groups. Needs ``completion_mask`` and
    ``values``; accepts ``token_rewards``.

    Options:
        gamma: discount in ``[0, 1]`` (default 1.0, verl ``algorithm.gamma``).
        lam: GAE lambda in ``[0, 1]`` (default 1.0, verl ``algorithm.lam``; lambda 1 is the Monte-Carlo return
            minus ``V``, lambda 0 the one-step TD error).
        whiten: whiten the advantages over every counted token of the batch (default True, as verl and TRL's
            PPO trainer do); the returns are never whitened.
        lam_critic: None (default: ``lam``) or a lambda in ``[0, 1]`` for the returns only: VAPO's decoupled GAE
            (the critic's targets with ``lam_critic = 1``, unbiased; the policy's advantages with ``lam``).
        length_adaptive_alpha: None (off, default) or ``alpha > 0``: VAPO's length-adaptive GAE, the policy's
            lambda per completion ``lam_i = 1 - 1 / (alpha * l_i)`` with ``l_i`` its counted tokens (clamped to
            ``[0, 1]``: completions shorter than ``1 / alpha`` get 0); replaces ``lam`` for the advantages
            (the paper's ``alpha = 0.05``). Returns use ``lam_critic`` (or ``lam``).

    Source: Schulman, Moritz, Levine, Jordan, Abbeel 2015, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", arXiv:1506.02438, eq. (16). Matches verl 0.9.1
    ``compute_gae_advantage_return`` (``adv_estimator="gae"``) at counted tokens (``lam_critic`` and
    ``length_adaptive_alpha`` off). Decoupled and length-adaptive GAE: Yue et al. 2025, "VAPO: Efficient and
    Reliable Reinforcement Learning for Advanced Reasoning Tasks", arXiv:2504.05118 (lambda_critic = 1,
    lambda_policy = 1 - 1 / (alpha l)); no reference implementation is installed, the tests state the formula.
    """

    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = True
    lam_critic: float | None = None
    length_adaptive_alpha: float | None = None

    needs = frozenset({"completion_mask", "values"})
    accepts = frozenset({"token_rewards"})
    uses_groups = False
    token_level = True

    def check(self) -> None:
        check_number("gae", "gamma", self.gamma, low=0.0, high=1.0)
        check_number("gae", "lam", self.lam, low=0.0, high=1.0)
        check_number("gae", "lam_critic", self.lam_critic, low=0.0, high=1.0, allow_none=True)
        check_number("gae", "length_adaptive_alpha", self.length_adaptive_alpha, low=0.0, low_open=True,
                     allow_none=True)
        if not isinstance(self.whiten, bool):
            raise ValueError(f"gae: whiten must be True or False, got {self.whiten!r}")

    def _both(self, rewards: Tensor, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        mask = inputs.mask
        assert inputs.values is not None
        dense = token_level_rewards(rewards, mask, inputs.token_rewards)
        lam: float | Tensor = self.lam
        if self.length_adaptive_alpha is not None:
            lengths = mask.sum(-1).to(rewards.dtype)
            lam = (1.0 - 1.0 / (self.length_adaptive_alpha * lengths.clamp(min=1))).clamp(0.0, 1.0)
        advantages = _gae(dense, inputs.values, mask, self.gamma, lam)
        critic = advantages if self.lam_critic is None and self.length_adaptive_alpha is None else _gae(
            dense, inputs.values, mask, self.gamma, self.lam if self.lam_critic is None else self.lam_critic)
        returns = torch.where(mask, critic + inputs.values, _zero(rewards))
        if self.whiten:
            advantages = torch.where(mask, whiten(advantages, mask.to(rewards.dtype)), _zero(rewards))
        return advantages, returns

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        return self._both(rewards, inputs)[0]

    def with_returns(
        self,
        rewards: Float[Tensor, " N"],
        *,
        completion_mask: Bool[Tensor, "N T"],
        values: Float[Tensor, "N T"],
        token_rewards: Float[Tensor, "N T"] | None = None,
    ) -> tuple[Float[Tensor, "N T"], Float[Tensor, "N T"]]:
        """``(advantages, returns)``: the advantages of ``__call__`` and the critic's targets ``A + V``
        (un-whitened).

        Args and errors as for ``__call__``. Both outputs are 0 at masked positions.

        Example:
            >>> import torch, rlzoo
            >>> gae = rlzoo.get_advantage("gae", gamma=1.0, lam=1.0, whiten=False)
            >>> mask = torch.ones(1, 3, dtype=torch.bool)
            >>> adv, ret = gae.with_returns(torch.tensor([1.0]), completion_mask=mask,
            ...                             values=torch.tensor([[0.5, 0.5, 0.5]]))
            >>> adv.tolist(), ret.tolist()
            ([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]])
        """
        owner = "advantage estimator 'gae'"
        rewards = check_rewards(rewards, owner)
        given = {"completion_mask": completion_mask, "values": values, "token_rewards": token_rewards}
        work = rewards.to(working_dtype(rewards.dtype))  # as __call__ computes
        inputs = build_inputs(owner, work, {k: v for k, v in given.items() if v is not None})
        advantages, returns = self._both(work, inputs)
        return advantages.to(rewards.dtype), returns.to(rewards.dtype)


def value_loss(
    values: Float[Tensor, "B T"],
    old_values: Float[Tensor, "B T"],
    returns: Float[Tensor, "B T"],
    completion_mask: Bool[Tensor, "B T"],
    *,
    cliprange_value: float,
    aggregation: str = "token-mean",
    normalizer: Normalizer | None = None,
    max_completion_length: int | None = None,
    group_index: Int[Tensor, " B"] | None = None,
) -> LossOutput:
    r"""PPO's clipped value (critic) loss.

    .. math::

        \ell_t = \tfrac12 \max\big((V_t - R_t)^2,\
                 (\operatorname{clip}(V_t, V^{old}_t - c, V^{old}_t + c) - R_t)^2\big)

    aggregated over counted tokens with one of the rules of :class:`rlzoo.losses.Aggregation` and the counts of
    ``normalizer`` (so micro-batch losses sum to the full-batch loss).

    Args:
        values: ``Float[B, T]``, the critic's current predictions ``V_t`` (carries the gradient).
        old_values: ``Float[B, T]``, the predictions at rollout time ``V^old_t`` (detached).
        returns: ``Float[B, T]``, targets ``R_t`` (e.g. :meth:`GAE.with_returns`; detached).
        completion_mask: ``Bool[B, T]``. Masked positions are inert: any value there, NaN included, changes
            neither the loss nor the gradient.
        cliprange_value: ``c > 0``; ``math.inf`` disables clipping (plain squared error).
        aggregation: a registered aggregation name (default ``"token-mean"``, verl's default).
        normalizer: counts of the whole optimizer-step batch; default: this batch's own.
        max_completion_length: needed by ``"seq-mean-token-sum-norm"`` only.
        group_index: ``Int[B]`` prompt id of each row (:attr:`rlzoo.PolicyBatch.group_index`), needed by
            ``"prompt-mean"`` only (the default normalizer then counts each prompt's tokens).

    Returns:
        :class:`~rlzoo.LossOutput` with ``loss`` (0-d) and metrics ``critic/vf_clipfrac`` (fraction of counted
        tokens where the clipped term is larger) and ``critic/vpred_mean``.

    Raises:
        ValueError: bad ``cliprange_value``; shapes that differ; a non-bool mask; NaN/inf at a counted
        position; ``"prompt-mean"`` without ``group_index``.
        rlzoo.BatchError: a ``group_index`` the default normalizer cannot count (a negative id, or labels rather
        than prompt indices: :meth:`rlzoo.Normalizer.from_masks`).
        rlzoo.UnknownNameError: unknown ``aggregation`` (lists the valid names).

    Source: the value clipping of OpenAI baselines' PPO2 (discussed by Engstrom et al. 2020, "Implementation
    Matters in Deep Policy Gradients", arXiv:2005.12729). Matches verl 0.9.1 ``compute_value_loss`` (its
    ``vpreds, values`` are our ``values, old_values``) and TRL's former ``PPOTrainer`` value loss.

    Example:
        >>> import torch, rlzoo
        >>> m = torch.ones(1, 2, dtype=torch.bool)
        >>> values, old, returns = torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[2.0, 0.0]])
        >>> out = rlzoo.advantages.value_loss(values, old, returns, m, cliprange_value=0.5)
        >>> out.loss.item(), out.metrics["critic/vf_clipfrac"].item()
        (0.5625, 0.5)
    """
    check_number("value_loss", "cliprange_value", cliprange_value, low=0.0, low_open=True, allow_inf=True)
    agg = aggregations.get(aggregation)()
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise ValueError(f"value_loss: {name} must be a floating-point tensor")
        if tuple(x.shape) != tuple(completion_mask.shape):
            raise ValueError(
                f"value_loss: {name} must have shape [B, T]={tuple(completion_mask.shape)} like "
                f"completion_mask, got {tuple(x.shape)}"
            )
    if completion_mask.dtype != torch.bool:
        raise ValueError(
            f"value_loss: completion_mask must have dtype torch.bool, got {completion_mask.dtype}"
        )
    mask = completion_mask
    flags = torch.stack(
        [(~torch.isfinite(x.detach()) & mask).any() for x in (values, old_values, returns)]
    ).cpu()
    for name, bad in zip(("values", "old_values", "returns"), flags.tolist(), strict=True):
        if bad:
            raise ValueError(f"value_loss: {name} holds NaN/inf at a counted position (completion_mask True)")
    zero = _zero(values)
    v = torch.where(mask, values, zero)
    old = torch.where(mask, old_values.detach().to(values.dtype), zero)
    target = torch.where(mask, returns.detach().to(values.dtype), zero)
    unclipped = (v - target) ** 2
    if math.isinf(cliprange_value):
        clipped = unclipped
    else:
        clipped = (torch.clamp(v, old - cliprange_value, old + cliprange_value) - target) ** 2
    per_token = 0.5 * torch.maximum(unclipped, clipped)
    if normalizer is None:
        normalizer = Normalizer.from_masks(mask, group_index=None if group_index is None else [group_index])
    loss = agg(per_token, mask, normalizer, max_completion_length, group_index)
    metrics = {
        "critic/vf_clipfrac": masked_mean((clipped > unclipped).to(values.dtype), mask).detach(),
        "critic/vpred_mean": masked_mean(v.detach(), mask),
    }
    return LossOutput(loss=loss, metrics=metrics)
