"""Zoo-wide conformance of the parts: every registered member of every slot (``rlzoo.losses.policy_loss.SLOTS``)
and every registered alternative of every option (``Component.choices()``) passes the same contract.

Nothing here lists a part by name: a new ratio level, correction, surrogate, token weight, penalty or
aggregation, in rlzoo/losses/ or in an algorithm file, is tested as soon as it is registered (optax's
``_common_test.py``). A member is tested with its ``example_options`` (what makes an optional part active),
alone in its slot of a plain composition (PPO clip, token ratio, token-mean), against properties that hold
for any member of the slot:

* the output contract, padding inertness, finite gradients that are exactly 0 on padding, and micro-batch
  additivity with the full batch's Normalizer (unless ``batch_coupled``);
* ratio levels and surrogates: their declared first-iteration promise (ratio 1, ``OnPolicy``);
* rejections: no sampler/trainer mismatch rejects nothing; a rejection is the same loss on the batch whose
  completion mask lost the rejected tokens (and the counts with them); the keep mask is detached and only
  removes tokens;
* corrections: no sampler/trainer mismatch (``rollout_logprobs == old_logprobs``) means no correction;
* token weights: a detached, non-negative, finite per-token multiplier of the per-token loss;
* penalties: an additive per-token term, aggregated like the policy term;
* aggregations: linear in the per-token loss, blind to masked positions, additive over any split of the rows;
* surrogates that declare ``uses_ratio`` False: independent of ``old_logprobs``.
"""

import dataclasses
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    aggregation_weights,
    batch_options_for,
    budget,
    example_field,
    fresh,
    loss_and_grads,
    masks,
    policy_batches,
    runtime_type_checker_off,
    with_garbage,
)
from tolerances import tol

import rlzoo
from rlzoo.batch import PolicyBatch
from rlzoo.losses import LossInputs, OnPolicy, Part, PolicyLoss, PPOClip, Surrogate
from rlzoo.losses.policy_loss import SLOTS

F64 = tol(torch.float64)
FAST = budget(0.1)
MEMBERS = [(slot, name, cls) for slot in SLOTS for name, cls in slot.base.registry.items()]
IDS = [f"{slot.field}/{name}" for slot, name, _ in MEMBERS]
ALTERNATIVES = [
    (slot, cls, option, alternative)
    for slot, _, cls in MEMBERS
    for option, registry in cls.choices().items()
    for alternative in registry.names()
]
ALT_IDS = [f"{cls.registered_name()}.{option}={alt}" for _, cls, option, alt in ALTERNATIVES]


def _member(cls: type[Part], **options) -> Part:
    return cls(**{**cls.example_options, **options})


def _compose(slot, part: Part, t: int) -> PolicyLoss:
    """A plain loss (PPO clip, token ratio, token-mean) with ``part`` in its slot."""
    fields = {"surrogate": PPOClip(), "aggregation": "token-mean", "max_completion_length": t}
    fields[slot.field] = (part,) if slot.many else part
    return PolicyLoss(**fields)


def _batch(data: st.DataObject, loss: PolicyLoss, **kw) -> PolicyBatch:
    return data.draw(policy_batches(**{**batch_options_for(loss), **kw}))


def _mixes_tokens(loss: PolicyLoss) -> bool:
    return loss.ratio.mixes_tokens or loss.surrogate.mixes_tokens


