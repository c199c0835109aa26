"""The trainer's view of a task: a training cursor, the held-out set, prompts and completion scores."""

import itertools
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlzoo.registry import WrongTypeError, did_you_mean
from rlzoo.trainer.config import DEFAULT_TASK, TaskConfig
from rlzoo.trainer.tasks.base import Task, TaskItem
from rlzoo.trainer.tasks.datasets_source import (
    DATASET_DEFAULTS,
    DATASET_OPTIONS,
    DatasetTask,
    is_dataset_spec,
    load_dataset_rows,
)
from rlzoo.trainer.tasks.extraction import DEFAULT_EXTRACTION, check_extraction, extract_answer
from rlzoo.trainer.tasks.prompts import format_prompt, render_prompt
from rlzoo.trainer.tasks.reasoning_gym_source import ReasoningGymTask, list_reasoning_gym_tasks
from rlzoo.trainer.tasks.rows import RowOrigin

__all__ = ["PYTHON_DATASET", "TaskStream", "build_task", "check_loadable_task", "check_python_dataset",
           "dataset_task_name", "holds_out_training_rows", "load_task", "make_task", "recorded_task"]

log = logging.getLogger("rlzoo.train")

PYTHON_DATASET = "train_dataset:"
"""How a data set given from Python (``Trainer(config, train_dataset=...)``) is named: ``train_dataset:`` and its
``datasets`` fingerprint. A run records this name as its ``task``; it cannot be loaded by name."""


def dataset_task_name(train_dataset: Any) -> str:
    """The name of a data set given from Python: ``train_dataset:FINGERPRINT`` (``datasets``' fingerprint of its
    content and transforms; ``train_dataset:IterableDataset`` for a data set without one)."""
    return f"{PYTHON_DATASET}{getattr(train_dataset, '_fingerprint', None) or type(train_dataset).__name__}"


def check_loadable_task(task: str) -> None:
    """Refuse a ``task`` that names a data set given from Python (what a run trained on ``train_dataset`` records).

    Raises:
        ValueError: ``task`` starts with :data:`PYTHON_DATASET` (names it and what to pass instead).
    """
    if task.startswith(PYTHON_DATASET):
        raise ValueError(f"task {task!r} is a data set that was given from Python (Trainer(config, train_dataset="
                         "...)) and cannot be loaded by name: pass the data set again via the Python API (a resume: "
                         "Trainer(resume_config(RUN), train_dataset=...)), or --task a data file or directory, a hub id "
                         "or a reasoning-gym task (a new run, or rlzoo eval --run)")


def holds_out_training_rows(config: TaskConfig) -> bool:
    """Whether the task is a data file or hub data set whose held-out rows are cut from its training rows (no
    ``--task.eval_split``; an answer column, without which nothing is held out), so that ``eval_size`` and
    ``eval_seed`` decide which rows it trains on. (A data set given from Python may have an ``eval_dataset``,
    which its config does not record.)"""
    task, options = config.task, config.task_kwargs or {}
    return (is_dataset_spec(task) and task not in list_reasoning_gym_tasks() and not task.startswith(PYTHON_DATASET)
            and not options.get("eval_split") and options.get("answer_column", "answer") is not None)


def recorded_task(task: str, train_dataset: Any = None) -> str:
    """The task a run trains on and records: :func:`dataset_task_name` of ``train_dataset`` when given (with a
    warning when it replaces a ``task`` other than the default), else ``task``.

    Raises:
        ValueError: no ``train_dataset`` and ``task`` names a data set given from Python (:func:`check_loadable_task`).
    """
    if train_dataset is not None:
        _note_replaced_task(task)
        return dataset_task_name(train_dataset)
    check_loadable_task(task)
    return task


def _note_replaced_task(task: str) -> None:
    """Warn that ``train_dataset`` replaces ``task`` (unless the default, or the name of a data set given from
    Python, which a resumed run's config records)."""
    if task != DEFAULT_TASK and not task.startswith(PYTHON_DATASET):
        log.warning("train_dataset replaces task %r: the run trains on train_dataset (drop task, or drop "
                    "train_dataset to train on the task)", task)


