"""Token-level estimators (gae, reinforce_pp, remax) against their direct definitions, and the critic's
clipped value loss."""

import math

import pytest
import torch
from adv_cases import token_case
from hypothesis import given
from hypothesis import strategies as st
from strategies import AGGREGATIONS, aggregate
from tolerances import tol

import rlzoo
from rlzoo.advantages import get_advantage, token_level_rewards, value_loss

TOL = tol(torch.float64)


def _dense(case: dict[str, torch.Tensor]) -> torch.Tensor:
    """Token rewards by definition: token_rewards at counted tokens + outcome reward on the last counted
    one."""
    mask = case["completion_mask"]
    out = torch.where(mask, case["token_rewards"], 0.0)
    for i in range(mask.shape[0]):
        counted = mask[i].nonzero().flatten().tolist()
        if counted:
            out[i, counted[-1]] += case["rewards"][i]
    return out


def _compressed(mask_row: torch.Tensor) -> list[int]:
    return mask_row.nonzero().flatten().tolist()


def _gae_by_definition(case: dict[str, torch.Tensor], gamma: float, lam: float) -> torch.Tensor:
    """A_t = sum_l (gamma lam)^l delta_{t+l}, delta_j = r_j + gamma V_{j+1} - V_j over each row's counted
    tokens (V past the last one = 0) - the explicit sum of Schulman et al. eq. (16), no recursion."""
    mask, values, r = case["completion_mask"], case["values"], _dense(case)
    out = torch.zeros_like(values)
    for i in range(mask.shape[0]):
        idx = _compressed(mask[i])
        v = [float(values[i, j]) for j in idx] + [0.0]
        rr = [float(r[i, j]) for j in idx]
        delta = [rr[j] + gamma * v[j + 1] - v[j] for j in range(len(idx))]
        for a, j in enumerate(idx):
            out[i, j] = sum((gamma * lam) ** l * delta[a + l] for l in range(len(idx) - a))
    return out


