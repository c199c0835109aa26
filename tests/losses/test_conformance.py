"""Zoo-wide conformance of the presets: every registered preset (``rlzoo.list_losses()``) passes the same contract.

A new preset is tested here for free (optax's ``_common_test.py``); tests/losses/test_parts_conformance.py does
the same for every registered part of every slot. Every loss is built with ``max_completion_length=T`` (a
universal option), and the batch carries the optional fields the loss's ``required_fields()`` asks for (and,
at random, the others too, which must then be ignored). What a surrogate is at ratio 1 comes from its
declared ``on_policy`` (:class:`rlzoo.losses.OnPolicy`), never from a list of classes.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    aggregation_weights,
    batch_options_for,
    budget,
    example_field,
    fresh,
    kl_closed_form,
    loss_and_grads,
    policy_batches,
    supported_options,
    with_garbage,
)
from tolerances import tol

import rlzoo
from rlzoo.algorithms.cov import ClipCov
from rlzoo.algorithms.opd import Distillation
from rlzoo.algorithms.vapo import PositiveNLL
from rlzoo.batch import BatchError
from rlzoo.losses import EntropyBonus, KLPenalty, LossInputs, OnPolicy, PolicyLoss, presets

PRESETS = rlzoo.list_losses()
F64 = tol(torch.float64)
# Per-preset example budget (8 with the ci profile's 40): 19+ presets x each property keeps the default suite
# fast; `pytest -m slow` runs test_exhaustive (every property, every preset, 300 examples each).
FAST = budget(0.2)

CLIP_METRIC_PREFIXES = ("clip_ratio/", "dppo/")


def _loss(name: str, t: int, **options) -> PolicyLoss:
    return rlzoo.get_loss(name, max_completion_length=t, **options)


def _batch_for(data: st.DataObject, loss: PolicyLoss, **kw) -> rlzoo.PolicyBatch:
    return data.draw(policy_batches(**{**batch_options_for(loss), **kw}))


def _shape_b_t(data: st.DataObject) -> int:
    return data.draw(st.integers(1, 8), label="T")


# ------------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("name", PRESETS)
@FAST
@given(data=st.data())
def test_output_contract(name, data):
    """loss is a 0-d float64 tensor with a graph to logprobs; metrics are detached, finite 0-d tensors.

    ``ratio/mean``, ``ratio/min``, ``ratio/max`` are always reported; ``kl`` when beta > 0; ``entropy`` when
    entropies are given.
    """
    t = _shape_b_t(data)
    loss_fn = _loss(name, t)
    batch = _batch_for(data, loss_fn, t=t)
    torch.manual_seed(0)
    out = loss_fn(batch)
    assert isinstance(out, rlzoo.LossOutput)
    assert out.loss.shape == () and out.loss.dtype == torch.float64
    assert out.loss.requires_grad
    assert torch.isfinite(out.loss)
    for key in ("ratio/mean", "ratio/min", "ratio/max"):
        assert key in out.metrics
    if any(isinstance(p, KLPenalty) for p in loss_fn.penalties):
        assert "kl" in out.metrics
    if batch.entropies is not None:
        assert "entropy" in out.metrics
    for key, value in out.metrics.items():
        assert isinstance(key, str)
        assert isinstance(value, torch.Tensor), key
        assert value.shape == (), key
        assert not value.requires_grad, key
        assert value.grad_fn is None, key
        assert torch.isfinite(value), (key, value)


@pytest.mark.parametrize("name", PRESETS)
def test_float32_in_float32_out(name):
    """The loss and its gradient follow the dtype of logprobs (float32 here)."""
    g = torch.Generator().manual_seed(0)
    b, t = 3, 5
    mask = torch.arange(t) < torch.tensor([[5], [2], [0]])
    lp = (-torch.rand(b, t, generator=g)).requires_grad_(True)
    loss_fn = _loss(name, t)
    fields = {f: -torch.rand(b, t, generator=g) for f in ("old_logprobs", "ref_logprobs", "rollout_logprobs", "teacher_logprobs")}
    fields |= {f: example_field(f, b, t, dtype=torch.float32) for f in loss_fn.required_fields() if f not in fields}
    if batch_options_for(loss_fn).get("old") is False:
        del fields["old_logprobs"]
    batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, -0.5, 0.0]), completion_mask=mask,
                              entropies=torch.rand(b, t, generator=g), **fields)
    torch.manual_seed(0)
    out = loss_fn(batch)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and lp.grad.dtype == torch.float32
    assert torch.isfinite(lp.grad).all()


# --------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("name", PRESETS)
@FAST
@given(data=st.data())
def test_gradients_finite_and_exactly_zero_on_padding(name, data):
    """d loss / d logprobs is finite everywhere and exactly 0 where completion_mask is False."""
    t = _shape_b_t(data)
    loss_fn = _loss(name, t)
    batch = _batch_for(data, loss_fn, t=t)
    _, grad, _ = loss_and_grads(loss_fn, batch)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[~batch.completion_mask], torch.zeros_like(grad[~batch.completion_mask]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", PRESETS)
def test_an_overflowing_importance_weight_leaves_the_gradient_finite(name, dtype):
    """A counted token whose log-ratio is 95 (exp overflows float32, in which bf16 is computed) and negative
    advantages: every preset's gradient and ratio metrics are finite (a clip, dual clip or gate that selects another
    branch there once gave 0 * inf = NaN; verl clamps the log-ratio at 20)."""
    t = 3
    loss_fn = _loss(name, t)
    lp = torch.tensor([[-0.01, -1.0, -2.0], [-0.5, -0.25, -1.0]], dtype=dtype)
    old = lp.detach().clone()
    old[0, 0] = -95.0
    fields = {f: lp - 0.1 for f in ("ref_logprobs", "rollout_logprobs", "teacher_logprobs")}
    fields |= {f: example_field(f, 2, t, dtype=dtype) for f in loss_fn.required_fields() if f not in fields}
    if batch_options_for(loss_fn).get("old") is False:
        del fields["old_logprobs"]
    else:
        fields["old_logprobs"] = old
    batch = rlzoo.PolicyBatch(logprobs=lp.clone().requires_grad_(True), advantages=torch.tensor([-1.0, -0.5], dtype=dtype),
                              completion_mask=torch.ones(2, t, dtype=torch.bool), **fields)
    torch.manual_seed(0)
    out = loss_fn(batch)
    out.loss.backward()
    assert torch.isfinite(batch.logprobs.grad).all(), batch.logprobs.grad
    assert all(bool(torch.isfinite(v).all()) for k, v in out.metrics.items() if k.startswith("ratio/")), out.metrics


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finite_exp_is_exp_wherever_exp_is_finite(dtype):
    """functional.finite_exp, the importance weight's exp: at its bound and below, value and gradient are exactly
    torch.exp's; one step above (where exp overflows) the value is exp(bound), finite, and the gradient 0."""
    from rlzoo.losses.functional import finite_exp

    bound = torch.tensor(math.log(torch.finfo(dtype).max), dtype=dtype)
    while torch.isinf(torch.exp(bound)):  # the largest value whose exp is finite, found one representable step at a time
        bound = torch.nextafter(bound, torch.zeros((), dtype=dtype))
    above = torch.nextafter(bound, torch.tensor(math.inf, dtype=dtype))
    assert torch.isinf(torch.exp(above))
    x = torch.stack([torch.tensor(-3.0, dtype=dtype), bound, above]).requires_grad_(True)
    y = finite_exp(x)
    y.sum().backward()
    expected = torch.exp(x.detach()[:2])
    assert torch.equal(y.detach()[:2], expected) and torch.equal(x.grad[:2], expected)
    assert y[2].item() == expected[1].item() and x.grad[2].item() == 0.0


