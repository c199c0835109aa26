"""Bad input raises a clear error that names the field or option (never a silent NaN).

DESIGN.md section 2: unknown names raise a KeyError/ValueError listing the valid names; bad shapes,
dtypes, NaN in counted positions, or invalid hyper-parameters raise an error naming the field.
"""

import dataclasses
import math
import re
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import policy_batches, runtime_type_checker_off
from tolerances import assert_grad_close, tol

import rlzoo
from rlzoo import BatchError, Normalizer, PolicyBatch, UnknownNameError
from rlzoo.losses import PolicyLoss, aggregations, kl_estimators, ratio_levels

B, T = 2, 3


@pytest.fixture(autouse=True)
def _users_error_path():
    """Check the errors users get: without the test-only jaxtyping checker, which would raise its own
    TypeCheckError in the generated __init__ before rlzoo's validation."""
    with runtime_type_checker_off():
        yield

LOGPROB_FIELDS = ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs")
TOKEN_FIELDS = (*LOGPROB_FIELDS, "entropies")


def _fields(**overrides):
    fields = {
        "logprobs": torch.full((B, T), -0.5, dtype=torch.float64, requires_grad=True),
        "advantages": torch.tensor([1.0, -1.0], dtype=torch.float64),
        "completion_mask": torch.tensor([[True, True, False], [True, False, False]]),
        "old_logprobs": torch.full((B, T), -0.4, dtype=torch.float64),
        "ref_logprobs": torch.full((B, T), -0.6, dtype=torch.float64),
        "rollout_logprobs": torch.full((B, T), -0.45, dtype=torch.float64),
        "entropies": torch.full((B, T), 1.0, dtype=torch.float64),
    }
    fields.update(overrides)
    return fields


def _batch(**overrides) -> PolicyBatch:
    return PolicyBatch(**_fields(**overrides))


def _names_all(message: str, names) -> bool:
    return all(n in message for n in names)


# ------------------------------------------------------------------------------------------ unknown names
def test_unknown_preset_lists_every_preset():
    """rlzoo.get_loss('nope') raises an UnknownNameError (both a KeyError and a ValueError) listing the presets."""
    with pytest.raises(UnknownNameError) as err:
        rlzoo.get_loss("grpoo")
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert "grpoo" in str(err.value) and _names_all(str(err.value), rlzoo.list_losses())


@pytest.mark.parametrize(
    ("option", "registry"),
    [("importance_sampling_level", ratio_levels), ("aggregation", aggregations)],
)
def test_unknown_part_name_lists_the_valid_names(option, registry):
    """An unknown ratio level (importance_sampling_level) or aggregation lists the registered names."""
    with pytest.raises(UnknownNameError) as err:
        rlzoo.get_loss("grpo", **{option: "seqence"})
    assert "seqence" in str(err.value) and _names_all(str(err.value), registry.names())


def test_unknown_kl_estimator_lists_the_estimators():
    """kl_estimator='k4' raises a ValueError naming kl_estimator and listing every estimator (k1, k2, k3, abs,
    k1+, k3+, low_var_kl, low_var_kl+)."""
    with pytest.raises(ValueError, match="kl_estimator") as err:
        rlzoo.get_loss("grpo", kl_estimator="k4")
    assert _names_all(str(err.value), kl_estimators.names())
    with pytest.raises(UnknownNameError) as err2:
        rlzoo.losses.kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "low_var_k3")
    assert _names_all(str(err2.value), kl_estimators.names())


@pytest.mark.parametrize("name", rlzoo.list_losses())
def test_unknown_option_lists_the_valid_options(name):
    """An option no part accepts (a typo) raises an UnknownNameError with the closest options ("did you mean")
    and the loss's valid options."""
    loss_fn = rlzoo.get_loss(name)
    with pytest.raises(UnknownNameError) as err:
        rlzoo.get_loss(name, epsilon_hihg=0.3)
    message = str(err.value)
    assert "epsilon_hihg" in message
    assert ("did you mean 'epsilon_high'" in message) == ("epsilon_high" in loss_fn.options())
    assert _names_all(message, sorted(loss_fn.options()))


