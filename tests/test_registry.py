"""Registry[T] (rlzoo/registry.py) and user extension through the registries: a user surrogate and a user
preset work through rlzoo.get_loss and PolicyLoss composition, and disappear when the scope ends."""

import dataclasses
import json
import re

import pytest
import torch
from strategies import runtime_type_checker_off

import rlzoo
from rlzoo import PolicyBatch, Registry, UnknownNameError
from rlzoo.losses import (
    PartOutput,
    PolicyLoss,
    Surrogate,
    TokenWeight,
    aggregations,
    kl_estimators,
    preset,
    presets,
    ratio_levels,
    surrogates,
    token_weights,
)
from rlzoo.registry import Component, choice


def test_register_get_names_contains_len():
    """register returns the object unchanged; get returns it; names() is sorted; `in` and len work."""
    reg = Registry[object]("widget")
    a, b = object(), object()
    assert reg.register("zeta")(a) is a
    assert reg.register("alpha")(b) is b
    assert reg.get("zeta") is a and reg.get("alpha") is b
    assert reg.names() == ["alpha", "zeta"]
    assert reg.items() == [("alpha", b), ("zeta", a)]
    assert "alpha" in reg and "beta" not in reg and len(reg) == 2
    assert "widget" in repr(reg)


def test_duplicate_registration_raises_and_keeps_the_first():
    """Registries never overwrite silently."""
    reg = Registry[int]("number")
    reg.register("one")(1)
    with pytest.raises(ValueError, match="'one' is already registered"):
        reg.register("one")(2)
    assert reg.get("one") == 1


@pytest.mark.parametrize("bad", ["", None, 3])
def test_names_must_be_non_empty_strings(bad):
    with runtime_type_checker_off(), pytest.raises(ValueError, match="non-empty string"):
        Registry[int]("number").register(bad)


def test_unknown_name_is_a_key_and_value_error_listing_the_names():
    """get('nope') raises UnknownNameError: catchable as KeyError and as ValueError; str() is the plain message
    (no KeyError repr quotes) naming the kind and listing every valid name."""
    reg = Registry[int]("number")
    reg.register("one")(1)
    reg.register("two")(2)
    with pytest.raises(UnknownNameError) as err:
        reg.get("three")
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert str(err.value) == "unknown number 'three'; valid names: one, two"
    with runtime_type_checker_off(), pytest.raises(KeyError):
        reg.get(["unhashable"])


def test_scoped_registrations_are_undone_even_on_error():
    """Inside scoped() registrations are temporary; the registry is restored on exit, exception or not."""
    reg = Registry[int]("number")
    reg.register("one")(1)
    with reg.scoped() as same:
        assert same is reg
        reg.register("two")(2)
        assert reg.names() == ["one", "two"]
    assert reg.names() == ["one"]
    with pytest.raises(RuntimeError), reg.scoped():
        reg.register("three")(3)
        raise RuntimeError
    assert reg.names() == ["one"]


def test_zoo_registries_hold_the_documented_names():
    """The slots named in DESIGN section 2 are registered."""
    assert set(ratio_levels.names()) >= {"token", "sequence", "sequence_token"}
    assert set(aggregations.names()) == {"token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                                         "seq-mean-token-sum-norm", "prompt-mean"}
    assert set(kl_estimators.names()) >= {"k1", "k2", "k3", "abs", "k1+", "k3+"}
    assert set(rlzoo.list_losses()) >= {
        "ppo", "grpo", "bnpo", "dr_grpo", "dapo", "gspo", "gspo_token", "cispo", "sapo", "gpg", "gmpo", "clip_cov",
        "kl_cov", "two_sided", "luspo", "vespo", "dppo_tv", "dppo_kl", "dro", "decoupled_ppo", "m2po", "vapo"}
    assert rlzoo.list_losses() == sorted(rlzoo.list_losses())


# ------------------------------------------------------------------------------------ user extensions
def _batch() -> PolicyBatch:
    lp = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, -9.0]], dtype=torch.float64, requires_grad=True)
    return PolicyBatch(logprobs=lp, advantages=torch.tensor([2.0, -1.0], dtype=torch.float64),
                       completion_mask=torch.tensor([[True, True, False], [True, True, True]]))


def _scaled_reinforce_class():
    class ScaledReinforce(Surrogate, name="scaled_reinforce"):
        """l = -scale * A * logp."""

        scale: float = 2.0

        def __call__(self, x):
            return PartOutput(-self.scale * x.advantages * x.logprobs, {})

    return ScaledReinforce