@pytest.mark.parametrize("name", PRESETS)
@FAST
@given(data=st.data())
def test_padding_is_inert(name, data):
    """NaN / +-inf / +-1e300 at every masked position of every input change neither loss, gradient nor metrics.

    (The advantages of fully masked rows are padding too.) Randomised parts draw with the same seed.
    """
    t = _shape_b_t(data)
    loss_fn = _loss(name, t)
    batch = _batch_for(data, loss_fn, t=t)
    dirty = with_garbage(batch, seed=data.draw(st.integers(0, 100), label="garbage seed"))
    clean_out, clean_grad, _ = loss_and_grads(loss_fn, batch, seed=1)
    dirty_out, dirty_grad, _ = loss_and_grads(loss_fn, dirty, seed=1)
    torch.testing.assert_close(dirty_out.loss, clean_out.loss, **F64)
    torch.testing.assert_close(dirty_grad, clean_grad, **F64)
    assert dirty_out.metrics.keys() == clean_out.metrics.keys()
    for key in clean_out.metrics:
        torch.testing.assert_close(dirty_out.metrics[key], clean_out.metrics[key], **F64, msg=key)


# ----------------------------------------------------------------------------------------- micro-batches
@pytest.mark.parametrize("name", PRESETS)
@FAST
@given(data=st.data())
def test_micro_batches_sum_to_the_full_batch(name, data):
    """sum_k loss(micro_k, normalizer=Normalizer.from_batch(full, loss=loss)) == loss(full), in value and gradient.

    Skipped for batch-coupled losses (``loss.batch_coupled``: clip_cov's covariance and random draw, kl_cov's
    covariance top-k are taken over the batch they are given, as verl does per micro-batch), which by
    construction depend on the split.
    """
    t = _shape_b_t(data)
    loss_fn = _loss(name, t)
    if loss_fn.batch_coupled:
        pytest.skip(f"{name} is batch-coupled: its token selection depends on the micro-batch (documented)")
    batch = _batch_for(data, loss_fn, t=t)
    size = data.draw(st.integers(1, batch.shape[0]), label="micro_batch_size")
    full_out, full_grad, _ = loss_and_grads(loss_fn, batch)

    whole = fresh(batch)
    normalizer = rlzoo.Normalizer.from_batch(whole, loss=loss_fn)
    total = sum(loss_fn(mb, normalizer=normalizer).loss for mb in whole.split(size))
    (grad,) = torch.autograd.grad(total, whole.logprobs)
    torch.testing.assert_close(total, full_out.loss, **F64)
    torch.testing.assert_close(grad, full_grad, **F64)


