"""Reward functions: TRL's contract as a ``Protocol``, the built-in ``accuracy`` and ``format`` rewards, and the
errors of reward functions. How a :class:`~rlzoo.trainer.rewards.RewardSet` calls them: :mod:`rlzoo.trainer.rewards`."""

import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.registry import UnknownNameError
from rlzoo.trainer.tasks import DEFAULT_EXTRACTION, DatasetTask, Task, TaskItem, TaskStream
from rlzoo.trainer.tasks.extraction import check_extraction

if TYPE_CHECKING:
    from rlzoo.trainer.rewards import RewardSet

__all__ = [
    "BUILTIN_REWARDS",
    "REWARD_ARGUMENTS",
    "RewardFunction",
    "RewardFunctionError",
    "accuracy_reward",
    "check_reward_values",
    "completion_text",
    "factory_error",
    "format_reward",
    "is_async_reward",
    "nanstd",
    "reward_error",
    "try_rewards",
]

BUILTIN_REWARDS: tuple[str, ...] = ("accuracy", "format")
"""Reward names :class:`~rlzoo.trainer.rewards.RewardSet` resolves itself (others: :mod:`~rlzoo.trainer.reward_loading`)."""

_FLOAT32_MAX = torch.finfo(torch.float32).max


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


REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""The arguments TRL 1.16 passes every reward function besides the data set's columns."""


_FACTORY_ADVICE = {
    "get_soft_overlong_punishment": (
        "; on the command line, --reward-funcs get_soft_overlong_punishment builds it as TRL's script does "
        "(max_completion_len=1280, soft_punish_cache=256), and --overlong-buffer L_CACHE adds the same punishment "
        "to the combined reward with max_completion_len = --max-completion-length"),
}
"""What rlzoo offers on the command line for TRL's factories (by name), added to :func:`factory_error`."""


