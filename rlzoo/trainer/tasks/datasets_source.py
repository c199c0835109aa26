"""Tasks from data sets: anything ``datasets`` loads, in TRL's standard or conversational prompt format.

Sources: a local data file, a ``save_to_disk`` or hub-style data set directory, or a hub data set id, loaded by
:func:`load_dataset_source` (:mod:`~rlzoo.trainer.tasks.dataset_loading`); and, from the Python API, a
``datasets.Dataset`` or ``IterableDataset``.

Each row is one problem: its prompt column (default ``prompt``) is a string (TRL's standard format: the model
sees it as it is) or a list of chat messages (TRL's conversational format: the chat template is applied); its
answer column (default ``answer``; ``None`` for none) is what the held-out accuracy and the ``accuracy`` reward
compare with (:func:`~rlzoo.trainer.tasks.normalized_match`). Every other column reaches reward functions as
TRL's ``**columns``.
"""

import array
import dataclasses
import hashlib
import logging
import math
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.tasks.base import Task, TaskItem, derive_seed
from rlzoo.trainer.tasks.dataset_loading import (
    FILE_BUILDERS,
    data_suffix,
    is_dataset_spec,
    load_dataset_rows,
    load_dataset_source,
)
from rlzoo.trainer.tasks.extraction import normalized_match
from rlzoo.trainer.tasks.rows import RowOrigin, check_rows, content_digest, describe, row_problem

__all__ = ["DATASET_DEFAULTS", "DATASET_OPTIONS", "FILE_BUILDERS", "DatasetTask", "is_dataset_spec", "load_dataset_rows",
           "load_dataset_source", "without_dataset_defaults"]

log = logging.getLogger("rlzoo.train")

DATASET_OPTIONS: Mapping[str, str] = {
    "split": "the training split (default train), or datasets' split syntax: train[:1000], train[10%:], ...",
    "eval_split": "a split to hold out from, or a slice (train[:100]) (default: a seeded split of the training rows)",
    "prompt_column": "the column with the prompt: a string or a list of chat messages (default prompt)",
    "answer_column": "the column the held-out accuracy and the accuracy reward compare with (default answer; "
                     "null: none)",
    "name": "the data set's configuration (TRL's dataset_config)",
    "data_dir": "a sub-directory of the data set repository",
    "revision": "a hub revision (branch, tag or commit)",
}
"""The ``--task.NAME`` options of a data set task and what each one means."""
DATASET_DEFAULTS: Mapping[str, Any] = {"split": "train", "eval_split": None, "prompt_column": "prompt",
                                       "answer_column": "answer", "name": None, "data_dir": None, "revision": None}
"""The value each of :data:`DATASET_OPTIONS` has when not given (one given at it is no change on resume)."""