# ------------------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("max_completion_length", [None, 7])
def test_config_round_trip(name, max_completion_length):
    """PolicyLoss.from_config(json.loads(json.dumps(loss.to_config()))) == loss, and to_config is a fixed point."""
    loss_fn = rlzoo.get_loss(name, max_completion_length=max_completion_length)
    config = json.loads(json.dumps(loss_fn.to_config()))
    rebuilt = PolicyLoss.from_config(config)
    assert rebuilt == loss_fn
    assert rebuilt.to_config() == config
    assert rebuilt.name == name


@pytest.mark.parametrize("name", PRESETS)
def test_config_round_trip_with_every_option_part(name):
    """Round trip with the optional parts added (KL, IS correction, OPSM, entropy bonus/mask) and an inf option."""
    options = {"beta": 0.1, "kl_estimator": "k3+", "is_correction": "sequence_mask", "is_min": 0.5, "is_max": math.inf,
               "off_policy_mask_threshold": 0.3, "entropy_coef": 0.01, "top_entropy_quantile": 0.2,
               "max_completion_length": 9}
    loss_fn = rlzoo.get_loss(name, **supported_options(name, options))
    rebuilt = PolicyLoss.from_config(json.loads(json.dumps(loss_fn.to_config())))
    assert rebuilt == loss_fn
    assert rebuilt.is_correction is not None and rebuilt.is_correction.is_max == math.inf