def test_user_surrogate_composes_with_builtin_parts_and_round_trips():
    """A user surrogate registered by name works in PolicyLoss (by name or instance), takes options,
    composes with a KL penalty, round-trips through its config, and is gone after the scope."""
    with surrogates.scoped():
        cls = _scaled_reinforce_class()
        loss_fn = PolicyLoss(surrogate="scaled_reinforce", aggregation="token-sum")
        assert isinstance(loss_fn.surrogate, cls)
        batch = _batch()
        out = loss_fn(batch)
        mask = batch.completion_mask
        expected = (-2.0 * batch.advantages.unsqueeze(-1) * batch.logprobs.detach())[mask].sum()
        torch.testing.assert_close(out.loss, expected)
        assert loss_fn.with_options(scale=3.0).surrogate.scale == 3.0
        with_kl = loss_fn.with_options(beta=0.1)
        assert with_kl.required_fields() == frozenset({"ref_logprobs"})
        config = json.loads(json.dumps(with_kl.to_config()))
        assert PolicyLoss.from_config(config) == with_kl
    assert "scaled_reinforce" not in surrogates
    with pytest.raises(UnknownNameError):
        PolicyLoss(surrogate="scaled_reinforce")


def test_user_preset_works_through_get_loss():
    """A preset registered with @preset is listed by rlzoo.list_losses, built by rlzoo.get_loss with overrides,
    has a card, and is gone after the scope."""
    with presets.scoped(), surrogates.scoped():
        _scaled_reinforce_class()

        @preset("my_pg", title="Scaled PG", paper="Williams 1992", arxiv=None, matches="-", advantage="grpo")
        def my_pg() -> PolicyLoss:
            """loss = sum_it -scale A logp / N_tokens"""
            return PolicyLoss(surrogate="scaled_reinforce", aggregation="token-mean")

        assert "my_pg" in rlzoo.list_losses()
        loss_fn = rlzoo.get_loss("my_pg", scale=0.5, aggregation="seq-mean-token-mean")
        assert loss_fn.name == "my_pg" and loss_fn.surrogate.scale == 0.5
        assert loss_fn.aggregation.registered_name() == "seq-mean-token-mean"
        out = loss_fn(_batch())
        assert out.loss.shape == () and out.loss.requires_grad
        assert presets.get("my_pg").card().startswith("my_pg: Scaled PG")
        with pytest.raises(ValueError, match="already registered"):
            preset("my_pg", title="x", paper="x", arxiv=None, matches="-")(my_pg)
    assert "my_pg" not in rlzoo.list_losses()
    with pytest.raises(UnknownNameError):
        rlzoo.get_loss("my_pg")


def test_user_kl_estimator_and_aggregation():
    """Custom KL estimators and aggregations plug in by name too."""
    with kl_estimators.scoped():
        kl_estimators.register("zero")(lambda logp, ref: 0.0 * logp)
        loss_fn = rlzoo.get_loss("grpo", kl_estimator="zero")
        batch = _batch()
        batch = dataclasses.replace(batch, ref_logprobs=batch.logprobs.detach() - 1.0)
        torch.testing.assert_close(loss_fn(batch).loss, rlzoo.get_loss("grpo", beta=0.0)(batch).loss)
    assert "zero" not in kl_estimators


def test_a_user_part_returning_other_than_one_value_per_token_is_named():
    """A ratio level, IS correction, surrogate, token weight or penalty returns ``[B, T]``; a ``[B]`` (or
    ``[B, 1]``) value would broadcast silently against the batch (``B == T``: a loss 3x too large, before this
    check) or fail inside torch without naming the part. The pipeline names the part, its shape and the batch's."""
    from rlzoo.losses import Correction, Penalty, RatioLevel, is_corrections, penalties

    lp = -torch.rand(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    square = PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64),
                         completion_mask=torch.ones(3, 3, dtype=torch.bool))
    with surrogates.scoped(), token_weights.scoped(), penalties.scoped(), ratio_levels.scoped(), \
            is_corrections.scoped(), runtime_type_checker_off():  # the error a user without the checker sees

        class SequenceColumn(RatioLevel, name="sequence_column"):
            """log w = the sequence's mean log-ratio as [B, 1] (wrong: broadcast over the tokens is the level's job)."""

            def __call__(self, x):
                return PartOutput(x.seq_mean(x.log_ratio), {})

        class Ones(Correction, name="ones"):
            """rho = 1 per sequence as [B] (wrong)."""

            def __call__(self, x):
                return PartOutput(torch.ones_like(x.lengths), {})

        class PerSequence(Surrogate, name="per_sequence"):
            """-A * sum_t logp (one value per sequence: wrong for a surrogate)."""

            def __call__(self, x):
                return PartOutput((-x.advantages * x.logprobs).sum(-1), {})

        class Column(TokenWeight, name="column"):
            """w = 1 per sequence as [B, 1] (wrong)."""

            def __call__(self, x):
                return PartOutput(torch.ones_like(x.logprobs[:, :1]), {})

        class Total(Penalty, name="total"):
            """A 0-d penalty (wrong)."""

            def __call__(self, x):
                return PartOutput(x.logprobs.sum(), {})

        for loss, owner, shape in [(PolicyLoss(surrogate="ppo_clip", ratio="sequence_column"), "the ratio level", (3, 1)),
                                   (PolicyLoss(surrogate="ppo_clip", is_correction=Ones()), "the IS correction", (3,)),
                                   (PolicyLoss(surrogate="per_sequence"), "surrogate 'per_sequence'", (3,)),
                                   (PolicyLoss(surrogate="ppo_clip", weights=(Column(),)), "token weight 'column'",
                                    (3, 1)),
                                   (PolicyLoss(surrogate="ppo_clip", penalties=(Total(),)), "penalty 'total'", ())]:
            with pytest.raises(ValueError, match=rf"^{re.escape(owner)} returned shape {re.escape(str(shape))}; a "
                                                 r"per-token value has the batch's \(3, 3\)$"):
                loss(square)
            with pytest.raises(ValueError, match=f"^{re.escape(owner)} returned shape"):  # not torch's error
                loss(_batch())


