"""Reward functions with TRL's signature, and a :class:`RewardSet` that evaluates several of them.

A reward function is called as ``fn(prompts=..., completions=..., completion_ids=..., **columns)`` and
returns one ``float`` (or ``None`` = "not applicable to this completion") per completion, as in TRL 1.16's
GRPOTrainer (``_calculate_rewards``). Here ``prompts`` are the formatted prompt strings
(:func:`rlzoo.trainer.tasks.format_prompt`), ``completions`` the decoded completion strings (special
tokens removed), ``completion_ids`` the completion token ids (list of lists, EOS included, no padding),
and ``columns`` the task item's columns (:attr:`rlzoo.trainer.tasks.TaskItem.columns`), one list entry
per completion (TRL repeats each prompt's columns over its ``G`` completions). Write functions with
``**kwargs`` so that unused columns are accepted.

Differences from TRL: completions are always plain strings (TRL passes message lists for
conversational data sets: ``completions[i][0]["content"]``); the ``trainer_state``/``log_extra``/
``log_metric`` keyword arguments are not passed; an explicit NaN or inf return is an error (return None).

Notation: ``N`` completions, ``K`` reward functions.
"""

import dataclasses
import importlib
import importlib.util
import math
import numbers
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.registry import UnknownNameError
from rlzoo.trainer.tasks import DEFAULT_EXTRACTION, EXTRACTIONS, Task, TaskItem, TaskStream

__all__ = [
    "BUILTIN_REWARDS",
    "RewardFunction",
    "RewardFunctionError",
    "RewardOutput",
    "RewardSet",
    "accuracy_reward",
    "format_reward",
    "load_reward_function",
    "nanstd",
]

BUILTIN_REWARDS: tuple[str, ...] = ("accuracy", "format")
"""Reward names :class:`RewardSet` resolves itself (anything else must be ``module:function``)."""


@runtime_checkable
class RewardFunction(Protocol):
    """TRL's reward-function contract (``GRPOTrainer(reward_funcs=...)``).

    ``__call__(prompts, completions, **columns) -> list[float | None]``: one value per completion, None when
    the function does not apply to it. Called with keyword arguments only.
    """

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]: ...


class RewardFunctionError(ValueError):
    """A reward function cannot be loaded (no such attribute, not callable), raised, or returned the wrong number
    or type of values; names the function. A ``ValueError``: the ``rlzoo`` command reports it in one line."""