def test_an_option_of_a_part_swapped_out_in_the_same_call_says_so():
    """gmpo's clip lives in its geometric ratio level: get_loss("gmpo", importance_sampling_level="token",
    epsilon_low=0.2) said "unknown option 'epsilon_low'; did you mean 'epsilon_low'?" and listed it as valid (the
    preset's options). It names the part the swap replaces."""
    for order in ({"importance_sampling_level": "token", "epsilon_low": 0.2},
                  {"epsilon_low": 0.2, "importance_sampling_level": "sequence"}):
        with pytest.raises(UnknownNameError, match=r"^option 'epsilon_low' belongs to geometric\(epsilon_low=0.4, "
                                                   r"epsilon_high=0.4\), the ratio level of loss 'gmpo', which "
                                                   r"importance_sampling_level='(token|sequence)' replaces: drop "
                                                   r"epsilon_low or keep that ratio level$"):
            rlzoo.get_loss("gmpo", **order)
    assert rlzoo.get_loss("gmpo", importance_sampling_level="geometric", epsilon_low=0.2).ratio.epsilon_low == 0.2


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token"])
def test_a_swap_that_drops_gmpos_clip_warns(level):
    """gmpo's clip lives in its geometric ratio level: importance_sampling_level="token" (or a sequence level) gives
    an unclipped loss, and said nothing. It warns, naming the replaced level and the options no part now has; a
    swap between option-less levels (grpo to sequence) and one that keeps the level say nothing."""
    with pytest.warns(UserWarning, match=rf"^importance_sampling_level='{level}' replaces ratio level "
                                         r"geometric\(epsilon_low=0.4, epsilon_high=0.4\) of loss 'gmpo', and no part "
                                         r"of the new loss has epsilon_low, epsilon_high: the loss no longer applies "
                                         r"them$") as record:
        loss = rlzoo.get_loss("gmpo", importance_sampling_level=level)
    assert record[0].filename == __file__  # the user's line, not rlzoo's (it said rlzoo/losses/policy_loss.py)
    batch = _batch()
    far = dataclasses.replace(batch, old_logprobs=batch.logprobs.detach() - 1.0)  # log-ratios 1 > 0.4: clipped
    assert not torch.equal(loss(far).loss, rlzoo.get_loss("gmpo")(far).loss)  # what the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlzoo.get_loss("grpo", importance_sampling_level="sequence")
        rlzoo.get_loss("gmpo", importance_sampling_level="geometric", epsilon_high=0.3)
    with warnings.catch_warnings(record=True) as seen:  # a level REINFORCE never read applied no clip to drop
        warnings.simplefilter("always")
        rlzoo.get_loss("gpg", importance_sampling_level="geometric").with_options(importance_sampling_level=level)
    assert not [w for w in seen if "no longer applies" in str(w.message)]


@pytest.mark.parametrize("name", ["dapo", "grpo", "cispo"])
def test_a_keyword_option_of_two_parts_warns(name):
    """importance_sampling_level="geometric" on a clipping surrogate: the level clips the token log-ratio with its
    epsilon_low / epsilon_high, the surrogate the ratio with its own, and a keyword epsilon_high set both silently
    (a log-ratio bound of 0.28 is a ratio bound of 1.32). Such a keyword warns, naming both parts and the class to
    set one with; building the loss without one, replacing a part as the warning says, a round trip through
    to_config and an unrelated option say nothing (no preset has two such parts)."""
    from rlzoo.algorithms.gmpo import GeometricRatio

    with pytest.warns(UserWarning, match=r"^epsilon_high sets both ratio level geometric\(epsilon_low=0.4, "
                                         r"epsilon_high=0.3\) and surrogate .*, each part with its own meaning; to set "
                                         r"one, replace that part: dataclasses.replace\(loss, "
                                         r"ratio=rlzoo.algorithms.gmpo.GeometricRatio\(epsilon_high=...\)\)$"):
        loss = rlzoo.get_loss(name, importance_sampling_level="geometric", epsilon_high=0.3)
    assert loss.ratio.epsilon_high == loss.surrogate.epsilon_high == 0.3  # what the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = rlzoo.get_loss(name, importance_sampling_level="geometric")
        replaced = dataclasses.replace(plain, ratio=GeometricRatio(epsilon_high=0.5))
        PolicyLoss.from_config(replaced.to_config())
        replaced.with_options(beta=0.04)
        for preset in rlzoo.list_losses():
            rlzoo.get_loss(preset, **{k: v for k, v in rlzoo.get_loss(preset).options().items()
                                      if k != "importance_sampling_level"})


def test_a_token_an_is_weight_drops_adds_zero_even_where_its_loss_overflowed():
    """decoupled_ppo masks a token whose behaviour weight exceeds its cap (weight 0); a proximal log-ratio of 95
    nats overflows that token's surrogate to inf, and 0 * inf made the loss NaN. The token adds exactly 0: the
    loss is the other token's alone."""
    lp = torch.tensor([[-0.01, -1.0]], requires_grad=True)
    batch = PolicyBatch(logprobs=lp, old_logprobs=torch.tensor([[-95.0, -1.0]]),
                        rollout_logprobs=torch.tensor([[-100.0, -1.0]]), advantages=torch.tensor([-2.0]),
                        completion_mask=torch.ones(1, 2, dtype=torch.bool))
    out = rlzoo.get_loss("decoupled_ppo")(batch)
    out.loss.backward()
    assert out.loss.item() == 1.0 and lp.grad.tolist() == [[0.0, 1.0]]  # token 2: -ratio * A / 2 tokens, ratio 1


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate", "token_truncate"])
@pytest.mark.parametrize("is_max", [None, math.inf])
def test_an_unbounded_is_weight_stays_finite(mode, is_max):
    """is_max=None (or inf) is a documented "no upper bound": the exp of a sequence's summed log-ratio (200 tokens
    0.5 nats apart: 100) overflowed float32 and made the loss and gradient NaN. The log-weight is clamped at verl's
    SAFETY_BOUND (20) then; with a finite is_max nothing is clamped (the bound masks or truncates)."""
    from rlzoo.losses.correction import SAFETY_BOUND

    lp = (-torch.rand(2, 200, generator=torch.Generator().manual_seed(0))).requires_grad_()
    gap = 0.5 if mode.startswith("sequence") else 100.0  # a token-level weight overflows at one token
    batch = PolicyBatch(logprobs=lp, old_logprobs=lp.detach(), rollout_logprobs=lp.detach() - gap,
                        advantages=torch.tensor([1.0, -1.0]), completion_mask=torch.ones(2, 200, dtype=torch.bool))
    out = rlzoo.get_loss("dapo", is_correction=mode, is_min=0.5, is_max=is_max)(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all() and lp.grad.abs().sum() > 0
    assert out.metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(SAFETY_BOUND), rel=1e-6)
    bounded = rlzoo.get_loss("dapo", is_correction=mode, is_min=0.5, is_max=3.0)(batch)
    assert bounded.metrics["sampling/importance_sampling_ratio/max"] == (0.0 if mode.endswith("mask") else 3.0)


