r"""The optimal token baseline (OTB): a per-token, per-group baseline weighted by the path's gradient variance.

Notation: ``N`` completions, ``T`` completion tokens, ``pi_t = exp(old_logprobs_t)`` the sampling policy's
probability of the sampled token ``o_t``, ``S_t = sum_v pi(v | o_<t)^2`` (``sum_pi_squared``), ``G_t`` the
return-to-go (undiscounted) and, for a group ``g`` of completions of one prompt, sums over its items ``i``.

The squared norm of the score of a softmax policy at the sampled token, ``||grad_z log pi(o_t)||^2 =
(1 - pi_t)^2 + sum_{v != o_t} pi_v^2 = 1 - 2 pi_t + S_t``, is cheap to compute from the log-prob and ``S_t``;
its running sum ``W_t`` over the completion is a proxy of the variance the policy-gradient estimator picks up
along the path, and the baseline minimising the estimator's variance at step ``t`` is the ``W``-weighted mean
of the returns over the group.
"""

import torch
from torch import Tensor

from rlzoo.advantages.base import AdvantageEstimator, AdvantageInputs
from rlzoo.advantages.groups import GroupIndex
from rlzoo.advantages.token import token_level_rewards
from rlzoo.registry import check_number

__all__ = ["OptimalTokenBaseline"]


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


