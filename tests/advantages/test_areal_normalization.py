"""reward_norm against AReaL 1.0.4's ``Normalization`` itself (areal/utils/data.py, the oracle, called).

AReaL installs with ``pip install --no-deps areal==1.0.4`` (.ci/run does it); tests/oracles.py imports
areal/utils/data.py and areal/api/cli_args.py with the rest of AReaL stubbed. AReaL normalises groups of
``group_size`` consecutive items (its layout), computes in float64 (``high_precision=True``) and returns float32
(``.float()``): the comparison uses the float32 row of tests/tolerances.py. Where rlzoo documents an exact 0
(RewardNorm's conventions, docs/advantages.md: ``mean_level="group"`` and a singleton or zero-variance group,
``mean_level="batch"`` and equal rewards) AReaL's value is a rounding of 0 over ``sigma + eps``, inside that row,
except for an item alone in its set with ``mean_leave1out``, where AReaL's baseline is 0 and it returns
``r / (sigma + eps)``: the documented difference, left out of the comparison.

The float64 restatement in test_frontier_reference.py stays: it covers arbitrary group labels and orders, which
AReaL's layout cannot express.
"""

import pytest
import torch
from adv_cases import consecutive_rewards
from hypothesis import given
from hypothesis import strategies as st
from oracles import areal
from strategies import budget
from tolerances import tol

from rlzoo.advantages import get_advantage

F32 = tol(torch.float32)  # AReaL returns float32
LEVELS = st.sampled_from(("group", "batch", "none"))


@pytest.fixture(scope="module")
def ar():
    return areal()


@budget(0.5)
@given(data=consecutive_rewards(), mean_level=LEVELS, std_level=LEVELS, leave1out=st.booleans(),
       unbiased=st.booleans(), eps=st.sampled_from((1e-5, 1e-2)))
def test_reward_norm_is_areal_normalization(ar, data, mean_level, std_level, leave1out, unbiased, eps):
    """reward_norm(mean_level, std_level, mean_leave1out, std_unbiased, eps) == AReaL
    Normalization(NormConfig(...same..., group_size=G)) on rewards in groups of G consecutive items, for every
    combination ("none" is AReaL's None); AReaL's defaults (batch / batch, unbiased, eps 1e-5) included."""
    rewards, size = data
    ids = torch.arange(rewards.shape[0]) // size
    config = ar.cli_args.NormConfig(mean_level=None if mean_level == "none" else mean_level, mean_leave1out=leave1out,
                                    std_level=None if std_level == "none" else std_level, std_unbiased=unbiased,
                                    eps=eps, group_size=size)
    want = ar.data.Normalization(config)(rewards.clone())
    ours = get_advantage("reward_norm", mean_level=mean_level, std_level=std_level, mean_leave1out=leave1out,
                         std_unbiased=unbiased, eps=eps)(rewards, group_ids=ids)
    assert want.dtype == torch.float32
    n = rewards.shape[0]
    groups = rewards.view(n // size, size)
    if mean_level == "group":  # rlzoo's documented exact 0: singleton or zero-variance groups
        zero = (groups.max(-1).values == groups.min(-1).values).repeat_interleave(size)
        alone = size == 1
    elif mean_level == "batch":
        zero = torch.full((n,), bool(rewards.max() == rewards.min()))
        alone = n == 1
    else:
        zero, alone = torch.zeros(n, dtype=torch.bool), False
    assert bool((ours[zero] == 0).all())
    compared = ~zero if leave1out and alone else torch.ones(n, dtype=torch.bool)
    torch.testing.assert_close(ours[compared].to(torch.float32), want[compared], **F32)

    default = ar.data.Normalization(ar.cli_args.NormConfig(group_size=size))(rewards.clone())
    ours = get_advantage("reward_norm", mean_level="batch", std_level="batch")(rewards, group_ids=ids)
    torch.testing.assert_close(ours.to(torch.float32), default, **F32)