# ----------------------------------------------------------------------------------------- declarations
@pytest.mark.parametrize(("slot", "name", "cls"), MEMBERS, ids=IDS)
def test_member_declarations(slot, name, cls):
    """A registered part is a frozen keyword-only dataclass of its slot, registered under its name, active
    with its example options, documented (every option named, a source cited), and round-trips its config."""
    assert issubclass(cls, slot.base) and cls.registered_name() == name and slot.base.registry.get(name) is cls
    part = _member(cls)
    assert part.active, f"{name}: example_options must make the part active"
    assert dataclasses.is_dataclass(part)
    if cls.option_names():
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, cls.option_names()[0], None)
    doc = cls.__doc__ or ""
    assert doc.strip(), f"{name} has no docstring"
    assert ("arXiv" in doc) or ("verl" in doc) or ("TRL" in doc), f"{name}: cite a source (arXiv id / reference)"
    for option in cls.option_names():
        assert option in doc, f"{name}: the docstring does not document option {option!r}"
    config = json.loads(json.dumps(part.to_config()))
    assert type(part).from_config(slot.base.registry, config) == part
    assert part.describe().startswith(f"{name}(")
    if issubclass(cls, Surrogate):
        assert cls.on_policy is not OnPolicy.UNDECLARED, f"{name}: declare on_policy (rlzoo.losses.OnPolicy)"


@pytest.mark.parametrize(("slot", "name", "cls"), MEMBERS, ids=IDS)
def test_member_options_reach_it_through_with_options(slot, name, cls):
    """Every option of a registered part is a loss option, and ``with_options`` sets it on the part."""
    part = _member(cls)
    loss = _compose(slot, part, 4)
    for option, value in part.options().items():
        assert option in loss.options()
        member = getattr(loss.with_options(**{option: value}), slot.field)
        assert (member[0] if slot.many else member) == part


@pytest.mark.parametrize(("slot", "name", "cls"), MEMBERS, ids=IDS)
def test_a_part_in_the_wrong_slot_is_refused(slot, name, cls):
    """Slots are typed: a part given to another slot is a TypeError naming the slot."""
    part = _member(cls)
    for other in SLOTS:
        if other.base is slot.base:
            continue
        fields = {"surrogate": PPOClip(), other.field: (part,) if other.many else part}
        with runtime_type_checker_off(), pytest.raises(TypeError, match=f"PolicyLoss.{other.field} must be a"):
            PolicyLoss(**fields)


@pytest.mark.parametrize("slot", [s for s in SLOTS if s.many], ids=lambda s: s.field)
def test_a_tuple_slot_given_one_part_a_name_or_none_says_to_write_a_tuple(slot):
    """A single part, a single name or None in a tuple slot is a TypeError naming the field and the tuple to
    write (a name was read letter by letter, a part was 'not iterable')."""
    name = slot.base.registry.names()[0]
    part = slot.base.registry.get(name)()
    for value, hint in ((name, f"{slot.field}=({name!r},)"), (part, f"{slot.field}=({type(part).__name__}(...),)"),
                        (None, f"{slot.field}=() for none")):
        with runtime_type_checker_off(), pytest.raises(TypeError) as info:
            PolicyLoss(surrogate=PPOClip(), **{slot.field: value})
        assert str(info.value).startswith(f"PolicyLoss.{slot.field} takes a tuple of {slot.base.__name__} parts")
        assert str(info.value).endswith(hint)
    with runtime_type_checker_off():  # a list is taken as the tuple it spells
        assert getattr(PolicyLoss(surrogate=PPOClip(), **{slot.field: [name]}), slot.field) == (part,)


@pytest.mark.parametrize("slot", [s for s in SLOTS if s.swap_option], ids=lambda s: s.swap_option)
def test_a_bad_value_of_a_swap_option_names_the_option(slot):
    """get_loss("grpo", importance_sampling_level=None) names the option the user wrote, not the loss's field."""
    with runtime_type_checker_off(), pytest.raises(TypeError, match=f"^{slot.swap_option} must be an? "
                                                   f"{slot.base.__name__} part or one of the registered names .*"
                                                   "got NoneType$"):
        rlzoo.get_loss("grpo", **{slot.swap_option: None})


