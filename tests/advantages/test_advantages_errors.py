"""Bad input raises a clear error naming the field (never a silent NaN).

Under the test suite's jaxtyping + beartype checker a wrong shape or dtype may be caught by the signature
first (a ``TypeCheckError``, a ``TypeError`` that names the parameter); without the checker rlzoo's own
validation raises ``ValueError``. Both paths are exercised: the public call (either error, naming the field)
and the validators directly (the ``ValueError`` message).
"""

import pytest
import torch

from rlzoo.advantages import GroupIndex, get_advantage
from rlzoo.advantages.base import build_inputs, check_rewards

F64 = torch.float64
REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.25], dtype=F64)
MASK = torch.ones(4, 3, dtype=torch.bool)


def test_rewards_shape_and_dtype() -> None:
    est = get_advantage("grpo")
    for bad in (torch.zeros(2, 2, dtype=F64), torch.zeros(4, dtype=torch.long), torch.zeros(0, dtype=F64)):
        with pytest.raises((ValueError, TypeError), match="rewards"):
            est(bad, group_size=2)
    with pytest.raises(ValueError, match=r"rewards must have shape \[N\] with N >= 1"):
        check_rewards(torch.zeros(2, 2, dtype=F64), "grpo")
    with pytest.raises(ValueError, match="rewards must be a floating-point tensor"):
        check_rewards(torch.zeros(4, dtype=torch.long), "grpo")
    with pytest.raises(ValueError, match="rewards must be a torch.Tensor"):
        check_rewards([1.0, 2.0], "grpo")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "gpg", "maxrl", "grpo_passk"])
def test_non_finite_rewards(name: str, value: float) -> None:
    rewards = REWARDS.clone()
    rewards[2] = value
    with pytest.raises(ValueError, match="rewards holds NaN/inf"):
        get_advantage(name)(rewards, group_size=2)


def test_grouping_errors() -> None:
    est = get_advantage("grpo")
    with pytest.raises(ValueError, match="group_size=3 does not divide the number of rewards N=4"):
        est(REWARDS, group_size=3)
    with pytest.raises(ValueError, match="pass group_size=G"):
        est(REWARDS)
    with pytest.raises(ValueError, match="either group_size or group_ids, not both"):
        est(REWARDS, group_size=2, group_ids=[0, 0, 1, 1])
    for bad in (0, -2):
        with pytest.raises(ValueError, match="group_size must be a positive integer"):
            est(REWARDS, group_size=bad)
    with pytest.raises((ValueError, TypeError), match="group_size"):
        est(REWARDS, group_size=True)
    with pytest.raises((ValueError, TypeError), match="group_ids"):
        est(REWARDS, group_ids=[0, 0, 1])
    with pytest.raises(ValueError, match="must hold N=4 labels"):
        GroupIndex.build(4, group_ids=[0, 0, 1])
    with pytest.raises(ValueError, match="group_ids must have shape"):
        GroupIndex.build(4, group_ids=torch.tensor([0, 1]))
    with pytest.raises((ValueError, TypeError), match="group_ids"):
        GroupIndex.build(4, group_ids=torch.zeros(4))


def test_token_input_errors() -> None:
    gae = get_advantage("gae")
    values = torch.zeros(4, 3, dtype=F64)
    with pytest.raises((ValueError, TypeError), match="completion_mask"):
        gae(REWARDS, completion_mask=MASK.double(), values=values)
    with pytest.raises((ValueError, TypeError), match="values"):
        gae(REWARDS, completion_mask=MASK, values=torch.zeros(4, 2, dtype=F64))
    with pytest.raises(ValueError, match="completion_mask must have dtype torch.bool"):
        build_inputs("gae", REWARDS, {"completion_mask": MASK.double()})
    with pytest.raises(ValueError, match=r"completion_mask must have shape \[N, T\] with N=4"):
        build_inputs("gae", REWARDS, {"completion_mask": MASK[:3]})
    with pytest.raises(ValueError, match=r"values must have shape \[N, T\] like completion_mask"):
        build_inputs("gae", REWARDS, {"completion_mask": MASK, "values": torch.zeros(4, 2, dtype=F64)})
    with pytest.raises(ValueError, match=r"baseline_rewards must have shape \[N\]"):
        build_inputs("remax", REWARDS, {"baseline_rewards": torch.zeros(3, dtype=F64)})
    bad = values.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"values holds NaN/inf at a counted position \(completion_mask True\); it must be finite$"):
        gae(REWARDS, completion_mask=MASK, values=bad)  # (not a hint about rewards, which are fine)
    masked = MASK.clone()
    masked[1, 2] = False
    out = gae(REWARDS, completion_mask=masked, values=bad)  # NaN only at a masked position: inert
    assert bool(torch.isfinite(out).all())
    with pytest.raises(ValueError, match="baseline_rewards holds NaN/inf"):
        get_advantage("remax")(
            REWARDS, completion_mask=MASK, baseline_rewards=torch.full((4,), float("nan"), dtype=F64)
        )
