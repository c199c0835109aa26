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
from rlzoo.losses._core import (
    LossInputs,
    Part,
    aggregations,
    is_corrections,
    masked_max,
    masked_mean,
    masked_min,
    penalties,
    ratio_levels,
    surrogates,
    token_weights,
)
from rlzoo.registry import Registry, UnknownNameError

__all__ = ["PolicyLoss"]

# Options that swap a whole part (by registry name) or set a loss-level value.
_SWAP_OPTIONS = {"importance_sampling_level": ("ratio", ratio_levels), "aggregation": ("aggregation", aggregations)}
_LOSS_OPTIONS = ("max_completion_length",)
# Registries of optional parts: naming one of their options adds the part.
_OPTIONAL_REGISTRIES: tuple[tuple[str, Registry[type]], ...] = (
    ("is_correction", is_corrections),
    ("weights", token_weights),
    ("penalties", penalties),
)


def _resolve(value: Any, registry: Registry[type], what: str) -> Part:
    if isinstance(value, str):
        return registry.get(value)()
    if not isinstance(value, Part):
        raise TypeError(f"PolicyLoss.{what} must be a registered part or its name, got {type(value).__name__}")
    return value


def _optional_owners() -> dict[str, tuple[str, type]]:
    """Option name -> (slot, part class) for every registered optional part."""
    owners: dict[str, tuple[str, type]] = {}
    for slot, registry in _OPTIONAL_REGISTRIES:
        for cls in map(registry.get, registry.names()):
            for option in cls.option_names():
                owners.setdefault(option, (slot, cls))
    return owners


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLoss:
    r"""A policy-optimization loss composed of registered parts.

    Pipeline, per token: ``log_w = ratio(...)``; ``rho = is_correction(...)``;
    ``l = surrogate(...)`` (times ``rho`` unless the surrogate folds it in); ``l *= weight`` for each token
    weight; ``l += term`` for each penalty; finally ``loss = aggregation(l, mask, normalizer)``.

    Args:
        surrogate: a surrogate part or its name in ``rlzoo.losses.surrogates``.
        ratio: ratio level part or name (``importance_sampling_level``): "token" (default), "sequence",
            "sequence_token", "geometric".
        aggregation: part or name: "token-mean" (default), "token-sum", "seq-mean-token-mean",
            "seq-mean-token-sum", "seq-mean-token-sum-norm".
        is_correction: an :class:`~rlzoo.losses.ISCorrection` or None.
        weights: token weights/masks (e.g. :class:`~rlzoo.losses.OffPolicySequenceMask`).
        penalties: additive per-token terms (e.g. :class:`~rlzoo.losses.KLPenalty`).
        max_completion_length: > 0; needed by "seq-mean-token-sum-norm" (and accepted by every loss).
        name: optional label (the preset name), used in messages.

    Inactive optional parts (``beta=0``, ``top_entropy_quantile=1``, ...) are dropped on construction.

    Raises:
        UnknownNameError: an unknown part name (lists the valid ones).
        ValueError: invalid options. (An aggregation that needs ``max_completion_length`` without it
            raises when called.)
    """

    surrogate: Part | str
    ratio: Part | str = "token"
    aggregation: Part | str = "token-mean"
    is_correction: Part | None = None
    weights: tuple[Part, ...] = ()
    penalties: tuple[Part, ...] = ()
    max_completion_length: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "surrogate", _resolve(self.surrogate, surrogates, "surrogate"))
        set_(self, "ratio", _resolve(self.ratio, ratio_levels, "ratio"))
        set_(self, "aggregation", _resolve(self.aggregation, aggregations, "aggregation"))
        if self.is_correction is not None and not self.is_correction.active:
            set_(self, "is_correction", None)
        modes = getattr(self.surrogate, "is_correction_modes", None)
        mode = getattr(self.is_correction, "is_correction", None)
        if mode is not None and modes is not None and mode not in modes:
            raise ValueError(
                f"is_correction={mode!r} is not supported by surrogate "
                f"{self.surrogate.registered_name()!r}; use one of {', '.join(map(repr, modes))}"
            )
        set_(self, "weights", tuple(p for p in self.weights if p.active))
        set_(self, "penalties", tuple(p for p in self.penalties if p.active))
        for slot in ("weights", "penalties"):
            kinds = [type(p) for p in getattr(self, slot)]
            if len(kinds) != len(set(kinds)):
                raise ValueError(f"PolicyLoss.{slot} holds two parts of the same kind: {kinds}")
        mcl = self.max_completion_length
        if mcl is not None and (isinstance(mcl, bool) or not isinstance(mcl, int) or mcl < 1):
            raise ValueError(f"max_completion_length must be a positive int, got {mcl!r}")

    # ----------------------------------------------------------------------------------------------- parts
    def parts(self) -> list[Part]:
        """Every part, in pipeline order."""
        out: list[Part] = [self.ratio]
        if self.is_correction is not None:
            out.append(self.is_correction)
        return [*out, self.surrogate, *self.weights, *self.penalties, self.aggregation]

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
        for part in self.parts():
            if part is not self.aggregation:
                opts.update(part.options())
        for option, (slot, cls) in _optional_owners().items():
            if option not in opts:
                opts[option] = getattr(cls(), option)
        return opts

    def with_options(self, **overrides: Any) -> "PolicyLoss":
        """A copy with keyword options changed (the field's standard names).

        Routing: ``importance_sampling_level`` / ``aggregation`` swap that part by name;
        ``max_completion_length`` is the loss's own; any other name sets that option on every part that
        has it (e.g. ``epsilon_high``), or adds the optional part that owns it (``beta`` adds a
        :class:`~rlzoo.losses.KLPenalty`, ``is_correction`` an :class:`~rlzoo.losses.ISCorrection`, ...).

        Raises:
            UnknownNameError: an option no part of this loss accepts; lists the valid options.
            ValueError: an invalid value (from the part's own validation).
        """
        if not overrides:
            return self
        fields: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        rest = dict(overrides)
        for option, (slot, registry) in _SWAP_OPTIONS.items():
            if option in rest:
                fields[slot] = _resolve(rest.pop(option), registry, slot)
        for option in _LOSS_OPTIONS:
            if option in rest:
                fields[option] = rest.pop(option)

        # Existing parts that own an option get it.
        slots = ("ratio", "surrogate", "is_correction", "weights", "penalties")
        updates: dict[int, dict[str, Any]] = {}
        parts_by_id: dict[int, Part] = {}
        for slot in slots:
            value = fields[slot]
            for part in (value if isinstance(value, tuple) else (value,)):
                if part is not None:
                    parts_by_id[id(part)] = part
        unowned: dict[str, Any] = {}
        for option, value in rest.items():
            owners = [p for p in parts_by_id.values() if option in p.option_names()]
            for part in owners:
                updates.setdefault(id(part), {})[option] = value
            if not owners:
                unowned[option] = value

        # Options nobody owns add the optional part that declares them.
        owners_map = _optional_owners()
        new_parts: dict[type, dict[str, Any]] = {}
        for option, value in unowned.items():
            if option not in owners_map:
                valid = sorted(self.options())
                raise UnknownNameError(
                    f"unknown option {option!r} for loss {self.name or type(self.surrogate).__name__!r}; "
                    f"valid options: {', '.join(valid)}"
                )
            new_parts.setdefault(owners_map[option][1], {})[option] = value

        def updated(part: Part | None) -> Part | None:
            if part is None or id(part) not in updates:
                return part
            return dataclasses.replace(part, **updates[id(part)])

        fields["ratio"] = updated(fields["ratio"])
        fields["surrogate"] = updated(fields["surrogate"])
        fields["is_correction"] = updated(fields["is_correction"])
        fields["weights"] = tuple(updated(p) for p in fields["weights"])
        fields["penalties"] = tuple(updated(p) for p in fields["penalties"])
        for cls, kwargs in new_parts.items():
            slot = next(s for s, reg in _OPTIONAL_REGISTRIES if cls in dict(reg.items()).values())
            part = cls(**kwargs)
            if slot == "is_correction":
                fields[slot] = part
            else:
                fields[slot] = (*fields[slot], part)
        return PolicyLoss(**fields)

    # ---------------------------------------------------------------------------------------------- config
    def to_config(self) -> dict[str, Any]:
        """JSON-able description; :meth:`from_config` rebuilds an equal loss."""
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
        try:
            return cls(
                name=config.get("name"),
                surrogate=Part.from_config(surrogates, config["surrogate"]),
                ratio=Part.from_config(ratio_levels, config["ratio"]),
                aggregation=Part.from_config(aggregations, config["aggregation"]),
                is_correction=(None if config.get("is_correction") is None
                               else Part.from_config(is_corrections, config["is_correction"])),
                weights=tuple(Part.from_config(token_weights, c) for c in config.get("weights", ())),
                penalties=tuple(Part.from_config(penalties, c) for c in config.get("penalties", ())),
                max_completion_length=config.get("max_completion_length"),
            )
        except KeyError as err:
            if isinstance(err, UnknownNameError):
                raise
            raise ValueError(f"loss config is missing {err}") from None

    def describe(self) -> str:
        """One line per part, as ``rlzoo explain`` prints them."""
        lines = [
            f"ratio level:   {self.ratio.describe()}",
            f"surrogate:     {self.surrogate.describe()}",
        ]
        if self.is_correction is not None:
            lines.append(f"IS correction: {self.is_correction.describe()}")
        lines += [f"token weight:  {p.describe()}" for p in self.weights]
        lines += [f"penalty:       {p.describe()}" for p in self.penalties]
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
        if self.max_completion_length is None and getattr(self.aggregation, "needs_max_completion_length", False):
            raise ValueError(
                f"aggregation {self.aggregation.registered_name()!r} needs max_completion_length: "
                f"get_loss({self.name!r}, max_completion_length=...)"
            )
        if normalizer is None:
            normalizer = Normalizer.from_batch(batch)
        x = LossInputs.from_batch(batch)
        log_weight, metrics = self.ratio(x)
        x.log_weight = log_weight
        if self.is_correction is not None:
            x.is_weight, is_metrics = self.is_correction(x)
            metrics.update(is_metrics)
        per_token, surrogate_metrics = self.surrogate(x)
        metrics.update(surrogate_metrics)
        if x.is_weight is not None and not getattr(self.surrogate, "handles_is_weight", False):
            per_token = per_token * x.is_weight
        for part in self.weights:
            weight, part_metrics = part(x)
            per_token = per_token * weight
            metrics.update(part_metrics)
        for part in self.penalties:
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