def factory_error(name: str, fn: Any) -> RewardFunctionError | None:
    """The error for ``fn`` (named ``name`` as the user gave it) taking none of a reward function's arguments: a
    function or class whose parameters hold none of :data:`REWARD_ARGUMENTS` and no ``**kwargs`` (so that TRL's
    call could not work). For TRL's factories (``trl.rewards.get_soft_overlong_punishment``, ...) the message says
    it is one, to call it first (its required parameters as ``name=...``) and what rlzoo offers on the command line;
    for another function, what TRL's call passes and, in case it is a factory, to call it first. None when ``fn``
    takes a reward function's arguments (or has no signature)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD or p.name in REWARD_ARGUMENTS for p in parameters):
        return None
    short = str(getattr(fn, "__name__", None) or type(fn).__name__)
    required = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL,)]
    taken = ", ".join(p.name for p in parameters) or "none"
    call = f"{short}({', '.join(f'{n}=...' for n in required)})"
    if short in _FACTORY_ADVICE or str(getattr(fn, "__module__", "")).split(".")[0] == "trl":  # TRL's factories
        return RewardFunctionError(
            f"reward function {name!r} is a factory, not a reward function (its parameters: {taken}; a reward "
            f"function takes completions or **kwargs): call it first and give its result, from Python: "
            f"Trainer(config, reward_funcs=[{call}])" + _FACTORY_ADVICE.get(short, ""))
    return RewardFunctionError(
        f"reward function {name!r} takes none of a reward function's arguments (its parameters: {taken}): TRL's "
        f"call passes prompts, completions, completion_ids, trainer_state and the data set's columns as keywords, so "
        f"it needs completions= or **kwargs; if it is a factory that makes reward functions, call it first and give "
        f"its result, from Python: Trainer(config, reward_funcs=[{call}])")


def reward_error(name: str, fn: Any, err: Exception, call: Mapping[str, Any],
                 task: Task | None = None) -> RewardFunctionError:
    """The one-line error for reward function ``fn`` (logged as ``name``) having raised ``err`` when called with
    ``call``: its type and first line, and what to do when the cause is plain:

    - a ``TypeError`` with required arguments of ``fn`` absent from ``call``: those are columns it needs (names
      them, the reward, the columns present and how to provide them: for a data set ``task``
      (:class:`~rlzoo.trainer.tasks.DatasetTask`) renaming its column, and ``--task.answer_column`` when that
      column is the task's answer column; for another task, or none, a reward function that takes the columns
      present);
    - a ``TypeError`` indexing a string while the completions are strings: ``fn`` expects conversational data;
    - an ``ImportError`` of one of TRL's functions: the extra to install.

    ``task``: the task whose items gave ``call``'s columns (None: columns given directly to a
    :class:`~rlzoo.trainer.rewards.RewardSet`).
    """
    message = str(err).splitlines()[0] if str(err) else ""
    text = f"reward function {name!r} raised {type(err).__name__}: {message}"
    if isinstance(err, TypeError):
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            parameters = []
        missing = [p.name for p in parameters if p.default is p.empty and p.name not in call
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            return RewardFunctionError(_missing_columns(name, missing, call, task))
        strings = all(isinstance(c, str) for c in call.get("completions", ()))
        if strings and "string indices" in message:
            return RewardFunctionError(
                f"{text}; it expects conversational data (completions as message lists, as TRL passes them when "
                "the prompts are lists of chat messages), but the prompts are plain strings: give the prompts as "
                "chat messages, or use a reward function for strings")
    if isinstance(err, ImportError) and str(getattr(fn, "__module__", "")).split(".")[0] == "trl":
        text += ': pip install "rlzoo[trl]" (TRL\'s reward functions need trl and math-verify)'
    return RewardFunctionError(text)


def _missing_columns(name: str, missing: Sequence[str], call: Mapping[str, Any], task: Task | None) -> str:
    """The message of :func:`reward_error` for reward function ``name`` lacking the columns ``missing``."""
    columns = ", ".join(repr(k) for k in call if k not in REWARD_ARGUMENTS) or "(none)"
    needed = ", ".join(map(repr, missing))
    if isinstance(task, DatasetTask):
        answer = task.answer_column
        also = f"; if that is the answer column {answer!r}, also pass --task.answer_column {missing[0]}" if answer else ""
        return (f"reward function {name!r} needs the data set column(s) {needed}, which the data set does not have; "
                f"its columns: {columns} (each reaches reward functions under its own name: rename the column "
                f"holding it to {missing[0]!r}{also})")
    if task is not None:
        return (f"reward function {name!r} needs the column(s) {needed}, which task {task.name!r} does not give "
                f"reward functions; its columns: {columns} (choose a reward function that takes these, or train on "
                f"a data set with a {missing[0]!r} column)")
    return (f"reward function {name!r} needs the column(s) {needed}, which were not given; the columns given: "
            f"{columns} (pass each under the name the function takes)")


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """A completion's text: the string itself, or the content of a conversational completion's first message."""
    return completion if isinstance(completion, str) else str(completion[0]["content"])


def accuracy_reward(task: Task, extraction: str = DEFAULT_EXTRACTION) -> RewardFunction:
    """The task's own scorer as a reward: ``task.score(extract_answer(completion, extraction), row)``.

    For reasoning-gym tasks that is ``dataset.score_answer(answer, entry)`` (in [0, 1], partial credit for
    answers that contain the reference); for JSONL tasks normalised exact match (0 or 1). The row is
    rebuilt from the columns (every column's i-th value). The function's ``__name__`` is ``"accuracy"``
    (logged as ``rewards/accuracy/mean``).

    Raises:
        UnknownNameError: unknown ``extraction`` (lists :data:`~rlzoo.trainer.tasks.EXTRACTIONS`).
    """
    check_extraction(extraction, "answer extraction")
    if not task.has_answers:
        option = "set --task.answer_column, or " if isinstance(task, DatasetTask) else ""
        raise ValueError(f"reward 'accuracy' needs reference answers; task {task.name!r} has none ({option}choose "
                         "other --reward-funcs)")

    def accuracy(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        for key in ("completion_ids", "trainer_state", "log_extra", "log_metric"):
            columns.pop(key, None)
        rows = [{key: values[i] for key, values in columns.items()} for i in range(len(completions))]
        return list(task.score_completions([completion_text(c) for c in completions], rows, extraction))

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

    def format(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        return [1.0 if pattern.fullmatch(completion_text(c)) else 0.0 for c in completions]

    format.__qualname__ = format.__name__ = "format"
    return format


def nanstd(values: Float[Tensor, "..."]) -> Float[Tensor, ""]:
    """Standard deviation over all entries ignoring NaN, with Bessel's correction (NaN with < 2 values).

    Matches ``trl.trainer.utils.nanstd`` (TRL 1.16) over all dimensions.
    """
    count = (~torch.isnan(values)).sum()
    if count < 2:
        return torch.tensor(float("nan"), dtype=values.dtype)
    mean = torch.nanmean(values)
    return torch.sqrt(torch.nansum((values - mean) ** 2) / (count - 1))


def is_async_reward(fn: Any) -> bool:
    """An ``async def`` function or an object whose ``__call__`` is one (TRL's ``is_async_callable``)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def check_reward_values(values: Any, n: int, name: str) -> list[float]:
    """One reward function's output (``name``'s, ``n`` completions) as ``n`` floats, None -> NaN; a 1-D tensor or
    array is read as a list (TRL iterates whatever is returned), a 0-d tensor or array in a list as its number (TRL's
    ``torch.tensor`` of the list takes it).

    Raises:
        RewardFunctionError: not a sequence, a count other than ``n``, a non-number, NaN or inf, a value beyond
            float32's range (names the function).
    """
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
        if isinstance(value, Tensor | np.ndarray) and value.ndim == 0:  # torch.tensor(list of 0-d tensors): TRL's
            value = value.item()
        if isinstance(value, np.bool_):  # numpy's bool (a comparison's result) is no numbers.Real: as Python's
            value = bool(value)
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
        if abs(value) > _FLOAT32_MAX:  # the rewards are float32: it would be inf there, naming no function
            raise RewardFunctionError(f"reward function {name!r} returned {value:g} at index {i}, beyond float32's "
                                      f"range (+-{_FLOAT32_MAX:.3g}) the rewards are held in: scale it down")
        out.append(value)
    return out


def try_rewards(rewards: "RewardSet", task: TaskStream, tokenizer: Any, item: TaskItem) -> None:
    """Call every function of ``rewards`` once on ``item`` of ``task`` with its reference answer as the completion,
    forgetting what they log, so that a broken reward fails in seconds (before an evaluation or a generation).

    Raises:
        RewardFunctionError: a function raised or returned a bad value (names it).
    """
    ids = tokenizer(item.answer, add_special_tokens=False)["input_ids"]
    rewards.compute(prompts=[task.prompt(tokenizer, item)], completions=[item.answer], items=[item],
                    completion_ids=[ids])
    rewards.take_logged()
