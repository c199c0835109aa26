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
  completion; ``log_metric(name, value)``: a scalar averaged over the step and logged with the step's metrics
  (their checks: :mod:`rlzoo.trainer.reward_logs`).
- ``columns``: every other column of the item (:attr:`rlzoo.trainer.tasks.TaskItem.columns`), one entry per
  completion (TRL repeats each prompt's columns over its ``G`` completions). Write functions with ``**kwargs``.

One difference from TRL: an explicit NaN or inf return is an error (return None for "not applicable").
Reward functions are named as TRL names them (:mod:`rlzoo.trainer.reward_loading`).

Notation: ``N`` completions, ``K`` reward functions.
"""

import asyncio
import dataclasses
import functools
import logging
import math
import sys
import threading
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.registry import UnknownNameError
from rlzoo.trainer.config import RewardConfig
from rlzoo.trainer.reward_functions import (
    BUILTIN_REWARDS,
    REWARD_ARGUMENTS,
    RewardFunction,
    RewardFunctionError,
    accuracy_reward,
    check_reward_values,
    completion_text,
    factory_error,
    format_reward,
    is_async_reward,
    nanstd,
    reward_error,
)
from rlzoo.trainer.reward_loading import RewardModel, load_reward_function
from rlzoo.trainer.reward_logs import MetricNameError, RewardLogs
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
            row where every function returned None (TRL: "unscorable"; the trainer gives it advantage 0, leaves it out
            of its group's baseline and logs a warning).
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
class RewardSet(RewardLogs):
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
        extra_columns: see :class:`~rlzoo.trainer.reward_logs.RewardLogs`.

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

        super().__init__()
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
                        if "," in spec:  # --report-to takes a comma list; --reward-funcs, like TRL's, separate names
                            raise UnknownNameError(f"unknown reward function {spec!r}: give the functions as separate "
                                                   f"arguments (--reward-funcs {' '.join(spec.split(','))})") from None
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
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"RewardSet(names={self.names}, weights={self.weights})"

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
        reserved = sorted(set(REWARD_ARGUMENTS) & set(columns))
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
            if is_async_reward(fn):
                pending.append((k, fn, name, own))
                continue
            try:
                values = fn(**own)
            except MetricNameError:
                raise  # names the function already
            except Exception as err:
                raise reward_error(name, fn, err, call, self._task) from err
            table[:, k] = torch.tensor(check_reward_values(values, n, name), dtype=torch.float32)
        for (k, _, name, _), values in zip(pending, self._gather([(fn, name, own) for _, fn, name, own in pending]),
                                           strict=True):
            table[:, k] = torch.tensor(check_reward_values(values, n, name), dtype=torch.float32)
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
            except MetricNameError:
                raise
            except Exception as err:
                raise reward_error(name, fn, err, call, self._task) from err

        async def every() -> list[Any]:
            return list(await asyncio.gather(*(one(fn, name, call) for fn, name, call in functions)))

        return asyncio.run_coroutine_threadsafe(every(), self._loop).result()


def build_rewards(config: RewardConfig, extra: Sequence[RewardFunction], *, task: TaskStream, max_steps: int,
                  device: str | torch.device) -> RewardSet:
    """The run's :class:`RewardSet`: ``config.reward_funcs`` then the Python API's ``extra`` functions, with
    ``config.reward_weights``.

    Raises:
        ValueError: no function (empty ``reward_funcs``, no ``extra``), or not one weight per function (names them).
        the errors of :class:`RewardSet`.
    """
    functions = list(config.reward_funcs) + list(extra)
    if not functions:  # a config file's reward_funcs = []: RewardSet's own error named neither
        raise ValueError("reward_funcs is empty and no Python reward function was given: name one (e.g. accuracy)")
    if config.reward_weights is not None and len(config.reward_weights) != len(functions):
        callables = f" and {[_function_name(fn) for fn in extra]} (Python callables)" if extra else ""
        raise ValueError(f"reward_weights has {len(config.reward_weights)} entries but there are {len(functions)} "
                         f"reward functions: {list(config.reward_funcs)} (reward_funcs){callables}")
    return RewardSet(functions, weights=config.reward_weights, task=task, max_steps=max_steps, device=device)
