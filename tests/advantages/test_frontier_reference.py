"""The 2026-frontier advantage side against its references (float64, random cases).

* ``optimal_token_baseline`` == verl 0.9.1 ``core_algos.compute_optimal_token_baseline_advantage`` (called as the
  oracle) on groups of two or more; degenerate groups (equal outcome rewards, no token rewards) are rlzoo's
  documented exact 0, compared separately.
* ``kl_in_reward`` + ``FixedKLController`` / ``AdaptiveKLController`` == verl 0.9.1 ``ray_trainer.apply_kl_penalty``
  with verl's ``FixedKLController`` / ``AdaptiveKLController``, over several consecutive batches (the controller
  state carries over). ``ray_trainer`` imports worker code that needs ``torchdata``, ``cachetools`` and
  ``fastapi`` at module load: stubbed like ``ray`` (tests/oracles.py); ``apply_kl_penalty`` itself uses none.
* ``reward_norm`` == AReaL's ``Normalization`` (areal/utils/data.py; called in test_areal_normalization.py on
  AReaL's consecutive-groups layout): the formula is restated below in float64 loops, item by item, for any group
  labels and order.
"""

import math
import re
import sys

import pytest
import torch
from adv_cases import GRID, grouped_rewards, labels_to_index, verl_token_rewards
from hypothesis import given
from hypothesis import strategies as st
from oracles import _StubFinder, verl_core_algos
from strategies import masks, runtime_type_checker_off
from tolerances import REFERENCE_ATOL, tol

from rlzoo.advantages import (
    AdaptiveKLController,
    FixedKLController,
    get_advantage,
    get_kl_controller,
    kl_in_reward,
)

F64 = tol(torch.float64)
REF = {"atol": REFERENCE_ATOL, "rtol": 0.0}


@pytest.fixture(scope="module")
def verl():
    return verl_core_algos()


@pytest.fixture(scope="module")
def verl_trainer(verl):
    finder = _StubFinder(("torchdata", "cachetools", "fastapi"))
    sys.meta_path.insert(0, finder)
    try:
        from verl import DataProto
        from verl.trainer.ppo import ray_trainer
    finally:
        sys.meta_path.remove(finder)
    return ray_trainer, DataProto


@st.composite
def policy_case(draw, *, min_size: int = 2):
    """Grouped rewards, a mask, a sampling policy's log-probs with a consistent sum_pi_squared, IS weights and token
    rewards (float64, from a drawn seed)."""
    rewards, ids = draw(grouped_rewards(min_size=min_size))
    mask = draw(masks(b=rewards.shape[0], min_t=1, max_t=6, holes=True))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    b, t = mask.shape
    p = torch.rand(b, t, generator=g, dtype=torch.float64).clamp(min=1e-3)
    rest = torch.rand(b, t, generator=g, dtype=torch.float64)
    return {
        "rewards": rewards,
        "group_ids": ids,
        "completion_mask": mask,
        "old_logprobs": p.log(),
        "sum_pi_squared": p * p + rest * (1 - p) ** 2,  # a vocabulary's sum: p^2 + (at most (1 - p)^2)
        "rollout_is_weights": torch.exp(0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)),
        "token_rewards": 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "ref_logprobs": p.log() + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64),
    }


# ---------------------------------------------------------------- optimal_token_baseline vs verl


@given(case=policy_case(), handle_zero_tail=st.booleans(), with_token_rewards=st.booleans(), with_is=st.booleans(),
       eps=st.sampled_from((1e-8, 1e-3)))
def test_optimal_token_baseline_matches_verl(verl, case, handle_zero_tail, with_token_rewards, with_is, eps):
    """rlzoo optimal_token_baseline == verl compute_optimal_token_baseline_advantage at every position, with and
    without token rewards, rollout IS weights and the zero-tail rule; degenerate groups (equal outcome rewards,
    no token rewards) give exactly 0 in rlzoo (verl: ~0, and G on the zero tail)."""
    mask = case["completion_mask"]
    token_rewards = case["token_rewards"] if with_token_rewards else None
    weights = case["rollout_is_weights"] if with_is else None
    extra = {k: v for k, v in (("token_rewards", token_rewards), ("rollout_is_weights", weights)) if v is not None}
    est = get_advantage("optimal_token_baseline", handle_zero_tail=handle_zero_tail, eps=eps)
    ours = est(case["rewards"], group_ids=case["group_ids"], completion_mask=mask,
               old_logprobs=case["old_logprobs"], sum_pi_squared=case["sum_pi_squared"], **extra)
    level = verl_token_rewards(case["rewards"], mask)
    if token_rewards is not None:
        level = level + token_rewards * mask
    want, _ = verl.compute_optimal_token_baseline_advantage(
        token_level_rewards=level, response_mask=mask.to(torch.float64), index=labels_to_index(case["group_ids"]),
        old_log_probs=case["old_logprobs"], sum_pi_squared=case["sum_pi_squared"], rollout_is_weights=weights,
        handle_zero_tail=handle_zero_tail, epsilon=eps)
    assert ours.shape == mask.shape
    if token_rewards is None:
        degenerate = _degenerate_rows(case["rewards"], case["group_ids"])
        assert bool((ours[degenerate] == 0).all())
        torch.testing.assert_close(ours[~degenerate], want[~degenerate], **F64)
    else:
        torch.testing.assert_close(ours, want, **F64)