def _whiten_counted(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    vals = x[mask]
    var = vals.var(correction=1) if vals.numel() > 1 else torch.zeros((), dtype=x.dtype)
    return torch.where(mask, (x - vals.mean()) / torch.sqrt(var + 1e-8), 0.0)


@given(
    case=token_case(holes=True), gamma=st.sampled_from((1.0, 0.9, 0.0)), lam=st.sampled_from((1.0, 0.95, 0.0))
)
def test_gae_matches_definition(case: dict[str, torch.Tensor], gamma: float, lam: float) -> None:
    """Un-whitened GAE equals the explicit discounted sum of TD errors over counted tokens (holes skipped);
    returns = A + V; whiten=True whitens A over every counted token; masked positions hold 0."""
    mask = case["completion_mask"]
    inputs = {k: case[k] for k in ("completion_mask", "values", "token_rewards")}
    expected = _gae_by_definition(case, gamma, lam)
    adv, ret = get_advantage("gae", gamma=gamma, lam=lam, whiten=False).with_returns(
        case["rewards"], **inputs
    )
    torch.testing.assert_close(adv, expected, **TOL)
    torch.testing.assert_close(ret, torch.where(mask, expected + case["values"], 0.0), **TOL)
    whitened = get_advantage("gae", gamma=gamma, lam=lam)(case["rewards"], **inputs)
    torch.testing.assert_close(whitened, _whiten_counted(expected, mask), **TOL)


@given(case=token_case(holes=False))
def test_gae_lambda_one_is_monte_carlo(case: dict[str, torch.Tensor]) -> None:
    """gamma = lam = 1: A_t = (sum of rewards from t on) - V_t (the Monte-Carlo return minus the baseline)."""
    mask = case["completion_mask"]
    inputs = {k: case[k] for k in ("completion_mask", "values", "token_rewards")}
    adv = get_advantage("gae", gamma=1.0, lam=1.0, whiten=False)(case["rewards"], **inputs)
    returns = _dense(case).flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(adv, torch.where(mask, returns - case["values"], 0.0), **TOL)


@given(case=token_case(holes=True), gamma=st.sampled_from((1.0, 0.9)), lam=st.sampled_from((0.95, 0.5)),
       lam_critic=st.sampled_from((None, 1.0, 0.9)), alpha=st.sampled_from((None, 0.05, 0.5, 2.0)))
def test_vapo_decoupled_and_length_adaptive_gae(case, gamma, lam, lam_critic, alpha) -> None:
    """VAPO (arXiv:2504.05118): the returns (critic targets) use lam_critic (default lam); the advantages use
    lam_i = clamp(1 - 1 / (alpha l_i), 0, 1) per completion of l_i counted tokens when alpha is set, else lam.
    Each row against the explicit sum of TD errors with its own lambda."""
    mask = case["completion_mask"]
    inputs = {k: case[k] for k in ("completion_mask", "values", "token_rewards")}
    adv, ret = get_advantage("gae", gamma=gamma, lam=lam, whiten=False, lam_critic=lam_critic,
                             length_adaptive_alpha=alpha).with_returns(case["rewards"], **inputs)
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        lam_i = lam if alpha is None else min(1.0, max(0.0, 1.0 - 1.0 / (alpha * max(n, 1))))
        row = {k: v[i:i + 1] for k, v in case.items()}
        torch.testing.assert_close(adv[i], _gae_by_definition(row, gamma, lam_i)[0], **TOL)
        critic = _gae_by_definition(row, gamma, lam if lam_critic is None else lam_critic)[0]
        torch.testing.assert_close(ret[i], torch.where(mask[i], critic + case["values"][i], 0.0), **TOL)


def test_vapo_gae_options_are_checked() -> None:
    with pytest.raises(ValueError, match="gae: lam_critic"):
        get_advantage("gae", lam_critic=1.5)
    with pytest.raises(ValueError, match="gae: length_adaptive_alpha"):
        get_advantage("gae", length_adaptive_alpha=0.0)


@given(case=token_case(holes=True), gamma=st.sampled_from((1.0, 0.9, 0.5)))
def test_reinforce_pp_matches_definition(case: dict[str, torch.Tensor], gamma: float) -> None:
    """G_t = sum_{t' >= t counted} gamma^{#counted steps} r_t', then whitened over all counted tokens."""
    mask, r = case["completion_mask"], _dense(case)
    returns = torch.zeros_like(r)
    for i in range(mask.shape[0]):
        idx = _compressed(mask[i])
        for a, j in enumerate(idx):
            returns[i, j] = sum(gamma ** (b - a) * float(r[i, idx[b]]) for b in range(a, len(idx)))
    adv = get_advantage("reinforce_pp", gamma=gamma)(
        case["rewards"], completion_mask=mask, token_rewards=case["token_rewards"]
    )
    torch.testing.assert_close(adv, _whiten_counted(returns, mask), **TOL)


@given(case=token_case(holes=True))
def test_remax_matches_definition(case: dict[str, torch.Tensor]) -> None:
    """A_t = sum_{t' >= t} r_t' - b (ReMax, b = greedy response's reward); outcome-only: A_t = r - b."""
    mask = case["completion_mask"]
    est = get_advantage("remax")
    adv = est(
        case["rewards"],
        completion_mask=mask,
        token_rewards=case["token_rewards"],
        baseline_rewards=case["baseline_rewards"],
    )
    returns = _dense(case).flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(
        adv, torch.where(mask, returns - case["baseline_rewards"][:, None], 0.0), **TOL
    )
    outcome = est(case["rewards"], completion_mask=mask, baseline_rewards=case["baseline_rewards"])
    expected = (case["rewards"] - case["baseline_rewards"])[:, None].expand(mask.shape)
    torch.testing.assert_close(outcome, torch.where(mask, expected, 0.0), **TOL)


@given(case=token_case(holes=True, min_counted=0))
def test_token_level_rewards_placement(case: dict[str, torch.Tensor]) -> None:
    """The outcome reward lands on each row's last counted token; token rewards elsewhere; 0 at masked."""
    out = token_level_rewards(case["rewards"], case["completion_mask"], case["token_rewards"])
    torch.testing.assert_close(out, _dense(case), **TOL)


def _value_case(seed: int, b: int = 4, t: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[0, 0] = True
    return {
        "values": torch.randn(b, t, generator=g, dtype=torch.float64),
        "old_values": torch.randn(b, t, generator=g, dtype=torch.float64),
        "returns": torch.randn(b, t, generator=g, dtype=torch.float64),
        "completion_mask": mask,
    }


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@given(seed=st.integers(0, 2**31 - 1), clip=st.sampled_from((0.05, 0.2, 0.5, math.inf)))
def test_value_loss_definition(aggregation: str, seed: int, clip: float) -> None:
    """loss = agg(0.5 max((V - R)^2, (clip(V, V_old +- c) - R)^2)); clipfrac = counted share where the clipped
    term is larger; c = inf is the plain squared error."""
    case = _value_case(seed)
    v, old, ret, mask = case["values"], case["old_values"], case["returns"], case["completion_mask"]
    out = value_loss(
        v, old, ret, mask, cliprange_value=clip, aggregation=aggregation, max_completion_length=7
    )
    clipped = (torch.maximum(torch.minimum(v, old + clip), old - clip) - ret) ** 2
    per_token = 0.5 * torch.maximum((v - ret) ** 2, clipped)
    torch.testing.assert_close(
        out.loss, aggregate(per_token, mask, aggregation, max_completion_length=7), **TOL
    )
    frac = ((clipped > (v - ret) ** 2) & mask).sum().double() / mask.sum()
    torch.testing.assert_close(out.metrics["critic/vf_clipfrac"], frac, **TOL)
    if math.isinf(clip):
        assert float(out.metrics["critic/vf_clipfrac"]) == 0.0


@given(seed=st.integers(0, 2**31 - 1))
def test_value_loss_padding_inert_and_microbatches_sum(seed: int) -> None:
    """NaN/inf at masked positions change neither loss nor gradient; micro-batch losses with the full batch's
    Normalizer sum to the full-batch loss and gradient."""
    case = _value_case(seed)
    mask = case["completion_mask"]
    v = case["values"].clone().requires_grad_(True)
    full = value_loss(v, case["old_values"], case["returns"], mask, cliprange_value=0.2)
    (grad_full,) = torch.autograd.grad(full.loss, v)

    v2 = torch.where(mask, case["values"], torch.nan).requires_grad_(True)
    dirty = value_loss(
        v2,
        torch.where(mask, case["old_values"], torch.inf),
        torch.where(mask, case["returns"], -torch.inf),
        mask,
        cliprange_value=0.2,
    )
    (grad_dirty,) = torch.autograd.grad(dirty.loss, v2)
    torch.testing.assert_close(dirty.loss, full.loss, **TOL)
    torch.testing.assert_close(grad_dirty, grad_full, **TOL)

    v3 = case["values"].clone().requires_grad_(True)
    norm = rlzoo.Normalizer.from_masks(mask)
    total = sum(
        value_loss(
            v3[sl],
            case["old_values"][sl],
            case["returns"][sl],
            mask[sl],
            cliprange_value=0.2,
            normalizer=norm,
        ).loss
        for sl in (slice(0, 1), slice(1, 4))
    )
    (grad_micro,) = torch.autograd.grad(total, v3)
    torch.testing.assert_close(total, full.loss, **TOL)
    torch.testing.assert_close(grad_micro, grad_full, **TOL)


def test_value_loss_errors() -> None:
    case = _value_case(0)
    args = (case["values"], case["old_values"], case["returns"], case["completion_mask"])
    with pytest.raises(ValueError, match="cliprange_value"):
        value_loss(*args, cliprange_value=0.0)
    with pytest.raises(rlzoo.UnknownNameError, match="token-mean"):
        value_loss(*args, cliprange_value=0.2, aggregation="mean")
    bad = case["returns"].clone()
    bad[0, 0] = torch.nan
    with pytest.raises(ValueError, match="returns holds NaN"):
        value_loss(case["values"], case["old_values"], bad, case["completion_mask"], cliprange_value=0.2)
    with pytest.raises((ValueError, TypeError), match="completion_mask"):
        value_loss(*args[:3], case["completion_mask"].double(), cliprange_value=0.2)
