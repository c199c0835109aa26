"""Equivalence with the reference implementations: verl 0.9.1 core_algos (called as an oracle) and TRL 1.16.

verl's estimators take ``token_level_rewards [N, T]`` (the outcome reward on the last response token),
``response_mask`` and an ``index`` of uid labels, and return ``[N, T]``; they are compared at counted tokens.
Where verl and rlzoo differ by documented convention (verl gives ``A = r`` to singleton groups in
grpo/rloo/opo/gpg/reinforce_plus_plus_baseline, raises in grpo_passk), groups have two or more items.

verl's ``masked_whiten`` divides by ``count + 1e-8`` in its means, so whitened outputs agree to
``REFERENCE_ATOL`` rather than to the float64 table; and batches whose counted values are (nearly) constant
are
skipped there: whitening a constant is 0/0 regularised by 1e-8, where that 1e-8 in verl's mean leaves
``~1e-4 * mean / count`` (rlzoo gives exactly 0).

TRL computes its GRPO advantage inline in ``GRPOTrainer._generate_and_score_completions`` (grpo_trainer.py
2761-2799), which cannot be called; :func:`trl_advantages` restates that formula with TRL's own ``nanstd``.
``nanstd`` computes its Bessel factor ``count / (count - 1)`` from integer counts, i.e. in the default float32
(trl/trainer/utils.py:1041), so float64 comparisons with TRL hold to ``REFERENCE_ATOL``.
"""

import math
import types

import pytest
import torch
from adv_cases import GRID, grouped_rewards, labels_to_index, token_case, verl_token_rewards
from hypothesis import assume, given
from hypothesis import strategies as st
from oracles import verl_core_algos
from strategies import masks
from tolerances import REFERENCE_ATOL, tol

from rlzoo.advantages import combine_rewards, get_advantage, value_loss

TOL = tol(torch.float64)
WHITENED = {"atol": REFERENCE_ATOL, "rtol": 0.0}


@pytest.fixture(scope="module")
def verl():
    return verl_core_algos()