def _degenerate_rows(rewards: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``Bool[N]``: the item's group holds equal rewards only."""
    out = torch.zeros(rewards.shape[0], dtype=torch.bool)
    for label in ids.unique():
        rows = ids == label
        out[rows] = bool(rewards[rows].max() == rewards[rows].min())
    return out


def test_optimal_token_baseline_equal_weights_is_the_group_mean_return():
    """With the same ``w`` at every token the baseline at step t is the mean return-to-go over the group's
    completions still counting at t, weighted by how many tokens each has seen (``W_t = t w``): equal lengths
    give the plain group mean (a closed form independent of verl)."""
    mask = torch.ones(3, 4, dtype=torch.bool)
    old = torch.full((3, 4), math.log(0.25), dtype=torch.float64)
    spq = torch.full((3, 4), 0.3, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    adv = get_advantage("optimal_token_baseline")(rewards, group_size=3, completion_mask=mask, old_logprobs=old,
                                                   sum_pi_squared=spq)
    w = 1 - 2 * 0.25 + 0.3
    # B = sum_i G_i t w / (3 t w + eps) at every t; eps = 1e-8 shifts it by ~1e-8 relative
    for t in range(4):
        cum = (t + 1) * w
        baseline = float(rewards.sum()) * cum / (3 * cum + 1e-8)
        torch.testing.assert_close(adv[:, t], rewards - baseline, **F64)


# ---------------------------------------------------------------- KL in reward vs verl apply_kl_penalty

VERL_KL = {"k1": "kl", "abs": "abs", "k2": "mse", "low_var_kl": "low_var_kl", "k1+": "k1+", "low_var_kl+": "k3+"}


@given(cases=st.lists(policy_case(min_size=1), min_size=1, max_size=3), penalty=st.sampled_from(sorted(VERL_KL)),
       kind=st.sampled_from(("fixed", "adaptive")), kl_coef=st.sampled_from((0.0, 0.001, 0.05, 0.7)),
       target_kl=st.sampled_from((0.01, 0.1, 2.0)), horizon=st.sampled_from((7, 100, 10000)))
def test_kl_in_reward_and_controller_match_verl(verl, verl_trainer, cases, penalty, kind, kl_coef, target_kl,
                                                horizon):
    """Over consecutive batches: verl's token_level_rewards = scores - beta kld equals the outcome reward on the
    last counted token plus rlzoo's ``kl_in_reward`` token rewards (counted positions), verl's current_kl equals
    rlzoo's (verl divides by n + 1e-8: REFERENCE_ATOL), and both controllers hold the same beta after each
    update. Horizons stay above N / 5 (at most 30 completions here): below, verl's beta turns negative and rlzoo
    raises (tested below)."""
    ray_trainer, data_proto = verl_trainer
    verl_ctrl = (verl.FixedKLController(kl_coef) if kind == "fixed"
                 else verl.AdaptiveKLController(kl_coef, target_kl, horizon))
    ours = get_kl_controller(kind, kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    assert isinstance(ours, FixedKLController if kind == "fixed" else AdaptiveKLController)
    for case in cases:
        mask = case["completion_mask"]
        scores = verl_token_rewards(case["rewards"], mask)
        data = data_proto.from_dict(tensors={"response_mask": mask.to(torch.float64), "token_level_scores": scores,
                                             "old_log_probs": case["old_logprobs"],
                                             "ref_log_prob": case["ref_logprobs"]})
        beta = ours.value
        data, metrics = ray_trainer.apply_kl_penalty(data, verl_ctrl, kl_penalty=VERL_KL[penalty])
        token_rewards, current_kl = kl_in_reward(case["old_logprobs"], case["ref_logprobs"], mask, kl_coef=beta,
                                                 kl_penalty=penalty)
        ours.update(float(current_kl), mask.shape[0])
        assert float(metrics["actor/reward_kl_penalty_coeff"]) == pytest.approx(beta, rel=1e-6, abs=0.0)
        got = data.batch["token_level_rewards"]
        torch.testing.assert_close((scores + token_rewards)[mask], got[mask], **F64)
        assert bool((token_rewards[~mask] == 0).all())
        torch.testing.assert_close(current_kl, torch.tensor(metrics["actor/reward_kl_penalty"],
                                                            dtype=torch.float64), **REF)
        # current_kl differs by verl's 1e-8 / n relative: beta by at most that times n / horizon per update
        assert ours.value == pytest.approx(float(verl_ctrl.value), rel=1e-6, abs=0.0)


@given(kls=st.lists(st.floats(-1.0, 5.0), min_size=1, max_size=6), n=st.integers(1, 64),
       target=st.floats(0.01, 1.0), horizon=st.integers(13, 20000), init=st.floats(0.0, 1.0))
def test_adaptive_controller_is_proportional_control(kls, n, target, horizon, init):
    """beta_{k+1} = beta_k (1 + clip(KL_k / target - 1, -0.2, 0.2) n / horizon): the Ziegler et al. update, stated
    in float64; a state_dict round trip continues bitwise identically."""
    ctrl = AdaptiveKLController(init, target, horizon)
    beta = init
    for i, kl in enumerate(kls):
        ctrl.update(kl, n)
        beta = beta * (1 + min(max(kl / target - 1, -0.2), 0.2) * n / horizon)
        assert ctrl.value == pytest.approx(beta, rel=1e-12, abs=0.0)
        if i == 0:
            clone = AdaptiveKLController(0.5, target, horizon)
            clone.load_state_dict(ctrl.state_dict())
            assert clone.value == ctrl.value
    fixed = FixedKLController(init)
    for kl in kls:
        fixed.update(kl, n)
    assert fixed.value == init


def test_kl_controller_defaults_are_verls():
    """``get_kl_controller("fixed", kl_coef=0.1)`` (as docs/advantages.md spells it) raised a TypeError for the adaptive
    controller's target_kl and horizon; they default to verl 0.9.1's KLControlConfig (0.001, 0.1, 10000)."""
    assert get_kl_controller("fixed", kl_coef=0.1).value == 0.1
    assert get_kl_controller("fixed").value == 0.001
    adaptive = get_kl_controller("adaptive")
    adaptive.update(1.0, 10000)  # KL 10x the target 0.1 over one horizon: the factor is 1.2
    assert adaptive.value == pytest.approx(0.001 * 1.2, rel=1e-12)


@pytest.mark.parametrize(("current_kl", "n_steps", "says"), [
    (math.nan, 8, "current_kl must be a number, got NaN"), (math.inf, 8, "current_kl must be finite"),
    (0.1, -8, "n_steps must be an int >= 0"), (0.1, 8.0, "n_steps must be an int >= 0"),
])
def test_a_bad_controller_update_is_refused_and_keeps_the_coefficient(current_kl, n_steps, says):
    """A NaN KL made the adaptive coefficient NaN for the rest of the run (min/max pass NaN through); a negative batch
    size reversed the update. Both are refused naming the argument, and the coefficient is unchanged."""
    ctrl = AdaptiveKLController(0.05, 0.1, 100)
    with runtime_type_checker_off(), pytest.raises(ValueError, match=rf"^kl controller update: {re.escape(says)}"):
        ctrl.update(current_kl, n_steps)
    assert ctrl.value == 0.05


def test_kl_in_reward_names_a_non_bool_mask():
    """verl's response_mask is an int / float tensor: torch.where raised its own error (or NotImplementedError for
    a float mask); the error names completion_mask and .bool()."""
    old, ref = -torch.rand(2, 3), -torch.rand(2, 3)
    for mask in (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3)):
        with runtime_type_checker_off(), pytest.raises(ValueError, match=r"^kl_in_reward: completion_mask must be a "
                                                                          r"torch.bool tensor .*\.bool\(\)"):
            kl_in_reward(old, ref, mask, kl_coef=0.1)
    rewards, _ = kl_in_reward(old, ref, torch.ones(2, 3, dtype=torch.bool), kl_coef=0.1)
    assert rewards.shape == (2, 3)


def test_kl_controller_errors_name_the_option():
    with pytest.raises(ValueError, match="kl_ctrl_type"):
        get_kl_controller("pid", kl_coef=0.1, target_kl=0.1, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=0)
    with pytest.raises(ValueError, match="target_kl"):
        get_kl_controller("adaptive", kl_coef=0.1, target_kl=0.0, horizon=10)
    with pytest.raises(ValueError, match="kl_coef"):
        get_kl_controller("fixed", kl_coef=-1.0, target_kl=0.1, horizon=10)
    ctrl = get_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=2)
    ctrl.update(1.0, 9)  # KL above target: the factor grows
    with pytest.raises(ValueError, match="horizon=2 is too short"):
        ctrl.update(0.0, 10)  # 1 - 0.2 * 10 / 2 = 0: verl would make beta 0, then negative
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_in_reward(torch.zeros(1, 2), torch.tensor([[0.0, float("nan")]]), mask, kl_coef=0.1)


# ---------------------------------------------------------------- reward_norm vs AReaL's formula


def _areal(rewards, ids, *, mean_level, std_level, leave1out, unbiased, eps):
    """AReaL ``Normalization.__call__`` (areal/utils/data.py) restated item by item in float64."""
    r = [float(x) for x in rewards]
    labels = [int(x) for x in ids]
    n = len(r)

    def members(i, level):
        return list(range(n)) if level == "batch" else [j for j in range(n) if labels[j] == labels[i]]

    mu = []
    for i in range(n):
        if mean_level == "none":
            mu.append(0.0)
            continue
        s = members(i, mean_level)
        if leave1out:
            mu.append(0.0 if len(s) <= 1 else (sum(r[j] for j in s) - r[i]) / (len(s) - 1))
        else:
            mu.append(sum(r[j] for j in s) / len(s))
    out = []
    for i in range(n):
        if std_level == "none":
            out.append(r[i] - mu[i])
            continue
        s = members(i, std_level)
        sq = sum((r[j] - mu[j]) ** 2 for j in s)
        sigma = (1.0 if len(s) <= 1 else math.sqrt(sq / (len(s) - 1))) if unbiased else math.sqrt(sq / len(s))
        out.append((r[i] - mu[i]) / (sigma + eps))
    return torch.tensor(out, dtype=torch.float64)


LEVELS = st.sampled_from(("group", "batch", "none"))


@given(data=grouped_rewards(min_size=1), mean_level=LEVELS, std_level=LEVELS, leave1out=st.booleans(),
       unbiased=st.booleans(), eps=st.sampled_from((1e-5, 1e-2, 0.0)))
def test_reward_norm_matches_areal(data, mean_level, std_level, leave1out, unbiased, eps):
    """reward_norm == AReaL's normalisation for every combination of levels, leave-one-out and Bessel; where rlzoo
    documents exact 0 (mean_level group: singleton or equal-reward groups; mean_level batch: equal rewards) the
    output is exactly 0, and AReaL's value there is a rounding of the mean over (sigma + eps)."""
    rewards, ids = data
    if eps == 0.0 and std_level != "none":
        eps = 1e-5  # sigma can be 0: AReaL then divides by 0; keep the oracle finite
    ours = get_advantage("reward_norm", mean_level=mean_level, std_level=std_level, mean_leave1out=leave1out,
                         std_unbiased=unbiased, eps=eps)(rewards, group_ids=ids)
    want = _areal(rewards, ids, mean_level=mean_level, std_level=std_level, leave1out=leave1out,
                  unbiased=unbiased, eps=eps)
    if mean_level == "group":
        zero = _degenerate_rows(rewards, ids)
    elif mean_level == "batch":
        zero = torch.full_like(rewards, bool(rewards.max() == rewards.min()), dtype=torch.bool)
    else:
        zero = torch.zeros_like(rewards, dtype=torch.bool)
    assert bool((ours[zero] == 0).all())
    torch.testing.assert_close(ours[~zero], want[~zero], **F64)


@given(data=grouped_rewards(min_size=1, values=GRID))
def test_reward_norm_special_cases_are_the_named_estimators(data):
    """group/group is grpo (same eps), std none is dr_grpo, leave-one-out without std is rloo."""
    rewards, ids = data
    norm = get_advantage("reward_norm", eps=1e-4)(rewards, group_ids=ids)
    torch.testing.assert_close(norm, get_advantage("grpo", eps=1e-4)(rewards, group_ids=ids), **F64)
    dr = get_advantage("reward_norm", std_level="none")(rewards, group_ids=ids)
    torch.testing.assert_close(dr, get_advantage("dr_grpo")(rewards, group_ids=ids), **F64)
    loo = get_advantage("reward_norm", std_level="none", mean_leave1out=True)(rewards, group_ids=ids)
    torch.testing.assert_close(loo, get_advantage("rloo")(rewards, group_ids=ids), **F64)