# ----------------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize(("slot", "name", "cls"), MEMBERS, ids=IDS)
@FAST
@given(data=st.data())
def test_member_contract_and_inert_padding(slot, name, cls, data):
    """0-d finite float64 loss with a graph; detached finite 0-d metrics; finite gradients, exactly 0 on padding;
    garbage (NaN, inf, 1e300) at masked positions changes neither loss, gradient nor metrics."""
    t = data.draw(st.integers(1, 7), label="T")
    loss = _compose(slot, _member(cls), t)
    batch = _batch(data, loss, t=t)
    out, grad, _ = loss_and_grads(loss, batch, seed=1)
    assert out.loss.shape == () and out.loss.dtype == torch.float64 and out.loss.requires_grad
    assert torch.isfinite(out.loss)
    for key, value in out.metrics.items():
        assert value.shape == () and not value.requires_grad and torch.isfinite(value), key
    assert torch.isfinite(grad).all()
    padding = ~batch.completion_mask
    assert torch.equal(grad[padding], torch.zeros_like(grad[padding]))
    dirty, dirty_grad, _ = loss_and_grads(loss, with_garbage(batch, seed=2), seed=1)
    torch.testing.assert_close(dirty.loss, out.loss, **F64)
    torch.testing.assert_close(dirty_grad, grad, **F64)
    assert dirty.metrics.keys() == out.metrics.keys()
    for key in out.metrics:
        torch.testing.assert_close(dirty.metrics[key], out.metrics[key], **F64, msg=key)


UNCOUPLED = [m for m in MEMBERS if not _member(m[2]).couples_batch]


@pytest.mark.parametrize(("slot", "name", "cls"), UNCOUPLED, ids=[f"{m[0].field}/{m[1]}" for m in UNCOUPLED])
@FAST
@given(data=st.data())
def test_member_micro_batches_sum_to_the_full_batch(slot, name, cls, data):
    """sum_k loss(micro_k, normalizer=Normalizer.from_batch(full, loss=loss)) == loss(full), value and gradient
    (the counts are over the loss's own loss_mask: rejected tokens leave them)."""
    t = data.draw(st.integers(1, 7), label="T")
    loss = _compose(slot, _member(cls), t)
    batch = _batch(data, loss, t=t)
    full, full_grad, _ = loss_and_grads(loss, batch)
    whole = fresh(batch)
    normalizer = rlzoo.Normalizer.from_batch(whole, loss=loss)
    size = data.draw(st.integers(1, batch.shape[0]), label="micro_batch_size")
    total = sum(loss(mb, normalizer=normalizer).loss for mb in whole.split(size))
    (grad,) = torch.autograd.grad(total, whole.logprobs)
    torch.testing.assert_close(total, full.loss, **F64)
    torch.testing.assert_close(grad, full_grad, **F64)


# ------------------------------------------------------------------------------------------- per slot
RATIO_AND_SURROGATES = [m for m in MEMBERS if m[0].field in ("ratio", "surrogate")]


@pytest.mark.parametrize(("slot", "name", "cls"), RATIO_AND_SURROGATES,
                         ids=[f"{m[0].field}/{m[1]}" for m in RATIO_AND_SURROGATES])
@FAST
@given(data=st.data())
def test_first_iteration_promise(slot, name, cls, data):
    """old_logprobs None: the ratio is exactly 1 (ratio/min == ratio/max == 1); the gradient is REINFORCE's
    -c A, and the value what the surrogate's ``on_policy`` promises (-A, or -A logp). Batch-coupled surrogates
    that drop tokens (Clip-Cov) are held to it on the tokens that keep a gradient."""
    t = data.draw(st.integers(1, 6), label="T")
    loss = _compose(slot, _member(cls), t)
    batch = _batch(data, loss, t=t, old=False, min_counted=1,
                   per_token_advantages=False if _mixes_tokens(loss) else None)
    out, grad, _ = loss_and_grads(loss, batch)
    one = torch.ones((), dtype=torch.float64)
    assert torch.equal(out.metrics["ratio/min"], one) and torch.equal(out.metrics["ratio/max"], one)
    mask = batch.completion_mask
    adv = batch.advantages
    adv = (adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv) * mask
    c = aggregation_weights(mask, "token-mean")
    kept = mask & ~((grad == 0) & (adv != 0)) if loss.batch_coupled else mask
    torch.testing.assert_close(grad * kept, -c * adv * kept, **F64)
    promise = type(loss.surrogate).on_policy
    lp = torch.where(mask, batch.logprobs.detach(), 0.0)
    if promise is OnPolicy.MINUS_ADVANTAGE:
        torch.testing.assert_close(out.loss, (-c * adv * kept).sum(), **F64)
    elif promise is OnPolicy.MINUS_ADVANTAGE_LOGP:
        torch.testing.assert_close(out.loss, (-c * adv * lp * kept).sum(), **F64)


