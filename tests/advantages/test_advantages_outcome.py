"""Properties of the outcome (one reward per completion) estimators, each compared with its definition."""

import pytest
import torch
from adv_cases import GRID, consecutive_rewards, grouped_rewards
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import masks
from tolerances import tol

from rlzoo.advantages import GroupIndex, get_advantage, whiten

TOL = tol(torch.float64)


def _groups(ids: torch.Tensor) -> dict[int, list[int]]:
    """label -> positions, by a plain Python loop (independent of GroupIndex)."""
    out: dict[int, list[int]] = {}
    for i, label in enumerate(ids.tolist()):
        out.setdefault(label, []).append(i)
    return out


def _degenerate(values: list[float]) -> bool:
    return len(values) < 2 or max(values) == min(values)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@given(data=grouped_rewards())
def test_grpo_zero_mean_per_group(scale: str, data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """sum_{i in group} A_i = 0 for every group: the group mean is subtracted before any scaling."""
    rewards, ids = data
    adv = get_advantage("grpo", scale=scale)(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        torch.testing.assert_close(adv[pos].sum(), torch.zeros((), dtype=torch.float64), **TOL)


@given(data=grouped_rewards(values=GRID))
def test_grpo_group_scale_unit_std(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """scale="group", eps=0: every group with two distinct rewards has unbiased std exactly 1, the others
    0."""
    rewards, ids = data
    adv = get_advantage("grpo", scale="group", eps=0.0)(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        if _degenerate(rewards[pos].tolist()):
            assert bool((adv[pos] == 0).all())
        else:
            torch.testing.assert_close(adv[pos].std(correction=1), torch.ones((), dtype=torch.float64), **TOL)


@given(data=grouped_rewards(values=GRID), eps=st.sampled_from((1e-6, 1e-4, 0.5)))
def test_grpo_group_scale_definition(data: tuple[torch.Tensor, torch.Tensor], eps: float) -> None:
    """A_i = (r_i - mean_g) / (std_g + eps), std unbiased, for non-degenerate groups (DeepSeekMath 4.1.2)."""
    rewards, ids = data
    adv = get_advantage("grpo", eps=eps)(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        r = rewards[pos]
        expected = torch.zeros_like(r) if _degenerate(r.tolist()) else (r - r.mean()) / (r.std() + eps)
        torch.testing.assert_close(adv[pos], expected, **TOL)


@given(data=grouped_rewards(), eps=st.sampled_from((0.0, 1e-4)))
def test_grpo_batch_scale_definition(data: tuple[torch.Tensor, torch.Tensor], eps: float) -> None:
    """scale="batch": A_i = (r_i - mean_g) / (std over all N + eps), the mean staying per group (TRL)."""
    rewards, ids = data
    adv = get_advantage("grpo", scale="batch", eps=eps)(rewards, group_ids=ids)
    std = rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=torch.float64)
    spread = bool((rewards != rewards[0]).any())
    # A batch with distinct rewards but a std that underflows to 0 (subnormal rewards, eps=0) has no finite
    # definition; the estimator then leaves the centred rewards undivided (see outcome._safe).
    assume(not spread or float(std) + eps > 0)
    for pos in _groups(ids).values():
        r = rewards[pos]
        expected = torch.zeros_like(r) if _degenerate(r.tolist()) else (r - r.mean()) / (std + eps)
        torch.testing.assert_close(adv[pos], expected, **TOL)


@given(data=grouped_rewards(), shift=st.floats(-100, 100))
def test_scale_none_is_shift_invariant(data: tuple[torch.Tensor, torch.Tensor], shift: float) -> None:
    """Dr. GRPO: A(r + c) = A(r) = r - mean_g; dr_grpo is grpo with scale="none"."""
    rewards, ids = data
    est = get_advantage("grpo", scale="none")
    adv = est(rewards, group_ids=ids)
    torch.testing.assert_close(
        est(rewards + shift, group_ids=ids), adv, atol=1e-10 * (1 + abs(shift)), rtol=0
    )
    torch.testing.assert_close(get_advantage("dr_grpo")(rewards, group_ids=ids), adv, **TOL)


@given(data=grouped_rewards(values=GRID), a=st.sampled_from((0.01, 0.5, 3.0, 100.0)), c=st.floats(-10, 10))
def test_group_scale_is_affine_invariant(data: tuple[torch.Tensor, torch.Tensor], a: float, c: float) -> None:
    """scale="group", eps=0: A(a r + c) = A(r) for a > 0 (only ranks within the group's spread matter)."""
    rewards, ids = data
    est = get_advantage("grpo", eps=0.0)
    torch.testing.assert_close(
        est(a * rewards + c, group_ids=ids), est(rewards, group_ids=ids), atol=1e-9, rtol=1e-9
    )


@given(data=consecutive_rewards())
def test_group_size_means_consecutive_items(data: tuple[torch.Tensor, int]) -> None:
    """group_size=G groups items [kG, (k+1)G) (TRL's layout): same result as per-group calls."""
    rewards, g = data
    est = get_advantage("grpo")
    adv = est(rewards, group_size=g)
    for k in range(rewards.shape[0] // g):
        sl = slice(k * g, (k + 1) * g)
        torch.testing.assert_close(adv[sl], est(rewards[sl], group_size=g), **TOL)


@given(data=grouped_rewards())
def test_rloo_is_leave_one_out(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """A_i = r_i - (1/(G-1)) sum_{j != i} r_j (Ahmadian et al. 2024) for G >= 2; 0 for singletons and constant
    groups; and A_rloo = G/(G-1) A_dr_grpo."""
    rewards, ids = data
    adv = get_advantage("rloo")(rewards, group_ids=ids)
    dr = get_advantage("dr_grpo")(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        size = len(pos)
        for i in pos:
            others = [rewards[j] for j in pos if j != i]
            expected = (
                0.0 if _degenerate(rewards[pos].tolist()) else float(rewards[i] - sum(others) / len(others))
            )
            assert abs(float(adv[i]) - expected) <= 1e-10 + 1e-8 * abs(expected)
        if size > 1:
            torch.testing.assert_close(adv[pos], dr[pos] * size / (size - 1), **TOL)


@given(data=grouped_rewards(), mask_data=st.data())
def test_opo_length_weighted_baseline(
    data: tuple[torch.Tensor, torch.Tensor], mask_data: st.DataObject
) -> None:
    """A_i = r_i - sum_j |o_j| r_j / sum_j |o_j| over the group (|o| = counted tokens); equal lengths give
    dr_grpo; degenerate groups and groups without counted tokens give 0."""
    rewards, ids = data
    n = rewards.shape[0]
    mask = mask_data.draw(masks(b=n, max_t=6, holes=True))
    lengths = mask.sum(-1).double()
    adv = get_advantage("opo")(rewards, group_ids=ids, completion_mask=mask)
    for pos in _groups(ids).values():
        r, lengths_g = rewards[pos], lengths[pos]
        if _degenerate(r.tolist()) or float(lengths_g.sum()) == 0:
            assert bool((adv[pos] == 0).all())
        else:
            torch.testing.assert_close(adv[pos], r - (lengths_g * r).sum() / lengths_g.sum(), **TOL)
    equal = torch.ones(n, 4, dtype=torch.bool)
    torch.testing.assert_close(
        get_advantage("opo")(rewards, group_ids=ids, completion_mask=equal),
        get_advantage("dr_grpo")(rewards, group_ids=ids),
        **TOL,
    )


@pytest.mark.parametrize("scale", ["group", "none"])
@given(data=grouped_rewards(values=GRID))
def test_grpo_passk_only_best_is_credited(scale: str, data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Per group: the first argmax gets (r_max - r_2nd)(/ (std + eps)), everyone else 0; a tie for the max, a
    singleton or a constant group gives 0 to all."""
    rewards, ids = data
    eps = 1e-4
    adv = get_advantage("grpo_passk", scale=scale, eps=eps)(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        r = rewards[pos].tolist()
        expected = [0.0] * len(pos)
        if not _degenerate(r):
            ranked = sorted(r, reverse=True)
            gap = ranked[0] - ranked[1]
            if scale == "group":
                gap /= float(rewards[pos].std()) + eps
            expected[r.index(ranked[0])] = gap
        torch.testing.assert_close(adv[pos], torch.tensor(expected, dtype=torch.float64), **TOL)


@given(data=grouped_rewards())
def test_gpg_alpha_rescales_dr_grpo(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """GPG: A = alpha (r - mean_g); alpha = N / #nonzero rewards (verl), N / #items in informative groups, or
    1."""
    rewards, ids = data
    n = rewards.shape[0]
    dr = get_advantage("dr_grpo")(rewards, group_ids=ids)
    nonzero = max(int((rewards != 0).sum()), 1)
    informative = sum(len(p) for p in _groups(ids).values() if not _degenerate(rewards[p].tolist()))
    for alpha, factor in (
        ("one", 1.0),
        ("nonzero_rewards", n / nonzero),
        ("informative", n / max(informative, 1)),
    ):
        torch.testing.assert_close(
            get_advantage("gpg", alpha=alpha)(rewards, group_ids=ids), dr * factor, **TOL
        )
    torch.testing.assert_close(get_advantage("gpg")(rewards, group_ids=ids), dr * n / nonzero, **TOL)


@given(data=grouped_rewards(values=st.sampled_from((0.0, 1.0))))
def test_maxrl_binary(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """0/1 rewards, pass rate p per group: success -> 1/p - 1, failure -> -1; p in {0, 1} -> 0 (MaxRL)."""
    rewards, ids = data
    adv = get_advantage("maxrl")(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        r = rewards[pos]
        p = float(r.mean())
        if p in (0.0, 1.0):
            assert bool((adv[pos] == 0).all())
        else:
            torch.testing.assert_close(adv[pos], torch.where(r == 1, 1 / p - 1, -1.0 + 0 * r), **TOL)


@given(data=grouped_rewards(values=st.floats(0, 5)))
def test_maxrl_definition(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """A_i = (r_i - mean_g) / mean_g for groups with mean > 0 and two distinct rewards, else 0."""
    rewards, ids = data
    adv = get_advantage("maxrl")(rewards, group_ids=ids)
    for pos in _groups(ids).values():
        r = rewards[pos]
        if _degenerate(r.tolist()) or float(r.mean()) == 0:
            assert bool((adv[pos] == 0).all())
        else:
            torch.testing.assert_close(adv[pos], (r - r.mean()) / r.mean(), **TOL)


def test_maxrl_rejects_negative_rewards() -> None:
    with pytest.raises(ValueError, match="rewards must be >= 0"):
        get_advantage("maxrl")(torch.tensor([1.0, -1.0], dtype=torch.float64), group_size=2)


@given(data=grouped_rewards(), mask_data=st.data())
def test_reinforce_pp_baseline_token_whitening(
    data: tuple[torch.Tensor, torch.Tensor], mask_data: st.DataObject
) -> None:
    """whiten="token": the [N] result broadcast over tokens equals whitening the token matrix x_i * m_it over
    the counted tokens, x = r - mean_g (REINFORCE++-baseline as verl computes it)."""
    rewards, ids = data
    n = rewards.shape[0]
    mask = mask_data.draw(masks(b=n, max_t=6, holes=True, min_counted=1))
    adv = get_advantage("reinforce_pp_baseline")(rewards, group_ids=ids, completion_mask=mask)
    x = get_advantage("dr_grpo")(rewards, group_ids=ids).unsqueeze(-1).expand(mask.shape)[mask]
    var = x.var(correction=1) if x.numel() > 1 else torch.zeros((), dtype=torch.float64)
    expected = (x - x.mean()) / torch.sqrt(var + 1e-8)
    torch.testing.assert_close(adv.unsqueeze(-1).expand(mask.shape)[mask], expected, **TOL)
    assert bool((adv[~mask.any(-1)] == 0).all())


@given(data=grouped_rewards(min_groups=2))
def test_reinforce_pp_baseline_sequence_whitening(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """whiten="sequence": A = (x - mean(x)) / sqrt(var(x) + 1e-8) over the N completions, x = r - mean_g."""
    rewards, ids = data
    adv = get_advantage("reinforce_pp_baseline", whiten="sequence")(rewards, group_ids=ids)
    x = get_advantage("dr_grpo")(rewards, group_ids=ids)
    var = x.var(correction=1) if x.numel() > 1 else torch.zeros((), dtype=torch.float64)
    torch.testing.assert_close(adv, (x - x.mean()) / torch.sqrt(var + 1e-8), **TOL)


@given(data=grouped_rewards())
def test_group_index_statistics(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """GroupIndex sum/mean/std/max/min/degenerate equal the per-group Python computation; std is unbiased
    (0 for singletons)."""
    rewards, ids = data
    g = GroupIndex.build(rewards.shape[0], group_ids=ids)
    groups = _groups(ids)
    for pos in groups.values():
        k = int(g.index[pos[0]])
        assert all(int(g.index[i]) == k for i in pos) and int(g.counts[k]) == len(pos)
        r = rewards[pos]
        torch.testing.assert_close(g.sum(rewards)[k], r.sum(), **TOL)
        torch.testing.assert_close(g.mean(rewards)[k], r.mean(), **TOL)
        std = r.std() if len(pos) > 1 else torch.zeros((), dtype=torch.float64)
        torch.testing.assert_close(g.std(rewards)[k], std, **TOL)
        assert float(g.max(rewards)[k]) == float(r.max()) and float(g.min(rewards)[k]) == float(r.min())
        assert bool(g.degenerate(rewards)[k]) == _degenerate(r.tolist())
    assert g.num_groups == len(groups)


def test_group_ids_accept_strings_and_numpy() -> None:
    import numpy as np

    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    est = get_advantage("rloo")
    expected = est(rewards, group_ids=torch.tensor([7, 3, 7, 3]))
    torch.testing.assert_close(est(rewards, group_ids=["a", "b", "a", "b"]), expected, **TOL)
    torch.testing.assert_close(
        est(rewards, group_ids=np.array(["x", "y", "x", "y"], dtype=object)), expected, **TOL
    )
    torch.testing.assert_close(expected, torch.tensor([-2.0, -1.0, 2.0, 1.0], dtype=torch.float64), **TOL)


def test_whiten_single_and_empty() -> None:
    """whiten: one counted element -> 0 (verl raises); uncounted elements do not enter the statistics."""
    x = torch.tensor([3.0, 100.0], dtype=torch.float64)
    torch.testing.assert_close(
        whiten(x, torch.tensor([1.0, 0.0], dtype=torch.float64))[0],
        torch.zeros((), dtype=torch.float64),
        **TOL,
    )