class OptimalTokenBaseline(AdvantageEstimator, name="optimal_token_baseline"):
    r"""The optimal token baseline: ``A_{i,t} = G_{i,t} - B_{g,t}``, ``B`` the path-variance-weighted mean return.

    .. math::

        w_{i,t} = (1 - 2\pi_{i,t} + S_{i,t})\,\rho_{i,t}^2, \qquad W_{i,t} = \sum_{j \le t} w_{i,j}\,m_{i,j},
        \qquad B_{g,t} = \frac{\sum_{i \in g} G_{i,t} W_{i,t} m_{i,t}}{\sum_{i \in g} W_{i,t} m_{i,t} + \epsilon},
        \qquad A_{i,t} = (G_{i,t} - B_{g,t})\,m_{i,t}

    with ``m`` the completion mask, ``G_{i,t} = sum_{t' >= t} r_{i,t'}`` the return-to-go of the per-token rewards
    (the outcome reward on the last counted token plus ``token_rewards``), ``pi = exp(old_logprobs)``, ``S =
    sum_pi_squared`` and ``rho`` the ``rollout_is_weights`` (1 when not given). With ``handle_zero_tail``, the
    positions of a group's unique longest completion past the second-longest one's length (counted tokens)
    get baseline 0 (the weighted mean there would be that completion's own return, i.e. advantage ~0).

    Options:
        handle_zero_tail: bool (default True, verl's).
        eps: ``epsilon``, finite, >= 0, added to the denominator (default 1e-8, verl's ``epsilon``).

    Needs ``completion_mask``, ``old_logprobs`` (the sampling policy's, scored at generation time) and
    ``sum_pi_squared`` (of the same policy and temperature); accepts ``token_rewards`` and
    ``rollout_is_weights``. Returns ``Float[N, T]``, 0 at masked positions.

    Conventions (docs/advantages.md): singleton groups get 0 (verl: baseline 0, ``A = G``); a group whose
    outcome rewards are all equal gets exactly 0 when no ``token_rewards`` are given (verl: ``G - B`` with ``B =
    G W / (W + eps)``, ~0, and ``A = G`` on the zero tail).

    Source: verl 0.9.1 ``compute_optimal_token_baseline_advantage`` (``adv_estimator="optimal_token_baseline"``,
    ``verl/trainer/ppo/core_algos.py``), which it matches on groups of two or more that are not degenerate (or
    carry token rewards); its derivation is the note "The Optimal Token Baseline" that verl's ``actor.yaml`` links
    (``calculate_sum_pi_squared``). The variance-minimising baseline ``E[G ||s||^2] / E[||s||^2]`` goes back to
    Weaver and Tao 2001, "The Optimal Reward Baseline for Gradient-Based Reinforcement Learning",
    arXiv:1301.2315, and Greensmith, Bartlett and Baxter 2004, "Variance Reduction Techniques for Gradient
    Estimates in Reinforcement Learning" (JMLR 5); OPO (Hao et al. 2025, arXiv:2505.23585) is its per-sequence
    form with ``||s||^2`` approximated by the length.

    Example:
        >>> import torch, rlzoo
        >>> otb = rlzoo.get_advantage("optimal_token_baseline")
        >>> mask = torch.ones(2, 2, dtype=torch.bool)
        >>> old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64))
        >>> spq = torch.full((2, 2), 0.5, dtype=torch.float64)  # w = 1 - 1 + 0.5 = 0.5 at every token
        >>> adv = otb(torch.tensor([1.0, 0.0], dtype=torch.float64), group_size=2, completion_mask=mask,
        ...           old_logprobs=old, sum_pi_squared=spq)
        >>> [[round(a, 6) for a in row] for row in adv.tolist()]  # equal W: the baseline is the mean return
        [[0.5, 0.5], [-0.5, -0.5]]
    """

    handle_zero_tail: bool = True
    eps: float = 1e-8

    needs = frozenset({"completion_mask", "old_logprobs", "sum_pi_squared"})
    accepts = frozenset({"token_rewards", "rollout_is_weights"})
    uses_groups = True
    token_level = True

    def check(self) -> None:
        if not isinstance(self.handle_zero_tail, bool):
            raise ValueError(f"optimal_token_baseline: handle_zero_tail must be True or False, got "
                             f"{self.handle_zero_tail!r}")
        check_number("optimal_token_baseline", "eps", self.eps, low=0.0)

    def _compute(self, rewards: Tensor, groups: GroupIndex | None, inputs: AdvantageInputs) -> Tensor:
        assert groups is not None and inputs.old_logprobs is not None and inputs.sum_pi_squared is not None
        mask = inputs.mask
        m = mask.to(rewards.dtype)
        returns = token_level_rewards(rewards, mask, inputs.token_rewards).flip(-1).cumsum(-1).flip(-1)
        w = 1.0 - 2.0 * torch.exp(inputs.old_logprobs) + inputs.sum_pi_squared
        if inputs.rollout_is_weights is not None:
            w = w * inputs.rollout_is_weights.square()
        cumulative = (w * m).cumsum(-1)
        numerator = groups.sum(returns * cumulative * m)
        denominator = groups.sum(cumulative * m) + self.eps
        baseline = groups.expand(numerator / denominator)
        if self.handle_zero_tail:
            baseline = torch.where(self._zero_tail(mask, groups), _zero(baseline), baseline)
        live = groups.expand(groups.counts > 1)
        if inputs.token_rewards is None:
            live = live & ~groups.expand(groups.degenerate(rewards))
        return torch.where(mask & live[:, None], returns - baseline, _zero(rewards))

    @staticmethod
    def _zero_tail(mask: Tensor, groups: GroupIndex) -> Tensor:
        """``Bool[N, T]``: the positions ``t >= L_2`` of each group's unique longest completion, ``L_2`` the
        second-longest length (counted tokens) in its group; False elsewhere (and where the longest is tied)."""
        lengths = mask.sum(-1).to(torch.float64)
        longest = groups.max(lengths)
        at_max = lengths == groups.expand(longest)
        unique = groups.sum(at_max.to(torch.float64)) == 1
        second = groups.max(torch.where(at_max, torch.full_like(lengths, -1.0), lengths))
        row = at_max & groups.expand(unique)
        position = torch.arange(mask.shape[1], device=mask.device, dtype=torch.float64)
        return row[:, None] & (position[None, :] >= groups.expand(second)[:, None])
