"""The base of the trainer's config sections (:mod:`rlzoo.trainer.config`): typed, range-checked, frozen."""

import dataclasses
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import tyro

from rlzoo.trainer.config_files import coerce

__all__ = ["DottedOptions", "OptionalDottedOptions", "Section"]

# Mapping options are given as dotted flags (--loss.epsilon_high 0.28), parsed by rlzoo.cli, not by tyro.
DottedOptions = Annotated[Mapping[str, Any], tyro.conf.Suppress]
OptionalDottedOptions = Annotated[Mapping[str, Any] | None, tyro.conf.Suppress]

S = TypeVar("S", bound="Section")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
    """Base of the config sections: values are type-checked (:func:`coerce`) and range-checked on construction.

    A section lists its range checks in :meth:`checks`; sections combined by inheritance (``TrainConfig``)
    run all of them (each ``checks`` extends ``super().checks()``).

    Raises:
        ValueError: a value of the wrong type or out of range, naming the field and what it must be.
    """

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, coerce(field.name, getattr(self, field.name), hints[field.name]))
        for name, ok, want in self.checks():
            if not ok:
                raise ValueError(f"{name} must be {want}, got {getattr(self, name)!r}")

    def checks(self) -> list[tuple[str, bool, str]]:
        """``(field, holds, what it must be)`` for each range check of this section."""
        return []