# ------------------------------------------------------------------------------------------ Component
def test_subclassing_with_a_name_registers_a_frozen_keyword_only_dataclass():
    """class X(Slot, name=...) registers X in the slot's registry and makes it a frozen kw-only dataclass whose
    fields are its options; a subclass without a name is registered nowhere; names never overwrite."""
    with token_weights.scoped():

        class Halve(TokenWeight, name="halve"):
            """w = factor (a constant weight)."""

            factor: float = 0.5

            def __call__(self, x):
                return PartOutput(torch.full_like(x.logprobs, self.factor), {})

        assert token_weights.get("halve") is Halve and Halve.registered_name() == "halve"
        part = Halve(factor=0.25)
        assert part.options() == {"factor": 0.25} and part.to_config() == {"name": "halve", "factor": 0.25}
        with pytest.raises(dataclasses.FrozenInstanceError):
            part.factor = 1.0
        with pytest.raises(TypeError):
            Halve(0.25)  # keyword-only
        assert PolicyLoss(surrogate="ppo_clip", weights=(part,)).with_options(factor=2.0).weights[0].factor == 2.0

        class Shared(TokenWeight):
            """An unnamed shared base: a dataclass, registered nowhere."""

            scale: float = 1.0

        assert dataclasses.is_dataclass(Shared) and Shared.label() == "Shared"
        with pytest.raises(LookupError, match="not registered"):
            Shared.registered_name()
        with pytest.raises(ValueError, match="'halve' is already registered"):

            class Again(TokenWeight, name="halve"):
                """A second class under a taken name."""

    assert "halve" not in token_weights


def test_choice_options_are_checked_against_their_registry():
    """An option declared with choice(default, registry) must name a registered alternative; registering a new
    alternative makes it valid without touching the part."""
    reg = Registry[type]("widget kind")

    class Kind(Component):
        """An alternative (the base of the registry's members)."""

        registry = reg

    class Round(Kind, name="round"):
        """A round widget."""

    class Widget(Component):
        """A component with a choice option."""

        kind: str = choice("round", reg)
        other: str | None = choice(None, reg, allow_none=True)

    assert Widget().kind == "round" and Widget.choices() == {"kind": reg, "other": reg}
    with pytest.raises(ValueError, match="Widget: kind must be one of 'round'; got 'square'"):
        Widget(kind="square")

    class Square(Kind, name="square"):
        """A square widget."""

    assert Widget(kind="square", other="square").kind == "square"


def test_slots_are_typed():
    """A part given to another slot's field is a TypeError naming the field and the expected base."""
    from rlzoo.losses import KLPenalty, PPOClip

    with runtime_type_checker_off():
        with pytest.raises(TypeError, match="weights must be a TokenWeight"):
            PolicyLoss(surrogate="ppo_clip", weights=(KLPenalty(beta=0.1),))
        with pytest.raises(TypeError, match="surrogate must be a Surrogate"):
            PolicyLoss(surrogate=KLPenalty(beta=0.1))
        with pytest.raises(TypeError, match="penalties must be a Penalty"):
            PolicyLoss(surrogate="ppo_clip", penalties=(PPOClip(),))


def test_an_option_two_optional_parts_declare_adds_neither_and_names_both():
    """A user penalty with a ``beta`` (as the built-in KL penalty's): ``get_loss("dapo", beta=...)`` cannot know
    which to add, so it refuses naming both (before: the KL penalty was added silently); the user's part is added
    as a part; a loss already holding the KL penalty still routes ``beta`` to it."""
    from rlzoo.losses import KLPenalty, Penalty, penalties

    with penalties.scoped():

        class MyKL(Penalty, name="my_kl"):
            """beta * (logp - ref)^2 per token (a test part)."""

            beta: float = 0.0

            @property
            def active(self) -> bool:
                return self.beta != 0.0

            def __call__(self, x):
                return PartOutput(self.beta * x.logprobs.square(), {})

        with pytest.raises(ValueError, match=r"'beta' .* several optional parts.*KLPenalty.*MyKL.*MyKL\(beta=\.\.\.\)"):
            rlzoo.get_loss("dapo", beta=0.1)
        dapo = rlzoo.get_loss("dapo")
        mine = dataclasses.replace(dapo, penalties=(*dapo.penalties, MyKL(beta=0.1)))
        assert [type(p) for p in mine.parts() if isinstance(p, Penalty)] == [MyKL]
        grpo = rlzoo.get_loss("grpo", beta=0.5)
        assert [p.beta for p in grpo.parts() if isinstance(p, KLPenalty)] == [0.5]
    assert rlzoo.get_loss("dapo", beta=0.1).required_fields() == frozenset({"ref_logprobs"})
