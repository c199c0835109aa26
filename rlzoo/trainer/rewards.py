"""Reward functions with TRL's signature, and a :class:`RewardSet` that evaluates several of them.

A reward function is called as TRL 1.16's GRPOTrainer calls it (``_calculate_rewards``):
``fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_extra=..., log_metric=...,
**columns)`` and returns one ``float`` (or ``None`` = "not applicable to this completion") per completion;
``async def`` functions are awaited, all of them concurrently, on one event loop that lives as long as the
:class:`RewardSet` (TRL's daemon loop).

- ``prompts``: each data set row's prompt as the data set holds it: a string (TRL's standard format) or a list
  of messages (conversational); for reasoning-gym tasks, the prompt string the model was given
  (:func:`rlzoo.trainer.tasks.format_prompt`).
- ``completions``: the decoded completions (special tokens removed): strings for standard prompts,
  ``[{"role": "assistant", "content": text}]`` for conversational ones (``completions[i][0]["content"]``).
- ``completion_ids``: the completion token ids (lists, EOS included, no padding).
- ``trainer_state``: a ``transformers.TrainerState`` whose ``global_step`` is the optimizer steps taken and
  ``max_steps`` the run's length (for curricula); in a run the trainer also sets ``epoch`` and
  ``num_train_epochs`` (:meth:`RewardSet.set_progress`): for a data set of ``R`` training rows, the rows drawn
  before this generation batch divided by ``R`` (a float: 1.5 = one and a half passes) and the passes the run's
  ``max_steps`` take, ``ceil(rows drawn by max_steps / R)``; for an endless task (reasoning-gym) or a streamed
  ``IterableDataset``, whose length is unknown, what ``transformers.Trainer`` sets for a data set without a length:
  ``epoch = global_step / max_steps`` (the run is one epoch) and ``num_train_epochs = sys.maxsize``.
- ``log_extra(column, values)``: adds a column to the completions table (``--log-completions``), one value per
  completion (a function may log a column in several calls, as TRL extends it; another count is an error naming
  the function, the column and the counts, where TRL would misalign the table); when several functions log the
  same column the last one logged is kept, as TRL keeps it (a warning when the values differ);
  ``log_metric(name, value)``: a scalar averaged over the step and logged with the step's metrics. A name the
  trainer writes in the step's row itself (``step``, ``loss``, ``reward``, ``rewards/NAME/mean``, ``kl``,
  ``eval/...``: every key of the row, checked when the row is assembled, plus ``step`` and ``eval/*`` when logged)
  is an error naming the function and the metric, where TRL would average it into its own metric or overwrite it
  (prefix the name, e.g. ``FUNCTION/loss``).
- ``columns``: every other column of the item (:attr:`rlzoo.trainer.tasks.TaskItem.columns`), one entry per
  completion (TRL repeats each prompt's columns over its ``G`` completions). Write functions with ``**kwargs``.

One difference from TRL: an explicit NaN or inf return is an error (return None for "not applicable").
Reward functions are named as TRL names them (:mod:`rlzoo.trainer.reward_loading`).

Notation: ``N`` completions, ``K`` reward functions.
"""

import asyncio
import collections
import dataclasses
import functools
import inspect
import logging
import math
import numbers
import sys
import threading
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.registry import UnknownNameError
from rlzoo.trainer.config import RewardConfig
from rlzoo.trainer.distributed import ONE_PROCESS, Distributed
from rlzoo.trainer.reward_functions import (
    BUILTIN_REWARDS,
    REWARD_ARGUMENTS,
    RewardFunction,
    RewardFunctionError,
    accuracy_reward,
    completion_text,
    factory_error,
    format_reward,
    nanstd,
    reward_error,
)
from rlzoo.trainer.reward_loading import RewardModel, load_reward_function
from rlzoo.trainer.tasks import DEFAULT_EXTRACTION, Task, TaskItem, TaskStream, is_conversational

log = logging.getLogger("rlzoo.train")

