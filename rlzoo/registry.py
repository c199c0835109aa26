"""One generic name -> object registry, and :class:`Component`, the base of every registered part.

Every slot of the zoo (ratio levels, IS corrections, surrogates, token weights, penalties, aggregations,
advantage estimators, loss presets) has one :class:`Registry`. Choosing an algorithm is choosing a name (as
in verl's ``@register_policy_loss("gspo")``).

Loss parts and advantage estimators are :class:`Component` subclasses: subclassing with ``name=``
registers the class in its slot's registry and makes it a frozen keyword-only dataclass whose fields are
its options::

    class PPOClip(Surrogate, name="ppo_clip"):     # registered in Surrogate.registry as "ppo_clip"
        epsilon_low: float = 0.2                   # an option: a dataclass field

A subclass without ``name=`` is an abstract or shared base (a dataclass too, registered nowhere).
"""

import contextlib
import dataclasses
import difflib
import functools
import math
import numbers
import sys
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

if sys.version_info >= (3, 12):  # pragma: no cover - depends on the interpreter
    from typing import dataclass_transform
else:  # pragma: no cover
    from typing_extensions import dataclass_transform

__all__ = ["Component", "Registry", "UnknownNameError", "WrongTypeError", "check_choice", "check_number", "choice",
           "close_names", "warn_caller"]

T = TypeVar("T")