@pytest.mark.parametrize("name", PRESETS)
def test_preset_card(name):
    """Every preset has a card: title, paper, formula (the builder's docstring), its components, and a
    recommended advantage estimator that is registered."""
    p = presets.get(name)
    assert p.title and p.paper and p.matches and p.formula
    card = p.card()
    assert card.startswith(f"{name}: ")
    for line in rlzoo.get_loss(name).describe().splitlines():
        assert line in card
    assert p.advantage in rlzoo.list_advantages()  # the trainer builds it by name
    # the files to read with the preset's own exist, and name every active part defined elsewhere
    root = Path(rlzoo.__file__).resolve().parents[1]
    reading = p.reading()
    assert all((root / path).is_file() for path in [p.source, *(path for path, _ in reading)])
    for part in rlzoo.get_loss(name).parts():
        if type(part).__module__ != p.build.__module__:
            assert any(path == type(part).__module__.replace(".", "/") + ".py" and part.registered_name() in what
                       for path, what in reading), (name, part)


@pytest.mark.parametrize("name", PRESETS)
def test_required_fields_are_enforced_and_sufficient(name):
    """A batch with exactly the required optional fields works; dropping one raises a BatchError naming it."""
    loss_fn = rlzoo.get_loss(name, max_completion_length=4)
    lp = torch.full((2, 4), -0.5, dtype=torch.float64, requires_grad=True)
    base = {"logprobs": lp, "advantages": torch.tensor([1.0, -1.0], dtype=torch.float64),
            "completion_mask": torch.ones(2, 4, dtype=torch.bool)}
    extra = {f: example_field(f, 2, 4) for f in loss_fn.required_fields()}
    torch.manual_seed(0)
    loss_fn(rlzoo.PolicyBatch(**base, **extra)).loss.backward()
    for missing in loss_fn.required_fields():
        partial = {k: v for k, v in extra.items() if k != missing}
        with pytest.raises(BatchError, match=missing):
            loss_fn(rlzoo.PolicyBatch(**base, **partial))


