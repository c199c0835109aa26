"""One generic name -> object registry, used for every slot of the zoo.

Slots: ratio levels, surrogates, KL estimators, aggregations, token weights, penalties, advantage
estimators and presets each have one :class:`Registry`. Choosing an algorithm is choosing a name
(as in verl's ``@register_policy_loss("gspo")``); users register their own parts the same way.
"""

import contextlib
import dataclasses
import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Configurable", "Registry", "UnknownNameError"]

T = TypeVar("T")


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
            folded = {n.casefold().replace("-", "_"): n for n in self._items}
            key = name.casefold().replace("-", "_")
            if key in folded:
                return self._items[folded[key]]
            close = [folded[n] for n in difflib.get_close_matches(key, list(folded), n=3, cutoff=0.6)]
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise UnknownNameError(f"unknown {self.kind} {name!r}{hint}; valid names: {', '.join(self.names())}")

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs sorted by name."""
        return sorted(self._items.items())

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


class Configurable:
    """Mixin of the registered components that are dataclasses (loss parts, advantage estimators): their
    keyword options are their dataclass fields."""

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The keyword options (dataclass fields) of this component."""
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    def options(self) -> dict[str, Any]:
        """Current option values, by name."""
        return {name: getattr(self, name) for name in self.option_names()}