def _verl_inputs(rewards: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    return {
        "token_level_rewards": verl_token_rewards(rewards, mask),
        "response_mask": mask.to(torch.float64),
        "index": labels_to_index(ids),
    }


def _assume_spread(before_whitening: torch.Tensor, mask: torch.Tensor) -> None:
    """Skip batches whose counted values are nearly constant (see the module docstring)."""
    values = _counted(before_whitening, mask)
    assume(values.numel() > 1 and float(values.var()) > 1e-2)


def _counted(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token view of a ``[N]`` or ``[N, T]`` advantage at counted positions."""
    if adv.ndim == 1:
        adv = adv.unsqueeze(-1).expand(mask.shape)
    return adv[mask]


@st.composite
def grouped_case(draw: st.DrawFn, *, min_size: int = 2, min_counted: int = 0, values=None):
    rewards, ids = draw(grouped_rewards(min_size=min_size, values=values))
    mask = draw(
        masks(b=rewards.shape[0], min_t=max(1, min_counted), max_t=5, holes=True, min_counted=min_counted)
    )
    return rewards, ids, mask


@pytest.mark.parametrize("norm", [True, False])
@given(case=grouped_case())
def test_grpo_matches_verl(verl, norm: bool, case) -> None:
    """verl adv_estimator="grpo" (epsilon=1e-6, norm_adv_by_std_in_grpo) == grpo(scale group|none,
    eps=1e-6). In a zero-variance group (every reward equal) rlzoo gives exactly 0 (documented) and verl
    (r - mean) / (0 + 1e-6), the rounding of the mean over 1e-6 (e.g. 4e-10 for three rewards of 3.6422):
    compared at 1e-15 / 1e-6 * max|r| there."""
    rewards, ids, mask = case
    ours = get_advantage("grpo", scale="group" if norm else "none", eps=1e-6)(rewards, group_ids=ids)
    theirs, _ = verl.compute_grpo_outcome_advantage(
        **_verl_inputs(rewards, ids, mask), epsilon=1e-6, norm_adv_by_std_in_grpo=norm
    )
    constant = torch.tensor([bool((rewards[ids == i] == rewards[ids == i][0]).all()) for i in ids.tolist()])
    live = mask & ~constant.unsqueeze(-1)
    torch.testing.assert_close(theirs[live], _counted(ours, live), **TOL)
    flat = mask & constant.unsqueeze(-1)
    assert bool((_counted(ours, flat) == 0).all())
    bound = 1e-15 / 1e-6 * float(rewards.abs().max()) if norm else 1e-15 * float(rewards.abs().max())
    assert bool((theirs[flat].abs() <= bound).all())


@pytest.mark.parametrize("norm", [True, False])
@given(case=grouped_case(values=GRID))
def test_grpo_matches_verl_vectorized(verl, norm: bool, case) -> None:
    """verl adv_estimator="grpo_vectorized" == grpo(eps=1e-6), to float32 precision: verl computes its group
    statistics in float32 whatever the input dtype (utils/groupwise.py group_mean_std); grid rewards keep the
    float32 computation well conditioned."""
    rewards, ids, mask = case
    ours = get_advantage("grpo", scale="group" if norm else "none", eps=1e-6)(rewards, group_ids=ids)
    theirs, _ = verl.compute_grpo_vectorized_outcome_advantage(
        **_verl_inputs(rewards, ids, mask), epsilon=1e-6, norm_adv_by_std_in_grpo=norm
    )
    torch.testing.assert_close(theirs[mask], _counted(ours, mask), **tol(torch.float32))


@given(case=grouped_case())
def test_rloo_matches_verl(verl, case) -> None:
    """verl adv_estimator="rloo" == rloo on groups of two or more."""
    rewards, ids, mask = case
    theirs, _ = verl.compute_rloo_outcome_advantage(**_verl_inputs(rewards, ids, mask))
    torch.testing.assert_close(
        theirs[mask], _counted(get_advantage("rloo")(rewards, group_ids=ids), mask), **TOL
    )


@given(case=grouped_case(min_size=1))
def test_rloo_matches_verl_vectorized_including_singletons(verl, case) -> None:
    """verl adv_estimator="rloo_vectorized" == rloo everywhere, singletons (A = 0) included."""
    rewards, ids, mask = case
    theirs, _ = verl.compute_rloo_vectorized_outcome_advantage(**_verl_inputs(rewards, ids, mask))
    torch.testing.assert_close(
        theirs[mask], _counted(get_advantage("rloo")(rewards, group_ids=ids), mask), **TOL
    )


@given(case=grouped_case(min_size=1))
def test_singleton_deviation_from_verl_grpo(verl, case) -> None:
    """Documented deviation: verl grpo gives a singleton r / (1 + eps); rlzoo gives 0 (as TRL). (verl's
    singleton std is a float32 tensor, so 1 + eps is rounded to float32.)"""
    rewards, ids, mask = case
    ours = get_advantage("grpo", eps=1e-6)(rewards, group_ids=ids)
    theirs, _ = verl.compute_grpo_outcome_advantage(**_verl_inputs(rewards, ids, mask), epsilon=1e-6)
    counts = {int(i): int((ids == i).sum()) for i in ids}
    for i in range(rewards.shape[0]):
        if counts[int(ids[i])] == 1:
            assert float(ours[i]) == 0.0
            row = theirs[i][mask[i]]
            torch.testing.assert_close(row, (rewards[i] / (1 + 1e-6)).expand(row.shape), **tol(torch.float32))


@given(case=grouped_case())
def test_opo_matches_verl(verl, case) -> None:
    """verl adv_estimator="opo" == opo (length-weighted baseline) on groups of two or more."""
    rewards, ids, mask = case
    ours = get_advantage("opo")(rewards, group_ids=ids, completion_mask=mask)
    theirs, _ = verl.compute_opo_outcome_advantage(**_verl_inputs(rewards, ids, mask))
    # verl divides by the group's total length with no guard: a group with no counted token is 0/0 there
    groups_with_tokens = {int(i) for i in ids[mask.any(-1)]}
    keep = torch.tensor([int(i) in groups_with_tokens for i in ids])[:, None] & mask
    torch.testing.assert_close(theirs[keep], _counted(ours, keep), **TOL)


@given(case=grouped_case())
def test_gpg_matches_verl(verl, case) -> None:
    """verl adv_estimator="gpg" (alpha = N / #nonzero rewards, f_norm = 1) == gpg() on groups of two or more.
    (verl's alpha = bsz / count_nonzero(...) is an int / int64-tensor division, i.e. float32.)"""
    rewards, ids, mask = case
    theirs, _ = verl.compute_gpg_outcome_advantage(**_verl_inputs(rewards, ids, mask))
    ours = get_advantage("gpg")(rewards, group_ids=ids)
    torch.testing.assert_close(theirs[mask], _counted(ours, mask), **tol(torch.float32))


@pytest.mark.parametrize("norm", [True, False])
@given(case=grouped_case(values=GRID))
def test_grpo_passk_matches_verl(verl, norm: bool, case) -> None:
    """verl adv_estimator="grpo_passk" == grpo_passk(scale group|none, eps=1e-6)."""
    rewards, ids, mask = case
    theirs, _ = verl.compute_grpo_passk_outcome_advantage(
        **_verl_inputs(rewards, ids, mask), epsilon=1e-6, config={"norm_adv_by_std_in_grpo": norm}
    )
    ours = get_advantage("grpo_passk", scale="group" if norm else "none", eps=1e-6)(rewards, group_ids=ids)
    torch.testing.assert_close(theirs[mask], _counted(ours, mask), **TOL)


@given(case=grouped_case(min_counted=2))
def test_reinforce_pp_baseline_matches_verl(verl, case) -> None:
    """verl adv_estimator="reinforce_plus_plus_baseline" == reinforce_pp_baseline() (token whitening)."""
    rewards, ids, mask = case
    _assume_spread(get_advantage("dr_grpo")(rewards, group_ids=ids), mask)
    theirs, _ = verl.compute_reinforce_plus_plus_baseline_outcome_advantage(
        **_verl_inputs(rewards, ids, mask)
    )
    ours = get_advantage("reinforce_pp_baseline")(rewards, group_ids=ids, completion_mask=mask)
    torch.testing.assert_close(theirs[mask], _counted(ours, mask), **WHITENED)


@given(case=token_case(holes=True), gamma=st.sampled_from((1.0, 0.9)))
def test_reinforce_pp_matches_verl(verl, case, gamma: float) -> None:
    """verl adv_estimator="reinforce_plus_plus" (config.gamma) == reinforce_pp(gamma), token rewards
    included."""
    mask = case["completion_mask"]
    dense = verl_token_rewards(case["rewards"], mask) + torch.where(mask, case["token_rewards"], 0.0)
    theirs, returns = verl.compute_reinforce_plus_plus_outcome_advantage(
        token_level_rewards=dense, response_mask=mask.double(), config=types.SimpleNamespace(gamma=gamma)
    )
    _assume_spread(returns, mask)
    ours = get_advantage("reinforce_pp", gamma=gamma)(
        case["rewards"], completion_mask=mask, token_rewards=case["token_rewards"]
    )
    torch.testing.assert_close(theirs[mask], ours[mask], **WHITENED)


@given(case=token_case(holes=True))
def test_remax_matches_verl(verl, case) -> None:
    """verl adv_estimator="remax" (reward_baselines) == remax at counted tokens."""
    mask = case["completion_mask"]
    dense = verl_token_rewards(case["rewards"], mask) + torch.where(mask, case["token_rewards"], 0.0)
    theirs, _ = verl.compute_remax_outcome_advantage(
        token_level_rewards=dense, reward_baselines=case["baseline_rewards"], response_mask=mask.double()
    )
    ours = get_advantage("remax")(
        case["rewards"],
        completion_mask=mask,
        token_rewards=case["token_rewards"],
        baseline_rewards=case["baseline_rewards"],
    )
    torch.testing.assert_close(theirs[mask], ours[mask], **TOL)


@given(case=token_case(holes=True), gamma=st.sampled_from((1.0, 0.99)), lam=st.sampled_from((1.0, 0.95, 0.0)))
def test_gae_matches_verl(verl, case, gamma: float, lam: float) -> None:
    """verl compute_gae_advantage_return == gae.with_returns: advantages (whitened by verl) and returns
    (never whitened), at counted tokens (holes skipped by both)."""
    mask = case["completion_mask"]
    dense = verl_token_rewards(case["rewards"], mask) + torch.where(mask, case["token_rewards"], 0.0)
    adv_v, ret_v = verl.compute_gae_advantage_return(dense, case["values"], mask.double(), gamma, lam)
    _assume_spread(torch.where(mask, ret_v - case["values"], 0.0), mask)
    adv, ret = get_advantage("gae", gamma=gamma, lam=lam).with_returns(
        case["rewards"], completion_mask=mask, values=case["values"], token_rewards=case["token_rewards"]
    )
    torch.testing.assert_close(adv_v[mask], adv[mask], **WHITENED)
    torch.testing.assert_close(ret_v[mask], ret[mask], **TOL)


@pytest.mark.parametrize(
    "aggregation",
    ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"],
)
@given(case=token_case(holes=True, min_counted=1), clip=st.sampled_from((0.1, 0.5)), data=st.data())
def test_value_loss_matches_verl(verl, aggregation: str, case, clip: float, data: st.DataObject) -> None:
    """verl compute_value_loss(vpreds, returns, values, ...) == value_loss(values, old_values, returns,
    ...)."""
    mask = case["completion_mask"]
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    old = case["values"] + 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    returns = case["values"] + torch.randn(mask.shape, generator=g, dtype=torch.float64)
    length = mask.shape[1] + 2
    theirs, clipfrac = verl.compute_value_loss(
        case["values"], returns, old, mask.double(), clip, loss_agg_mode=aggregation, loss_scale_factor=length
    )
    out = value_loss(
        case["values"],
        old,
        returns,
        mask,
        cliprange_value=clip,
        aggregation=aggregation,
        max_completion_length=length,
    )
    torch.testing.assert_close(out.loss, theirs, **WHITENED)
    torch.testing.assert_close(out.metrics["critic/vf_clipfrac"], clipfrac.double(), **WHITENED)


# --- GDPO / multi-reward ---


@given(case=grouped_case(min_counted=2))
def test_gdpo_single_reward_matches_verl(verl, case) -> None:
    """verl adv_estimator="gdpo" with one reward == reinforce_pp_baseline(combine_rewards(normalize_then_sum,
    eps=1e-6)): per-group normalisation, then token whitening."""
    rewards, ids, mask = case
    combined = combine_rewards(rewards[:, None], mode="normalize_then_sum", group_ids=ids, eps=1e-6)
    _assume_spread(combined, mask)
    theirs, _ = verl.compute_gdpo_outcome_advantage(**_verl_inputs(rewards, ids, mask), epsilon=1e-6)
    ours = get_advantage("reinforce_pp_baseline")(combined, group_ids=ids, completion_mask=mask)
    torch.testing.assert_close(theirs[mask], _counted(ours, mask), **WHITENED)


@given(case=grouped_case(min_counted=2, values=GRID), k=st.integers(2, 3), data=st.data())
def test_gdpo_multi_reward_matches_verl(verl, case, k: int, data: st.DataObject) -> None:
    """verl gdpo with K reward keys and weights (it casts each key's scores to float32, hence the float32 row
    of the tolerance table) == token whitening of the weighted sum of per-group-normalised rewards."""
    rewards, ids, mask = case
    n, t = mask.shape
    extra = torch.tensor(
        data.draw(st.lists(GRID, min_size=n * (k - 1), max_size=n * (k - 1))), dtype=torch.float64
    )
    table = torch.cat([rewards[:, None], extra.view(n, k - 1)], dim=1)
    weights = data.draw(st.lists(st.sampled_from((0.5, 1.0, 2.0)), min_size=k, max_size=k))
    # contiguous right-padded responses: verl places each key's score at attention_mask-derived positions
    lengths = data.draw(st.lists(st.integers(1, t), min_size=n, max_size=n))
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    combined = combine_rewards(table, weights, mode="normalize_then_sum", group_ids=ids, eps=1e-6)
    _assume_spread(combined, mask)
    keys = [f"r{j}" for j in range(k)]
    prompt = torch.zeros(n, 3, dtype=torch.long)
    attention = torch.cat([torch.ones(n, 3, dtype=torch.long), mask.long()], dim=1)
    theirs, _ = verl.compute_gdpo_outcome_advantage(
        token_level_rewards=verl_token_rewards(rewards, mask),
        response_mask=mask.double(),
        index=labels_to_index(ids),
        epsilon=1e-6,
        config={"gdpo_reward_keys": keys, "gdpo_reward_weights": weights},
        non_tensor_batch={key: table[:, j].numpy() for j, key in enumerate(keys)},
        batch={"prompts": prompt, "attention_mask": attention},
    )
    ours = get_advantage("reinforce_pp_baseline")(combined, group_ids=ids, completion_mask=mask)
    torch.testing.assert_close(theirs[mask].double(), _counted(ours, mask), **tol(torch.float32))


def trl_advantages(rewards: torch.Tensor, num_generations: int, scale: str) -> torch.Tensor:
    """TRL 1.16 GRPO advantage, multi_objective_aggregation="sum_then_normalize" (grpo_trainer.py 2761-2786),
    for one reward column, restated with TRL's nanstd."""
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    elif num_generations > 1:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations)
    else:
        std = torch.zeros_like(rewards)
    advantages = rewards - mean
    return advantages if scale == "none" else advantages / (std + 1e-4)


def trl_normalize_then_sum(
    rewards: torch.Tensor, weights: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """TRL 1.16 multi_objective_aggregation="normalize_then_sum" (grpo_trainer.py 2790-2799), restated."""
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, num_generations, rewards.shape[1])
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    summed = (((grouped - mean) / (std + 1e-4)).view(-1, rewards.shape[1]) * weights).nansum(dim=1)
    batch_std = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    return (summed - torch.nanmean(summed)) / (batch_std + 1e-4)


def trl_scored_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int,
                          scale: str, aggregation: str) -> torch.Tensor:
    """TRL 1.16's advantages with None rewards (NaN; grpo_trainer.py 2756-2812), restated: an unscorable row (every
    function None) is NaN in the baseline's nanmean / nanstd and gets advantage 0 (nan_to_num)."""
    from trl.trainer.utils import nanstd

    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        return torch.nan_to_num(trl_advantages(rewards, num_generations, scale), nan=0.0)
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    std = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    rewards = (((grouped - mean) / (std + 1e-4)).view(-1, rewards_per_func.shape[1]) * weights).nansum(dim=1)
    rewards[unscorable] = torch.nan
    batch_std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    return torch.nan_to_num((rewards - torch.nanmean(rewards)) / (batch_std + 1e-4), nan=0.0)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@given(data=st.data(), g=st.integers(2, 5), k=st.integers(1, 4), m=st.integers(1, 3))
def test_none_rewards_and_unscorable_completions_match_trl(aggregation: str, data: st.DataObject, g: int, k: int,
                                                           m: int) -> None:
    """A reward function's None (NaN) and unscorable completions (every function None), as rlzoo train treats
    them (rlzoo.trainer.advantage_inputs: combine_rewards, then the estimator on the scorable rows in their groups,
    0 for the others) give TRL 1.16's advantages: grpo with scale_rewards group / batch / none after
    sum_then_normalize, and grpo(scale="batch") after normalize_then_sum."""
    n = g * k
    cells = st.one_of(GRID, st.just(math.nan))
    table = torch.tensor(data.draw(st.lists(cells, min_size=n * m, max_size=n * m)), dtype=torch.float64).view(n, m)
    weights = torch.tensor(data.draw(st.lists(st.sampled_from((0.5, 1.0, 2.0)), min_size=m, max_size=m)),
                           dtype=torch.float64)
    scales = ["group", "batch", "none"] if aggregation == "sum_then_normalize" else ["batch"]
    scale = data.draw(st.sampled_from(scales), label="scale")
    combined = combine_rewards(table, weights, mode=aggregation, group_size=g)
    scored = ~torch.isnan(table).all(dim=1)
    assert torch.equal(torch.isnan(combined), ~scored)  # NaN exactly for the unscorable rows
    ours = torch.zeros(n, dtype=torch.float64)
    if bool(scored.any()):
        groups = torch.arange(n) // g
        ours[scored] = get_advantage("grpo", scale=scale)(combined[scored], group_ids=groups[scored])
    torch.testing.assert_close(ours, trl_scored_advantages(table, weights, g, scale, aggregation), **WHITENED)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@given(data=st.data(), g=st.integers(1, 6), k=st.integers(1, 5))
def test_grpo_matches_trl(scale: str, data: st.DataObject, g: int, k: int) -> None:
    """grpo(scale) == TRL's scale_rewards=scale advantage (unbiased nanstd, eps 1e-4), singletons included."""
    values = data.draw(st.sampled_from((GRID, st.floats(-3, 3))))
    rewards = torch.tensor(data.draw(st.lists(values, min_size=g * k, max_size=g * k)), dtype=torch.float64)
    ours = get_advantage("grpo", scale=scale)(rewards, group_size=g)
    torch.testing.assert_close(ours, trl_advantages(rewards, g, scale), **WHITENED)


@given(data=st.data(), g=st.integers(1, 5), k=st.integers(1, 4), m=st.integers(1, 3))
def test_multi_reward_matches_trl(data: st.DataObject, g: int, k: int, m: int) -> None:
    """TRL multi_objective_aggregation: sum_then_normalize == grpo(combine(sum)); normalize_then_sum ==
    grpo(scale="batch")(combine(normalize_then_sum)) (the sum has zero mean in every group)."""
    n = g * k
    rewards = torch.tensor(
        data.draw(st.lists(GRID, min_size=n * m, max_size=n * m)), dtype=torch.float64
    ).view(n, m)
    weights = torch.tensor(
        data.draw(st.lists(st.sampled_from((0.5, 1.0, 2.0)), min_size=m, max_size=m)), dtype=torch.float64
    )
    summed = combine_rewards(rewards, weights, mode="sum_then_normalize")
    trl_sum = trl_advantages((rewards * weights).nansum(dim=1), g, "group")
    torch.testing.assert_close(get_advantage("grpo")(summed, group_size=g), trl_sum, **WHITENED)
    decoupled = combine_rewards(rewards, weights, mode="normalize_then_sum", group_size=g)
    ours = get_advantage("grpo", scale="batch")(decoupled, group_size=g)
    torch.testing.assert_close(ours, trl_normalize_then_sum(rewards, weights, g), **WHITENED)