# ------------------------------------------------------------------------------------- first iteration
def _first_iteration_expectation(loss_fn: PolicyLoss, batch: rlzoo.PolicyBatch, kept: torch.Tensor):
    """Expected (loss or None, d loss / d logprobs) at ratio 1, computed from the definitions (not from rlzoo).

    Per-token value v at w = 1 (before penalties), from the surrogate's declared ``on_policy``:
      * ``MINUS_ADVANTAGE`` (PPO clip family, GSPO/LUSPO, GMPO, Clip-Cov, KL-Cov): v = -A (GMPO's -mean_t A of
        the row is -A for the per-sequence advantages drawn for token-mixing losses; KL-Cov's |log w| is 0);
      * ``MINUS_ADVANTAGE_LOGP`` (CISPO, GPG/REINFORCE, VESPO with phi(1) = 1, DPPO with an unmasked,
        untruncated ratio, DRO with a zero log-ratio penalty): v = -A logp;
      * ``REINFORCE_GRADIENT`` (SAPO, whose value -2A/tau is its own property test): only the gradient.
    Every one has d v / d logp = -A at w = 1, the REINFORCE gradient. ``kept`` marks the tokens whose policy
    term survives (Clip-Cov removes some). A rollout rejection removes tokens from the mask and the counts (the
    loss's ``loss_mask``); a rollout IS correction multiplies the policy term by its detached weight (the part's
    own output, checked against TRL / verl / AReaL elsewhere). Penalties add beta * KL (closed form),
    -entropy_coef * H, and VAPO's positive NLL (a mean over positive tokens, not aggregated). Everything is
    aggregated with the loss's aggregation written as weights c[b, t]; the loss is None when the surrogate does
    not promise its value.
    """
    mask = loss_fn.loss_mask(batch.completion_mask, logprobs=batch.logprobs, old_logprobs=batch.old_logprobs,
                             rollout_logprobs=batch.rollout_logprobs)
    kept = kept & mask
    lp = batch.logprobs.detach()
    zero = torch.zeros((), dtype=lp.dtype)
    adv = batch.advantages
    adv = adv.unsqueeze(-1).expand_as(lp) if adv.ndim == 1 else adv
    adv = torch.where(mask, adv, zero)
    rho = torch.ones_like(lp)
    if loss_fn.is_correction is not None and loss_fn.is_correction.active:
        rho = loss_fn.is_correction(LossInputs.from_batch(batch)).value
    promise = type(loss_fn.surrogate).on_policy
    if promise is OnPolicy.MINUS_ADVANTAGE:
        value = -adv
    elif promise is OnPolicy.MINUS_ADVANTAGE_LOGP:
        value = -adv * torch.where(mask, lp, zero)
    elif promise is OnPolicy.REINFORCE_GRADIENT:
        value = None
    else:
        pytest.fail(f"surrogate {loss_fn.surrogate.registered_name()!r} declares no on_policy promise")
    value = torch.where(kept, value * rho, zero) if value is not None else None
    grad_token = torch.where(kept, -adv * rho, zero)
    own = torch.zeros((), dtype=lp.dtype)
    own_grad = torch.zeros_like(lp)
    for part in loss_fn.penalties:
        if isinstance(part, KLPenalty):
            assert not part.use_bias_correction_kl
            kl, dkl = kl_closed_form(torch.where(mask, lp, zero), torch.where(mask, batch.ref_logprobs, zero),
                                     part.kl_estimator)
            value = value + part.beta * kl if value is not None else None
            grad_token = grad_token + part.beta * dkl
        elif isinstance(part, EntropyBonus):
            value = value - part.entropy_coef * torch.where(mask, batch.entropies.detach(), zero) if value is not None else None
        elif isinstance(part, PositiveNLL):
            positive = mask & (batch.rewards > 0).unsqueeze(-1)
            n_pos = max(int(positive.sum()), 1)
            own = own + part.positive_nll_coef * torch.where(positive, -lp, zero).sum() / n_pos
            own_grad = own_grad - part.positive_nll_coef * positive.to(lp.dtype) / n_pos
        elif isinstance(part, Distillation):  # at w = 1: lambda d (PPO of A = -sg[d]: value and gradient d)
            kl, dkl = kl_closed_form(torch.where(mask, lp, zero), torch.where(mask, batch.teacher_logprobs, zero),
                                     part.distillation_loss_mode)
            assert part.distillation_loss_max_clamp is None
            value = value + part.distillation_loss_coef * kl if value is not None else None
            grad_token = grad_token + part.distillation_loss_coef * (kl if part.distillation_policy_gradient else dkl)
        else:
            pytest.fail(f"unknown penalty {type(part).__name__}")
    c = aggregation_weights(mask, loss_fn.aggregation.registered_name(),
                            max_completion_length=loss_fn.max_completion_length)
    loss = None if value is None else (c * torch.where(mask, value, zero)).sum() + own
    return loss, c * grad_token + own_grad


@pytest.mark.parametrize("old", ["none", "equal"])
@pytest.mark.parametrize("name", PRESETS)
@FAST
@given(data=st.data())
def test_first_iteration_is_reinforce(name, old, data):
    """old_logprobs None (or == logprobs) => r == 1 exactly => every clip metric is 0, the loss equals the
    aggregated per-token value at r = 1 (see _first_iteration_expectation; -A for ratio surrogates, plus
    beta * KL) and the gradient equals REINFORCE's -agg(A * grad logp) (plus the KL's gradient).

    DeepSeekMath's eq. (3) with one update per exploration stage, vs. TRL's exp(logp - logp.detach()).
    Losses whose ratio level or surrogate ``mixes_tokens`` (gspo, luspo, gmpo) get per-sequence advantages:
    with per-token advantages their gradient mixes the advantages of a row (tested in test_properties). Clip-Cov removes
    random covariance-window tokens even at r = 1: the removed tokens are read off the gradient and checked
    to be candidates, as many as the rule allows; on the kept tokens the property holds.
    """
    t = _shape_b_t(data)
    loss_fn = _loss(name, t)
    token_wise = not (loss_fn.ratio.mixes_tokens or loss_fn.surrogate.mixes_tokens)
    batch = _batch_for(data, loss_fn, t=t, old="equal" if old == "equal" else False, min_counted=1,
                       per_token_advantages=None if token_wise else False)
    out, grad, _ = loss_and_grads(loss_fn, batch)
    metrics = out.metrics
    one = torch.ones((), dtype=torch.float64)
    for key in ("ratio/mean", "ratio/min", "ratio/max"):
        assert torch.equal(metrics[key], one), (key, metrics[key])
    for key, value in metrics.items():
        if key.startswith(CLIP_METRIC_PREFIXES):
            assert value == 0, (key, value)

    mask = batch.completion_mask
    kept = mask.clone()
    if isinstance(loss_fn.surrogate, ClipCov):
        kept = _clip_cov_kept(loss_fn.surrogate, batch, grad, metrics)
    expected_loss, expected_grad = _first_iteration_expectation(loss_fn, batch, kept)
    if expected_loss is not None:
        torch.testing.assert_close(out.loss, expected_loss, **F64)
    torch.testing.assert_close(grad, expected_grad, **F64)