def close_names(name: str, names: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The spellings in ``names`` closest to ``name`` (``difflib`` ratio >= ``cutoff``, at most ``n``), compared with
    case and ``-`` / ``_`` folded: the "did you mean" of an unknown name."""
    folded = {key.casefold().replace("-", "_"): key for key in names}
    return [folded[k] for k in difflib.get_close_matches(name.casefold().replace("-", "_"), list(folded), n=n,
                                                         cutoff=cutoff)]


def did_you_mean(unknown: Iterable[str], names: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for each of the ``unknown`` names with a close spelling in ``names``
    (:func:`close_names`), else ``""``: the hint after a list of unknown options."""
    names = list(names)
    pairs = [(bad, close[0]) for bad in unknown if (close := close_names(bad, names, n=1))]
    return f" (did you mean {', '.join(f'{good!r} for {bad!r}' if len(pairs) > 1 else repr(good) for bad, good in pairs)}?)" \
        if pairs else ""


class WrongTypeError(TypeError, ValueError):
    """An input of the wrong type (a ``DatasetDict`` for a ``Dataset``, a module that is not a model); names the
    type expected and how to get one. Subclasses ``ValueError`` too, so that one ``except ValueError`` catches every
    input error (and the ``rlzoo`` command reports it in one line)."""


class UnknownNameError(KeyError, ValueError):
    """An unknown name was asked of a :class:`Registry` (or of a loss option); lists the valid names.

    Subclasses both ``KeyError`` and ``ValueError`` so either ``except`` clause catches it.
    """

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A named collection of objects of one kind.

    Args:
        kind: what the registry holds, used in error messages (e.g. ``"loss preset"``).

    Example:
        >>> reg = Registry[int]("number")
        >>> _ = reg.register("one")(1)
        >>> reg.get("one"), reg.names()
        (1, ['one'])
        >>> with reg.scoped():
        ...     _ = reg.register("two")(2)
        ...     reg.names()
        ['one', 'two']
        >>> reg.names()
        ['one']
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers the decorated object under ``name`` and returns it unchanged.

        Raises:
            ValueError: if ``name`` is empty, not a string, or already registered (registries never
                silently overwrite; use :meth:`scoped` in tests).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """The object registered as ``name``; a name differing only in case or ``-`` / ``_`` is accepted when it
        matches exactly one registered name (``DAPO``, ``dr-grpo``).

        Raises:
            UnknownNameError: (a ``KeyError`` and ``ValueError``) with the closest names ("did you mean") and the
                valid names.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            pass
        close: list[str] = []
        if isinstance(name, str):
            if (found := self.canonical(name)) in self._items:
                return self._items[found]
            close = close_names(name, self._items, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise UnknownNameError(f"unknown {self.kind} {name!r}{hint}; valid names: {', '.join(self.names())}")

    def canonical(self, name: str) -> str:
        """The registered spelling of ``name`` as :meth:`get` resolves it (``DAPO`` -> ``dapo``, ``dr-grpo`` ->
        ``dr_grpo``); ``name`` itself when it matches none (:meth:`get` then raises with its did-you-mean)."""
        if name in self._items or not isinstance(name, str):
            return name
        folded = {n.casefold().replace("-", "_"): n for n in self._items}
        return folded.get(name.casefold().replace("-", "_"), name)

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs sorted by name."""
        return sorted(self._items.items())

    def values(self) -> list[T]:
        """The registered objects, sorted by name."""
        return [obj for _, obj in self.items()]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    @contextlib.contextmanager
    def scoped(self) -> Iterator["Registry[T]"]:
        """Context in which registrations are temporary: on exit the registry is restored.

        Lets a test register a custom part without leaking it into other tests.
        """
        saved = dict(self._items)
        try:
            yield self
        finally:
            self._items = saved

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


# ----------------------------------------------------------------------------------------- validation
def check_number(owner: str, name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, allow_none: bool = False, allow_inf: bool = False) -> None:
    """Raise ``ValueError`` naming ``owner: name`` unless ``value`` is a real number in range.

    Args:
        owner: who owns the option (e.g. ``"ppo_clip"``), first in the message.
        name: the option's name.
        value: the value to check: an ``int`` or ``float`` (not a ``bool``), or None when ``allow_none``.
        low, high: inclusive bounds (``low`` exclusive with ``low_open``); None = unbounded.
        allow_inf: accept +-inf (NaN is never accepted).

    Raises:
        ValueError: ``"{owner}: {name} must be ..., got {value}"``.
    """
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{owner}: {name} must be a number, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        unset = allow_none and isinstance(value, str) and value.strip().lower() in ("none", "null", "~")
        raise ValueError(f"{owner}: {name} must be a number, got {type(value).__name__} {value!r}"
                         + ("; for no value pass None (on the command line: null or None)" if unset else ""))
    if math.isnan(value):
        raise ValueError(f"{owner}: {name} must be a number, got NaN")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{owner}: {name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{owner}: {name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{owner}: {name} must be <= {high}, got {value}")


_NOT_THE_CALLER = frozenset({"rlzoo", "dataclasses", "jaxtyping", "beartype", "typeguard"})  # and runtime type checks


def warn_caller(message: str) -> None:
    """A ``UserWarning`` attributed to the first frame outside rlzoo: the user's line that built the loss, however
    deep inside rlzoo (presets, ``with_options``, ``dataclasses.replace``, a ``__post_init__``) the check ran."""
    frame, level = sys._getframe(1), 2
    while frame is not None and (frame.f_globals.get("__name__", "").partition(".")[0] in _NOT_THE_CALLER
                                 or frame.f_code.co_filename == "<string>" and frame.f_code.co_name == "__init__"):
        frame, level = frame.f_back, level + 1  # (a dataclass's generated __init__ runs in its class's module)
    warnings.warn(message, UserWarning, stacklevel=level if frame is not None else 2)


def check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    """Raise ``ValueError`` naming ``owner: name`` and listing ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def choice(default: str | None, registry: "Registry[Any]", *, allow_none: bool = False) -> Any:
    """A :class:`Component` option whose value is a name registered in ``registry``.

    A string switch becomes a registered alternative: the option holds the name (so configs stay JSON), the
    component resolves it with ``registry.get(name)``, and anyone can register a new alternative. The value
    is checked on construction against ``registry.names()`` (plus None with ``allow_none``).

    Returns:
        A ``dataclasses.field`` carrying the registry in its metadata (see :meth:`Component.choices`).
    """
    return dataclasses.field(default=default, metadata={"registry": registry, "allow_none": allow_none})


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _from_jsonable(value: Any) -> Any:
    if value == "inf":
        return math.inf
    if value == "-inf":
        return -math.inf
    return value


# Option annotations whose values Component checks before ``check`` for a part defined outside rlzoo (a part written
# in a notebook gets the same "must be a number" as the built-in parts, which check their own options): what each
# accepts (a bool is never a number). A field's default is not checked (``x: float = None`` is the user's choice).
_SIMPLE = {float: ("a number", numbers.Real), int: ("an integer", numbers.Integral), bool: ("a bool", bool),
           str: ("a string", str)}


@functools.cache
def _simple_types(cls: type) -> dict[str, tuple[type, ...]]:
    """Per field of the component class ``cls``: the simple types (float, int, bool, str, None) its annotation
    allows, for the fields whose annotation is made only of those (others: not checked here)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 -- an annotation that does not resolve: left to the class's own check
        return {}
    out: dict[str, tuple[type, ...]] = {}
    for field in dataclasses.fields(cls):
        hint = hints.get(field.name)
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        if members and all(m in _SIMPLE or m is type(None) for m in members):
            out[field.name] = tuple(members)
    return out


def _check_simple_type(owner: str, name: str, value: Any, allowed: tuple[type, ...] | None) -> None:
    """Raise ``ValueError`` naming ``owner: name`` unless ``value`` fits ``allowed`` (:func:`_simple_types`)."""
    if allowed is None or (value is None and type(None) in allowed):
        return
    kinds = [m for m in allowed if m in _SIMPLE]
    if any(isinstance(value, _SIMPLE[m][1]) and (m is bool or not isinstance(value, bool)) for m in kinds):
        return
    wanted = " or ".join(_SIMPLE[m][0] for m in kinds) + (" or None" if type(None) in allowed else "")
    raise ValueError(f"{owner}: {name} must be {wanted}, got {type(value).__name__} {value!r}")


# ------------------------------------------------------------------------------------------ component
@dataclass_transform(kw_only_default=True, frozen_default=True)
class Component:
    """Base of every registered component: loss parts (one abstract base per slot) and advantage estimators.

    A subclass is made a frozen, keyword-only dataclass when it is defined; its fields are its keyword
    options. ``name=`` in the class statement registers it in ``cls.registry`` (set by the slot's abstract
    base)::

        class Surrogate(Part, abc.ABC):          # a slot: declares its registry and call signature
            registry: ClassVar[Registry[type]] = surrogates

        class PPOClip(Surrogate, name="ppo_clip"):
            epsilon_low: float = 0.2

    Validation: :meth:`check` (override it, not ``__post_init__``) raises ``ValueError`` naming a bad option;
    options declared with :func:`choice` are checked against their registry first.

    Raises:
        ValueError: on subclassing with a ``name`` already registered in the slot (registries never
            overwrite), or when ``name`` is given to a class whose slot declares no registry.
    """

    registry: ClassVar[Registry[Any]]

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)  # in place: no slots, so the same class
        cls._registered_name = name
        if name is not None:
            if getattr(cls, "registry", None) is None:
                raise ValueError(f"{cls.__name__} names itself {name!r} but its base declares no registry")
            cls.registry.register(name)(cls)

    def __post_init__(self) -> None:
        owner = self.label()
        for field in dataclasses.fields(self):
            registry = field.metadata.get("registry")
            value = getattr(self, field.name)
            if registry is None:
                if not type(self).__module__.startswith("rlzoo.") and value is not field.default:
                    # a part of the user's (the built-in parts check their options with their own messages)
                    _check_simple_type(owner, field.name, value, _simple_types(type(self)).get(field.name))
            elif not (value is None and field.metadata.get("allow_none")):
                check_choice(owner, field.name, value, registry.names())
        self.check()

    def check(self) -> None:
        """Validate the options; raise ``ValueError`` naming the bad one. Default: nothing to check."""

    # ------------------------------------------------------------------------------------------ names
    @classmethod
    def registered_name(cls) -> str:
        """The name this class is registered under.

        Raises:
            LookupError: the class was defined without ``name=`` (an abstract or shared base).
        """
        name = cls.__dict__.get("_registered_name")
        if name is None:
            raise LookupError(f"{cls.__name__} is not registered (define it with name=...)")
        return name

    @classmethod
    def label(cls) -> str:
        """The registered name, or the class name for an unregistered class (used in messages)."""
        return cls.__dict__.get("_registered_name") or cls.__name__

    # ---------------------------------------------------------------------------------------- options
    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The keyword options (dataclass fields) of this component."""
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def choices(cls) -> dict[str, Registry[Any]]:
        """Options declared with :func:`choice`: option name -> the registry of its alternatives."""
        return {f.name: f.metadata["registry"] for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if "registry" in f.metadata}

    def options(self) -> dict[str, Any]:
        """Current option values, by name."""
        return {name: getattr(self, name) for name in self.option_names()}

    # ----------------------------------------------------------------------------------------- config
    def to_config(self) -> dict[str, Any]:
        """JSON-able ``{"name": registered name, **options}`` (infinities as ``"inf"`` / ``"-inf"``)."""
        return {"name": self.registered_name(), **{k: _jsonable(v) for k, v in self.options().items()}}

    @staticmethod
    def from_config(registry: "Registry[Any]", config: Mapping[str, Any]) -> "Component":
        """Inverse of :meth:`to_config` for a component of ``registry``.

        Raises:
            UnknownNameError: the name is not registered (lists the valid names).
            KeyError: ``config`` has no ``"name"``.
        """
        config = dict(config)
        cls = registry.get(config.pop("name"))
        return cls(**{k: _from_jsonable(v) for k, v in config.items()})

    def describe(self) -> str:
        """``name(option=value, ...)``, as printed by ``rlzoo explain`` (an unregistered part: its class name)."""
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{self.label()}({opts})"