def accuracy_reward(task: Task, extraction: str = DEFAULT_EXTRACTION) -> RewardFunction:
    """The task's own scorer as a reward: ``task.score(extract_answer(completion, extraction), row)``.

    For reasoning-gym tasks that is ``dataset.score_answer(answer, entry)`` (in [0, 1], partial credit for
    answers that contain the reference); for JSONL tasks normalised exact match (0 or 1). The row is
    rebuilt from the columns (every column's i-th value). The function's ``__name__`` is ``"accuracy"``
    (logged as ``rewards/accuracy/mean``).

    Raises:
        UnknownNameError: unknown ``extraction`` (lists :data:`~rlzoo.trainer.tasks.EXTRACTIONS`).
    """
    if extraction not in EXTRACTIONS:
        raise UnknownNameError(f"unknown answer extraction {extraction!r}; valid: {', '.join(EXTRACTIONS)}")

    def accuracy(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        columns.pop("completion_ids", None)
        rows = [{key: values[i] for key, values in columns.items()} for i in range(len(completions))]
        return list(task.score_completions(completions, rows, extraction))

    accuracy.__qualname__ = accuracy.__name__ = "accuracy"
    return accuracy


_FORMATS = {
    # DeepSeek-R1 style: optional <think>...</think>, then exactly one <answer>...</answer>, nothing else
    "tag": r"\s*(?:<think>(?:(?!<think>).)*?</think>\s*)?<answer>(?:(?!<answer>).)*?</answer>\s*",
    # a bare number: optional sign, digits (thousands commas allowed), decimals, optional final period
    "number": r"\s*[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\.?\s*",
}


def format_reward(style: str = "number") -> RewardFunction:
    """1.0 when the whole completion has the expected shape, else 0.0.

    Styles (full match, ``re.DOTALL``):

    - ``number``: the completion is a bare number (optional sign, thousands commas, decimals, a final
      period, surrounding whitespace) and nothing else; pairs with ``full``/``first_number`` extraction.
    - ``tag``: an optional ``<think>...</think>`` followed by one ``<answer>...</answer>`` and nothing else
      (DeepSeek-R1 format; TRL's ``think_format_reward`` checks only the think part); pairs with ``tag``.

    The function's ``__name__`` is ``"format"``.

    Raises:
        UnknownNameError: unknown ``style`` (lists the valid ones).

    Example:
        >>> fn = format_reward("tag")
        >>> fn(prompts=["q", "q"], completions=["<think>1+1</think><answer>2</answer>", "2"])
        [1.0, 0.0]
    """
    import re

    if style not in _FORMATS:
        raise UnknownNameError(f"unknown format reward style {style!r}; valid: {', '.join(sorted(_FORMATS))}")
    pattern = re.compile(_FORMATS[style], re.DOTALL)

    def format(prompts: list[str], completions: list[str], **columns: Any) -> list[float | None]:
        return [1.0 if pattern.fullmatch(c) else 0.0 for c in completions]

    format.__qualname__ = format.__name__ = "format"
    return format


def load_reward_function(spec: str) -> RewardFunction:
    """Import a reward function given as ``"module:function"`` (or ``"path/to/file.py:function"``).

    Raises:
        ValueError: ``spec`` is not of the form ``module:function``.
        ImportError: the module (or file) cannot be found or fails to import (its error is chained).
        RewardFunctionError: the module has no such attribute (the message lists its public callables), or the
            attribute is not callable.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr or not attr.isidentifier():
        raise ValueError(f"reward function {spec!r} must be 'module:function' (or 'file.py:function')")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ImportError(f"reward function {spec!r}: file {module_name!r} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"rlzoo_reward_{path.stem}", path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        try:
            mod_spec.loader.exec_module(module)
        except Exception as err:
            sys.modules.pop(mod_spec.name, None)
            raise ImportError(f"reward function {spec!r}: importing {module_name!r} failed: {err!r}") from err
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise ImportError(f"reward function {spec!r}: no module named {err.name!r}") from err
        except Exception as err:
            raise ImportError(f"reward function {spec!r}: importing {module_name!r} failed: {err!r}") from err
    if not hasattr(module, attr):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardFunctionError(
            f"reward function {spec!r}: module {module_name!r} has no attribute {attr!r}; "
            f"its public callables: {', '.join(public) or '(none)'}"
        )
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardFunctionError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not callable")
    return fn


def nanstd(values: Float[Tensor, "..."]) -> Float[Tensor, ""]:
    """Standard deviation over all entries ignoring NaN, with Bessel's correction (NaN with < 2 values).

    Matches ``trl.trainer.utils.nanstd`` (TRL 1.16) over all dimensions.
    """
    count = (~torch.isnan(values)).sum()
    if count < 2:
        return torch.tensor(float("nan"), dtype=values.dtype)
    mean = torch.nanmean(values)
    return torch.sqrt(torch.nansum((values - mean) ** 2) / (count - 1))


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
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


@typing.final
class RewardSet:
    """Several reward functions with weights, evaluated together on a batch (TRL's ``reward_funcs``).

    Args:
        functions: reward functions (TRL signature) or names: ``"accuracy"`` (:func:`accuracy_reward` of
            ``task``), ``"format"`` (:func:`format_reward`, style ``tag`` when the extraction is ``tag``,
            else ``number``), ``"module:function"`` / ``"file.py:function"`` (:func:`load_reward_function`).
        weights: one finite weight per function (TRL ``reward_weights``); None = all 1.
        names: one distinct name per function for metrics and errors; None = the built-in name or the
            function's ``__name__`` (``_2``, ``_3``... appended to repeats).
        task: the :class:`~rlzoo.trainer.tasks.Task` or :class:`~rlzoo.trainer.tasks.TaskStream` that
            ``"accuracy"`` scores with.
        extraction: answer extraction for ``"accuracy"``/``"format"``; None = the TaskStream's
            ``answer_extraction``, else :data:`~rlzoo.trainer.tasks.DEFAULT_EXTRACTION`.

    Attributes:
        functions, names, weights (tuples).

    Raises:
        ValueError: no functions, a weight count that does not match, non-finite weights, repeated names,
            ``"accuracy"`` without a task.
        UnknownNameError: a name that is neither built-in nor ``module:function`` (lists the built-ins).
        TypeError: an entry that is neither a string nor callable.
        and the errors of :func:`load_reward_function`.
    """

    def __init__(
        self,
        functions: Sequence[str | RewardFunction],
        *,
        weights: Sequence[float | int] | None = None,
        names: Sequence[str] | None = None,
        task: Task | TaskStream | None = None,
        extraction: str | None = None,
    ) -> None:
        if not functions:
            raise ValueError("RewardSet needs at least one reward function")
        if extraction is None:
            extraction = task.answer_extraction if isinstance(task, TaskStream) else DEFAULT_EXTRACTION
        base_task = task.task if isinstance(task, TaskStream) else task
        resolved: list[RewardFunction] = []
        default_names: list[str] = []
        for spec in functions:
            if isinstance(spec, str):
                if spec == "accuracy":
                    if base_task is None:
                        raise ValueError("reward function 'accuracy' needs a task (RewardSet(..., task=...))")
                    fn = accuracy_reward(base_task, extraction)
                elif spec == "format":
                    fn = format_reward("tag" if extraction == "tag" else "number")
                elif ":" in spec:
                    fn = load_reward_function(spec)
                else:
                    raise UnknownNameError(
                        f"unknown reward function {spec!r}; built-in: {', '.join(BUILTIN_REWARDS)}, "
                        "or give 'module:function'"
                    )
            elif callable(spec):
                fn = spec
            else:
                raise TypeError(f"reward function {spec!r} is neither a name nor callable")
            resolved.append(fn)
            default_names.append(_function_name(fn))
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
            for base in default_names:
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

    def __repr__(self) -> str:
        return f"RewardSet(names={self.names}, weights={self.weights})"

    def compute(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        items: Sequence[TaskItem],
        *,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> Float[Tensor, "N K"]:
        """Per-function rewards of completions of task items (NaN where a function returned None).

        The columns passed to the functions are the items' :attr:`~rlzoo.trainer.tasks.TaskItem.columns`
        (a key missing from some item is None there). See :meth:`__call__` for the checks and errors.
        """
        keys: dict[str, None] = {}
        for item in items:
            keys.update(dict.fromkeys(item.columns))
        columns = {key: [item.columns.get(key) for item in items] for key in keys}
        return self(prompts, completions, completion_ids=completion_ids, columns=columns).per_function

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        *,
        completion_ids: Sequence[Sequence[int]] | None = None,
        columns: Mapping[str, Sequence[Any]] | None = None,
    ) -> RewardOutput:
        """Evaluate every function on a batch.

        Args:
            prompts: ``N`` prompt strings (repeated per completion of a group, as TRL).
            completions: ``N`` decoded completions.
            completion_ids: ``N`` token-id lists, passed on as ``completion_ids`` if given.
            columns: column name -> ``N`` values, passed on as keyword arguments.

        Raises:
            ValueError: ``prompts``, ``completions``, ``completion_ids`` or a column of different lengths, or
                a column named ``prompts``/``completions``/``completion_ids``.
            RewardFunctionError: a function raised (chained), returned a non-sequence, the wrong number of
                values, a non-number (str, list...), or NaN/inf; the message names the function.
        """
        n = len(completions)
        columns = dict(columns or {})
        lengths = {"prompts": len(prompts), **{f"column {k!r}": len(v) for k, v in columns.items()}}
        if completion_ids is not None:
            lengths["completion_ids"] = len(completion_ids)
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"{n} completions but {bad}")
        reserved = sorted({"prompts", "completions", "completion_ids"} & set(columns))
        if reserved:
            raise ValueError(f"column names {reserved} clash with reward-function arguments")
        kwargs: dict[str, Any] = {k: list(v) for k, v in columns.items()}
        if completion_ids is not None:
            kwargs["completion_ids"] = [list(ids) for ids in completion_ids]
        table = torch.empty(n, len(self.functions), dtype=torch.float32)
        for k, (fn, name) in enumerate(zip(self.functions, self.names, strict=True)):
            try:
                values = fn(prompts=list(prompts), completions=list(completions), **kwargs)
            except Exception as err:
                raise RewardFunctionError(
                    f"reward function {name!r} raised {type(err).__name__}: {err}"
                ) from err
            table[:, k] = torch.tensor(_check_values(values, n, name), dtype=torch.float32)
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


def _check_values(values: Any, n: int, name: str) -> list[float]:
    """Validate one function's output; None -> NaN."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        if isinstance(values, Tensor) and values.ndim == 1:
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