CORRECTIONS = [m for m in MEMBERS if m[0].field == "is_correction"]


@pytest.mark.parametrize(("slot", "name", "cls"), CORRECTIONS, ids=[m[1] for m in CORRECTIONS])
@FAST
@given(data=st.data())
def test_no_mismatch_means_no_correction(slot, name, cls, data):
    """rollout_logprobs == old_logprobs (the sampler is the trainer's policy): the corrected loss equals the
    uncorrected one, in value and gradient."""
    t = data.draw(st.integers(1, 6), label="T")
    loss = _compose(slot, _member(cls), t)
    batch = data.draw(policy_batches(t=t, old=True))
    batch = fresh(batch, rollout_logprobs=batch.old_logprobs.clone())
    plain = dataclasses.replace(loss, is_correction=None)
    a, ga, _ = loss_and_grads(loss, batch)
    b, gb, _ = loss_and_grads(plain, batch)
    torch.testing.assert_close(a.loss, b.loss, **F64)
    torch.testing.assert_close(ga, gb, **F64)


def _stage_inputs(loss: PolicyLoss, batch: PolicyBatch) -> LossInputs:
    x = LossInputs.from_batch(fresh(batch), normalizer=rlzoo.Normalizer.from_batch(batch, loss=loss))
    return x.with_weights(loss.ratio(x).value)


REJECTIONS = [m for m in MEMBERS if m[0].field == "rejections"]


@pytest.mark.parametrize(("slot", "name", "cls"), REJECTIONS, ids=[m[1] for m in REJECTIONS])
@FAST
@given(data=st.data())
def test_no_mismatch_rejects_nothing(slot, name, cls, data):
    """rollout_logprobs == old_logprobs: every token is kept (loss_mask is the completion mask) and the loss equals
    the loss without the rejection, in value and gradient."""
    t = data.draw(st.integers(1, 6), label="T")
    loss = _compose(slot, _member(cls), t)
    batch = data.draw(policy_batches(t=t, old=True))
    batch = fresh(batch, rollout_logprobs=batch.old_logprobs.clone())
    mask = batch.completion_mask
    assert torch.equal(loss.loss_mask(mask, old_logprobs=batch.old_logprobs, rollout_logprobs=batch.rollout_logprobs),
                       mask)
    plain = dataclasses.replace(loss, rejections=())
    a, ga, _ = loss_and_grads(loss, batch)
    b, gb, _ = loss_and_grads(plain, batch)
    torch.testing.assert_close(a.loss, b.loss, **F64)
    torch.testing.assert_close(ga, gb, **F64)