def without_dataset_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without those at their :data:`DATASET_DEFAULTS` (``split="train"`` is no option given)."""
    return {k: v for k, v in options.items() if k not in DATASET_DEFAULTS or DATASET_DEFAULTS[k] != v}

MAX_EVAL_FRACTION = 0.2
"""A held-out split cut from the training rows takes at most this share of them (capped with a warning)."""


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class DatasetTask(Task):
    """Problems from a ``datasets.Dataset`` (or ``IterableDataset``): one row each.

    Held-out set: the first ``eval_size`` rows of ``eval_dataset`` when given; else, for a ``Dataset``, rows drawn
    with ``random.Random(eval_seed)`` (at most :data:`MAX_EVAL_FRACTION` of them: a larger ``eval_size`` is capped
    with a warning) and, for an ``IterableDataset``, its first ``eval_size`` rows (capped alike when the stream
    ends within ``eval_size / MAX_EVAL_FRACTION`` rows). Training stream: the other rows in
    epochs, each reshuffled with a seed derived from ``(train_seed, epoch)`` (an ``IterableDataset`` is streamed in
    its own order).

    Attributes:
        name: what the data came from (a path, a hub id, or ``train_dataset`` for a Python object).
        dataset, eval_dataset: the training data and the held-out data (or None).
        prompt_column, answer_column: see the module docstring (``answer_column`` None: no accuracy).
        kwargs: the ``--task.NAME`` options the data set was loaded with (part of the stream's identity).
        origin, eval_origin: where the training and held-out rows come from, for errors (:class:`RowOrigin`;
            None: ``data set NAME`` and ``data set NAME (held out)``, rows numbered from 0).
        evaluation_only: the task is only evaluated (``rlzoo eval``), nothing trains on it: the held-out set cut
            from the training rows takes up to ``eval_size`` of them, without the :data:`MAX_EVAL_FRACTION` cap
            (its training stream may be empty, and is an error when read).

    Every row of a ``Dataset`` (and the held-out rows used) is checked at construction (:func:`check_rows`), so
    that a bad row is refused before training rather than when the stream reaches it; an ``IterableDataset``'s
    training rows are checked as they are read (the error names the stream's row).

    Raises (at construction):
        ValueError: a missing prompt or answer column (names the columns present and the option), a row whose
            prompt is missing, empty or neither a string nor a list of messages, or whose answer is missing or
            empty (names the row as its file numbers it, the column and the value), ``eval_size`` < 0, no row
            left for training (an empty training stream too), or ``ClassLabel`` answer columns whose names differ
            between the training and the held-out data.
    """

    name: str
    dataset: Any
    eval_dataset: Any = None
    prompt_column: str = "prompt"
    answer_column: str | None = "answer"
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    origin: RowOrigin | None = None
    eval_origin: RowOrigin | None = None
    evaluation_only: bool = False
    train_seed: int = 1
    eval_seed: int = 1000
    eval_size: int = 200
    exclude_eval_questions: bool = False

    def __post_init__(self) -> None:
        if self.eval_size < 0:
            raise ValueError(f"eval_size must be >= 0, got {self.eval_size}")
        for option in ("prompt_column", "answer_column"):
            column = getattr(self, option)
            if not isinstance(column, str) and (column is not None or option == "prompt_column"):
                raise ValueError(f"task {self.name!r}: --task.{option} must be a column name (text), got "
                                 f"{type(column).__name__} {column!r}; a config file reads 1 or yes as a number or "
                                 "a bool: quote it ('1')")
        if self.prompt_column == self.answer_column:
            raise ValueError(f"task {self.name!r}: --task.prompt_column and --task.answer_column both name the column "
                             f"{self.prompt_column!r}; the answer is another column (or --task.answer_column null)")
        for data, what in ((self.dataset, "training"), (self.eval_dataset, "held-out")):
            if data is not None:
                self._check_columns(data, what)
        if self.origin is None:
            object.__setattr__(self, "origin", RowOrigin(f"data set {self.name!r}"))
        if self.eval_origin is None:
            object.__setattr__(self, "eval_origin", RowOrigin(f"data set {self.name!r} (held out)"))
        object.__setattr__(self, "_label_names", self._answer_labels())
        # without answers a held-out set is scored by the reward functions only: one given (eval_dataset), as TRL
        # evaluates, but no split cut from the training rows (TRL never cuts one); only evaluated: its rows
        held_out = self.answer_column is not None or self.eval_dataset is not None or self.evaluation_only
        wanted = self.eval_size if held_out else 0
        if self._streaming:
            self._hold_out_stream(wanted)
            return
        self._check_rows(self.dataset, self.origin)
        n = len(self.dataset)
        order = list(range(n))
        if self.eval_dataset is not None and self._is_stream(self.eval_dataset):  # its first eval_size rows
            eval_rows = self._first_rows(self.eval_dataset, wanted)
            self._check_row_list(eval_rows, self.eval_origin)
        elif self.eval_dataset is not None:
            self._check_rows(self.eval_dataset, self.eval_origin, limit=wanted)
            eval_rows = [self.eval_dataset[i] for i in range(min(wanted, len(self.eval_dataset)))]
        else:
            random.Random(self.eval_seed).shuffle(order)
            k = min(wanted, n) if self.evaluation_only else self._capped(wanted, n)
            eval_rows = [self.dataset[j] for j in order[:k]]
            order = order[k:]
        if not order and not self.evaluation_only:
            raise ValueError(f"task {self.name!r} has {n} rows; none is left for training")
        self._note_small_held_out(eval_rows, wanted)
        object.__setattr__(self, "_eval_rows", eval_rows)
        object.__setattr__(self, "_pool", order)

    def _capped(self, wanted: int, n: int) -> int:
        """How many of ``n`` rows to hold out for ``wanted``: at most :data:`MAX_EVAL_FRACTION` of them (with a
        warning), so that a small data set is not left with a handful of training rows."""
        if wanted <= MAX_EVAL_FRACTION * n:
            return wanted
        k = int(MAX_EVAL_FRACTION * n)
        log.warning("task %s: eval_size=%d would leave %d of %d rows for training; the held-out split is capped at %d "
                    "row%s (%.0f %%). Pass eval_dataset / --task.eval_split for a separate set",
                    self.name, self.eval_size, max(0, n - wanted), n, k, "" if k == 1 else "s", 100 * MAX_EVAL_FRACTION)
        return k

    def _note_small_held_out(self, eval_rows: list[Any], wanted: int) -> None:
        """Log (one warning) a held-out set used in full because it has fewer than ``eval_size`` rows: a separate
        one (``eval_dataset`` / ``--task.eval_split``) or, when only evaluated, the data set itself (a held-out
        split cut from the training rows warns in :meth:`_capped` instead)."""
        if len(eval_rows) >= wanted or (self.eval_dataset is None and not self.evaluation_only):
            return
        source = self.eval_origin if self.eval_dataset is not None else self.origin
        log.warning("task %s: the held-out set (%s) has %d rows, fewer than eval_size=%d: all %d are evaluated",
                    self.name, source.label if source else "eval_dataset", len(eval_rows), wanted, len(eval_rows))

    def _hold_out_stream(self, wanted: int) -> None:
        """An ``IterableDataset``'s held-out rows: ``eval_dataset``'s first ``wanted``, or the training stream's
        first ``wanted``, which the training stream then skips. The stream's head is read up to
        ``wanted / MAX_EVAL_FRACTION`` rows to apply the same cap as for a ``Dataset`` (a stream that ends
        sooner is small); an empty training stream is an error now, before the model loads."""
        if self.eval_dataset is not None:
            eval_rows, skip, left = self._first_rows(self.eval_dataset, wanted), 0, self._first_rows(self.dataset, 1)
            self._check_row_list(eval_rows, self.eval_origin)
        elif self.evaluation_only:  # nothing trains on it: no cap, and no row need be left
            eval_rows = self._first_rows(self.dataset, wanted)
            self._check_row_list(eval_rows, self.origin)
            self._note_small_held_out(eval_rows, wanted)
            object.__setattr__(self, "_eval_rows", eval_rows)
            object.__setattr__(self, "_skip", len(eval_rows))
            return
        else:
            head = self._first_rows(self.dataset, max(1, math.ceil(wanted / MAX_EVAL_FRACTION)))
            skip = wanted if len(head) >= wanted / MAX_EVAL_FRACTION else self._capped(wanted, len(head))
            eval_rows, left = head[:skip], head[skip:]
            self._check_row_list(eval_rows, self.origin)
        if self.eval_dataset is not None:
            self._note_small_held_out(eval_rows, wanted)
        if not left:
            raise ValueError(f"task {self.name!r}: the training stream has no row left for training (held out: "
                             f"{skip}); pass eval_dataset or a smaller eval_size")
        self._check_row_list(left, self.origin, skip)  # a column's type (a list answer) shows in its first row
        object.__setattr__(self, "_eval_rows", eval_rows)
        object.__setattr__(self, "_skip", skip)

    @property
    def _streaming(self) -> bool:
        return self._is_stream(self.dataset)

    @staticmethod
    def _is_stream(data: Any) -> bool:
        import datasets

        return isinstance(data, datasets.IterableDataset)

    def _check_columns(self, data: Any, what: str) -> None:
        columns = data.column_names
        if columns is None:  # an IterableDataset of unknown features: look at its first row
            first = next(iter(data), None)
            if first is None:
                raise ValueError(f"task {self.name!r}: the {what} stream has no row"
                                 + (" left for training" if what == "training" else ""))
            columns = list(first)
        missing = [(c, o) for c, o in ((self.prompt_column, "prompt_column"), (self.answer_column, "answer_column"))
                   if c is not None and c not in columns]
        if missing:
            column, option = missing[0]
            extra = " (or --task.answer_column null for none)" if option == "answer_column" else ""
            one = columns[0] if len(columns) == 1 else ""
            if data_suffix(Path(self.name)) == ".csv" and any(sep in one for sep in ";|\t"):  # another separator
                extra += "; a .csv file is read comma-separated: write it with commas, or tab-separated as .tsv"
            raise ValueError(f"task {self.name!r}: the {what} data has no column {column!r}; its columns: "
                             f"{', '.join(map(repr, columns))}; choose one with --task.{option}{extra}")
        from rlzoo.trainer.reward_functions import REWARD_ARGUMENTS

        clash = [c for c in columns if c in REWARD_ARGUMENTS and c != self.prompt_column  # columns as _item passes them
                 and (c != "completion_ids" or c == self.answer_column)]
        if clash:
            raise ValueError(f"task {self.name!r}: the {what} data has a column named {clash[0]!r}, which reward "
                             f"functions receive as their own argument; rename the column")

    def _answer_labels(self) -> list[str] | None:
        """The names of a ``datasets.ClassLabel`` answer column (its rows hold ids: the accuracy compares the
        extracted answer with the id's name, reward functions get the id as TRL passes it), or None.

        Raises:
            ValueError: the training and held-out data label the answer column with different names.
        """
        import datasets

        found = []
        for data in (self.dataset, self.eval_dataset):
            feature = (getattr(data, "features", None) or {}).get(self.answer_column) if data is not None else None
            if isinstance(feature, datasets.ClassLabel):
                found.append(list(feature.names))
            if isinstance(feature, datasets.Value) and feature.dtype in ("float16", "float32"):
                object.__setattr__(self, "_answer_dtype", feature.dtype)  # its shortest text, not float64's
        if len(found) == 2 and found[0] != found[1]:
            raise ValueError(f"task {self.name!r}: the answer column {self.answer_column!r} has different class "
                             f"labels in the training data ({found[0]}) and the held-out data ({found[1]})")
        return found[0] if found else None

    def _answer(self, row: Mapping[str, Any]) -> str:
        """The reference answer of a row as text (a class label's name for a ``ClassLabel`` column's id; a float16 /
        float32 column's value as that dtype writes it, ``0.9``, not as the float64 it is read as)."""
        value, names = row[self.answer_column], self.__dict__["_label_names"]
        if names is not None and isinstance(value, int) and 0 <= value < len(names):
            return names[value]
        kind = self.__dict__.get("_answer_dtype")
        if isinstance(value, float) and kind:  # a float32 0.9 reads as 0.8999999761581421
            import numpy as np

            narrow = np.dtype(kind).type(value)
            if float(narrow) == value:  # a value of that dtype (not a float64 one of another split): its own text
                return np.format_float_positional(narrow, unique=True, trim="0")
        return str(value)

    def _check_rows(self, data: Any, origin: RowOrigin, limit: int | None = None) -> None:
        """:func:`check_rows` of a ``Dataset`` with this task's columns."""
        check_rows(data, origin, prompt_column=self.prompt_column, answer_column=self.answer_column, limit=limit)

    def _check_row_list(self, rows: list[Mapping[str, Any]], origin: RowOrigin, start: int = 0) -> None:
        """:func:`row_problem` of rows read from a stream (``start``: the stream's row of the first)."""
        for i, row in enumerate(rows):
            self._check_row(row, origin, start + i)

    def _check_row(self, row: Mapping[str, Any], origin: RowOrigin, position: int) -> None:
        problem = row_problem(row, self.prompt_column, self.answer_column)
        if problem is not None:
            column, what = problem
            raise ValueError(f"{origin.where(position)}: {describe(column, self.prompt_column, what)}")

    @staticmethod
    def _first_rows(data: Any, k: int) -> list[dict[str, Any]]:
        return list(data.take(k)) if k else []

    def stream_identity(self) -> dict[str, Any]:
        """``rows``: the training rows in their order (a digest of the data's length and the rows left after the
        held-out split: ``eval_size``, ``eval_seed`` and a held-out split cut from the data change it), and
        ``content``: :func:`content_digest` of the data; computed once. Empty for a stream (an
        ``IterableDataset``, which has no length)."""
        if self._streaming:
            return {}
        cached = self.__dict__.get("_stream_identity")
        if cached is None:
            pool = array.array("q", [len(self.dataset), *self.__dict__["_pool"]]).tobytes()
            cached = {"rows": hashlib.sha256(pool).hexdigest()[:16], "content": content_digest(self.dataset)}
            self.__dict__["_stream_identity"] = cached
        return dict(cached)

    @property
    def num_train_rows(self) -> int | None:
        """The rows left for training after the held-out split (one epoch of the stream); None for an
        ``IterableDataset`` (no length) or when every row is held out (``evaluation_only``)."""
        return None if self._streaming else len(self.__dict__["_pool"]) or None

    @property
    def has_answers(self) -> bool:
        """Whether items carry a reference answer (``answer_column`` is set)."""
        return self.answer_column is not None

    @property
    def conversational(self) -> bool:
        """Whether prompts are chat messages (TRL's conversational format), judged on the first training row."""
        first = next(iter(self.dataset.take(1))) if self._streaming else self.dataset[0]
        return not isinstance(first[self.prompt_column], str)

    def _item(self, row: Mapping[str, Any], index: int) -> TaskItem:
        """The item of a checked row (:meth:`_check_row`) at stream position ``index``."""
        prompt = row[self.prompt_column]
        if isinstance(prompt, str):
            question = prompt
        else:
            prompt = [dict(m) for m in prompt]
            question = next((str(m["content"]) for m in reversed(prompt) if m["role"] == "user"),
                            str(prompt[-1]["content"]))
        columns = {k: v for k, v in row.items()  # TRL 1.16 hands reward functions neither completion column
                   if k != self.prompt_column and (k not in ("completion", "completion_ids") or k == self.answer_column)}
        answer = "" if self.answer_column is None else self._answer(row)
        return TaskItem(question=question, answer=answer, columns=columns, index=index, prompt=prompt)

    def _build_eval_items(self) -> list[TaskItem]:
        return [self._item(row, i) for i, row in enumerate(self.__dict__["_eval_rows"])]

    def _raw_train_items(self, start: int) -> Iterator[TaskItem]:
        if self._streaming:
            yield from self._stream_items(start)
            return
        pool: list[int] = self.__dict__["_pool"]
        if not pool:
            raise ValueError(f"task {self.name!r} is only evaluated (evaluation_only): all its rows are held out, none "
                             "is left for training")
        epoch, offset = divmod(start, len(pool))
        while True:
            order = list(pool)
            random.Random(derive_seed("dataset-train", self.train_seed, epoch)).shuffle(order)
            for i in range(offset, len(order)):
                yield self._item(self.dataset[order[i]], epoch * len(pool) + i)
            epoch, offset = epoch + 1, 0

    def _stream_items(self, start: int) -> Iterator[TaskItem]:
        skip, index, produced = self.__dict__["_skip"], 0, False
        while True:
            for row_in_pass, row in enumerate(self.dataset.skip(skip), start=skip):
                produced = True
                if index >= start:
                    self._check_row(row, self.origin, row_in_pass)  # a stream is checked as it is read
                    yield self._item(row, index)
                index += 1
            if not produced:
                raise ValueError(f"task {self.name!r}: the training stream is empty")

    def score(self, answer: str | None, row: Mapping[str, Any]) -> float:
        """:func:`normalized_match` of ``answer`` and the row's answer column (1.0 or 0.0; a ``ClassLabel``
        column's id is compared by its name).

        Raises:
            ValueError: the task has no answer column.
        """
        if self.answer_column is None:
            raise ValueError(f"task {self.name!r} has no answer column (--task.answer_column null): nothing to "
                             "score the accuracy with")
        return normalized_match(answer, self._answer(row))
