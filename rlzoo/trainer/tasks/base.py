"""A task: an endless deterministic stream of training problems and a fixed held-out set, with a scorer.

A :class:`Task` yields :class:`TaskItem` s (question, reference answer, and the columns handed to reward
functions as TRL's ``**columns``). Its sources: :mod:`~rlzoo.trainer.tasks.reasoning_gym_source` (any
reasoning-gym data set) and :mod:`~rlzoo.trainer.tasks.datasets_source` (anything ``datasets`` loads).
"""

import abc
import dataclasses
import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from rlzoo.trainer.tasks.extraction import DEFAULT_EXTRACTION, extract_answer

__all__ = ["MAX_SKIPPED", "TRAIN_CHUNK", "Task", "TaskItem", "derive_seed"]

TRAIN_CHUNK: Final[int] = 1024
"""Items per reasoning-gym data set instance in the training stream (one derived seed per chunk)."""
_SEED_SPACE: Final[int] = 2**31 - 2 * TRAIN_CHUNK  # some generators seed numpy RandomState (< 2**32)
MAX_SKIPPED: Final[int] = 100 * TRAIN_CHUNK
"""With ``exclude_eval_questions``, this many held-out questions in a row in the training stream mean that the
held-out set covers the problem space (an error)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskItem:
    """One problem.

    Attributes:
        question: the user message (reasoning-gym ``question``, JSONL ``prompt``).
        answer: the reference answer string.
        columns: the row handed to reward functions as TRL's ``**columns`` (every column but the prompt's and, as
            TRL, ``completion`` and ``completion_ids`` unless one is the answer column): reasoning-gym:
            ``question``, ``answer``, ``metadata``; data sets: the answer column and the other columns.
        index: position in its stream (training: the raw stream position, ``Task.train_items(start=index+1)``
            resumes after it; eval: 0..eval_size-1).
        prompt: the data set's own prompt, in TRL's standard (a string, used as it is) or conversational (a list
            of ``{"role", "content"}`` messages, rendered with the chat template) format; None for tasks whose
            question is put in a user message (reasoning-gym).
    """

    question: str
    answer: str
    columns: Mapping[str, Any]
    index: int
    prompt: str | list[dict[str, Any]] | None = None


class Task(abc.ABC):
    """A source of problems: an endless deterministic training stream and a fixed held-out set.

    Attributes:
        name: the task's name (data set name or file path).
        train_seed, eval_seed, eval_size: as given to :func:`~rlzoo.trainer.tasks.load_task`.
        exclude_eval_questions: drop training items whose question is in the eval set.
    """

    name: str
    train_seed: int
    eval_seed: int
    eval_size: int
    exclude_eval_questions: bool

    @property
    def num_train_rows(self) -> int | None:
        """The training stream's rows in one pass over the data (an epoch), or None when it has no end (a
        generated task) or its length is unknown (a streamed data set)."""
        return None

    @property
    def has_answers(self) -> bool:
        """Whether items carry a reference answer to score (held-out accuracy, the ``accuracy`` reward)."""
        return True

    def stream_identity(self) -> dict[str, Any]:
        """What makes the training stream beyond the name, options and seeds a checkpoint records (compared on
        resume): nothing for a generated task; a data set's rows (:meth:`DatasetTask.stream_identity`)."""
        return {}

    @abc.abstractmethod
    def _raw_train_items(self, start: int) -> Iterator[TaskItem]:
        """Endless training stream from raw position ``start`` (before eval-question exclusion)."""

    @abc.abstractmethod
    def _build_eval_items(self) -> list[TaskItem]:
        """The held-out items."""

    @abc.abstractmethod
    def score(self, answer: str | None, row: Mapping[str, Any]) -> float:
        """Score an extracted answer against one item's ``columns`` row; in [0, 1]."""

    def eval_items(self) -> list[TaskItem]:
        """The fixed held-out set (``eval_size`` items, same for every call and process)."""
        cached = self.__dict__.get("_eval_cache")
        if cached is None:
            cached = self._build_eval_items()
            self.__dict__["_eval_cache"] = cached
        return list(cached)

    def train_items(self, start: int = 0) -> Iterator[TaskItem]:
        """Endless deterministic training stream, from raw position ``start`` (``item.index + 1`` resumes).

        Raises:
            ValueError: ``start`` < 0.
            ValueError: with ``exclude_eval_questions``, the eval set covers all problems the generator
                produced over a long stretch (nothing left to train on).
        """
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        if not self.exclude_eval_questions:
            yield from self._raw_train_items(start)
            return
        held_out = {item.question for item in self.eval_items()}
        skipped = 0
        for item in self._raw_train_items(start):
            if item.question in held_out:
                skipped += 1
                if skipped > MAX_SKIPPED:
                    raise ValueError(
                        f"task {self.name!r}: {MAX_SKIPPED} training items in a row are eval questions; the "
                        "eval set covers the problem space (use exclude_eval_questions=False or a smaller "
                        "eval_size)"
                    )
                continue
            skipped = 0
            yield item

    def eval_overlap(self, num_train: int) -> dict[str, float]:
        """How much the first ``num_train`` training items and the eval set share question strings.

        Returns:
            ``eval_seen``: fraction of eval items whose question occurs in those training items;
            ``train_in_eval``: fraction of those training items whose question is an eval question;
            ``eval_distinct``: distinct eval questions / eval size.
        """
        evals = [item.question for item in self.eval_items()]
        train = [item.question for item in itertools.islice(self.train_items(), num_train)]
        eval_set, train_set = set(evals), set(train)
        return {
            "eval_seen": sum(q in train_set for q in evals) / max(len(evals), 1),
            "train_in_eval": sum(q in eval_set for q in train) / max(len(train), 1),
            "eval_distinct": len(eval_set) / max(len(evals), 1),
        }

    def score_completions(
        self,
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
        extraction: str = DEFAULT_EXTRACTION,
    ) -> list[float]:
        """Score completions against their items' rows: ``score(extract_answer(c, extraction), row)``.

        Raises:
            ValueError: different lengths.
        """
        if len(completions) != len(rows):
            raise ValueError(f"got {len(completions)} completions but {len(rows)} rows")
        return [
            self.score(extract_answer(c, extraction), row) for c, row in zip(completions, rows, strict=True)
        ]


def derive_seed(*parts: object) -> int:
    """A seed in [0, 2**31 - 2048) from SHA-256 of ``repr(parts)`` (stable across processes and platforms)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") % _SEED_SPACE