@pytest.mark.parametrize(("slot", "name", "cls"), REJECTIONS, ids=[m[1] for m in REJECTIONS])
@FAST
@given(data=st.data(), bypass=st.booleans())
def test_rejection_is_the_loss_on_the_kept_tokens(slot, name, cls, data, bypass):
    """keep = the part's detached mask; loss_mask(...) = completion_mask & keep (a subset). Decoupled mode: the
    loss equals the loss without the rejection on the batch whose completion mask is loss_mask (counts
    included), for every aggregation. Bypass mode: the counts and the penalties keep the rejected tokens, the
    policy term drops them (loss_mask is the completion mask)."""
    t = data.draw(st.integers(1, 6), label="T")
    aggregation = data.draw(st.sampled_from(rlzoo.losses.aggregations.names()), label="aggregation")
    loss = _compose(slot, _member(cls), t).with_options(aggregation=aggregation, bypass_mode=bypass, beta=0.1)
    batch = data.draw(policy_batches(**{**batch_options_for(loss), "groups": True}, t=t, log_ratio_scale=0.5))
    mask = batch.completion_mask
    kept = loss.loss_mask(mask, logprobs=batch.logprobs, old_logprobs=batch.old_logprobs,
                          rollout_logprobs=batch.rollout_logprobs)
    assert not kept.requires_grad and not (kept & ~mask).any()
    plain = dataclasses.replace(loss, rejections=())
    out, grad, _ = loss_and_grads(loss, batch)
    if not bypass:
        want, want_grad, _ = loss_and_grads(plain, fresh(batch, completion_mask=kept))
    else:
        assert torch.equal(kept, mask)
        x = LossInputs.from_batch(batch, old_logprobs=batch.rollout_logprobs, bypass_mode=True)
        keep = _member(cls)(x).value & mask
        policy_only = dataclasses.replace(plain, penalties=())
        normalizer = rlzoo.Normalizer.from_batch(batch, loss=loss)
        penalty = dataclasses.replace(plain, surrogate=_ZeroSurrogate())
        a, ga, _ = loss_and_grads(policy_only, fresh(batch, completion_mask=keep), normalizer)
        b, gb, _ = loss_and_grads(penalty, batch, normalizer)
        want, want_grad = a.loss + b.loss, ga + gb
        want = want.detach()
    torch.testing.assert_close(out.loss.detach(), want if bypass else want.loss.detach(), **F64)
    torch.testing.assert_close(grad, want_grad, **F64)


class _ZeroSurrogate(Surrogate):
    """A policy term of 0 (unregistered; isolates the penalties in a test)."""

    on_policy = OnPolicy.MINUS_ADVANTAGE

    def __call__(self, x: LossInputs):
        return torch.zeros_like(x.logprobs), {}


RATIO_FREE = [m for m in MEMBERS if m[0].field == "surrogate" and not m[2].uses_ratio]


@pytest.mark.parametrize(("slot", "name", "cls"), RATIO_FREE, ids=[m[1] for m in RATIO_FREE])
@FAST
@given(data=st.data())
def test_a_surrogate_that_ignores_the_ratio_ignores_old_logprobs(slot, name, cls, data):
    """``uses_ratio`` False (bypass mode applies the rollout IS weight to it): loss and gradient do not depend on
    old_logprobs."""
    t = data.draw(st.integers(1, 6), label="T")
    loss = _compose(slot, _member(cls), t)
    batch = _batch(data, loss, t=t, old=True)
    a, ga, _ = loss_and_grads(loss, batch)
    b, gb, _ = loss_and_grads(loss, fresh(batch, old_logprobs=None))
    torch.testing.assert_close(a.loss, b.loss, **F64)
    torch.testing.assert_close(ga, gb, **F64)


WEIGHTS = [m for m in MEMBERS if m[0].field == "weights"]


@pytest.mark.parametrize(("slot", "name", "cls"), WEIGHTS, ids=[m[1] for m in WEIGHTS])
@FAST
@given(data=st.data())
def test_token_weight_multiplies_the_per_token_loss(slot, name, cls, data):
    """A token weight is detached, finite and >= 0, and multiplies the per-token loss: with token-mean,
    loss = sum c m l and d loss / d logp = m * (d loss_without / d logp)."""
    t = data.draw(st.integers(1, 6), label="T")
    part = _member(cls)
    loss = _compose(slot, part, t)
    batch = _batch(data, loss, t=t)
    m = part(_stage_inputs(loss, batch)).value
    assert not m.requires_grad and torch.isfinite(m).all() and (m >= 0).all()
    plain = dataclasses.replace(loss, weights=())
    _, g_plain, _ = loss_and_grads(plain, batch, seed=4)
    _, g_with, _ = loss_and_grads(loss, batch, seed=4)
    torch.testing.assert_close(g_with, m * g_plain, **F64)