def _clip_cov_kept(part: ClipCov, batch: rlzoo.PolicyBatch, grad: torch.Tensor, metrics) -> torch.Tensor:
    """Clip-Cov at r = 1: tokens with zero gradient but nonzero advantage were removed; check the rule.

    Candidates: counted tokens with lb < (A - mean A)(logp - mean logp) < ub (nothing is PPO-clipped at r = 1);
    exactly min(max(1, floor(ratio * N)), #candidates) are removed (``clip_cov/removed_mean * N``).
    """
    mask = batch.completion_mask
    lp = batch.logprobs.detach()
    adv = batch.advantages
    adv = adv.unsqueeze(-1).expand_as(lp) if adv.ndim == 1 else adv
    n = int(mask.sum())
    cov = (adv - adv[mask].mean()) * (lp - lp[mask].mean())
    candidates = mask & (cov > part.clip_cov_lb) & (cov < part.clip_cov_ub)
    expected_removed = min(max(1, math.floor(part.clip_cov_ratio * n)), int(candidates.sum()))
    removed_metric = metrics["clip_cov/removed_mean"] * n
    assert abs(float(removed_metric) - expected_removed) < 1e-9
    visibly_removed = mask & (grad == 0) & (adv != 0)
    assert not (visibly_removed & ~candidates).any()
    assert int(visibly_removed.sum()) <= expected_removed
    return mask & ~visibly_removed


# ------------------------------------------------------------------------------------------------ slow
HYPOTHESIS_PROPERTIES = [
    test_output_contract,
    test_gradients_finite_and_exactly_zero_on_padding,
    test_padding_is_inert,
    test_micro_batches_sum_to_the_full_batch,
    test_first_iteration_is_reinforce,
]


@pytest.mark.slow
@pytest.mark.parametrize("check", HYPOTHESIS_PROPERTIES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", PRESETS)
@settings(max_examples=300)
@given(data=st.data())
def test_exhaustive(check, name, data):
    """Every hypothesis property of this file for every preset, with 300 examples instead of the fast budget."""
    kwargs = {}
    if check is test_first_iteration_is_reinforce:
        kwargs["old"] = data.draw(st.sampled_from(["none", "equal"]), label="old")
    check.hypothesis.inner_test(name=name, data=data, **kwargs)


def test_every_algorithm_file_registers_presets_with_a_doctest():
    """rlzoo/algorithms/ holds every built-in preset (its card's source), each module registers at least one, has
    a doctest in its docstring, and is listed in the package's table (docs stay true without a hand list in
    the tests)."""
    import importlib

    sources = {presets.get(name).source for name in PRESETS}
    assert all(source.startswith("rlzoo/algorithms/") for source in sources), sources
    for module in rlzoo.algorithms.modules():
        assert f"rlzoo/algorithms/{module}.py" in sources, f"{module}.py registers no preset"
        assert ">>>" in (importlib.import_module(f"rlzoo.algorithms.{module}").__doc__ or ""), f"{module}: doctest"
        assert f"{module}.py" in (rlzoo.algorithms.__doc__ or ""), f"{module}.py is missing from the package table"
