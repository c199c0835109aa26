r"""Several reward functions: combine ``Float[N, K]`` rewards into the one reward an estimator consumes.

Two orders, TRL's ``multi_objective_aggregation`` values:

* ``"sum_then_normalize"``: the weighted sum ``sum_k w_k r_k``; the estimator then normalises it (with
  ``grpo`` this is TRL's default GRPO advantage for several reward functions).
* ``"normalize_then_sum"`` (GDPO): normalise each reward within its group first, so a reward with a large
  spread cannot drown the others, then take the weighted sum. Both frameworks normalise that sum once more
  over the batch, and differently:

  - TRL: over the ``N`` completions, ``(x - mean) / (std + 1e-4)``: feed the result to
    ``get_advantage("grpo", scale="batch")``, which gives exactly that (the sum already has zero mean in every
    group, so subtracting the group mean or the batch mean is the same);
  - verl ``adv_estimator="gdpo"``: whitening over every counted **token**, so long completions weigh more:
    feed it to ``get_advantage("reinforce_pp_baseline")`` (``whiten="token"``) with ``eps=1e-6`` here.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.advantages.base import check_rewards
from rlzoo.advantages.groups import GroupIds, GroupIndex
from rlzoo.advantages.outcome import group_normalized
from rlzoo.losses.functional import working_dtype
from rlzoo.registry import check_choice, check_number

__all__ = ["MULTI_REWARD_MODES", "combine_rewards"]

MULTI_REWARD_MODES: tuple[str, ...] = ("sum_then_normalize", "normalize_then_sum")


def combine_rewards(
    rewards: Float[Tensor, "N K"],
    weights: Float[Tensor, " K"] | Sequence[float] | None = None,
    *,
    mode: str = "sum_then_normalize",
    group_size: int | None = None,
    group_ids: GroupIds | None = None,
    eps: float = 1e-4,
) -> Float[Tensor, " N"]:
    r"""One reward per completion from ``K`` reward functions.

    .. math::

        \text{sum\_then\_normalize:}\quad x_i = \sum_k w_k r_{ik} \qquad
        \text{normalize\_then\_sum:}\quad x_i = \sum_k w_k \frac{r_{ik} - \operatorname{mean}_g(r_{\cdot k})}
        {\operatorname{std}_g(r_{\cdot k}) + \epsilon}

    with ``mean_g`` / ``std_g`` (unbiased) over the group of item ``i``; a reward that is constant within a
    group (or a singleton group) contributes 0 there. See the module docstring for the batch normalisation
    that follows.

    NaN is a reward function's None (TRL: the function does not apply to that completion): it adds nothing to
    the sum, and under ``"normalize_then_sum"`` the function's group mean and std are taken over the completions
    it scored (TRL's ``nanmean`` / ``nanstd``). A completion every function returned None for is unscorable: its
    result is NaN, and TRL leaves it out of the advantage's baseline and gives it advantage 0 (pass the other
    rows to the estimator, as ``rlzoo train`` does).

    Args:
        rewards: ``Float[N, K]``, finite or NaN; column ``k`` is reward function ``k``.
        weights: ``K`` finite weights (TRL ``reward_weights``); None = all 1.
        mode: ``"sum_then_normalize"`` (TRL's default) or ``"normalize_then_sum"`` (GDPO).
        group_size, group_ids: the grouping (exactly one; see :class:`~rlzoo.advantages.GroupIndex`); needed
            by ``"normalize_then_sum"`` only.
        eps: ``>= 0`` added to each per-group std (TRL 1e-4; verl gdpo 1e-6).

    Returns:
        ``Float[N]`` in ``rewards``' dtype (bf16 / fp16 rewards are computed in float32 and rounded once).

    Raises:
        ValueError: naming the field: unknown ``mode`` (listing both), ``rewards`` not ``[N, K]`` floating
            point or holding inf, ``weights`` of the wrong length or not finite, bad grouping.

    Source: Liu, Dong et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization", arXiv:2601.05242. Matches TRL 1.16 ``multi_objective_aggregation``
    (followed by ``grpo``; None rewards and unscorable completions as TRL's) and
    the first two steps of verl 0.9.1 ``adv_estimator="gdpo"`` on groups of two or more.

    Example:
        >>> import torch
        >>> r = torch.tensor([[1.0, 10.0], [0.0, 30.0]])
        >>> combine_rewards(r, [1.0, 0.5]).tolist()
        [6.0, 15.0]
        >>> r = torch.tensor([[1.0, 30.0], [0.0, 10.0]])
        >>> [round(x, 3) for x in combine_rewards(r, mode="normalize_then_sum", group_size=2).tolist()]
        [1.414, -1.414]
    """
    owner = "combine_rewards"
    check_choice(owner, "mode", mode, MULTI_REWARD_MODES)
    check_number(owner, "eps", eps, low=0.0)
    if not isinstance(rewards, Tensor) or rewards.ndim != 2 or rewards.shape[0] < 1 or rewards.shape[1] < 1:
        shape = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(
            f"{owner}: rewards must be a tensor of shape [N, K] (one column per reward function), got {shape}"
        )
    n, k = (int(s) for s in rewards.shape)
    for column in range(k):
        check_rewards(rewards[:, column], owner, name="rewards")
    if bool(torch.isinf(rewards).any()):
        raise ValueError(f"{owner}: rewards holds inf; a reward is a finite number, or NaN for a function's None")
    dtype = rewards.dtype  # bf16 / fp16: computed in float32 (a bf16 group sum stops at 256), returned in it
    rewards = rewards.to(working_dtype(dtype))
    if weights is None:
        w = torch.ones(k, dtype=rewards.dtype, device=rewards.device)
    else:
        w = torch.as_tensor(weights, dtype=rewards.dtype, device=rewards.device)
        if tuple(w.shape) != (k,):
            raise ValueError(
                f"{owner}: weights must hold K={k} values (one per reward column), got shape {tuple(w.shape)}"
            )
        if not bool(torch.isfinite(w).all()):
            raise ValueError(f"{owner}: weights must be finite, got {w.tolist()}")
    scored = ~torch.isnan(rewards)
    if mode == "sum_then_normalize":
        if bool(scored.all()):
            return (rewards @ w).to(dtype)
        return torch.where(scored.any(dim=1), torch.nan_to_num(rewards, nan=0.0) @ w, torch.nan).to(dtype)
    groups = GroupIndex.build(
        n, group_size=group_size, group_ids=group_ids, device=rewards.device, owner=owner
    )
    if bool(scored.all()):
        normalized = torch.stack(
            [group_normalized(rewards[:, j], groups, scale="group", eps=eps) for j in range(k)], dim=-1
        )
        return (normalized @ w).to(dtype)
    columns = []
    for j in range(k):  # each function over the completions it scored, in their groups
        column, ok = torch.zeros_like(rewards[:, j]), scored[:, j]
        if bool(ok.any()):
            kept = GroupIndex.build(int(ok.sum()), group_ids=groups.index[ok], device=rewards.device, owner=owner)
            column[ok] = group_normalized(rewards[ok, j], kept, scale="group", eps=eps)
        columns.append(column)
    return torch.where(scored.any(dim=1), torch.stack(columns, dim=-1) @ w, torch.nan).to(dtype)
