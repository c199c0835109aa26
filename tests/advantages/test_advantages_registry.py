"""Registry contract and zoo-wide conformance: every registered estimator passes the same checks for free."""

import json

import pytest
import torch
from adv_cases import GRID, grouped_rewards, token_case
from hypothesis import given
from hypothesis import strategies as st
from tolerances import tol

import rlzoo
from rlzoo.advantages import INPUTS, AdvantageEstimator, advantage_estimators, get_advantage, list_advantages

EXPECTED = {
    "dr_grpo",
    "gae",
    "gpg",
    "grpo",
    "grpo_passk",
    "maxrl",
    "opo",
    "optimal_token_baseline",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "reward_norm",
    "rloo",
}
ALL = list_advantages()


def _inputs_for(est: AdvantageEstimator, case: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: case[k] for k in est.accepts}


def _rewards_for(name: str, case: dict[str, torch.Tensor]) -> torch.Tensor:
    return case["rewards"].abs() if name == "maxrl" else case["rewards"]


def test_public_names() -> None:
    assert rlzoo.get_advantage is get_advantage and rlzoo.list_advantages is list_advantages
    assert ALL == sorted(ALL)
    assert EXPECTED <= set(ALL)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(rlzoo.UnknownNameError) as info:
        get_advantage("grpoo")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "grpoo" in str(info.value) and all(name in str(info.value) for name in ALL)


@pytest.mark.parametrize(
    ("name", "options", "field", "valid"),
    [
        ("grpo", {"scale": "std"}, "scale", "'batch', 'group', 'none'"),
        ("grpo", {"eps": -1e-4}, "eps", ">= 0"),
        ("grpo", {"eps": float("nan")}, "eps", "a number, got NaN"),
        ("grpo_passk", {"scale": "batch"}, "scale", "'group', 'none'"),
        ("gpg", {"alpha": "two"}, "alpha", "'informative', 'nonzero_rewards', 'one'"),
        ("reinforce_pp_baseline", {"whiten": "batch"}, "whiten", "'sequence', 'token'"),
        ("reinforce_pp", {"gamma": 1.5}, "gamma", "<= 1"),
        ("gae", {"lam": -0.1}, "lam", ">= 0"),
        ("reward_norm", {"mean_level": "prompt"}, "mean_level", "'batch', 'group', 'none'"),
        ("reward_norm", {"std_level": "token"}, "std_level", "'batch', 'group', 'none'"),
        ("reward_norm", {"eps": -1.0}, "eps", ">= 0"),
        ("optimal_token_baseline", {"eps": float("inf")}, "eps", "finite"),
    ],
)
def test_bad_option_value_names_option_and_valid_values(
    name: str, options: dict, field: str, valid: str
) -> None:
    with pytest.raises(ValueError, match=field) as info:
        get_advantage(name, **options)
    assert valid in str(info.value)


def test_non_bool_whiten_is_rejected() -> None:
    """gae.whiten must be a bool (a beartype error under the test checker, a ValueError without it)."""
    with pytest.raises((ValueError, TypeError), match="whiten"):
        get_advantage("gae", whiten="yes")


def test_unknown_option_lists_valid_options() -> None:
    with pytest.raises(ValueError, match="'scales'") as info:
        get_advantage("grpo", scales="group")
    assert "scale, eps" in str(info.value)
    with pytest.raises(ValueError, match="has no option 'scale'; valid options: none"):
        get_advantage("dr_grpo", scale="group")


def test_preset_estimators_work_without_options() -> None:
    """Loss presets name an estimator (+ options); each must build and run on plain grouped rewards."""
    names = {"grpo", "dr_grpo", "gpg"}
    for preset_name in rlzoo.losses.presets.names():
        preset = rlzoo.losses.presets.get(preset_name)
        names.add(preset.advantage)
        get_advantage(preset.advantage, **dict(preset.advantage_options))
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    for name in sorted(names):
        out = get_advantage(name)(rewards, group_size=2)
        assert out.shape == (4,) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("name", ALL)
def test_declarations(name: str) -> None:
    """needs <= accepts <= INPUTS; registered name round-trips; config is JSON and rebuilds an equal
    estimator;
    the class documents its source (arXiv id) and the reference implementation it matches (or lacks)."""
    est = get_advantage(name)
    assert isinstance(est, AdvantageEstimator)
    assert est.needs <= est.accepts <= set(INPUTS)
    assert type(est).registered_name() == name and advantage_estimators.get(name) is type(est)
    config = json.loads(json.dumps(est.to_config()))
    assert get_advantage(**config) == est
    assert name in est.describe()
    doc = type(est).__doc__ or ""
    assert "arXiv:" in doc and ("verl" in doc or "TRL" in doc)
    if est.token_level:
        assert "completion_mask" in est.needs