__all__ = [
    "BUILTIN_REWARDS",
    "RewardFunction",
    "RewardFunctionError",
    "RewardModel",
    "RewardOutput",
    "RewardSet",
    "accuracy_reward",
    "build_rewards",
    "completion_text",
    "format_reward",
    "load_reward_function",
    "nanstd",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardOutput:
    """Rewards of one batch of ``N`` completions under ``K`` functions.

    Attributes:
        per_function: ``Float[N, K]`` float32; NaN where a function returned None.
        total: ``Float[N]`` TRL's combined reward: ``nansum_k(weights[k] * per_function[:, k])``, NaN for a
            row where every function returned None (TRL: "unscorable"; the trainer gives it reward 0 and logs a warning).
        metrics: ``rewards/{name}/mean`` and ``rewards/{name}/std`` (NaN-ignoring, as TRL logs them),
            ``reward`` and ``reward_std`` of ``total``; Python floats.
    """

    per_function: Float[Tensor, "N K"]
    total: Float[Tensor, " N"]
    metrics: Mapping[str, float]


def _function_name(fn: Any) -> str:
    """The name a reward's metrics go under: a ``functools.partial`` by the function it wraps (as TRL 1.16's
    ``get_callable_name``), else ``__name__`` or the class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


@typing.final
class RewardSet:
    """Several reward functions with weights, evaluated together on a batch (TRL's ``reward_funcs``).

    Args:
        functions: one or several reward functions (TRL signature, sync or ``async``), sequence-classification models
            (``PreTrainedModel``: a :class:`~rlzoo.trainer.reward_loading.RewardModel` with the tokenizer of its
            ``config._name_or_path``, as TRL; build the ``RewardModel`` yourself to give another tokenizer) or names:
            ``"accuracy"`` (:func:`accuracy_reward` of ``task``), ``"format"`` (:func:`format_reward`, style ``tag``
            when the extraction is ``tag``, else ``number``), or any spelling :func:`load_reward_function` resolves
            (``module:function``, ``pkg.module.function``, TRL's names, reward models).
        weights: one finite weight per function (TRL ``reward_weights``); None = all 1.
        names: one distinct name per function for metrics and errors; None = the built-in name or the
            function's ``__name__`` (``_2``, ``_3``... appended to repeats).
        task: the :class:`~rlzoo.trainer.tasks.Task` or :class:`~rlzoo.trainer.tasks.TaskStream` that
            ``"accuracy"`` scores with, and whose columns the functions get (a function's missing-column error
            says how to provide the column for that kind of task).
        extraction: answer extraction for ``"accuracy"``/``"format"``; None = the TaskStream's
            ``answer_extraction``, else :data:`~rlzoo.trainer.tasks.DEFAULT_EXTRACTION`.
        max_steps: the run's length (``trainer_state.max_steps``).
        device: where reward models run.

    Attributes:
        functions, names, weights (tuples).
        trainer_state: the ``transformers.TrainerState`` passed to the functions (the trainer sets its
            ``global_step``, ``epoch`` and ``num_train_epochs`` with :meth:`set_progress`).
        extra_columns: what the functions logged with ``log_extra`` since :meth:`take_extra` or :meth:`take_logged`
            (column -> values).

    Raises:
        ValueError: no functions, a weight count that does not match, non-finite weights, repeated names,
            ``"accuracy"`` without a task (or a task without answers).
        UnknownNameError: a name that is neither built-in nor a loadable spelling (lists the built-ins).
        RewardFunctionError: a callable that is a factory of reward functions (e.g. TRL's
            ``get_soft_overlong_punishment``; says to call it first).
        TypeError: an entry that is neither a string nor callable; :class:`~rlzoo.registry.WrongTypeError` (also a
            ``ValueError``) a ``torch.nn.Module`` that is not a ``PreTrainedModel``.
        and the errors of :func:`load_reward_function`.
    """

    def __init__(
        self,
        functions: str | RewardFunction | Sequence[str | RewardFunction],
        *,
        weights: Sequence[float | int] | None = None,
        names: Sequence[str] | None = None,
        task: Task | TaskStream | None = None,
        extraction: str | None = None,
        max_steps: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        from transformers import TrainerState

        if isinstance(functions, str) or callable(functions):  # one function, as TRL's reward_funcs takes it
            functions = [functions]
        if not functions:
            raise ValueError("RewardSet needs at least one reward function")
        if extraction is None:
            extraction = task.answer_extraction if isinstance(task, TaskStream) else DEFAULT_EXTRACTION
        base_task = task.task if isinstance(task, TaskStream) else task
        resolved: list[RewardFunction] = []
        for spec in functions:
            if isinstance(spec, str):
                if spec == "accuracy":
                    if base_task is None:
                        raise ValueError("reward function 'accuracy' needs a task (RewardSet(..., task=...))")
                    fn = accuracy_reward(base_task, extraction)
                elif spec == "format":
                    fn = format_reward("tag" if extraction == "tag" else "number")
                else:
                    try:
                        fn = load_reward_function(spec, device=device)
                    except ValueError as err:
                        if isinstance(err, RewardFunctionError):
                            raise
                        raise UnknownNameError(f"unknown reward function {spec!r}; built-in: "
                                               f"{', '.join(BUILTIN_REWARDS)}; or {err}") from None
            elif isinstance(spec, torch.nn.Module):  # TRL's reward model object; a module is callable, but not so
                fn = RewardModel(spec, device=device)
            elif callable(spec):
                error = factory_error(_function_name(spec), spec)
                if error is not None:
                    raise error
                fn = spec
            else:
                raise TypeError(f"reward function {spec!r} is neither a name nor callable")
            resolved.append(fn)
        k = len(resolved)
        weight_values = tuple(float(w) for w in weights) if weights is not None else (1.0,) * k
        if len(weight_values) != k:
            raise ValueError(
                f"reward_weights has {len(weight_values)} entries but there are {k} reward functions"
            )
        if not all(math.isfinite(w) for w in weight_values):
            raise ValueError(f"reward_weights must be finite, got {list(weight_values)}")
        if names is None:
            unique: list[str] = []
            for base in map(_function_name, resolved):
                name, n = base, 1
                while name in unique:
                    n += 1
                    name = f"{base}_{n}"
                unique.append(name)
        else:
            unique = list(names)
            if len(unique) != k or len(set(unique)) != k:
                raise ValueError(f"names must be {k} distinct strings, got {unique}")
        self.functions: tuple[RewardFunction, ...] = tuple(resolved)
        self.weights: tuple[float, ...] = weight_values
        self.names: tuple[str, ...] = tuple(unique)
        self.trainer_state = TrainerState(max_steps=max_steps)
        self._task = base_task  # whose columns the functions get (named in their errors)
        self.extra_columns: dict[str, list[Any]] = collections.defaultdict(list)
        self._extra_rows = 0  # completions scored since the extra columns were last taken (aligns the columns)
        self._warned_extra: set[tuple[str, tuple[str, ...]]] = set()
        self._metrics: dict[str, list[float]] = collections.defaultdict(list)
        self._metric_owners: dict[str, dict[str, None]] = {}  # metric -> the functions that logged it (names)
        self._taken_owners: dict[str, dict[str, None]] = {}  # those of the metrics take_logged returned last
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"RewardSet(names={self.names}, weights={self.weights})"

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """TRL's ``log_extra``: add ``values`` (one per completion) to the completions table's ``column``.

        Reward functions called by the set get a ``log_extra`` of their own that checks the count (see
        :meth:`__call__`); this one, for calls outside of the set's, appends as given."""
        self.extra_columns[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar, averaged over the values logged before :meth:`take_logged`.

        Reward functions called by the set get a ``log_metric`` of their own that names them in its errors (see
        :meth:`__call__`); this one is for calls outside of the set's.

        Raises:
            RewardFunctionError: ``name`` is not a string, or ``step`` or ``eval/*``, the trainer's (its other
                names, those of the step's row, are refused when the row is assembled: :meth:`add_logged`).
        """
        self._log_metric(name, value, None)

    def _log_metric(self, name: str, value: float, function: str | None) -> None:
        """Record ``value`` for metric ``name``, logged by reward function ``function`` (None: unknown).

        Raises:
            RewardFunctionError: see :meth:`log_metric` (names ``function``).
        """
        functions = (function,) if function is not None else ()
        if not isinstance(name, str):
            raise _MetricNameError(f"{_who(functions)} logged a metric named {name!r} ({type(name).__name__}) with "
                                   "log_metric; a metric's name is a string")
        if _always_reserved(name):
            raise _MetricNameError(_clash(name, functions, _reserved_because(name)))
        self._metrics[name].append(float(value))
        if function is not None:
            self._metric_owners.setdefault(name, {})[function] = None

    def _metric_logger(self, function: str) -> Callable[[str, float], None]:
        """The ``log_metric`` given to reward function ``function``: :meth:`log_metric`, naming it in errors."""

        def log_metric(name: str, value: float) -> None:
            self._log_metric(name, value, function)

        return log_metric

    def add_logged(self, row: Mapping[str, Any], metrics: Mapping[str, float]) -> dict[str, Any]:
        """``row`` with the ``log_metric`` ``metrics`` of :meth:`take_logged` added, refusing a metric that would
        replace one of the trainer's own: a key of ``row`` (the step's metrics: ``loss``, ``reward``, ``kl``...),
        ``step`` or ``eval/*`` (the held-out evaluation's, joined later). TRL 1.16 would average such a value into
        its own metric of that name, or overwrite it (``loss``); the error is raised before the row is written.

        Raises:
            RewardFunctionError: a metric named as one of the trainer's (names it and the functions that logged it,
                and says to rename it).
        """
        for name in metrics:
            if name in row or _always_reserved(name):
                owners = tuple(self._taken_owners.get(name, ()))
                raise RewardFunctionError(_clash(name, owners, _reserved_because(name)))
        return {**row, **metrics}

    def take_extra(self) -> dict[str, list[Any]]:
        """The ``log_extra`` columns logged since the last call (or :meth:`take_logged`), which forgets them (so that
        the trainer can attach each call's values to the completions it scored)."""
        extra = dict(self.extra_columns)
        self.extra_columns.clear()
        self._extra_rows = 0
        return extra

    def _extra_logger(self, name: str, logged: dict[str, dict[str, list[Any]]]) -> Callable[[str, Sequence[Any]], None]:
        """The ``log_extra`` given to reward function ``name`` in one call: collects its values per column in
        ``logged`` (column -> function -> values; the function that logged a column last comes last), extending
        them when it logs a column again, as TRL's ``_log_completion_extra``."""

        def log_extra(column: str, values: Sequence[Any]) -> None:
            if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                raise RewardFunctionError(f"reward function {name!r} logged {type(values).__name__} for column "
                                          f"{column!r} with log_extra; expected a list, one value per completion")
            by_function = logged.setdefault(column, {})
            by_function[name] = [*by_function.pop(name, []), *values]

        return log_extra

    def _record_extra(self, logged: Mapping[str, Mapping[str, list[Any]]], n: int) -> None:
        """Add one call's ``log_extra`` columns (``n`` completions) to :attr:`extra_columns`, aligned: a column not
        logged by this call (or only by later ones) is None for its completions.

        As TRL 1.16 (``_log_completion_extra`` extends the batch's list; the table keeps the generation batch's last
        values), a column several functions logged keeps the values of the one that logged it last (a warning,
        once, when their values differ). A count other than ``n`` is an error, where TRL would misalign the table.

        Raises:
            RewardFunctionError: a function logged a column with a count other than ``n`` (names it, the column and
                both counts).
        """
        for column, by_function in logged.items():
            for name, values in by_function.items():
                if len(values) != n:
                    raise RewardFunctionError(
                        f"reward function {name!r} logged {len(values)} values for column {column!r} with log_extra, "
                        f"but {n} completions were scored (one value per completion; TRL would misalign the "
                        "completions table)")
        for column, by_function in logged.items():
            names = tuple(by_function)
            if len(names) > 1 and (column, names) not in self._warned_extra:
                first = next(iter(by_function.values()))
                try:
                    same = all(bool(values == first) for values in by_function.values())
                except (ValueError, TypeError):  # values whose == is not a bool (arrays)
                    same = False
                if not same:
                    self._warned_extra.add((column, names))
                    log.warning("reward functions %s all log the column %r with log_extra; the completions table "
                                "keeps the values of %r (the last logged, as TRL)", ", ".join(map(repr, names)), column,
                                names[-1])
        for column in [*self.extra_columns, *(c for c in logged if c not in self.extra_columns)]:
            values = list(logged[column].values())[-1] if column in logged else [None] * n
            self.extra_columns[column] = [*self.extra_columns.get(column, [None] * self._extra_rows), *values]
        self._extra_rows += n

    def take_logged(self, dist: Distributed = ONE_PROCESS) -> tuple[dict[str, float], dict[str, list[Any]]]:
        """The metrics and extra columns logged since the last call, which forgets them. A metric is the mean of every
        value logged for it on every rank of ``dist`` (TRL 1.16 ``GRPOTrainer._generate_and_score_completions``: the
        values' sum over the processes divided by their count; one all-gather); extra columns are this rank's."""
        sums = {name: (sum(v), len(v)) for name, v in self._metrics.items() if v}
        if dist.enabled:  # a metric some ranks did not log counts their values only
            merged: dict[str, tuple[float, int]] = {}
            gathered = dist.all_gather_object((sums, {k: list(v) for k, v in self._metric_owners.items()}))
            for rank_sums, owners in gathered:
                for name, (total, count) in rank_sums.items():
                    before = merged.get(name, (0.0, 0))
                    merged[name] = (before[0] + total, before[1] + count)
                for name, functions in owners.items():  # so that every rank's error names them alike
                    self._metric_owners.setdefault(name, {}).update(dict.fromkeys(functions))
            sums = merged
        self._metrics.clear()
        self._taken_owners, self._metric_owners = self._metric_owners, {}  # an error names this round's functions
        return {name: total / count for name, (total, count) in sums.items()}, self.take_extra()

    def set_progress(self, *, global_step: int, rows_drawn: int, train_rows: int | None,
                     rows_per_run: int) -> None:
        """Set :attr:`trainer_state`'s progress as TRL's ``TrainerState`` holds it, for the functions' schedules.

        Args:
            global_step: optimizer steps taken (``global_step``).
            rows_drawn: training rows drawn from the task before this generation batch.
            train_rows: the training rows of one pass over the data (one epoch); None for an endless task or a
                stream of unknown length.
            rows_per_run: the training rows the run's ``max_steps`` draw (without dynamic sampling's extra rounds).

        ``epoch`` is ``rows_drawn / train_rows`` and ``num_train_epochs`` ``ceil(rows_per_run / train_rows)``
        (``transformers.Trainer`` for ``max_steps``: the epochs those steps reach). Without ``train_rows``, what
        ``transformers.Trainer`` sets for a data set without a length: ``epoch = global_step / max_steps`` (the run
        is one epoch; 0 when ``max_steps`` is 0) and ``num_train_epochs = sys.maxsize``.

        Raises:
            ValueError: ``train_rows`` < 1, or a negative count.
        """
        if train_rows is not None and train_rows < 1:
            raise ValueError(f"train_rows must be >= 1 or None, got {train_rows}")
        if min(global_step, rows_drawn, rows_per_run) < 0:
            raise ValueError(f"counts must be >= 0, got global_step={global_step}, rows_drawn={rows_drawn}, "
                             f"rows_per_run={rows_per_run}")
        state = self.trainer_state
        state.global_step = global_step
        if train_rows is None:
            state.epoch = global_step / state.max_steps if state.max_steps else 0.0
            state.num_train_epochs = sys.maxsize
        else:
            state.epoch = rows_drawn / train_rows
            state.num_train_epochs = math.ceil(rows_per_run / train_rows)

    def compute(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        items: Sequence[TaskItem],
        *,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> Float[Tensor, "N K"]:
        """Per-function rewards of completions of task items (NaN where a function returned None).

        The functions see each item's own prompt (:attr:`~rlzoo.trainer.tasks.TaskItem.prompt`) where it has one
        (else the given prompt string), completions as message lists when those prompts are conversational, and
        the items' :attr:`~rlzoo.trainer.tasks.TaskItem.columns` (a key missing from some item is None there).
        See :meth:`__call__` for the checks and errors.
        """
        keys: dict[str, None] = {}
        for item in items:
            keys.update(dict.fromkeys(item.columns))
        columns = {key: [item.columns.get(key) for item in items] for key in keys}
        shown = [p if item.prompt is None else item.prompt for p, item in zip(prompts, items, strict=True)]
        if shown and is_conversational(shown[0]):
            completions = [[{"role": "assistant", "content": c}] for c in completions]  # type: ignore[misc]
        return self(shown, completions, completion_ids=completion_ids, columns=columns).per_function

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        *,
        completion_ids: Sequence[Sequence[int]] | None = None,
        columns: Mapping[str, Sequence[Any]] | None = None,
    ) -> RewardOutput:
        """Evaluate every function on a batch (the async ones concurrently, as TRL's ``asyncio.gather``).

        Args:
            prompts: ``N`` prompts (repeated per completion of a group, as TRL): strings or message lists.
            completions: ``N`` decoded completions: strings or ``[{"role": "assistant", "content": ...}]``.
            completion_ids: ``N`` token-id lists, passed on as ``completion_ids`` if given.
            columns: column name -> ``N`` values, passed on as keyword arguments.

        Raises:
            ValueError: ``prompts``, ``completions``, ``completion_ids`` or a column of different lengths, or
                a column named like a reward-function argument.
            RewardFunctionError: a function raised (chained), returned a non-sequence, the wrong number of
                values, a non-number (str, list...), or NaN/inf, logged a ``log_extra`` column with a count
                other than ``N`` (see :meth:`_record_extra`), or a ``log_metric`` named ``step`` or ``eval/*``
                (:meth:`log_metric`); the message names the function.
        """
        n = len(completions)
        columns = dict(columns or {})
        lengths = {"prompts": len(prompts), **{f"column {k!r}": len(v) for k, v in columns.items()}}
        if completion_ids is not None:
            lengths["completion_ids"] = len(completion_ids)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"{n} completions but {bad}")
        reserved = sorted(set(_ARGUMENTS) & set(columns))
        if reserved:
            raise ValueError(f"column names {reserved} clash with reward-function arguments")
        kwargs: dict[str, Any] = {k: list(v) for k, v in columns.items()}
        if completion_ids is not None:
            kwargs["completion_ids"] = [list(ids) for ids in completion_ids]
        kwargs.update(trainer_state=self.trainer_state, log_extra=self.log_extra, log_metric=self.log_metric)
        call = {"prompts": list(prompts), "completions": list(completions), **kwargs}
        table = torch.empty(n, len(self.functions), dtype=torch.float32)
        pending = []
        logged: dict[str, dict[str, list[Any]]] = {}
        for k, (fn, name) in enumerate(zip(self.functions, self.names, strict=True)):
            own = {**call, "log_extra": self._extra_logger(name, logged), "log_metric": self._metric_logger(name)}
            if _is_async(fn):
                pending.append((k, fn, name, own))
                continue
            try:
                values = fn(**own)
            except _MetricNameError:
                raise  # names the function already
            except Exception as err:
                raise reward_error(name, fn, err, call, self._task) from err
            table[:, k] = torch.tensor(_check_values(values, n, name), dtype=torch.float32)
        for (k, _, name, _), values in zip(pending, self._gather([(fn, name, own) for _, fn, name, own in pending]),
                                           strict=True):
            table[:, k] = torch.tensor(_check_values(values, n, name), dtype=torch.float32)
        self._record_extra(logged, n)
        weights = torch.tensor(self.weights, dtype=torch.float32)
        unscorable = torch.isnan(table).all(dim=1)
        total = (table * weights).nansum(dim=1)
        total[unscorable] = float("nan")
        metrics: dict[str, float] = {}
        for k, name in enumerate(self.names):
            metrics[f"rewards/{name}/mean"] = float(torch.nanmean(table[:, k]))
            metrics[f"rewards/{name}/std"] = float(nanstd(table[:, k]))
        metrics["reward"] = float(torch.nanmean(total))
        metrics["reward_std"] = float(nanstd(total))
        return RewardOutput(per_function=table, total=total, metrics=metrics)

    def _gather(self, functions: list[tuple[Any, str, Mapping[str, Any]]]) -> list[Any]:
        """Await the async functions (each with its call's arguments) together on the set's event loop (started on
        first use, in a daemon thread)."""
        if not functions:
            return []
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="rlzoo-rewards", daemon=True).start()

        async def one(fn: Any, name: str, call: Mapping[str, Any]) -> Any:
            try:
                return await fn(**call)
            except _MetricNameError:
                raise
            except Exception as err:
                raise reward_error(name, fn, err, call, self._task) from err

        async def every() -> list[Any]:
            return list(await asyncio.gather(*(one(fn, name, call) for fn, name, call in functions)))

        return asyncio.run_coroutine_threadsafe(every(), self._loop).result()


_ARGUMENTS = REWARD_ARGUMENTS


class _MetricNameError(RewardFunctionError):
    """A ``log_metric`` name the trainer keeps for itself; raised inside the reward function's call and passed on as
    it is (it names the function already)."""


def _who(functions: Sequence[str]) -> str:
    """``reward function 'f'``, ``reward functions 'f' and 'g'``, or ``a reward function`` when none is known."""
    if not functions:
        return "a reward function"
    return f"reward function{'s' if len(functions) > 1 else ''} {' and '.join(map(repr, functions))}"


def _always_reserved(name: str) -> bool:
    """Whether metric ``name`` is the trainer's in every row: ``step``, and ``eval/*`` (the evaluation's, joined
    after the reward metrics)."""
    return name == "step" or name.startswith("eval/")


def _reserved_because(name: str) -> str:
    """Why metric ``name`` is the trainer's (for :func:`_clash`)."""
    if name.startswith("eval/"):
        return "the held-out evaluation writes eval/* in the step's row"
    return "the trainer writes it in every row" if name == "step" else "the trainer writes it in the step's row"


def _clash(name: str, functions: Sequence[str], why: str) -> str:
    """The one-line error of metric ``name``, one of the trainer's, logged by ``functions``."""
    rename = f"{functions[0] if functions else 'FUNCTION'}/{name}"
    return f"{_who(functions)} logged the metric {name!r} with log_metric, but {why}: log it under another name, " \
           f"e.g. {rename!r}"


def _is_async(fn: Any) -> bool:
    """An ``async def`` function or an object whose ``__call__`` is one (TRL's ``is_async_callable``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def build_rewards(config: RewardConfig, extra: Sequence[RewardFunction], *, task: TaskStream, max_steps: int,
                  device: str | torch.device) -> RewardSet:
    """The run's :class:`RewardSet`: ``config.reward_funcs`` then the Python API's ``extra`` functions, with
    ``config.reward_weights``.

    Raises:
        ValueError: ``config.reward_weights`` does not hold one weight per function (names, then ``extra``).
        the errors of :class:`RewardSet`.
    """
    functions = list(config.reward_funcs) + list(extra)
    if config.reward_weights is not None and len(config.reward_weights) != len(functions):
        callables = f" and {[_function_name(fn) for fn in extra]} (Python callables)" if extra else ""
        raise ValueError(f"reward_weights has {len(config.reward_weights)} entries but there are {len(functions)} "
                         f"reward functions: {list(config.reward_funcs)} (reward_funcs){callables}")
    return RewardSet(functions, weights=config.reward_weights, task=task, max_steps=max_steps, device=device)


def _check_values(values: Any, n: int, name: str) -> list[float]:
    """Validate one function's output; None -> NaN."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        if isinstance(values, Tensor | np.ndarray) and values.ndim == 1:  # TRL iterates whatever is returned
            values = values.tolist()
        else:
            raise RewardFunctionError(
                f"reward function {name!r} must return a list of {n} floats (or None), "
                f"got {type(values).__name__}"
            )
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} rewards, but {n} were expected "
            "(one per prompt-completion pair)"
        )
    out: list[float] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(float("nan"))
            continue
        if not isinstance(value, numbers.Real):  # bool counts as 0/1, as in TRL
            raise RewardFunctionError(
                f"reward function {name!r} returned {value!r} ({type(value).__name__}) at index {i}; "
                "expected a float or None"
            )
        value = float(value)
        if not math.isfinite(value):
            raise RewardFunctionError(
                f"reward function {name!r} returned {value} at index {i}; return None for 'not applicable'"
            )
        out.append(value)
    return out
