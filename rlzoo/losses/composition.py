"""How a :class:`~rlzoo.losses.PolicyLoss` is put together and changed: its slots, the resolution of parts given
by name, keyword options routed to the parts that own them, configs, and the description ``rlzoo explain`` prints.

None of this runs when a loss is called: the pipeline (:mod:`rlzoo.losses.policy_loss`) reads without it.
Every function takes the loss it works on; :class:`~rlzoo.losses.PolicyLoss`'s methods of the same names call
them.
"""

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlzoo.batch import BatchError
from rlzoo.losses.base import Aggregation, Part
from rlzoo.losses.correction import Correction
from rlzoo.losses.off_policy import PROX_LOGP_METHODS, Rejection
from rlzoo.losses.penalty import KLPenalty, Penalty
from rlzoo.losses.surrogate import RatioLevel, Surrogate
from rlzoo.losses.weights import TokenWeight
from rlzoo.registry import Component, UnknownNameError, check_choice, close_names, warn_caller

if TYPE_CHECKING:  # pragma: no cover - the loss imports this module
    from rlzoo.losses.policy_loss import PolicyLoss

__all__ = ["SLOTS", "Slot", "describe", "from_config", "missing_field", "options", "resolve", "to_config",
           "with_options"]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One field of :class:`~rlzoo.losses.PolicyLoss`: the slot's abstract base, and how keyword options reach it.

    Attributes:
        field: the loss's field name.
        base: the slot's abstract base (its ``registry`` holds the members).
        many: the field holds a tuple of parts (at most one of each class).
        optional: an option of a registered member adds that member.
        swap_option: this option names the member (by registry name).
    """

    field: str
    base: type[Part]
    many: bool = False
    optional: bool = False
    swap_option: str | None = None


SLOTS = (
    Slot("rejections", Rejection, many=True, optional=True),
    Slot("ratio", RatioLevel, swap_option="importance_sampling_level"),
    Slot("is_correction", Correction, optional=True),
    Slot("surrogate", Surrogate),
    Slot("weights", TokenWeight, many=True, optional=True),
    Slot("penalties", Penalty, many=True, optional=True),
    Slot("aggregation", Aggregation, swap_option="aggregation"),
)
"""The slots of a loss, in pipeline order."""

_LOSS_OPTIONS = ("max_completion_length", "bypass_mode", "prox_logp_method")


def _resolve(value: Any, slot: Slot, given_as: str | None = None) -> Part:
    """A part for ``slot`` from a part or a registered name; a TypeError naming ``given_as`` (the option it came
    from; default the loss's field) for a part of another slot."""
    if isinstance(value, str):
        return slot.base.registry.get(value)()
    if not isinstance(value, slot.base):
        article = "an" if slot.base.__name__[0] in "AEIOU" else "a"
        raise TypeError(
            f"{given_as or f'PolicyLoss.{slot.field}'} must be {article} {slot.base.__name__} part or one of the "
            f"registered names "
            f"{', '.join(slot.base.registry.names())}; got {type(value).__name__}"
        )
    return value


def _optional_owners() -> dict[str, list[tuple[Slot, type[Part]]]]:
    """Option name -> the (slot, member class) of every registered member of an optional slot declaring it (more
    than one only when a part registered outside rlzoo reuses an option name)."""
    owners: dict[str, list[tuple[Slot, type[Part]]]] = {}
    for slot in SLOTS:
        if slot.optional:
            for cls in slot.base.registry.values():
                for option in cls.option_names():
                    owners.setdefault(option, []).append((slot, cls))
    return owners


def _members(value: Any) -> tuple[Part, ...]:
    if value is None:
        return ()
    return value if isinstance(value, tuple) else (value,)


def resolve(loss: "PolicyLoss") -> None:
    """Replace the parts ``loss`` was given by name with registered parts, in place (``PolicyLoss.__post_init__``),
    and validate its options. A ratio level other than ``token`` that nothing reads (``Surrogate.reads_ratio_level``
    False, no bias-corrected KL) warns, as TRL 1.16 warns for ``loss_type="vespo"``: it changes only the ``ratio/*``
    metrics (which then match TRL's).

    Raises:
        UnknownNameError: an unknown part name (lists the valid ones).
        TypeError: a part in the wrong slot, or a tuple slot (rejections, weights, penalties) given something
            other than a tuple or list.
        ValueError: two parts of one class in a slot, an IS correction the surrogate cannot take, a bad
            max_completion_length, a non-bool bypass_mode, an unknown prox_logp_method, or bypass_mode with
            prox_logp_method="loglinear".
    """
    for slot in SLOTS:
        value = getattr(loss, slot.field)
        if slot.many:
            if not isinstance(value, (tuple, list)):
                one = repr(value) if isinstance(value, str) else f"{type(value).__name__}(...)"
                raise TypeError(f"PolicyLoss.{slot.field} takes a tuple of {slot.base.__name__} parts or registered "
                                f"names ({', '.join(slot.base.registry.names())}), got {type(value).__name__}: write "
                                f"{slot.field}=" + ("() for none" if value is None else f"({one},)"))
            resolved: Any = tuple(_resolve(p, slot) for p in value)
            kinds = [type(p) for p in resolved]
            if len(kinds) != len(set(kinds)):
                twice = next(k for k in kinds if kinds.count(k) > 1)
                raise ValueError(f"PolicyLoss.{slot.field} holds two {twice.label()!r} parts ("
                                 f"{', '.join(p.describe() for p in resolved if type(p) is twice)}); give one")
        else:
            resolved = None if value is None and slot.optional else _resolve(value, slot)
        object.__setattr__(loss, slot.field, resolved)
    correction = loss.is_correction
    if correction is not None and correction.sequence_level and not loss.surrogate.sequence_is_weight:
        raise ValueError(
            f"{correction.describe()} gives one IS weight per sequence, which surrogate "
            f"{loss.surrogate.registered_name()!r} does not take (it folds token-level IS weights into its "
            f"own weight); {correction.token_level_hint()}"
        )
    level = loss.ratio.label()  # an unregistered level (a user's class without name=) has its class name
    if level != "token" and not _reads_ratio_level(loss):
        warn_caller(f"surrogate {loss.surrogate.label()!r} does not read the ratio level: importance_sampling_level="
                    f"{level!r} changes nothing but the ratio/* metrics (leave it 'token')")
    mcl = loss.max_completion_length
    if mcl is not None and (isinstance(mcl, bool) or not isinstance(mcl, int) or mcl < 1):
        raise ValueError(f"max_completion_length must be a positive int, got {mcl!r}")
    if not isinstance(loss.bypass_mode, bool):
        raise ValueError(f"bypass_mode must be a bool, got {loss.bypass_mode!r}")
    check_choice("PolicyLoss", "prox_logp_method", loss.prox_logp_method, PROX_LOGP_METHODS)
    if loss.bypass_mode and loss.prox_logp_method != "recompute":
        raise ValueError(
            "bypass_mode=True uses the sampler's log-probs as the old log-probs; prox_logp_method="
            f"{loss.prox_logp_method!r} approximates them instead: use one"
        )


_SLOT_WORDS = {"rejections": "rejection", "ratio": "ratio level", "is_correction": "IS correction",
               "surrogate": "surrogate", "weights": "token weight", "penalties": "penalty", "aggregation": "aggregation"}


def _warn_shared_options(built: "PolicyLoss", overrides: Mapping[str, Any]) -> None:
    """A UserWarning when a keyword option of ``overrides`` is declared by two active parts of ``built``: it set both
    (``importance_sampling_level="geometric"``'s log-ratio clip and PPO's ratio clip are both ``epsilon_high``)."""
    holders: dict[str, list[tuple[str, Part]]] = {}
    for slot in SLOTS:
        for part in _members(getattr(built, slot.field)):
            if part.active:
                for option in part.option_names():
                    holders.setdefault(option, []).append((slot.field, part))
    shared = sorted(option for option in overrides if len(holders.get(option, ())) > 1)
    if not shared:
        return
    parts = list({id(part): (field, part) for option in shared for field, part in holders[option]}.values())
    field, part = parts[0]
    warn_caller(
        f"{', '.join(shared)} set{'s' if len(shared) == 1 else ''} both "
        f"{' and '.join(f'{_SLOT_WORDS[f]} {p.describe()}' for f, p in parts)}, each part with its own meaning; to "
        f"set one, replace that part: dataclasses.replace(loss, {field}={type(part).__module__}."
        f"{type(part).__qualname__}({shared[0]}=...))"
    )


def _reads_ratio_level(loss: "PolicyLoss") -> bool:
    """Whether anything in ``loss`` reads its ratio level (``Surrogate.reads_ratio_level``, or a bias-corrected KL)."""
    return loss.surrogate.reads_ratio_level or any(
        isinstance(p, KLPenalty) and p.active and p.use_bias_correction_kl for p in loss.penalties)


def _warn_dropped_options(loss: "PolicyLoss", built: "PolicyLoss", overrides: Mapping[str, Any]) -> None:
    """A UserWarning when a swap option (``importance_sampling_level``) replaces an active part whose options no part
    of the new loss has (``gmpo``'s clip lives in its ``geometric`` ratio level: the ``token`` level drops it)."""
    kept = {option for part in built.all_parts() for option in part.option_names()}
    for slot in SLOTS:
        old = getattr(loss, slot.field)
        swapped = slot.swap_option in overrides and type(getattr(built, slot.field)) is not type(old) and old.active
        swapped = swapped and (slot.field != "ratio" or _reads_ratio_level(loss))  # else it applied nothing
        if swapped and (dropped := [option for option in old.option_names() if option not in kept]):
            warn_caller(
                f"{slot.swap_option}={overrides[slot.swap_option]!r} replaces {_SLOT_WORDS[slot.field]} "
                f"{old.describe()} of loss {loss.name or type(loss.surrogate).__name__!r}, and no part of the new "
                f"loss has {', '.join(dropped)}: the loss no longer applies them"
            )


def options(loss: "PolicyLoss") -> dict[str, Any]:
    """Every keyword option of ``loss`` and its current value (:meth:`~rlzoo.losses.PolicyLoss.options`)."""
    opts: dict[str, Any] = {
        "importance_sampling_level": loss.ratio.registered_name(),
        "aggregation": loss.aggregation.registered_name(),
        "max_completion_length": loss.max_completion_length,
        "bypass_mode": loss.bypass_mode,
        "prox_logp_method": loss.prox_logp_method,
    }
    for part in loss.all_parts():
        if part is not loss.aggregation:
            opts.update(part.options())
    for option, [(_, cls), *_] in _optional_owners().items():
        if option not in opts:
            opts[option] = getattr(cls(), option)
    return opts


def with_options(loss: "PolicyLoss", overrides: Mapping[str, Any]) -> "PolicyLoss":
    """A copy of ``loss`` with keyword options changed (:meth:`~rlzoo.losses.PolicyLoss.with_options`, which
    documents the routing and the errors)."""
    if not overrides:
        return loss
    fields: dict[str, Any] = {f.name: getattr(loss, f.name) for f in dataclasses.fields(loss)}
    rest = dict(overrides)
    for slot in SLOTS:
        if slot.swap_option is not None and slot.swap_option in rest:
            fields[slot.field] = _resolve(rest.pop(slot.swap_option), slot, given_as=slot.swap_option)
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
    new_parts: dict[type[Part], tuple[Slot, dict[str, Any]]] = {}
    for option, value in unowned.items():
        if option in owners and all(_inactive_default(cls, option, value) for _, cls in owners[option]):
            continue  # an absent part's default, as options() reports it: adding that inactive part changes nothing
        if option not in owners:
            replaced = [(slot, getattr(loss, slot.field)) for slot in SLOTS if slot.swap_option in overrides
                        and option in getattr(loss, slot.field).option_names()]
            if replaced:  # its part was swapped out in this very call (gmpo's geometric level holds its clip)
                (slot, part), *_ = replaced
                what = "ratio level" if slot.field == "ratio" else slot.field
                raise UnknownNameError(
                    f"option {option!r} belongs to {part.describe()}, the {what} of loss "
                    f"{loss.name or type(loss.surrogate).__name__!r}, which {slot.swap_option}="
                    f"{overrides[slot.swap_option]!r} replaces: drop {option} or keep that {what}"
                )
            close = close_names(option, loss.options())
            meant = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise UnknownNameError(
                f"unknown option {option!r} for loss {loss.name or type(loss.surrogate).__name__!r}; {meant}"
                f"valid options: {', '.join(sorted(loss.options()))}"
            )
        if len(owners[option]) > 1:
            declared = ", ".join(f"{cls.__name__} ({cls.registered_name()!r}, slot {slot.field})"
                                 for slot, cls in owners[option])
            slot, cls = owners[option][-1]
            part = f"{cls.__name__}({option}=...)"
            raise ValueError(
                f"option {option!r} of loss {loss.name or type(loss.surrogate).__name__!r} is declared by several "
                f"optional parts, which it would add: {declared}; add the one you mean as a part, e.g. "
                f"dataclasses.replace(loss, {slot.field}="
                + (f"(*loss.{slot.field}, {part}))" if slot.many else f"{part})")
            )
        [(slot, cls)] = owners[option]
        new_parts.setdefault(cls, (slot, {}))[1][option] = value
    for cls, (slot, kwargs) in new_parts.items():
        part = cls(**kwargs)
        if slot.many:
            fields[slot.field] = (*fields[slot.field], part)
            continue
        current = fields[slot.field]
        others = [c for c, (s, _) in new_parts.items() if s is slot and c is not cls]
        configured = current is not None and type(current) is not cls and (current.active or current != type(current)())
        switch, *settings = current.option_names() if current is not None else ("",)
        if configured and not current.active and overrides.get(switch, "") is None and not any(
                overrides.get(k) is not None for k in settings):
            configured = False  # switched off in this very call (is_correction=None): the new part takes the slot
        if others or configured:
            rival = repr(others[0].registered_name()) if others else current.describe()
            raise ValueError(
                f"PolicyLoss.{slot.field} holds one part: {', '.join(sorted(kwargs))} ({cls.registered_name()!r}) and "
                f"{rival} configure the same slot; use the options of one (TRL's is_correction / is_min / is_max "
                "or verl's rollout_is / rollout_is_threshold / rollout_is_batch_normalize)"
                + ("" if others else f"; to replace {current.describe()}, pass {switch}=None in the same call "
                   "(and none of its other options)")
            )
        fields[slot.field] = part
    built = type(loss)(**fields)
    _warn_dropped_options(loss, built, overrides)
    _warn_shared_options(built, overrides)
    return built


def _inactive_default(cls: type[Part], option: str, value: Any) -> bool:
    """Whether ``cls`` built with ``option=value`` is its default instance and inactive (a value its checks refuse,
    ``beta=False``, is not: it is refused as before)."""
    default = cls()
    try:
        return not default.active and cls(**{option: value}) == default
    except (TypeError, ValueError):
        return False


def to_config(loss: "PolicyLoss") -> dict[str, Any]:
    """JSON-able description of ``loss`` (inactive parts included, with their options)."""
    return {
        "name": loss.name,
        "surrogate": loss.surrogate.to_config(),
        "ratio": loss.ratio.to_config(),
        "aggregation": loss.aggregation.to_config(),
        "is_correction": None if loss.is_correction is None else loss.is_correction.to_config(),
        "weights": [p.to_config() for p in loss.weights],
        "penalties": [p.to_config() for p in loss.penalties],
        "rejections": [p.to_config() for p in loss.rejections],
        "max_completion_length": loss.max_completion_length,
        "bypass_mode": loss.bypass_mode,
        "prox_logp_method": loss.prox_logp_method,
    }


def from_config(cls: "type[PolicyLoss]", config: Mapping[str, Any]) -> "PolicyLoss":
    """The loss of class ``cls`` that :func:`to_config` described.

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
            rejections=tuple(build("rejections", c) for c in config.get("rejections", ())),
            max_completion_length=config.get("max_completion_length"),
            bypass_mode=config.get("bypass_mode", False),
            prox_logp_method=config.get("prox_logp_method", "recompute"),
        )
    except KeyError as err:
        if isinstance(err, UnknownNameError):
            raise
        raise ValueError(f"loss config is missing {err}") from None


def describe(loss: "PolicyLoss") -> str:
    """One line per active part of ``loss``, as ``rlzoo explain`` prints them."""
    lines = [f"rejection:     {p.describe()}" for p in loss.rejections if p.active]
    if loss.bypass_mode:
        lines.append("old policy:    rollout_logprobs (bypass_mode=True)")
    if loss.prox_logp_method != "recompute":
        lines.append(f"old policy:    proximal, prox_logp_method={loss.prox_logp_method!r}")
    lines += [
        f"ratio level:   {loss.ratio.describe()}",
        f"surrogate:     {loss.surrogate.describe()}",
    ]
    if loss.is_correction is not None and loss.is_correction.active:
        reported = loss.bypass_mode and loss.surrogate.uses_ratio  # off_policy.policy_loss: the ratio is pi / pi_s
        lines.append(f"IS correction: {loss.is_correction.describe()}" + (
            " (metrics only: in bypass mode the ratio already is pi_theta / pi_sampler, as verl)" if reported else ""))
    lines += [f"token weight:  {p.describe()}" for p in loss.weights if p.active]
    lines += [f"penalty:       {p.describe()}" for p in loss.penalties if p.active]
    lines.append(f"aggregation:   {loss.aggregation.registered_name()}"
                 + (f" (max_completion_length={loss.max_completion_length})"
                    if loss.max_completion_length is not None else ""))
    return "\n".join(lines)


def missing_field(loss: "PolicyLoss", field: str) -> BatchError:
    """The error for a batch without the optional ``field`` that ``loss`` needs: it names the field and the parts
    (or the loss options) that need it."""
    who = [p.describe() for p in loss.parts() if field in p.required_fields()]
    if not who:
        who = ["bypass_mode=True" if loss.bypass_mode else f"prox_logp_method={loss.prox_logp_method!r}"]
    owner = f"loss {loss.name}" if loss.name else "the loss"
    return BatchError(f"{owner} needs PolicyBatch.{field} for {', '.join(who)}; it is None")