@pytest.mark.parametrize("name", ALL)
@given(case=token_case(), labels=st.data())
def test_conformance(name: str, case: dict[str, torch.Tensor], labels: st.DataObject) -> None:
    """Every estimator: right shape and dtype, finite; token-level output is 0 at masked positions; values at
    masked positions of token inputs are inert (NaN included); group_size == the equivalent group_ids; with
    group_ids, permuting the items permutes the output (rows of token outputs)."""
    est = get_advantage(name)
    n, t = case["completion_mask"].shape
    g = labels.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    rewards = _rewards_for(name, case)
    inputs = _inputs_for(est, case)
    out = est(rewards, group_size=g, **inputs)
    assert out.dtype == torch.float64
    assert out.shape == ((n, t) if est.token_level else (n,))
    assert bool(torch.isfinite(out).all())
    mask = case["completion_mask"]
    if est.token_level:
        assert bool((out[~mask] == 0).all())

    # padding is inert
    garbage = {
        k: (torch.where(mask, v, torch.nan) if v.shape == mask.shape and k != "completion_mask" else v)
        for k, v in inputs.items()
    }
    torch.testing.assert_close(est(rewards, group_size=g, **garbage), out, **tol(torch.float64))

    # group_size == group_ids; permutation equivariance
    ids = torch.arange(n) // g
    torch.testing.assert_close(est(rewards, group_ids=ids, **inputs), out, **tol(torch.float64))
    perm = torch.tensor(labels.draw(st.permutations(range(n))))
    permuted = {k: v[perm] for k, v in inputs.items()}
    out_p = est(rewards[perm], group_ids=ids[perm].tolist(), **permuted)
    torch.testing.assert_close(out_p, out[perm], **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ALL)
def test_half_precision_inputs_are_computed_in_float32(name: str, dtype: torch.dtype) -> None:
    """bf16 / fp16 rewards (and inputs) give the float32 advantages of the same values, rounded once to the input
    dtype: a bf16 group sum stopped growing at 256 (dr_grpo on a group of 4096 uniform rewards had mean advantage
    0.43, not 0) and an fp16 sum over 65 536 tokens overflowed (reinforce_pp: all NaN)."""
    est = get_advantage(name)
    g = torch.Generator().manual_seed(0)
    n, t, size = 64, 1024, 64
    mask = torch.rand(n, t, generator=g) < 0.98
    old = -torch.rand(n, t, generator=g) - 0.1
    case = {"rewards": torch.rand(n, generator=g), "completion_mask": mask, "token_rewards": torch.rand(n, t, generator=g),
            "values": torch.rand(n, t, generator=g), "baseline_rewards": torch.rand(n, generator=g), "old_logprobs": old,
            "sum_pi_squared": old.exp() ** 2, "rollout_is_weights": torch.ones(n, t)}
    low = {k: v if v.dtype == torch.bool else v.to(dtype) for k, v in case.items()}
    inputs = _inputs_for(est, low)
    got = est(low["rewards"], group_size=size, **inputs)
    want = est(low["rewards"].float(), group_size=size, **{k: v if v.dtype == torch.bool else v.float()
                                                             for k, v in inputs.items()})
    assert got.dtype == dtype and bool(torch.isfinite(got).all())
    assert torch.equal(got, want.to(dtype))
    if name == "dr_grpo":
        big = torch.rand(4096, generator=g).to(dtype)
        assert abs(est(big, group_size=4096).float().mean().item()) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gae_returns_and_combined_rewards_are_computed_in_float32(dtype: torch.dtype) -> None:
    """GAE.with_returns (documented as __call__'s advantages) and combine_rewards computed in the input dtype: fp16
    whitening gave all-NaN advantages where __call__ gave finite ones, and a bf16 normalize_then_sum group of 4096
    had mean 3.5 instead of 0. Both now compute in float32 and round once."""
    from rlzoo.advantages import combine_rewards

    g = torch.Generator().manual_seed(1)
    mask = torch.ones(64, 1024, dtype=torch.bool)
    rewards, values = torch.rand(64, generator=g).to(dtype), torch.rand(64, 1024, generator=g).to(dtype)
    gae = get_advantage("gae", whiten=True)
    advantages, returns = gae.with_returns(rewards, completion_mask=mask, values=values)
    assert torch.equal(advantages, gae(rewards, completion_mask=mask, values=values))
    want, want_returns = gae.with_returns(rewards.float(), completion_mask=mask, values=values.float())
    assert torch.equal(advantages, want.to(dtype)) and torch.equal(returns, want_returns.to(dtype))
    big = torch.rand(4096, 2, generator=g).to(dtype)
    for mode in ("sum_then_normalize", "normalize_then_sum"):
        got = combine_rewards(big, [1.0, 0.5], mode=mode, group_size=4096)
        assert got.dtype == dtype
        assert torch.equal(got, combine_rewards(big.float(), [1.0, 0.5], mode=mode, group_size=4096).to(dtype))
    assert abs(combine_rewards(big, mode="normalize_then_sum", group_size=4096).float().mean().item()) < 1e-2


