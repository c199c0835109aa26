r"""``PolicyLoss``: the composition ratio -> IS correction -> surrogate -> token weights -> + penalties -> aggregation.

Build one from parts, from a preset (:func:`rlzoo.get_loss`), or from a saved config::

    >>> import rlzoo
    >>> from rlzoo.losses import PolicyLoss, PPOClip
    >>> loss_fn = PolicyLoss(surrogate=PPOClip(epsilon_high=0.28), ratio="sequence",
    ...                      aggregation="seq-mean-token-mean")
    >>> loss_fn.with_options(beta=0.04).required_fields()
    frozenset({'ref_logprobs'})
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from rlzoo.batch import BatchError, LossOutput, Normalizer, PolicyBatch
from rlzoo.losses.base import (
    Aggregation,
    Correction,
    LossInputs,
    Part,
    Penalty,
    RatioLevel,
    Surrogate,
    TokenWeight,
    masked_max,
    masked_mean,
    masked_min,
)
from rlzoo.registry import Component, UnknownNameError

__all__ = ["PolicyLoss"]


@dataclasses.dataclass(frozen=True)
class _Slot:
    """One field of :class:`PolicyLoss`: the slot's abstract base, and how keyword options reach it."""

    field: str
    base: type[Part]
    many: bool = False  # a tuple of parts (at most one of each class)
    optional: bool = False  # an option of a registered member adds that member
    swap_option: str | None = None  # this option names the member (by registry name)


SLOTS = (
    _Slot("ratio", RatioLevel, swap_option="importance_sampling_level"),
    _Slot("is_correction", Correction, optional=True),
    _Slot("surrogate", Surrogate),
    _Slot("weights", TokenWeight, many=True, optional=True),
    _Slot("penalties", Penalty, many=True, optional=True),
    _Slot("aggregation", Aggregation, swap_option="aggregation"),
)
_LOSS_OPTIONS = ("max_completion_length",)


def _resolve(value: Any, slot: _Slot) -> Part:
    """A part for ``slot`` from a part or a registered name; a TypeError for a part of another slot."""
    if isinstance(value, str):
        return slot.base.registry.get(value)()
    if not isinstance(value, slot.base):
        raise TypeError(
            f"PolicyLoss.{slot.field} must be a {slot.base.__name__} (a registered part or its name), got "
            f"{type(value).__name__}"
        )
    return value