def test_a_delta_at_or_below_the_upper_clip_warns():
    """ppo_clip's delta <= 1 + epsilon_high was taken silently: at delta 0.9 no A > 0 token gets a gradient even
    on-policy (helper trial: a run that cannot learn from its positive tokens). TRL recommends delta > 1 + epsilon;
    it stays a value TRL takes (numbers unchanged), with a warning naming both."""
    lp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0], dtype=torch.float64),
                              completion_mask=torch.ones(1, 1, dtype=torch.bool))
    with pytest.warns(UserWarning, match=r"^ppo_clip: delta=0.9 <= 1 \+ epsilon_high = 1.2 caps the ratio of A > 0 "
                                         r"tokens below the upper clip"):
        loss_fn = rlzoo.get_loss("two_sided", delta=0.9, beta=0.0)
    loss_fn(batch).loss.backward()
    assert lp.grad.item() == 0.0  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for delta in (None, 1.21, 4.0, math.inf):
            rlzoo.get_loss("two_sided", delta=delta)
        rlzoo.get_loss("ppo", epsilon_high=math.inf, delta=2.0)  # delta the only upper bound: meant
    with pytest.warns(UserWarning, match="delta=1.25") as record:
        rlzoo.get_loss("dapo", delta=1.25)  # epsilon_high 0.28
    assert record[0].filename == __file__  # the user's line (it was dataclasses.py's)


