"""Hypothesis strategies and reference adapters for the advantage-estimator tests.

Strategies
----------
* :func:`grouped_rewards` - float64 rewards with group labels: groups of any size (singletons included), in
  any order, values on a coarse grid (ties and zero-variance groups are frequent) or continuous.
* :func:`consecutive_rewards` - rewards in groups of ``group_size`` consecutive items (TRL's layout).
* :func:`token_case` - rewards + ``Bool[N, T]`` mask (holes allowed) + dense token rewards + values +
  baselines.

Adapters
--------
* :func:`verl_token_rewards` - verl's ``token_level_rewards`` layout: the outcome reward on the last counted
  token (what verl's reward manager builds), so ``token_level_rewards.sum(-1) == rewards``.
* :func:`labels_to_index` - the same labels as verl's ``index`` numpy array of strings (verl's ``uid``).
"""

import numpy as np
import torch
from hypothesis import strategies as st
from strategies import masks

__all__ = [
    "GRID",
    "consecutive_rewards",
    "grouped_rewards",
    "labels_to_index",
    "token_case",
    "verl_token_rewards",
]

# Rewards on a grid of quarters: exactly representable, so ties and constant groups are exact.
GRID = st.integers(-12, 12).map(lambda k: k / 4)
CONTINUOUS = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@st.composite
def grouped_rewards(
    draw: st.DrawFn,
    *,
    min_groups: int = 1,
    max_groups: int = 5,
    min_size: int = 1,
    max_size: int = 6,
    values: st.SearchStrategy[float] | None = None,
    shuffle: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rewards Float64[N], group_ids Int64[N])``; groups of ``min_size..max_size`` items, labels
    arbitrary."""
    values = draw(st.sampled_from((GRID, CONTINUOUS))) if values is None else values
    sizes = draw(st.lists(st.integers(min_size, max_size), min_size=min_groups, max_size=max_groups))
    labels = draw(st.lists(st.integers(-50, 50), min_size=len(sizes), max_size=len(sizes), unique=True))
    ids = [label for label, size in zip(labels, sizes, strict=True) for _ in range(size)]
    rewards = draw(st.lists(values, min_size=len(ids), max_size=len(ids)))
    order = list(range(len(ids)))
    if shuffle:
        order = draw(st.permutations(order))
    r = torch.tensor([rewards[i] for i in order], dtype=torch.float64)
    g = torch.tensor([ids[i] for i in order], dtype=torch.int64)
    return r, g


@st.composite
def consecutive_rewards(
    draw: st.DrawFn,
    *,
    min_size: int = 1,
    max_size: int = 6,
    max_groups: int = 5,
    values: st.SearchStrategy[float] | None = None,
) -> tuple[torch.Tensor, int]:
    """``(rewards Float64[K G], G)``: ``K`` groups of ``G`` consecutive items."""
    values = draw(st.sampled_from((GRID, CONTINUOUS))) if values is None else values
    size = draw(st.integers(min_size, max_size))
    k = draw(st.integers(1, max_groups))
    r = draw(st.lists(values, min_size=k * size, max_size=k * size))
    return torch.tensor(r, dtype=torch.float64), size


@st.composite
def token_case(
    draw: st.DrawFn,
    *,
    n: int | None = None,
    max_n: int = 6,
    max_t: int = 7,
    holes: bool | None = None,
    min_counted: int = 2,
    min_len: int = 0,
) -> dict[str, torch.Tensor]:
    """Token-level inputs: ``rewards [N]``, ``completion_mask [N, T]``, ``token_rewards``, ``values``,
    ``baseline_rewards [N]``, and a sampling policy's ``old_logprobs`` with a consistent ``sum_pi_squared`` (in
    ``[p^2, p^2 + (1 - p)^2]`` for the sampled token's probability ``p``) and ``rollout_is_weights`` (float64;
    values from a hypothesis-drawn seed)."""
    mask = draw(
        masks(
            min_b=n or 1,
            max_b=n or max_n,
            min_t=max(1, min_counted),
            max_t=max_t,
            holes=holes,
            min_counted=min_counted,
            min_len=min_len,
        )
    )
    b, t = mask.shape
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    case = {
        "rewards": torch.randn(b, generator=g, dtype=torch.float64),
        "completion_mask": mask,
        "token_rewards": 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "values": torch.randn(b, t, generator=g, dtype=torch.float64),
        "baseline_rewards": torch.randn(b, generator=g, dtype=torch.float64),
    }
    p = torch.rand(b, t, generator=g, dtype=torch.float64).clamp(min=1e-3)
    rest = torch.rand(b, t, generator=g, dtype=torch.float64)
    case["old_logprobs"] = p.log()
    case["sum_pi_squared"] = p * p + rest * (1 - p) ** 2
    case["rollout_is_weights"] = torch.exp(0.3 * torch.randn(b, t, generator=g, dtype=torch.float64))
    return case


def verl_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` with ``rewards[i]`` on row i's last counted token (rows without one: on the last
    position)."""
    t = mask.shape[1]
    last = (t - 1) - mask.flip(-1).to(torch.int64).argmax(-1)
    out = torch.zeros(mask.shape, dtype=rewards.dtype)
    out[torch.arange(mask.shape[0]), last] = rewards
    return out


def labels_to_index(group_ids: torch.Tensor) -> np.ndarray:
    """verl's ``index``: a numpy object array of uid strings."""
    return np.array([f"uid-{int(i)}" for i in group_ids], dtype=object)