def _optional_owners() -> dict[str, tuple[_Slot, type[Part]]]:
    """Option name -> (slot, member class) for every registered member of an optional slot (first wins)."""
    owners: dict[str, tuple[_Slot, type[Part]]] = {}
    for slot in SLOTS:
        if slot.optional:
            for cls in slot.base.registry.values():
                for option in cls.option_names():
                    owners.setdefault(option, (slot, cls))
    return owners


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLoss:
    r"""A policy-optimization loss composed of registered parts, one per slot of :mod:`rlzoo.losses.base`.

    Pipeline, per token: ``log_w = ratio(x)``; ``rho = is_correction(x)``; ``l = surrogate(x)`` (times ``rho``
    unless the surrogate folds it in); ``l *= weight`` for each token weight; ``l += term`` for each penalty;
    finally ``loss = aggregation(l, mask, normalizer)``.

    Args:
        surrogate: a :class:`~rlzoo.losses.Surrogate` or its name in ``rlzoo.losses.surrogates``.
        ratio: a :class:`~rlzoo.losses.RatioLevel` or its name (``importance_sampling_level``): "token"
            (default), "sequence", "sequence_token", "geometric".
        aggregation: an :class:`~rlzoo.losses.Aggregation` or its name: "token-mean" (default), "token-sum",
            "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm".
        is_correction: a :class:`~rlzoo.losses.Correction` (e.g. :class:`~rlzoo.losses.ISCorrection`) or None.
        weights: :class:`~rlzoo.losses.TokenWeight` parts (e.g. :class:`~rlzoo.losses.OffPolicySequenceMask`).
        penalties: :class:`~rlzoo.losses.Penalty` parts (e.g. :class:`~rlzoo.losses.KLPenalty`).
        max_completion_length: > 0; needed by "seq-mean-token-sum-norm" (and accepted by every loss).
        name: optional label (the preset name), used in messages.

    Inactive optional parts (``beta=0``, ``top_entropy_quantile=1``, ``is_correction=None``...) are kept, with
    their options, but skipped when the loss runs, and left out of :meth:`parts`, :meth:`required_fields` and
    :meth:`describe`.

    Raises:
        UnknownNameError: an unknown part name (lists the valid ones).
        TypeError: a part in the wrong slot (a surrogate given as a token weight...).
        ValueError: invalid options, two parts of one class in a slot, or an IS correction the surrogate
            cannot take. (An aggregation that needs ``max_completion_length`` without it raises when called.)
    """

    surrogate: Surrogate | str
    ratio: RatioLevel | str = "token"
    aggregation: Aggregation | str = "token-mean"
    is_correction: Correction | None = None
    weights: tuple[TokenWeight, ...] = ()
    penalties: tuple[Penalty, ...] = ()
    max_completion_length: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        for slot in SLOTS:
            value = getattr(self, slot.field)
            if slot.many:
                resolved: Any = tuple(_resolve(p, slot) for p in value)
                kinds = [type(p) for p in resolved]
                if len(kinds) != len(set(kinds)):
                    raise ValueError(f"PolicyLoss.{slot.field} holds two parts of the same kind: {kinds}")
            else:
                resolved = None if value is None and slot.optional else _resolve(value, slot)
            object.__setattr__(self, slot.field, resolved)
        correction = self.is_correction
        if correction is not None and correction.sequence_level and not self.surrogate.sequence_is_weight:
            raise ValueError(
                f"{correction.describe()} gives one IS weight per sequence, which surrogate "
                f"{self.surrogate.registered_name()!r} does not take (it folds token-level IS weights into its "
                f"own weight); {correction.token_level_hint()}"
            )
        mcl = self.max_completion_length
        if mcl is not None and (isinstance(mcl, bool) or not isinstance(mcl, int) or mcl < 1):
            raise ValueError(f"max_completion_length must be a positive int, got {mcl!r}")

    # ----------------------------------------------------------------------------------------------- parts
    def _all_parts(self) -> list[Part]:
        """Every part, active or not, in pipeline order."""
        out: list[Part] = [self.ratio]
        if self.is_correction is not None:
            out.append(self.is_correction)
        return [*out, self.surrogate, *self.weights, *self.penalties, self.aggregation]

    def parts(self) -> list[Part]:
        """Every active part, in pipeline order (what runs)."""
        return [p for p in self._all_parts() if p.active]

    def required_fields(self) -> frozenset[str]:
        """Optional :class:`PolicyBatch` fields this loss needs (e.g. ``ref_logprobs`` when beta > 0)."""
        return frozenset().union(*(p.required_fields() for p in self.parts()))

    @property
    def batch_coupled(self) -> bool:
        """True when a part couples sequences (covariance top-k, entropy quantile): micro-batch splits change it."""
        return any(type(p).batch_coupled for p in self.parts())

    def options(self) -> dict[str, Any]:
        """Every keyword option of this loss and its current value (what :meth:`with_options` accepts)."""
        opts: dict[str, Any] = {
            "importance_sampling_level": self.ratio.registered_name(),
            "aggregation": self.aggregation.registered_name(),
            "max_completion_length": self.max_completion_length,
        }
        for part in self._all_parts():
            if part is not self.aggregation:
                opts.update(part.options())
        for option, (_, cls) in _optional_owners().items():
            if option not in opts:
                opts[option] = getattr(cls(), option)
        return opts

    def with_options(self, **overrides: Any) -> "PolicyLoss":
        """A copy with keyword options changed (the field's standard names).

        Routing: ``importance_sampling_level`` / ``aggregation`` swap that part by name;
        ``max_completion_length`` is the loss's own; any other name sets that option on every part that
        has it (e.g. ``epsilon_high``), active or not, or adds the optional part that owns it (``beta`` adds a
        :class:`~rlzoo.losses.KLPenalty`, ``is_correction`` an :class:`~rlzoo.losses.ISCorrection`, ...). An
        option of a part that is inactive at the time is kept (``kl_estimator`` before ``beta``, ``is_max``
        before ``is_correction``).

        Raises:
            UnknownNameError: an option no part of this loss accepts; lists the valid options.
            ValueError: an invalid value (from the part's own validation).
        """
        if not overrides:
            return self
        fields: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        rest = dict(overrides)
        for slot in SLOTS:
            if slot.swap_option is not None and slot.swap_option in rest:
                fields[slot.field] = _resolve(rest.pop(slot.swap_option), slot)
        for option in _LOSS_OPTIONS:
            if option in rest:
                fields[option] = rest.pop(option)

        # Options owned by a part already in the loss (active or not) go to every such part.
        def owned(part: Part) -> dict[str, Any]:
            return {k: v for k, v in rest.items() if k in part.option_names()}

        def updated(part: Part) -> Part:
            changes = owned(part)
            return dataclasses.replace(part, **changes) if changes else part

        present = [p for slot in SLOTS for p in _members(fields[slot.field])]
        unowned = {k: v for k, v in rest.items() if not any(k in p.option_names() for p in present)}
        for slot in SLOTS:
            value = fields[slot.field]
            if slot.many:
                fields[slot.field] = tuple(updated(p) for p in value)
            elif value is not None:
                fields[slot.field] = updated(value)

        # Options nobody owns add the optional member that declares them.
        owners = _optional_owners()
        new_parts: dict[type[Part], tuple[_Slot, dict[str, Any]]] = {}
        for option, value in unowned.items():
            if option not in owners:
                raise UnknownNameError(
                    f"unknown option {option!r} for loss {self.name or type(self.surrogate).__name__!r}; "
                    f"valid options: {', '.join(sorted(self.options()))}"
                )
            slot, cls = owners[option]
            new_parts.setdefault(cls, (slot, {}))[1][option] = value
        for cls, (slot, kwargs) in new_parts.items():
            part = cls(**kwargs)
            fields[slot.field] = (*fields[slot.field], part) if slot.many else part
        return PolicyLoss(**fields)

    # ---------------------------------------------------------------------------------------------- config
    def to_config(self) -> dict[str, Any]:
        """JSON-able description (inactive parts included, with their options); :meth:`from_config` rebuilds
        an equal loss."""
        return {
            "name": self.name,
            "surrogate": self.surrogate.to_config(),
            "ratio": self.ratio.to_config(),
            "aggregation": self.aggregation.to_config(),
            "is_correction": None if self.is_correction is None else self.is_correction.to_config(),
            "weights": [p.to_config() for p in self.weights],
            "penalties": [p.to_config() for p in self.penalties],
            "max_completion_length": self.max_completion_length,
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "PolicyLoss":
        """Inverse of :meth:`to_config`.

        Raises:
            UnknownNameError: a part name that is not registered.
            ValueError: a missing or invalid entry.
        """
        slots = {slot.field: slot for slot in SLOTS}

        def build(field: str, entry: Mapping[str, Any]) -> Part:
            return Component.from_config(slots[field].base.registry, entry)

        try:
            return cls(
                name=config.get("name"),
                surrogate=build("surrogate", config["surrogate"]),
                ratio=build("ratio", config["ratio"]),
                aggregation=build("aggregation", config["aggregation"]),
                is_correction=(None if config.get("is_correction") is None
                               else build("is_correction", config["is_correction"])),
                weights=tuple(build("weights", c) for c in config.get("weights", ())),
                penalties=tuple(build("penalties", c) for c in config.get("penalties", ())),
                max_completion_length=config.get("max_completion_length"),
            )
        except KeyError as err:
            if isinstance(err, UnknownNameError):
                raise
            raise ValueError(f"loss config is missing {err}") from None

    def describe(self) -> str:
        """One line per active part, as ``rlzoo explain`` prints them."""
        lines = [
            f"ratio level:   {self.ratio.describe()}",
            f"surrogate:     {self.surrogate.describe()}",
        ]
        if self.is_correction is not None and self.is_correction.active:
            lines.append(f"IS correction: {self.is_correction.describe()}")
        lines += [f"token weight:  {p.describe()}" for p in self.weights if p.active]
        lines += [f"penalty:       {p.describe()}" for p in self.penalties if p.active]
        lines.append(f"aggregation:   {self.aggregation.registered_name()}"
                     + (f" (max_completion_length={self.max_completion_length})"
                        if self.max_completion_length is not None else ""))
        return "\n".join(lines)

    # ----------------------------------------------------------------------------------------------- call
    def __call__(self, batch: PolicyBatch, normalizer: Normalizer | None = None) -> LossOutput:
        """Compute the loss of one (micro-)batch.

        Args:
            batch: the :class:`~rlzoo.batch.PolicyBatch`.
            normalizer: counts of the whole optimizer-step batch; default: this batch's own counts.

        Returns:
            :class:`~rlzoo.batch.LossOutput` with the 0-d loss and detached 0-d metrics.

        Raises:
            BatchError: a field this loss needs is None (names the field and the part needing it).
            ValueError: the aggregation needs ``max_completion_length`` and the loss has none.
        """
        if not isinstance(batch, PolicyBatch):
            raise TypeError(f"a loss takes a rlzoo.PolicyBatch, got {type(batch).__name__}")
        for field in sorted(self.required_fields()):
            if getattr(batch, field) is None:
                who = [p.describe() for p in self.parts() if field in p.required_fields()]
                raise BatchError(
                    f"loss {self.name or ''!s} needs PolicyBatch.{field} for {', '.join(who)}; it is None"
                )
        if self.max_completion_length is None and self.aggregation.needs_max_completion_length:
            raise ValueError(
                f"aggregation {self.aggregation.registered_name()!r} needs max_completion_length: "
                f"get_loss({self.name!r}, max_completion_length=...)"
            )
        if normalizer is None:
            normalizer = Normalizer.from_batch(batch)
        x = LossInputs.from_batch(batch)
        log_weight, metrics = self.ratio(x)
        metrics = dict(metrics)
        is_weight = None
        if self.is_correction is not None and self.is_correction.active:
            is_weight, is_metrics = self.is_correction(x)
            metrics.update(is_metrics)
        x = x.with_weights(log_weight, is_weight, per_sequence=self.ratio.per_sequence)
        per_token, surrogate_metrics = self.surrogate(x)
        metrics.update(surrogate_metrics)
        if is_weight is not None and not self.surrogate.folds_is_weight:
            per_token = per_token * is_weight
        for part in self.weights:
            if part.active:
                weight, part_metrics = part(x)
                per_token = per_token * weight
                metrics.update(part_metrics)
        for part in self.penalties:
            if part.active:
                term, part_metrics = part(x)
                per_token = per_token + term
                metrics.update(part_metrics)
        loss = self.aggregation(per_token, x.mask, normalizer, self.max_completion_length)
        with torch.no_grad():
            ratio = torch.exp(log_weight.detach())
            metrics["ratio/mean"] = masked_mean(ratio, x.mask)
            metrics["ratio/min"] = masked_min(ratio, x.mask)
            metrics["ratio/max"] = masked_max(ratio, x.mask)
            if x.entropies is not None:
                metrics["entropy"] = masked_mean(x.entropies.detach(), x.mask)
        return LossOutput(loss=loss, metrics={k: v.detach() for k, v in metrics.items()})


def _members(value: Any) -> tuple[Part, ...]:
    if value is None:
        return ()
    return value if isinstance(value, tuple) else (value,)
