"""Tasks from reasoning-gym: any of its procedural data sets by name, with its config options.

Train/eval separation. reasoning-gym generators draw item ``i`` of a data set with seed ``s`` from
``random.Random(s + i)``: passing the user's seeds through unchanged would make the eval set (seed 1000)
a shifted copy of the training stream (seed 1) from item 999 on. So the seeds reaching reasoning-gym are
derived (SHA-256 of ``("eval", eval_seed)`` and ``("train", train_seed, chunk)``) and every training
chunk whose ``[s, s + CHUNK)`` range meets the eval range is skipped: no training item is generated from
the same RNG state as an eval item. Procedural generators still repeat *problems* by chance (chain_sum
with two 1-digit terms has only 200 distinct questions); :meth:`Task.eval_overlap` measures that, and
``exclude_eval_questions=True`` drops training items whose question string is in the eval set (off by
default, as in a plain TRL run on two reasoning-gym seeds).
"""

import dataclasses
import itertools
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rlzoo.registry import UnknownNameError, close_names, did_you_mean
from rlzoo.trainer.tasks.base import TRAIN_CHUNK, Task, TaskItem, derive_seed

__all__ = ["ReasoningGymTask", "list_reasoning_gym_tasks"]


def list_reasoning_gym_tasks() -> list[str]:
    """Sorted names of the registered reasoning-gym data sets."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _check_option_type(config_cls: type, option: str, value: Any) -> None:
    """Refuse ``value`` for the reasoning-gym config field ``option`` when the field is an int, float, bool, str or
    Literal (possibly Optional) and ``value`` is not one (where the field's default is not one either, a value
    of the default's type goes): reasoning-gym compares the values unchecked, so ``--task.min_terms abc`` failed
    with Python's "'>' not supported between instances of 'str' and 'int'". Other fields are left to reasoning-gym.

    Raises:
        ValueError: one line naming the option (``--task.NAME``) and what it takes.
    """
    try:
        hint = typing.get_type_hints(config_cls).get(option)
    except (NameError, TypeError, AttributeError):  # an annotation that does not resolve: reasoning-gym checks the value
        return
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        if value is None:
            return
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return
        hint = rest[0]
    if typing.get_origin(hint) is typing.Literal:
        fits, want = (lambda v: v in typing.get_args(hint)), f"one of {', '.join(map(repr, typing.get_args(hint)))}"
    elif hint is bool:
        fits, want = (lambda v: isinstance(v, bool)), "true or false"
    elif hint is int:
        fits, want = (lambda v: isinstance(v, int) and not isinstance(v, bool)), "an integer"
    elif hint is float:
        fits, want = (lambda v: isinstance(v, int | float) and not isinstance(v, bool)), "a number"
    elif hint is str:
        fits, want = (lambda v: isinstance(v, str)), "a string"
    else:
        return
    ok = fits(value)
    default = next((f.default for f in dataclasses.fields(config_cls) if f.name == option), dataclasses.MISSING)
    if not ok and default is not dataclasses.MISSING and not fits(default):
        # an annotation its own default does not fit (rearc's diff_ub: int, default 0.2): the default's type goes
        ok = type(value) is type(default)
    if not ok:
        raise ValueError(f"task option {option} (--task.{option}) must be {want}{' or null' if optional else ''}, "
                         f"got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ReasoningGymTask(Task):
    """A reasoning-gym procedural data set (see the module docstring for the seed derivation).

    Attributes:
        name: reasoning-gym data set name (:func:`list_reasoning_gym_tasks`).
        kwargs: the data set's config fields (e.g. chain_sum ``min_terms``); not ``seed``/``size``.
        train_seed: seed of the training stream.
        eval_seed: seed of the held-out set.
        eval_size: held-out items (>= 0).
        exclude_eval_questions: drop training items whose question string is an eval question.

    Raises (at construction):
        UnknownNameError: unknown data set name (lists the available ones).
        ValueError: bad config kwargs (names the valid fields), a value not of its field's type (an integer, ...),
            or invalid values (reasoning-gym's message).
    """

    name: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    train_seed: int = 1
    eval_seed: int = 1000
    eval_size: int = 200
    exclude_eval_questions: bool = False

    def __post_init__(self) -> None:
        from reasoning_gym.factory import DATASETS

        if self.name not in DATASETS:
            close = close_names(self.name, list_reasoning_gym_tasks(), n=2, cutoff=0.8)
            if Path(self.name).suffix and not close:  # a data file's name mistyped (data.jsnol): the files beside it
                folder = Path(self.name).parent
                files = [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
                close = [str(folder / f) for f in close_names(Path(self.name).name, files, n=2, cutoff=0.8)]
            meant = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise UnknownNameError(
                f"unknown task {self.name!r}: not a data file, a data set directory or a hub id (org/name), nor a "
                f"reasoning-gym task{meant}; "
                f"available: {', '.join(list_reasoning_gym_tasks())}"
            )
        if self.eval_size < 0:
            raise ValueError(f"eval_size must be >= 0, got {self.eval_size}")
        _, config_cls = DATASETS[self.name]
        fields = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size"))
        bad = sorted(set(self.kwargs) - set(fields))
        if bad:
            reserved = [k for k in bad if k in ("seed", "size")]
            hint = " (use train_seed / eval_seed / eval_size instead)" if reserved else did_you_mean(bad, fields)
            raise ValueError(
                f"unknown option(s) {bad} for reasoning-gym task {self.name!r}{hint}; "
                f"valid: {', '.join(fields)}"
            )
        for option, value in self.kwargs.items():
            _check_option_type(config_cls, option, value)
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))
        # builds (and validates) the config now; its instance is the scorer
        object.__setattr__(
            self, "_scorer", self._dataset(derive_seed("eval", self.eval_seed), max(self.eval_size, 1))
        )

    def _dataset(self, seed: int, size: int) -> Any:
        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(self.name, seed=seed, size=size, **self.kwargs)
        except (AssertionError, ValueError, TypeError) as err:
            raise ValueError(
                f"invalid options {dict(self.kwargs)} for reasoning-gym task {self.name!r}: {err}"
            ) from err

    def _item(self, entry: Mapping[str, Any], index: int) -> TaskItem:
        return TaskItem(
            question=str(entry["question"]), answer=str(entry["answer"]), columns=dict(entry), index=index
        )

    def _build_eval_items(self) -> list[TaskItem]:
        dataset = self.__dict__["_scorer"]
        return [self._item(dataset[i], i) for i in range(self.eval_size)]

    def train_chunk_seeds(self) -> Iterator[int]:
        """The derived seed of each training chunk of ``TRAIN_CHUNK`` items, skipping chunks that would share a
        random state with a held-out item."""
        eval_lo = derive_seed("eval", self.eval_seed)
        eval_hi = eval_lo + self.eval_size
        for chunk in itertools.count():
            seed = derive_seed("train", self.train_seed, chunk)
            if seed < eval_hi and eval_lo < seed + TRAIN_CHUNK:  # would share an RNG state with an eval item
                continue
            yield seed

    def _raw_train_items(self, start: int) -> Iterator[TaskItem]:
        first_chunk, offset = divmod(start, TRAIN_CHUNK)
        seeds = itertools.islice(self.train_chunk_seeds(), first_chunk, None)
        for chunk, seed in enumerate(seeds, start=first_chunk):
            dataset = self._dataset(seed, TRAIN_CHUNK)
            for i in range(offset if chunk == first_chunk else 0, TRAIN_CHUNK):
                yield self._item(dataset[i], chunk * TRAIN_CHUNK + i)

    def score(self, answer: str | None, row: Mapping[str, Any]) -> float:
        """reasoning-gym's ``score_answer(answer=answer, entry=row)`` (the data set's scorer, in [0, 1])."""
        return float(self.__dict__["_scorer"].score_answer(answer=answer, entry=dict(row)))

