"""combine_rewards: several reward functions -> one reward per completion (TRL multi_objective_aggregation,
GDPO)."""

import pytest
import torch
from adv_cases import GRID, grouped_rewards
from hypothesis import given
from hypothesis import strategies as st
from tolerances import tol

from rlzoo.advantages import combine_rewards, get_advantage

TOL = tol(torch.float64)


@st.composite
def multi_rewards(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    first, ids = draw(grouped_rewards())
    n = first.shape[0]
    k = draw(st.integers(1, 4))
    rest = draw(st.lists(GRID, min_size=n * (k - 1), max_size=n * (k - 1)))
    table = torch.cat([first[:, None], torch.tensor(rest, dtype=torch.float64).view(n, k - 1)], dim=1)
    weights = torch.tensor(draw(st.lists(st.floats(-2, 2), min_size=k, max_size=k)), dtype=torch.float64)
    return table, weights, ids


@given(data=multi_rewards())
def test_sum_then_normalize_is_weighted_sum(data) -> None:
    """x_i = sum_k w_k r_ik; weights None = all ones."""
    table, weights, _ = data
    torch.testing.assert_close(combine_rewards(table, weights), (table * weights).sum(-1), **TOL)
    torch.testing.assert_close(combine_rewards(table, weights.tolist()), (table * weights).sum(-1), **TOL)
    torch.testing.assert_close(combine_rewards(table), table.sum(-1), **TOL)


@given(data=multi_rewards(), eps=st.sampled_from((0.0, 1e-6, 1e-4)))
def test_normalize_then_sum_is_sum_of_grpo_advantages(data, eps: float) -> None:
    """GDPO: x = sum_k w_k grpo(r_k) (per-group, unbiased std + eps; constant/singleton -> 0), so x has zero
    mean in every group."""
    table, weights, ids = data
    x = combine_rewards(table, weights, mode="normalize_then_sum", group_ids=ids, eps=eps)
    grpo = get_advantage("grpo", eps=eps)
    expected = sum(w * grpo(table[:, j], group_ids=ids) for j, w in enumerate(weights.tolist()))
    torch.testing.assert_close(x, expected, **TOL)
    torch.testing.assert_close(get_advantage("dr_grpo")(x, group_ids=ids), x, **TOL)


@given(data=multi_rewards(), scale=st.floats(0.01, 100))
def test_normalize_then_sum_decouples_reward_scales(data, scale: float) -> None:
    """Rescaling one reward column (by a > 0) leaves the GDPO sum unchanged with eps = 0: no reward can
    drown the others by its spread."""
    table, weights, ids = data
    rescaled = table.clone()
    rescaled[:, 0] *= scale
    a = combine_rewards(table, weights, mode="normalize_then_sum", group_ids=ids, eps=0.0)
    b = combine_rewards(rescaled, weights, mode="normalize_then_sum", group_ids=ids, eps=0.0)
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_errors_name_the_field() -> None:
    table = torch.zeros(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="mode must be one of 'sum_then_normalize', 'normalize_then_sum'"):
        combine_rewards(table, mode="gdpo")
    with pytest.raises(ValueError, match="weights must hold K=2"):
        combine_rewards(table, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="weights must be finite"):
        combine_rewards(table, [1.0, float("nan")])
    with pytest.raises(ValueError, match="pass group_size=G"):
        combine_rewards(table, mode="normalize_then_sum")
    with pytest.raises(ValueError, match="group_size=3 does not divide"):
        combine_rewards(table, mode="normalize_then_sum", group_size=3)
    bad = table.clone()
    bad[1, 1] = float("inf")  # NaN is a function's None (test_advantages_reference: as TRL's)
    with pytest.raises(ValueError, match="rewards holds inf"):
        combine_rewards(bad)
    with pytest.raises((ValueError, TypeError), match="rewards"):
        combine_rewards(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="eps"):
        combine_rewards(table, eps=-1.0)