def load_task(
    name_or_path: str,
    *,
    kwargs: Mapping[str, Any] | None = None,
    train_seed: int = 1,
    eval_seed: int = 1000,
    eval_size: int = 200,
    exclude_eval_questions: bool = False,
    evaluation_only: bool = False,
) -> Task:
    """A task from a reasoning-gym data set name (with its config ``kwargs``), or a data set that ``datasets``
    loads: a data file, a ``save_to_disk`` or hub-style directory, a hub id (``kwargs``: :data:`DATASET_OPTIONS`;
    ``evaluation_only``: :attr:`DatasetTask.evaluation_only`).

    Raises:
        UnknownNameError: neither a data set nor a reasoning-gym name (lists the available names).
        ValueError: an option a data set task does not have (lists the valid ones), or the errors of
            :class:`ReasoningGymTask`, :func:`load_dataset_source` and :class:`DatasetTask`.
        FileNotFoundError: a data file that does not exist.
    """
    common = {"train_seed": train_seed, "eval_seed": eval_seed, "eval_size": eval_size,
              "exclude_eval_questions": exclude_eval_questions}
    if is_dataset_spec(name_or_path) and name_or_path not in list_reasoning_gym_tasks():
        options = dict(kwargs or {})
        unknown = sorted(set(options) - set(DATASET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for data set task {name_or_path!r}{did_you_mean(unknown, DATASET_OPTIONS)}"
                             f"; valid: {', '.join(DATASET_OPTIONS)}")
        columns = {k: options[k] for k in ("prompt_column", "answer_column") if k in options}
        train, held_out, origin, eval_origin = load_dataset_rows(
            name_or_path, **{k: v for k, v in options.items() if k not in columns})
        return DatasetTask(name=name_or_path, dataset=train, eval_dataset=held_out, kwargs=options, origin=origin,
                           eval_origin=eval_origin, evaluation_only=evaluation_only, **columns, **common)
    return ReasoningGymTask(
        name=name_or_path,
        kwargs=dict(kwargs or {}),
        train_seed=train_seed,
        eval_seed=eval_seed,
        eval_size=eval_size,
        exclude_eval_questions=exclude_eval_questions,
    )


class TaskStream:
    """The trainer's view of a task: a training cursor, the held-out set, prompts and completion scores.

    Wraps a :class:`Task` with the answer extraction, the system prompt and the position in the training
    stream; the position is the trainer's checkpointed state (:meth:`state_dict`).

    Args:
        task: the task.
        answer_extraction: how completions become answers (:data:`EXTRACTIONS`).
        system_prompt: the system message of every prompt (None: the chat template's default).

    Raises:
        UnknownNameError: unknown ``answer_extraction`` (lists the valid ones).
    """

    def __init__(self, task: Task, *, answer_extraction: str = DEFAULT_EXTRACTION,
                 system_prompt: str | None = None) -> None:
        check_extraction(answer_extraction)
        self.task = task
        self.answer_extraction = answer_extraction
        self.system_prompt = system_prompt
        self.position = 0
        self._iterator: Iterator[TaskItem] | None = None

    @property
    def eval_items(self) -> list[TaskItem]:
        """The fixed held-out items."""
        return self.task.eval_items()

    def sample_item(self) -> TaskItem:
        """One problem to try things on: the first of the training stream (the rows reward functions score in
        training; a held-out set may lack a column they need); the training position does not move."""
        return next(iter(self.task.train_items()))

    def next_train(self, n: int) -> list[TaskItem]:
        """The next ``n`` training items (advances the cursor).

        Raises:
            ValueError: ``n`` < 0.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if self._iterator is None:
            self._iterator = self.task.train_items(start=self.position)
        items = list(itertools.islice(self._iterator, n))
        if items:
            self.position = items[-1].index + 1
        return items

    def prompt(self, tokenizer: PreTrainedTokenizerBase, item: TaskItem) -> str:
        """The string the model is conditioned on, as TRL builds it: the item's own prompt through
        :func:`render_prompt` (data sets), else :func:`format_prompt` of its question (reasoning-gym); with the
        stream's system prompt."""
        if item.prompt is not None:
            return render_prompt(tokenizer, item.prompt, self.system_prompt)
        return format_prompt(tokenizer, item.question, self.system_prompt)

    def question(self, item: TaskItem) -> str:
        """The item's question (for logs)."""
        return item.question

    def score(self, completion: str, item: TaskItem) -> float:
        """``task.score(extract_answer(completion, answer_extraction), item.columns)``, in [0, 1]."""
        return self.task.score(extract_answer(completion, self.answer_extraction), item.columns)

    def unscorable_answers(self, limit: int = 16) -> str | None:
        """A warning when no reference answer of the first ``limit`` held-out items (else of the first training
        item), given as the completion (in ``<answer>`` tags for ``tag``), scores under the answer extraction: the
        held-out accuracy and the ``accuracy`` reward could then never exceed 0 (a text answer under the default
        ``last_number``, a LaTeX ``$4$``); None when one scores, or the task has no answers (nor do items a
        reasoning-gym task scores by verifying them, whose ``answer`` is None)."""
        if not self.task.has_answers:
            return None
        items = [item for item in self.eval_items[:limit] or [self.sample_item()]  # a reasoning-gym task scored by
                 if item.columns.get("answer", "") is not None]  # verification has no answer (graph_color)
        if not items:
            return None
        as_completion = "<answer>{}</answer>" if self.answer_extraction == "tag" else "{}"
        if any(self.score(as_completion.format(item.answer), item) > 0 for item in items):
            return None
        answer = items[0].answer
        return (f"task {self.task.name!r}: no reference answer scores as the completion with answer_extraction "
                f"{self.answer_extraction!r} ({answer!r} -> {extract_answer(answer, self.answer_extraction)!r}; "
                f"{len(items)} tried): the accuracy and the accuracy reward cannot exceed 0; choose "
                f"--answer-extraction (full, first_line, first_number, last_number, tag) or --reward-funcs of your own")

    def _identity(self) -> dict[str, Any]:
        task = self.task
        kwargs = dict(getattr(task, "kwargs", {}))
        return {
            "name": task.name,
            "kwargs": kwargs,
            "train_seed": task.train_seed,
            "exclude_eval_questions": task.exclude_eval_questions,
            **task.stream_identity(),
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the training position and what identifies the stream."""
        return {"position": self.position, **self._identity()}

    def load_state_dict(self, state: Mapping[str, Any], *, warn: bool = True) -> None:
        """Restore the training position.

        A data set whose rows changed in content (an edited file; the same number of rows, split alike) is
        resumed with a warning (unless ``warn`` is False: a rank other than the first): the run goes on with the
        rows as they are now; so is a stream (an ``IterableDataset``), which has no digest to check.

        Raises:
            ValueError: the state belongs to a different stream (task name, options, train seed; a data set's
                training rows: its length or held-out split); names the differing keys.
        """
        mine = self._identity()
        theirs = {k: state.get(k) for k in mine}
        theirs["kwargs"] = dict(theirs["kwargs"] or {})
        if isinstance(theirs["name"], str) and os.path.abspath(theirs["name"]) == mine["name"]:
            theirs["name"] = mine["name"]  # a data file recorded relative (before runs recorded absolute paths)
        differ = sorted(
            k
            for k in mine
            if (k in state or k not in ("rows", "content"))  # (older checkpoints did not record a data set's rows)
            and json.dumps(mine[k], sort_keys=True, default=str) != json.dumps(theirs[k], sort_keys=True, default=str)
        )
        changed_content, differ = "content" in differ, [k for k in differ if k != "content"]
        if changed_content and not differ and warn:
            log.warning("resume: the rows of data set %s differ from those the checkpoint trained on (the data "
                        "changed since): the run goes on with the rows as they are now", mine["name"])
        if "rows" in differ:
            raise ValueError(f"task state is from a different training stream: the training rows of data set "
                             f"{mine['name']!r} are not the checkpoint's (its number of rows or its held-out split "
                             "changed: eval_size, eval_seed, --task.eval_split); resume with the checkpoint's")
        if differ:
            details = ", ".join(f"{k}={theirs[k]!r} (now {mine[k]!r})" for k in differ)
            raise ValueError(f"task state is from a different training stream: {details}")
        position = state.get("position")
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"task state 'position' must be an int >= 0, got {position!r}")
        if warn and isinstance(self.task, DatasetTask) and "rows" not in mine:  # a stream: no digest of its rows
            log.warning("resume: data set %s is a stream (an IterableDataset), which cannot be checked against the one "
                        "the checkpoint trained on: the run goes on from its row %d", mine["name"], position)
        self.position = position
        self._iterator = None


def make_task(
    name_or_path: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    train_seed: int = 1,
    eval_seed: int = 1000,
    eval_size: int = 200,
    answer_extraction: str = DEFAULT_EXTRACTION,
    exclude_eval_questions: bool = False,
) -> TaskStream:
    """:func:`load_task` wrapped in a :class:`TaskStream` (what the trainer uses).

    Raises:
        the errors of :func:`load_task` and :class:`TaskStream`.
    """
    task = load_task(
        name_or_path,
        kwargs=kwargs,
        train_seed=train_seed,
        eval_seed=eval_seed,
        eval_size=eval_size,
        exclude_eval_questions=exclude_eval_questions,
    )
    return TaskStream(task, answer_extraction=answer_extraction)


def check_python_dataset(name: str, data: Any) -> None:
    """Refuse what ``Trainer(train_dataset=...)`` cannot take, saying how to make a ``datasets.Dataset`` of it.

    Raises:
        WrongTypeError: (a ``TypeError`` and ``ValueError``) a ``DatasetDict`` (names its splits), a list, a pandas
            DataFrame or another type.
    """
    import datasets

    if data is None or isinstance(data, (datasets.Dataset, datasets.IterableDataset)):
        return
    if isinstance(data, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise WrongTypeError(f"{name} is a {type(data).__name__} with the splits {', '.join(map(repr, data))}: pass one "
                        f"split, e.g. {name}=data[{next(iter(data), 'train')!r}]")
    how = {"list": "datasets.Dataset.from_list(rows)", "dict": "datasets.Dataset.from_dict(columns)",
           "DataFrame": "datasets.Dataset.from_pandas(frame)"}.get(type(data).__name__, "a datasets.Dataset")
    raise WrongTypeError(f"{name} must be a datasets.Dataset or IterableDataset, got {type(data).__name__}: pass {how}")


def build_task(config: TaskConfig, *, train_dataset: Any = None, eval_dataset: Any = None,
               evaluation_only: bool = False) -> TaskStream:
    """The :class:`TaskStream` of a run's task section, or of ``train_dataset`` (a ``datasets.Dataset`` or
    ``IterableDataset``, with ``eval_dataset`` as its held-out set; the columns from ``config.task_kwargs``, whose
    other options are not used, with a warning; a ``config.task`` other than the default is replaced, with a
    warning). ``evaluation_only``: the task is only
    evaluated (``rlzoo eval``): a data set's held-out set is up to ``eval_size`` of its rows, without the cap that
    keeps rows for training (:attr:`DatasetTask.evaluation_only`).

    Raises:
        WrongTypeError: ``train_dataset`` / ``eval_dataset`` not a ``Dataset`` / ``IterableDataset`` (a ``DatasetDict``
            names its splits; a list or DataFrame, the conversion).
        ValueError: ``system_prompt`` with standard-format (string) prompts; a ``config.task`` that names a data set
            given from Python, without ``train_dataset`` (:func:`check_loadable_task`); and the errors of
            :func:`load_task`,
            :class:`DatasetTask` and :class:`TaskStream`.
    """
    common = {"train_seed": config.train_seed, "eval_seed": config.eval_seed, "eval_size": config.eval_size,
              "exclude_eval_questions": config.exclude_eval_questions}
    for name, data in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        check_python_dataset(name, data)
    if train_dataset is not None:
        if eval_dataset is not None and config.eval_size == 0 and not evaluation_only:  # it was ignored silently
            log.warning("eval_dataset is not used: eval_size is 0 (no held-out evaluation); set eval_size to its rows")
        _note_replaced_task(config.task)
        options = dict(config.task_kwargs or {})
        columns = {k: options[k] for k in ("prompt_column", "answer_column") if k in options}
        ignored = sorted(k for k, v in options.items()
                         if k not in columns and not (k in DATASET_DEFAULTS and DATASET_DEFAULTS[k] == v))
        if ignored:  # they were dropped silently (a typo of a column option too); a warning: an older run's
            # config.json may record such options, and its resume must go on
            log.warning("task_kwargs %s are not used: a train_dataset given from Python takes only prompt_column and "
                        "answer_column%s; split it yourself (e.g. Dataset.train_test_split) and pass eval_dataset",
                        ignored, did_you_mean(ignored, ("prompt_column", "answer_column")))
        task: Task = DatasetTask(name=dataset_task_name(train_dataset), dataset=train_dataset,
                                 eval_dataset=eval_dataset, kwargs=options, origin=RowOrigin("train_dataset"),
                                 eval_origin=RowOrigin("eval_dataset"), evaluation_only=evaluation_only,
                                 **columns, **common)
    elif eval_dataset is not None:
        held_out = (f"the held-out split of the task {config.task!r} is task_kwargs['eval_split'] (--task.eval_split "
                    "SPLIT), else a seeded split of its rows" if is_dataset_spec(config.task) else
                    f"the task {config.task!r} holds out its own problems (eval_size, eval_seed)")
        raise ValueError(f"eval_dataset needs a train_dataset (Trainer(config, train_dataset=..., eval_dataset=...)); "
                         f"{held_out}")
    else:
        check_loadable_task(config.task)
        task = load_task(config.task, kwargs=config.resolved_task_kwargs, evaluation_only=evaluation_only,
                         **common)
    if config.system_prompt is not None and isinstance(task, DatasetTask) and not task.conversational:
        raise ValueError("system_prompt applies to conversational prompts (lists of messages); this data set's "
                         "prompts are strings (TRL's standard format, used as they are)")
    return TaskStream(task, answer_extraction=config.answer_extraction, system_prompt=config.system_prompt)