def test_unknown_is_correction_mode_lists_the_modes():
    """is_correction='bogus' raises a ValueError naming is_correction and listing the four modes."""
    with pytest.raises(ValueError, match="is_correction") as err:
        rlzoo.get_loss("grpo", is_correction="bogus")
    assert _names_all(str(err.value), ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"))


def test_unknown_part_names_in_composition_and_config():
    """PolicyLoss(surrogate='nope') and from_config with an unknown part name list the valid names; a config
    missing a part is a ValueError naming it; a non-part surrogate is a TypeError."""
    with pytest.raises(UnknownNameError, match="ppo_clip"):
        PolicyLoss(surrogate="nope")
    config = rlzoo.get_loss("grpo").to_config()
    config["surrogate"]["name"] = "ppo_clipp"
    with pytest.raises(UnknownNameError, match="ppo_clip"):
        PolicyLoss.from_config(config)
    config = rlzoo.get_loss("grpo").to_config()
    del config["aggregation"]
    with pytest.raises(ValueError, match="aggregation"):
        PolicyLoss.from_config(config)
    with pytest.raises(TypeError, match="surrogate"):
        PolicyLoss(surrogate=42)


# -------------------------------------------------------------------------------------- shapes, dtypes
@pytest.mark.parametrize("field", TOKEN_FIELDS)
def test_wrong_shape_names_the_field(field):
    """A [B, T] field of another shape raises a BatchError naming it."""
    for shape in ((B, T + 1), (B + 1, T), (B * T,), (B, T, 1)):
        bad = torch.full(shape, -0.5, dtype=torch.float64)
        with pytest.raises(BatchError, match=field):
            _batch(**{field: bad})


def test_wrong_advantages_shape_names_the_field():
    """advantages must be [B] or [B, T]."""
    for shape in ((B + 1,), (B, T + 1), (T,), (B, T, 1), ()):
        with pytest.raises(BatchError, match="advantages"):
            _batch(advantages=torch.zeros(shape, dtype=torch.float64))


@pytest.mark.parametrize("field", (*TOKEN_FIELDS, "advantages"))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_non_float_dtype_names_the_field(field, dtype):
    """Integer or bool log-probs / advantages / entropies raise a BatchError naming the field."""
    shape = (B,) if field == "advantages" else (B, T)
    with pytest.raises(BatchError, match=field):
        _batch(**{field: torch.zeros(shape, dtype=dtype)})


@pytest.mark.parametrize("field", (*TOKEN_FIELDS, "advantages", "completion_mask"))
def test_non_tensor_names_the_field(field):
    """A list or numpy-like value instead of a tensor raises a BatchError naming the field."""
    with pytest.raises(BatchError, match=field):
        _batch(**{field: [[0.0] * T] * B})


def test_logprobs_must_be_2d_and_non_empty():
    """logprobs is [B, T] with B >= 1 and T >= 1."""
    for bad in (torch.zeros(3), torch.zeros(0, 3), torch.zeros(2, 0), torch.zeros(1, 2, 3)):
        shape = bad.shape if bad.ndim == 2 else (2, 3)
        with pytest.raises(BatchError, match="logprobs"):
            PolicyBatch(logprobs=bad.double(), advantages=torch.zeros(shape[0]).double(),
                        completion_mask=torch.ones(shape, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8, torch.int8])
def test_non_bool_mask_is_rejected(dtype):
    """completion_mask must be torch.bool; a 0/1 float or integer mask is an error naming it (not a silent cast)."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=dtype)
    with pytest.raises(BatchError, match=r"completion_mask.*bool"):
        _batch(completion_mask=mask)


def test_mask_of_the_wrong_shape_is_rejected():
    with pytest.raises(BatchError, match="completion_mask"):
        _batch(completion_mask=torch.ones(B, T + 1, dtype=torch.bool))


# ---------------------------------------------------------------------------------- values at counted
@pytest.mark.parametrize("field", (*TOKEN_FIELDS, "advantages"))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_or_inf_at_a_counted_position_names_the_field(field, value):
    """NaN/inf where completion_mask is True raises a BatchError naming the field; at a masked position it is
    accepted (padding)."""
    base = _fields()[field].detach().clone()
    counted = base.clone()
    counted.view(-1)[0] = value  # (0, 0) is counted; advantages[0] belongs to a non-empty row
    with pytest.raises(BatchError, match=field):
        _batch(**{field: counted})
    if base.ndim == 2:
        masked = base.clone()
        masked[0, 2] = value  # masked position
        _batch(**{field: masked})


@given(batch=policy_batches(ref=True, rollout=True, entropies=True, old=True, min_counted=1),
       field=st.sampled_from((*TOKEN_FIELDS, "advantages")), value=st.sampled_from([math.nan, math.inf, -math.inf]),
       pick=st.integers(0, 10**6))
def test_any_counted_non_finite_value_is_caught(batch, field, value, pick):
    """For any batch, field and counted position, a NaN/inf there raises a BatchError naming the field."""
    mask = batch.completion_mask
    tensor = getattr(batch, field).detach().clone()
    where = mask if tensor.ndim == 2 else mask.any(-1)
    idx = where.nonzero()[pick % int(where.sum())]
    tensor[tuple(idx)] = value
    fields = {f: getattr(batch, f) for f in ("logprobs", "advantages", "completion_mask", "old_logprobs",
                                             "ref_logprobs", "rollout_logprobs", "entropies")}
    fields[field] = tensor
    with pytest.raises(BatchError, match=field):
        PolicyBatch(**fields)


@pytest.mark.parametrize("field", LOGPROB_FIELDS)
def test_positive_log_prob_at_a_counted_position_names_the_field(field):
    """Log-probs are <= 0: a positive value at a counted position raises; at a masked position it is padding.
    Entropies may be positive."""
    base = _fields()[field].detach().clone()
    bad = base.clone()
    bad[1, 0] = 0.25
    with pytest.raises(BatchError, match=field):
        _batch(**{field: bad})
    ok = base.clone()
    ok[1, 1] = 0.25
    _batch(**{field: ok})
    _batch(entropies=torch.full((B, T), 3.0, dtype=torch.float64))


def test_check_values_false_skips_only_the_value_checks():
    """check_values=False accepts NaN at counted positions (caller's guarantee) but still checks shapes."""
    nan = torch.full((B, T), math.nan, dtype=torch.float64)
    PolicyBatch(**_fields(old_logprobs=nan), check_values=False)
    with pytest.raises(BatchError, match="old_logprobs"):
        PolicyBatch(**_fields(old_logprobs=nan[:, :2]), check_values=False)


# ------------------------------------------------------------------------------------- hyper-parameters
@pytest.mark.parametrize(
    ("name", "option"),
    [("ppo", "epsilon_low"), ("ppo", "epsilon_high"), ("dapo", "epsilon_high"), ("cispo", "epsilon_low"),
     ("clip_cov", "epsilon_low"), ("gmpo", "epsilon_low"), ("gmpo", "epsilon_high"),
     ("dppo_tv", "epsilon_low"), ("dppo_kl", "epsilon_high"), ("gspo", "epsilon_low")],
)
@pytest.mark.parametrize("value", [-0.1, -1e-12, math.nan, math.inf, "0.2", None, True])
def test_invalid_epsilon_names_the_option(name, option, value):
    """epsilon < 0 (and NaN, inf, strings, None, bools) raise a ValueError naming the option.

    ppo_clip (ppo, dapo, gspo) accepts epsilon = inf, "no clip on that side" (M2PO's unclipped ratio):
    :func:`test_ppo_clip_infinite_epsilon_is_no_clip`.
    """
    if value == math.inf and name in ("ppo", "dapo", "gspo"):
        pytest.skip("ppo_clip accepts inf (no clip); see test_ppo_clip_infinite_epsilon_is_no_clip")
    with pytest.raises(ValueError, match=option):
        rlzoo.get_loss(name, **{option: value})


def test_ppo_clip_infinite_epsilon_is_no_clip():
    """epsilon_low = epsilon_high = inf is the unclipped surrogate -w A (value and gradient), not an error."""
    gen = torch.Generator().manual_seed(0)
    lp = (-torch.rand(3, 4, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    old = lp.detach() + torch.randn(3, 4, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, dtype=torch.float64, generator=gen)
    mask = torch.ones(3, 4, dtype=torch.bool)
    out = rlzoo.get_loss("ppo", epsilon_low=math.inf, epsilon_high=math.inf)(
        PolicyBatch(logprobs=lp, old_logprobs=old.clamp(max=0), advantages=adv, completion_mask=mask))
    expected = (-(lp - old.clamp(max=0)).exp() * adv[:, None]).sum(-1).div(4).mean()
    torch.testing.assert_close(out.loss, expected, **tol(torch.float64))
    (g,) = torch.autograd.grad(out.loss, lp, retain_graph=True)
    (g_ref,) = torch.autograd.grad(expected, lp)
    assert_grad_close(g, g_ref)


@pytest.mark.parametrize("value", [1.0, 0.99, 0.0, -3.0, math.nan])
def test_dual_clip_must_exceed_one(value):
    """dual_clip = c must be > 1 (Ye et al.: c > 1); c <= 1 raises a ValueError naming dual_clip."""
    with pytest.raises(ValueError, match="dual_clip"):
        rlzoo.get_loss("ppo", dual_clip=value)


@pytest.mark.parametrize(
    ("name", "options", "option"),
    [
        ("cispo", {"epsilon_high": -1.5}, "epsilon_high"),
        ("cispo", {"epsilon_low": 0.1, "epsilon_high": -0.5}, "epsilon_high"),
        ("two_sided", {"delta": 0.0}, "delta"),
        ("two_sided", {"delta": -1.0}, "delta"),
        ("grpo", {"beta": -0.01}, "beta"),
        ("sapo", {"tau_pos": 0.0}, "tau_pos"),
        ("sapo", {"tau_neg": -1.0}, "tau_neg"),
        ("clip_cov", {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        ("clip_cov", {"clip_cov_ratio": 1.5}, "clip_cov_ratio"),
        ("clip_cov", {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_ub"),
        ("kl_cov", {"kl_cov_ratio": 0.0}, "kl_cov_ratio"),
        ("kl_cov", {"ppo_kl_coef": -1.0}, "ppo_kl_coef"),
        ("dro", {"dro_beta": 0.0}, "dro_beta"),
        ("dppo_tv", {"clip_ratio_c": 0.0}, "clip_ratio_c"),
        ("grpo", {"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ("grpo", {"top_entropy_quantile": -0.1}, "top_entropy_quantile"),
        ("grpo", {"is_correction": "token_mask", "is_min": 2.0, "is_max": 1.0}, "is_min"),
        ("grpo", {"is_correction": "token_truncate", "is_min": None, "is_max": None}, "is_max"),
        ("grpo", {"is_correction": "token_mask", "is_max": -1.0}, "is_max"),
        ("grpo", {"use_bias_correction_kl": "yes"}, "use_bias_correction_kl"),
        ("grpo", {"max_completion_length": 0}, "max_completion_length"),
        ("grpo", {"max_completion_length": 12.5}, "max_completion_length"),
        ("grpo", {"max_completion_length": True}, "max_completion_length"),
        ("vespo", {"k_pos": math.nan}, "k_pos"),
        ("grpo", {"entropy_coef": math.inf}, "entropy_coef"),
    ],
)
def test_invalid_hyper_parameter_names_the_option(name, options, option):
    """Each invalid hyper-parameter raises a ValueError whose message names it."""
    with pytest.raises(ValueError, match=option):
        rlzoo.get_loss(name, **options)


@pytest.mark.parametrize("mode", ["sequence_truncate", "sequence_mask"])
def test_vespo_rejects_sequence_level_is_correction(mode):
    """VESPO folds the token IS weights into its sequence weight W (TRL raises for sequence modes too): a
    sequence-level mode would count the sequence weight once per token, so it is a ValueError naming
    is_correction; token modes are accepted."""
    with pytest.raises(ValueError, match="is_correction"):
        rlzoo.get_loss("vespo", is_correction=mode)
    rlzoo.get_loss("vespo", is_correction=mode.replace("sequence", "token"))


@pytest.mark.parametrize("name", ["vespo", "gpg", "dro"])
@pytest.mark.parametrize("level", ["sequence", "sequence_token", "geometric"])
def test_a_ratio_level_the_surrogate_does_not_read_warns(name, level):
    """VESPO, REINFORCE (gpg) and DRO read the token log-ratio (or none) themselves: another importance_sampling_level
    changes nothing but the ratio/* metrics, and said nothing (TRL 1.16 warns for loss_type="vespo"; its ratio
    metrics follow the level, so rlzoo keeps the level and warns). A KL penalty with use_bias_correction_kl
    multiplies by the level's weight: with it the level is read, and nothing is said."""
    surrogate = {"gpg": "reinforce"}.get(name, name)
    batch = _batch()
    token = rlzoo.get_loss(name)(batch)
    with pytest.warns(UserWarning, match=rf"^surrogate '{surrogate}' does not read the ratio level: "
                                         rf"importance_sampling_level='{level}' changes nothing but the ratio/\* "
                                         r"metrics \(leave it 'token'\)$"):
        other = rlzoo.get_loss(name, importance_sampling_level=level)
    assert torch.equal(other(batch).loss, token.loss)  # what the warning says
    with pytest.warns(UserWarning, match="does not read the ratio level") as record:
        rlzoo.get_loss(name, beta=0.1, importance_sampling_level=level)  # a KL penalty that does not read it
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        corrected = rlzoo.get_loss(name, beta=0.1, use_bias_correction_kl=True, importance_sampling_level=level)
    assert corrected.ratio.registered_name() == level


def test_an_unregistered_ratio_level_builds():
    """A ratio level defined without name= (a user's class) built a loss before the ratio-level warning asked for
    its registered name (LookupError); it builds, and is named by its class in the warning."""
    from rlzoo.losses import RatioLevel
    from rlzoo.losses.surrogate import TokenRatio

    class MyRatio(RatioLevel):
        def __call__(self, x):
            return TokenRatio()(x)

    assert isinstance(PolicyLoss(ratio=MyRatio(), surrogate="ppo_clip", aggregation="token-mean").ratio, MyRatio)
    with pytest.warns(UserWarning, match="importance_sampling_level='MyRatio' changes nothing"):
        PolicyLoss(ratio=MyRatio(), surrogate="reinforce", aggregation="token-mean")


def test_two_parts_of_the_same_kind_are_rejected():
    """PolicyLoss(penalties=(KL, KL)) is ambiguous: a ValueError."""
    from rlzoo.losses import KLPenalty

    with pytest.raises(ValueError, match=r"^PolicyLoss\.penalties holds two 'kl' parts \(kl\(beta=0\.1, .*\), "
                                         r"kl\(beta=0\.2, .*\)\); give one$"):
        PolicyLoss(surrogate="ppo_clip", penalties=(KLPenalty(beta=0.1), KLPenalty(beta=0.2)))


# ------------------------------------------------------------------------------------ missing fields
def _without(*names):
    return _batch(**{n: None for n in names})


@pytest.mark.parametrize(("name", "options"), [("grpo", {}), ("ppo", {"beta": 0.1}), ("two_sided", {})])
def test_missing_ref_logprobs_with_beta(name, options):
    """beta > 0 without ref_logprobs: a BatchError naming ref_logprobs (and beta = 0 needs none)."""
    loss_fn = rlzoo.get_loss(name, **options)
    with pytest.raises(BatchError, match=rf"^loss {name} needs PolicyBatch.ref_logprobs for .*; it is None$"):
        loss_fn(_without("ref_logprobs"))
    unnamed = dataclasses.replace(loss_fn, name=None)  # composed in Python: no double space where the name was
    with pytest.raises(BatchError, match=r"^the loss needs PolicyBatch.ref_logprobs for "):
        unnamed(_without("ref_logprobs"))
    rlzoo.get_loss(name, beta=0.0)(_without("ref_logprobs"))


@pytest.mark.parametrize("options", [{"top_entropy_quantile": 0.2}, {"entropy_coef": 0.01}])
def test_missing_entropies(options):
    """top_entropy_quantile < 1 or entropy_coef != 0 without entropies: a BatchError naming entropies."""
    with pytest.raises(BatchError, match="entropies"):
        rlzoo.get_loss("dapo", **options)(_without("entropies"))


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_missing_rollout_logprobs_with_is_correction(mode):
    """An IS correction without rollout_logprobs: a BatchError naming rollout_logprobs."""
    with pytest.raises(BatchError, match="rollout_logprobs"):
        rlzoo.get_loss("dapo", is_correction=mode, is_max=2.0)(_without("rollout_logprobs"))


@pytest.mark.parametrize("name", ["dr_grpo", "dppo_tv", "dppo_kl"])
def test_token_sum_norm_without_max_completion_length(name):
    """seq-mean-token-sum-norm needs the constant max_completion_length: calling without it is a ValueError
    naming max_completion_length (never a silent fallback to the padded length)."""
    loss_fn = rlzoo.get_loss(name)
    with pytest.raises(ValueError, match=rf"needs max_completion_length: get_loss\('{name}', max_completion_length=...\)$"):
        loss_fn(_batch())
    rlzoo.get_loss(name, max_completion_length=T)(_batch())
    unnamed = rlzoo.PolicyLoss(surrogate="ppo_clip", aggregation="seq-mean-token-sum-norm")  # said get_loss(None, ...)
    with pytest.raises(ValueError, match=r"needs max_completion_length: PolicyLoss\(..., max_completion_length=...\)$"):
        unnamed(_batch())


def test_an_aggregation_called_alone_names_the_input_it_lacks():
    """An aggregation called without a PolicyLoss (as rlzoo.advantages.value_loss calls one) checks the inputs its
    capabilities declare before it reduces: a ValueError naming the input, never a TypeError from float(None)."""
    loss, mask = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    counts = Normalizer.from_masks(mask)
    with pytest.raises(ValueError, match=r"^aggregation 'seq-mean-token-sum-norm' needs max_completion_length$"):
        aggregations.get("seq-mean-token-sum-norm")()(loss, mask, counts)
    with pytest.raises(ValueError, match=r"'prompt-mean' needs the group id of each row \(PolicyBatch.group_index\)"):
        aggregations.get("prompt-mean")()(loss, mask, counts)
    with pytest.raises(ValueError, match=r"'prompt-mean' needs Normalizer.group_num_tokens: build the normalizer"):
        aggregations.get("prompt-mean")()(loss, mask, counts, group_index=torch.tensor([0, 1]))
    batch = PolicyBatch(logprobs=-loss, advantages=torch.ones(2), completion_mask=mask,
                        group_index=torch.tensor([0, 1]))  # the public path: a normalizer without group counts
    with pytest.raises(ValueError, match="needs Normalizer.group_num_tokens"):
        rlzoo.get_loss("dapo", aggregation="prompt-mean")(batch, normalizer=counts)

    class Custom(aggregations.get("token-mean")):  # unregistered
        needs_max_completion_length = True  # declared, not checked by the member itself

    with pytest.raises(ValueError, match="needs max_completion_length"):
        Custom()(loss, mask, counts)


def test_loss_rejects_a_non_batch():
    """A loss takes a PolicyBatch, not a dict of tensors."""
    with pytest.raises(TypeError, match="PolicyBatch"):
        rlzoo.get_loss("grpo")(_fields())


@pytest.mark.parametrize("normalizer", [6, {"num_tokens": 6, "num_sequences": 2}])
def test_loss_rejects_a_non_normalizer(normalizer):
    """The normalizer is a rlzoo.Normalizer or None: a count or a dict of counts is a ValueError that says how to make
    one (it was an AttributeError from inside the pipeline)."""
    with runtime_type_checker_off(), pytest.raises(ValueError, match=r"normalizer must be a rlzoo.Normalizer .*got"):
        rlzoo.get_loss("dapo")(_batch(), normalizer=normalizer)


# ------------------------------------------------------------------------------------------ Normalizer
@pytest.mark.parametrize("field", ["num_tokens", "num_sequences"])
@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, -math.inf, "3", None, True, torch.ones(2)])
def test_normalizer_rejects_bad_counts(field, value):
    """Negative, NaN, inf, non-numeric or non-scalar counts raise a BatchError naming the count (an inf
    count would silently give a loss of 0)."""
    counts = {"num_tokens": 4, "num_sequences": 2, field: value}
    with pytest.raises(BatchError, match=field):
        Normalizer(**counts)


@pytest.mark.parametrize("field", ["num_tokens", "num_sequences"])
@pytest.mark.parametrize(
    "value",
    [torch.tensor(-1), torch.tensor([-3]), torch.tensor(-0.5, dtype=torch.float64), torch.tensor(math.nan),
     torch.tensor(math.inf), torch.tensor(-math.inf), torch.tensor(True), torch.tensor(2 + 0j)],
    ids=["int-neg", "int-neg-1elem", "f64-neg", "nan", "inf", "-inf", "bool", "complex"],
)
def test_normalizer_rejects_bad_cpu_tensor_counts(field, value):
    """A CPU tensor count is checked like a number: negative, NaN, inf, bool or complex is a BatchError naming
    the count (reading a CPU value costs no device sync)."""
    counts = {"num_tokens": 4, "num_sequences": 2, field: value}
    with pytest.raises(BatchError, match=field):
        Normalizer(**counts)


def test_normalizer_accepts_valid_counts_and_leaves_accelerator_tensors_unread():
    """Zero and positive counts pass as numbers or tensors (kept 0-d, on their device). A count on another
    device (meta stands in for CUDA) is not read: checking its value would be a device sync."""
    n = Normalizer(num_tokens=torch.tensor([0]), num_sequences=torch.tensor(3.0, dtype=torch.float64))
    assert n.num_tokens.shape == () and n.num_sequences.dtype == torch.float64
    assert Normalizer(num_tokens=0, num_sequences=2.5).num_tokens == 0.0
    meta = Normalizer(num_tokens=torch.empty((), device="meta"), num_sequences=torch.empty(1, device="meta"))
    assert meta.num_tokens.device.type == "meta" and meta.num_sequences.shape == ()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_normalizer_from_masks_rejects_non_bool_masks(dtype):
    """from_masks counts True entries: a 0/1 float or integer mask (which would be summed, not counted) is a
    BatchError naming the mask's position and torch.bool."""
    good = torch.ones(B, T, dtype=torch.bool)
    with pytest.raises(BatchError, match=r"mask 1 .*torch\.bool"):
        Normalizer.from_masks(good, torch.ones(B, T, dtype=dtype))


@pytest.mark.parametrize("shape", [(T,), (B, T, 1), ()])
def test_normalizer_from_masks_rejects_non_2d_masks(shape):
    """Masks are [B, T]: a 1-D or 3-D mask (whose any(dim=-1) would count something else than sequences) is a
    BatchError naming the mask and its shape."""
    with pytest.raises(BatchError, match=re.escape(f"mask 0 must have shape [B, T] (2 dims), got {shape}")):
        Normalizer.from_masks(torch.ones(shape, dtype=torch.bool))


def test_normalizer_from_masks_rejects_non_tensors_and_mixed_devices():
    """A list instead of a tensor, or masks on two devices, is a BatchError naming the mask."""
    good = torch.ones(B, T, dtype=torch.bool)
    with pytest.raises(BatchError, match="mask 0"):
        Normalizer.from_masks([[True] * T] * B)
    with pytest.raises(BatchError, match=r"mask 1 is on meta.*mask 0 is on cpu"):
        Normalizer.from_masks(good, torch.ones(B, T, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="at least one"):
        Normalizer.from_masks()


@pytest.mark.parametrize(("field", "shape"), [("completion_mask", (B, T)), ("advantages", (B,)),
                                               ("advantages", (B, T))])
def test_device_mismatch_of_mask_or_advantages_names_field_and_devices(field, shape):
    """completion_mask and advantages must be on logprobs' device: a BatchError naming the field and both
    devices (meta stands in for CUDA), raised before any value check."""
    dtype = torch.bool if field == "completion_mask" else torch.float64
    with pytest.raises(BatchError, match=rf"{field} is on meta but logprobs is on cpu"):
        _batch(**{field: torch.ones(shape, dtype=dtype, device="meta")})


# ------------------------------------------------------------------------------------------ masked_quantile
@pytest.mark.parametrize("q", [-0.1, -1e-12, 1.0 + 1e-9, 2.0, math.nan, math.inf, "0.5", None, True])
def test_masked_quantile_rejects_q_outside_the_unit_interval(q):
    """masked_quantile's q is a number in [0, 1]; anything else is a ValueError naming q (never a gather out of
    range or a silent extrapolation)."""
    values = torch.arange(6, dtype=torch.float64).view(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\bq\b"):
        rlzoo.losses.masked_quantile(values, mask, q)
    assert rlzoo.losses.masked_quantile(values, mask, 0.0) == 0.0
    assert rlzoo.losses.masked_quantile(values, mask, 1) == 5.0


def test_error_messages_say_what_was_expected():
    """Messages carry the expected shape / dtype, not only the field name."""
    with pytest.raises(BatchError, match=re.escape(str((B, T)))):
        _batch(old_logprobs=torch.zeros(B, T + 1, dtype=torch.float64))
    with pytest.raises(BatchError, match="torch.bool"):
        _batch(completion_mask=torch.ones(B, T))


# ------------------------------------------------------------------------------- options of inactive parts
@pytest.mark.parametrize(
    ("first", "then", "kept"),
    [
        ({"kl_estimator": "k1"}, {"beta": 0.1}, ("penalties", "kl_estimator", "k1")),
        ({"use_bias_correction_kl": True}, {"beta": 0.1}, ("penalties", "use_bias_correction_kl", True)),
        ({"beta": 0.0, "kl_estimator": "k2"}, {"beta": 0.3}, ("penalties", "kl_estimator", "k2")),
        ({"is_max": 2.0}, {"is_correction": "token_truncate"}, ("is_correction", "is_max", 2.0)),
        ({"is_min": 0.5, "is_max": None}, {"is_correction": "token_mask"}, ("is_correction", "is_min", 0.5)),
        ({"is_correction": "token_mask", "is_max": 5.0}, {"is_correction": None}, ("is_correction", "is_max", 5.0)),
    ],
)
def test_with_options_keeps_the_options_of_an_inactive_part(first, then, kept):
    """An option of a part that is inactive at the time (kl_estimator before beta, is_max before the IS mode,
    an IS mode switched off) is kept, not dropped, and applies once the part is switched on; it survives a
    config round trip; an inactive part does not run, is not required, and is not described."""
    slot, option, value = kept

    def part_of(loss):
        part = getattr(loss, slot)
        return part[0] if isinstance(part, tuple) else part

    for name in ("ppo", "grpo"):
        loss = rlzoo.get_loss(name, **first)
        rebuilt = PolicyLoss.from_config(loss.to_config())
        for candidate in (loss.with_options(**then), rebuilt.with_options(**then)):
            assert getattr(part_of(candidate), option) == value
    for loss in (rlzoo.get_loss("ppo", **first), rlzoo.get_loss("ppo", **first).with_options(**then)):
        if not part_of(loss).active:
            assert loss.required_fields() == frozenset() and loss.describe() == rlzoo.get_loss("ppo").describe()
            assert loss.options()[option] == getattr(part_of(loss), option)


@pytest.mark.parametrize("name", rlzoo.list_losses())
def test_options_pass_back_unchanged(name):
    """``options()`` is what ``with_options`` accepts: every preset's options, given back to ``get_loss`` (or one by
    one to ``with_options``), rebuild the same loss. The defaults options() reports for absent optional parts (TRL's
    is_correction / is_max and verl's rollout_is for the one IS slot, beta, entropy_coef...) add nothing; they once
    raised "holds one part" or added an inactive part, so that a loss rebuilt from its logged options differed."""
    loss = rlzoo.get_loss(name)
    assert rlzoo.get_loss(name, **loss.options()) == loss
    for option, value in loss.options().items():
        assert loss.with_options(**{option: value}) == loss, option
    for refused in ({"beta": False}, {"entropy_coef": False}):  # False == 0.0, but not a number: refused as before
        with pytest.raises(ValueError, match="must be a number, got bool"):
            loss.with_options(**refused)
    changed = loss.with_options(kl_estimator="k1", max_completion_length=8)  # a non-default one is still kept
    assert rlzoo.get_loss(name, **changed.options()) == changed and changed.options()["kl_estimator"] == "k1"


def test_a_custom_parts_simply_typed_options_are_checked_like_the_built_in_ones():
    """A part written in a notebook with ``scale: float`` and no ``check`` of its own got ``scale="2"`` through, to
    fail later inside torch; an option annotated float / int / bool / str (or that or None) is checked on
    construction with the built-in parts' message. Other annotations are left to the part's ``check``."""
    from rlzoo.losses import Surrogate

    class Scaled(Surrogate):  # no name=: not registered
        scale: float = 1.0
        steps: int | None = None
        label_: str = "x"
        spec: float | str = 1.0

        def __call__(self, x):  # pragma: no cover - never called
            raise AssertionError

    for options, message in [({"scale": "2"}, "scale must be a number, got str '2'"),
                             ({"scale": True}, "scale must be a number, got bool True"),
                             ({"steps": 2.0}, "steps must be an integer or None, got float 2.0"),
                             ({"label_": 3}, "label_ must be a string, got int 3")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            Scaled(**options)
    assert Scaled(scale=2, steps=None, spec="lower_upper").scale == 2  # an int is a number; a union with str: free

    class Unset(Surrogate):  # a default outside the annotation is the author's choice: not checked
        scale: float = None  # type: ignore[assignment]

        def __call__(self, x):  # pragma: no cover - never called
            raise AssertionError

    assert Unset().scale is None
    with pytest.raises(ValueError, match="must be True or False"):  # a built-in part keeps its own message
        rlzoo.get_advantage("gae", whiten=1)