PENALTIES = [m for m in MEMBERS if m[0].field == "penalties"]


@pytest.mark.parametrize(("slot", "name", "cls"), PENALTIES, ids=[m[1] for m in PENALTIES])
@FAST
@given(data=st.data(), aggregation=st.sampled_from(rlzoo.losses.aggregations.names()))
def test_penalty_is_an_aggregated_additive_term(slot, name, cls, data, aggregation):
    """loss(with the penalty) - loss(without) == aggregation(term), for every registered aggregation (the sum of
    the term for a penalty that normalises itself, ``aggregated`` False)."""
    t = data.draw(st.integers(1, 6), label="T")
    part = _member(cls)
    loss = _compose(slot, part, t).with_options(aggregation=aggregation)
    batch = _batch(data, loss, t=t)
    plain = dataclasses.replace(loss, penalties=())
    term = part(_stage_inputs(loss, batch)).value.detach()
    mask = batch.completion_mask
    if cls.aggregated:
        expected = loss.aggregation(term, mask, rlzoo.Normalizer.from_batch(batch), t, batch.group_index)
    else:  # normalised by its own counts: the pipeline adds its sum
        expected = torch.where(mask, term, 0.0).sum()
    with torch.no_grad():
        diff = loss(fresh(batch)).loss - plain(fresh(batch)).loss
    torch.testing.assert_close(diff, expected, **F64)


AGGREGATIONS = [m for m in MEMBERS if m[0].field == "aggregation"]


@pytest.mark.parametrize(("slot", "name", "cls"), AGGREGATIONS, ids=[m[1] for m in AGGREGATIONS])
@FAST
@given(data=st.data())
def test_aggregation_is_linear_masked_and_additive_over_rows(slot, name, cls, data):
    """agg(a l1 + l2) == a agg(l1) + agg(l2); values at masked positions are never read (NaN included); with the
    full batch's Normalizer, the aggregations of any split of the rows sum to the full one."""
    agg = _member(cls)
    mask = data.draw(masks())
    b, t = mask.shape
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    l1, l2 = (torch.randn(b, t, generator=g, dtype=torch.float64) for _ in range(2))
    a = data.draw(st.floats(-3.0, 3.0), label="a")
    groups = torch.randint(0, max(1, b // 2), (b,), generator=g)
    norm = rlzoo.Normalizer.from_masks(mask, group_index=[groups] if cls.needs_group_index else None)
    mcl = t + 2

    def apply(values, sel=slice(None)):
        return agg(values[sel], mask[sel], norm, mcl, groups[sel])

    torch.testing.assert_close(apply(a * l1 + l2), a * apply(l1) + apply(l2), **F64)
    torch.testing.assert_close(apply(torch.where(mask, l1, torch.nan)), apply(l1), **F64)
    rows = torch.tensor(data.draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    parts = sum(apply(l1, sel) for sel in (rows, ~rows) if sel.any())
    torch.testing.assert_close(parts, apply(l1), **F64)


# ------------------------------------------------------------------------------------------ alternatives
@pytest.mark.parametrize(("slot", "cls", "option", "alternative"), ALTERNATIVES, ids=ALT_IDS)
def test_every_registered_alternative_works(slot, cls, option, alternative):
    """Every registered alternative of an option (IS modes, KL estimators, ...) builds a part that runs in a loss,
    or is refused with a ValueError naming the option (a part may take a subset)."""
    try:
        part = _member(cls, **{option: alternative})
    except ValueError as err:
        assert option in str(err)
        return
    loss = _compose(slot, part, 4)
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 4, generator=g, dtype=torch.float64) - 0.01
    fields = {f: example_field(f, 3, 4, seed=i) for i, f in enumerate(sorted(loss.required_fields()))}
    batch = PolicyBatch(logprobs=lp.requires_grad_(True), advantages=torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64),
                        completion_mask=torch.tensor([[True] * 4, [True, True, False, False], [True] + [False] * 3]),
                        **fields)
    out = loss(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all()