@pytest.mark.parametrize("name", ALL)
def test_missing_and_unused_inputs_raise(name: str) -> None:
    """A needed input that is missing, or an input the estimator does not use, raises naming it."""
    est = get_advantage(name)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    full = {
        "completion_mask": mask,
        "token_rewards": torch.zeros(2, 3, dtype=torch.float64),
        "values": torch.zeros(2, 3, dtype=torch.float64),
        "baseline_rewards": torch.zeros(2, dtype=torch.float64),
        "old_logprobs": torch.full((2, 3), -0.5, dtype=torch.float64),
        "sum_pi_squared": torch.full((2, 3), 0.5, dtype=torch.float64),
        "rollout_is_weights": torch.ones(2, 3, dtype=torch.float64),
    }
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    for missing in est.needs:
        kwargs = {k: full[k] for k in est.accepts if k != missing}
        with pytest.raises(ValueError, match=f"^advantage estimator '{name}' needs {missing} \\(not given\\)$"):
            est(rewards, group_size=2, **kwargs)
    for extra in set(INPUTS) - est.accepts:
        kwargs = {k: full[k] for k in est.accepts} | {extra: full[extra]}
        with pytest.raises(ValueError, match=f"does not use {extra}"):
            est(rewards, group_size=2, **kwargs)


def _needed(est: AdvantageEstimator, n: int, t: int) -> dict[str, torch.Tensor]:
    """The inputs ``est`` needs, for ``n`` completions of ``t`` counted tokens (a plausible sampling policy)."""
    values = {
        "completion_mask": torch.ones(n, t, dtype=torch.bool),
        "old_logprobs": torch.full((n, t), -0.7, dtype=torch.float64),
        "sum_pi_squared": torch.full((n, t), 0.4, dtype=torch.float64),
    }
    return {k: values[k] for k in est.needs}


@pytest.mark.parametrize("name", [n for n in ALL if get_advantage(n).uses_groups])
@given(data=grouped_rewards(min_size=1, max_size=1, values=GRID))
def test_all_singletons_give_zero(name: str, data: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Documented convention: a group of one completion has no relative information -> advantage 0."""
    rewards, ids = data
    est = get_advantage(name)
    out = est(rewards.abs() if name == "maxrl" else rewards, group_ids=ids, **_needed(est, rewards.shape[0], 3))
    assert bool((out == 0).all())


@pytest.mark.parametrize(
    "name", [n for n in ALL if get_advantage(n).uses_groups and n != "reinforce_pp_baseline"]
)
@given(value=st.sampled_from((0.1, 0.3, 1.0 / 3.0, 0.7, 2.9)), size=st.integers(2, 9), other=GRID)
def test_zero_variance_groups_give_exact_zero(name: str, value: float, size: int, other: float) -> None:
    """Documented convention: a group whose rewards are all equal gets exactly 0, even where the float mean is
    not exactly the common value (0.1 * 3 / 3 != 0.1), independently of the other groups."""
    rewards = torch.tensor([value] * size + [abs(other), abs(other) + 1.0], dtype=torch.float64)
    ids = [0] * size + [1, 1]
    est = get_advantage(name)
    out = est(rewards, group_ids=ids, **_needed(est, size + 2, 2))
    assert bool((out[:size] == 0).all())
    assert bool((out[size:] != 0).any())


ALTERNATIVES = [
    (name, option, alternative)
    for name, cls in advantage_estimators.items()
    for option, registry in cls.choices().items()
    for alternative in registry.names()
]


@pytest.mark.parametrize(("name", "option", "alternative"), ALTERNATIVES,
                         ids=[f"{n}.{o}={a}" for n, o, a in ALTERNATIVES])
@given(case=token_case())
def test_every_registered_alternative_works(name: str, option: str, alternative: str,
                                            case: dict[str, torch.Tensor]) -> None:
    """Every registered alternative of an estimator option (scale, alpha, whiten, ...) builds an estimator that
    gives finite advantages of the right shape with inert padding, or is refused with a ValueError naming the
    option (grpo_passk takes the per-group scales only). The instance needs what its class and its chosen
    alternative need."""
    try:
        est = get_advantage(name, **{option: alternative})
    except ValueError as err:
        assert option in str(err)
        return
    alt = type(est).choices()[option].get(alternative)
    assert est.needs == type(est).needs | alt.needs and est.needs <= est.accepts
    n, t = case["completion_mask"].shape
    inputs = _inputs_for(est, case)
    out = est(_rewards_for(name, case), group_size=1 if n == 1 else n, **inputs)
    assert out.shape == ((n, t) if est.token_level else (n,)) and bool(torch.isfinite(out).all())


def test_needs_is_declared_on_the_class() -> None:
    """``needs`` / ``accepts`` are public class attributes (what a trainer reads to list usable estimators); an
    instance adds what its chosen alternatives need."""
    assert advantage_estimators.get("gae").needs == frozenset({"completion_mask", "values"})
    assert advantage_estimators.get("remax").accepts >= advantage_estimators.get("remax").needs
    usable = [n for n, cls in advantage_estimators.items() if cls.needs <= {"completion_mask"}]
    assert "grpo" in usable and "gae" not in usable and "remax" not in usable
    assert advantage_estimators.get("reinforce_pp_baseline").needs == frozenset()
    assert get_advantage("reinforce_pp_baseline").needs == frozenset({"completion_mask"})
    assert get_advantage("reinforce_pp_baseline", whiten="sequence").needs == frozenset()
