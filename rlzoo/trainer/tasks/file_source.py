"""Tasks from a file: a JSONL file with ``prompt`` and ``answer`` columns, scored by normalised exact match."""

import dataclasses
import json
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.tasks.base import Task, TaskItem, derive_seed
from rlzoo.trainer.tasks.extraction import normalized_match

__all__ = ["JsonlTask"]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class JsonlTask(Task):
    """Problems from a JSONL file: a JSON object a line with ``prompt`` (str) and ``answer`` (str or number).

    The rows are shuffled with ``random.Random(eval_seed)``; the first ``eval_size`` form the held-out set and
    the rest the training pool (disjoint by row). The training stream walks the pool in epochs, each
    reshuffled with a seed derived from ``(train_seed, epoch)``. Other columns reach reward functions.
    Blank lines are skipped. Scoring: :func:`normalized_match` against ``answer``.

    Raises (at construction):
        FileNotFoundError: no such file.
        ValueError: a line that is not UTF-8 or not a JSON object (with its line number), missing ``prompt``/``answer``
            columns (named, with the line number), wrong column types, or ``eval_size`` leaving no
            training rows.
    """

    path: str
    train_seed: int = 1
    eval_seed: int = 1000
    eval_size: int = 200
    exclude_eval_questions: bool = False

    @property
    def name(self) -> str:  # type: ignore[override]
        """The file path."""
        return self.path

    def __post_init__(self) -> None:
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"task file {self.path!r} does not exist")
        if self.eval_size < 0:
            raise ValueError(f"eval_size must be >= 0, got {self.eval_size}")
        rows: list[dict[str, Any]] = []
        for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{self.path}:{lineno}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                    "task files must be UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{self.path}:{lineno}: invalid JSON: {err.msg} (column {err.colno})") from None
            problem = _row_problem(row)
            if problem is not None:
                raise ValueError(f"{self.path}:{lineno}: {problem}")
            rows.append(row)
        if len(rows) <= self.eval_size:
            raise ValueError(
                f"task file {self.path!r} has {len(rows)} rows; eval_size={self.eval_size} must leave "
                "at least one training row"
            )
        order = list(range(len(rows)))
        random.Random(self.eval_seed).shuffle(order)
        items = [self._item(rows[j], j) for j in order]
        object.__setattr__(self, "_eval", items[: self.eval_size])
        object.__setattr__(self, "_pool", items[self.eval_size :])

    @staticmethod
    def _item(row: Mapping[str, Any], index: int) -> TaskItem:
        columns = {k: v for k, v in row.items() if k != "prompt"}
        columns["answer"] = str(row["answer"])
        return TaskItem(question=row["prompt"], answer=columns["answer"], columns=columns, index=index)

    def _build_eval_items(self) -> list[TaskItem]:
        return [dataclasses.replace(item, index=i) for i, item in enumerate(self.__dict__["_eval"])]

    def _raw_train_items(self, start: int) -> Iterator[TaskItem]:
        pool: list[TaskItem] = self.__dict__["_pool"]
        epoch, offset = divmod(start, len(pool))
        while True:
            order = list(range(len(pool)))
            random.Random(derive_seed("jsonl-train", self.train_seed, epoch)).shuffle(order)
            for i in range(offset, len(pool)):
                yield dataclasses.replace(pool[order[i]], index=epoch * len(pool) + i)
            epoch, offset = epoch + 1, 0

    def score(self, answer: str | None, row: Mapping[str, Any]) -> float:
        """:func:`normalized_match` of ``answer`` and ``row["answer"]`` (1.0 or 0.0)."""
        return normalized_match(answer, str(row["answer"]))


def _row_problem(row: Any) -> str | None:
    """What is wrong with one parsed JSONL task line, or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    missing = [col for col in ("prompt", "answer") if col not in row]
    if missing:
        return (
            f"missing column(s) {missing}; a task JSONL line needs 'prompt' and 'answer' (has: {sorted(row)})"
        )
    if not isinstance(row["prompt"], str):
        return f"column 'prompt' must be a string, got {row['prompt']!r}"
    if isinstance(row["answer"], bool) or not isinstance(row["answer"], (str, int, float)):
        return f"column 'answer' must be a string or a number, got {row['answer']!r}"
    return None

