"""Tasks: a deterministic stream of training problems, a fixed held-out set, prompt formatting and scoring.

A :class:`Task` yields :class:`TaskItem` s (question, reference answer, and the columns handed to reward
functions as TRL's ``**columns``). Two sources (:func:`load_task`):

- any reasoning-gym data set by name with its config keyword arguments (scored by the data set's own
  ``score_answer(answer=..., entry=...)``, which may give partial credit in [0, 1]);
- a JSONL file with ``prompt`` and ``answer`` columns (scored by normalised exact match,
  :func:`normalized_match`).

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

import abc
import dataclasses
import decimal
import hashlib
import itertools
import json
import os
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from transformers import PreTrainedTokenizerBase

from rlzoo.registry import UnknownNameError

__all__ = [
    "DEFAULT_EXTRACTION",
    "EXTRACTIONS",
    "JsonlTask",
    "ReasoningGymTask",
    "Task",
    "TaskItem",
    "TaskStream",
    "extract_answer",
    "format_prompt",
    "list_reasoning_gym_tasks",
    "load_task",
    "make_task",
    "normalized_match",
    "prompt_messages",
]

EXTRACTIONS: Final[tuple[str, ...]] = ("full", "first_line", "first_number", "last_number", "tag")
"""Ways to turn a completion into an answer string (:func:`extract_answer`)."""
DEFAULT_EXTRACTION: Final[str] = "last_number"
"""The default extraction. SmolLM2-135M-Instruct answers chain_sum in a sentence ("The final answer to this
arithmetic problem is 15."), so ``full`` scores ~0 (reasoning-gym's partial credit: mean 0.013 on 200
held-out 2-term 1-digit problems, greedy) while ``last_number`` gives 40.0 %: a learnable reward. The last
number rather than the first: worked answers end with the result ("5 - 9 = -4")."""

TRAIN_CHUNK: Final[int] = 1024
"""Items per reasoning-gym data set instance in the training stream (one derived seed per chunk)."""
_SEED_SPACE: Final[int] = 2**31 - 2 * TRAIN_CHUNK  # some generators seed numpy RandomState (< 2**32)
_MAX_SKIPPED: Final[int] = 100 * TRAIN_CHUNK

_NUMBER = re.compile(r"(?:(?<![\w)\]])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")


def extract_answer(completion: str, extraction: str = DEFAULT_EXTRACTION) -> str | None:
    """The answer string that a completion gives, or None when it gives none.

    Args:
        completion: decoded completion text (special tokens already removed, as TRL decodes).
        extraction: one of :data:`EXTRACTIONS`:

            - ``full``: the whole completion, whitespace stripped (None if empty);
            - ``first_line``: the first non-blank line, stripped;
            - ``first_number`` / ``last_number``: the first / last number: optional sign (only when not
              preceded by a word character, so ``4-1`` is ``4`` and ``1``), digits with optional thousands
              commas, optional decimals and exponent;
            - ``tag``: the content of the last ``<answer>...</answer>`` (reasoning_gym.utils.extract_answer).

    Raises:
        UnknownNameError: unknown ``extraction`` (lists the valid ones).

    Example:
        >>> extract_answer("The answer is -4. Check: 5 - 9 = -4", "first_number")
        '-4'
        >>> extract_answer("<think>5-9</think> <answer> -4 </answer>", "tag")
        '-4'
        >>> extract_answer("  7\\n", "full")
        '7'
    """
    if extraction == "full":
        return completion.strip() or None
    if extraction == "first_line":
        return next((line.strip() for line in completion.splitlines() if line.strip()), None)
    if extraction in ("first_number", "last_number"):
        numbers = _NUMBER.findall(completion)
        if not numbers:
            return None
        return numbers[0] if extraction == "first_number" else numbers[-1]
    if extraction == "tag":
        from reasoning_gym.utils import extract_answer as rg_extract_answer

        return rg_extract_answer(completion, tag_name="answer", strip=True)
    raise UnknownNameError(f"unknown answer extraction {extraction!r}; valid: {', '.join(EXTRACTIONS)}")


def normalized_match(answer: str | None, reference: str) -> float:
    """1.0 if ``answer`` equals ``reference`` after normalisation, else 0.0 (the JSONL tasks' scorer).

    Normalisation: strip, collapse runs of whitespace to one space, casefold; if both sides then parse as
    decimal numbers (thousands commas removed, a trailing period allowed) they are compared as numbers
    (``"1,000.0" == "1000"``, ``"+3" == "3"``). None or empty answers score 0.

    Example:
        >>> normalized_match(" Paris ", "paris"), normalized_match("1,000.0", "1000")
        (1.0, 1.0)
        >>> normalized_match(None, "1"), normalized_match("-4", "4")
        (0.0, 0.0)
    """
    if answer is None:
        return 0.0
    a, b = (" ".join(s.split()).casefold() for s in (answer, reference))
    if not a:
        return 0.0
    if a == b:
        return 1.0
    try:
        return float(
            decimal.Decimal(a.replace(",", "").rstrip(".")) == decimal.Decimal(b.replace(",", "").rstrip("."))
        )
    except (decimal.InvalidOperation, ValueError):
        return 0.0


def prompt_messages(question: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The conversational prompt of one question: ``[system?, user]`` messages (TRL's "prompt" column)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    return [*messages, {"role": "user", "content": question}]


def format_prompt(tokenizer: PreTrainedTokenizerBase, question: str, system_prompt: str | None = None) -> str:
    """The prompt string a model is conditioned on, exactly as TRL 1.16's GRPOTrainer builds it.

    For a tokenizer with a chat template, TRL renders the conversational prompt :func:`prompt_messages`
    with ``apply_chat_template(..., add_generation_prompt=True)`` (trl/data_utils.py
    ``apply_chat_template`` for a last "user" message; GRPOTrainer._tokenize_prompts), so with
    ``system_prompt=None`` the template's default system prompt applies (SmolLM2: "You are a helpful AI
    assistant named SmolLM, trained by Hugging Face"). Tokenize the result with
    ``add_special_tokens=False`` (what ``apply_chat_template(tokenize=True)`` does) to get TRL's prompt ids.
    Without a chat template the question is returned unchanged (TRL's standard, non-conversational format).

    Raises:
        ValueError: ``system_prompt`` given for a tokenizer without a chat template.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        if system_prompt is not None:
            raise ValueError("system_prompt needs a tokenizer with a chat_template; this tokenizer has none")
        return question
    text = tokenizer.apply_chat_template(
        prompt_messages(question, system_prompt), tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    return text


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskItem:
    """One problem.

    Attributes:
        question: the user message (reasoning-gym ``question``, JSONL ``prompt``).
        answer: the reference answer string.
        columns: the row handed to reward functions as TRL's ``**columns`` (every column but ``prompt``):
            reasoning-gym: ``question``, ``answer``, ``metadata``; JSONL: ``answer`` and the file's other
            columns.
        index: position in its stream (training: the raw stream position, ``Task.train_items(start=index+1)``
            resumes after it; eval: 0..eval_size-1).
    """

    question: str
    answer: str
    columns: Mapping[str, Any]
    index: int


class Task(abc.ABC):
    """A source of problems: an endless deterministic training stream and a fixed held-out set.

    Attributes:
        name: the task's name (data set name or file path).
        train_seed, eval_seed, eval_size: as given to :func:`load_task`.
        exclude_eval_questions: drop training items whose question is in the eval set.
    """

    name: str
    train_seed: int
    eval_seed: int
    eval_size: int
    exclude_eval_questions: bool

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
            RuntimeError: with ``exclude_eval_questions``, the eval set covers all problems the generator
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
                if skipped > _MAX_SKIPPED:
                    raise RuntimeError(
                        f"task {self.name!r}: {_MAX_SKIPPED} training items in a row are eval questions; the "
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


def _derive_seed(*parts: object) -> int:
    """A seed in [0, _SEED_SPACE) from SHA-256 of ``repr(parts)`` (stable across processes and platforms)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") % _SEED_SPACE


def list_reasoning_gym_tasks() -> list[str]:
    """Sorted names of the registered reasoning-gym data sets."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


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
        ValueError: bad config kwargs (names the valid fields) or invalid values (reasoning-gym's message).
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
            raise UnknownNameError(
                f"unknown reasoning-gym task {self.name!r}; "
                f"available: {', '.join(list_reasoning_gym_tasks())}"
            )
        if self.eval_size < 0:
            raise ValueError(f"eval_size must be >= 0, got {self.eval_size}")
        _, config_cls = DATASETS[self.name]
        fields = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size"))
        bad = sorted(set(self.kwargs) - set(fields))
        if bad:
            reserved = [k for k in bad if k in ("seed", "size")]
            hint = " (use train_seed / eval_seed / eval_size instead)" if reserved else ""
            raise ValueError(
                f"unknown option(s) {bad} for reasoning-gym task {self.name!r}{hint}; "
                f"valid: {', '.join(fields)}"
            )
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))
        # builds (and validates) the config now; its instance is the scorer
        object.__setattr__(
            self, "_scorer", self._dataset(_derive_seed("eval", self.eval_seed), max(self.eval_size, 1))
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

    def _train_chunk_seeds(self) -> Iterator[int]:
        eval_lo = _derive_seed("eval", self.eval_seed)
        eval_hi = eval_lo + self.eval_size
        for chunk in itertools.count():
            seed = _derive_seed("train", self.train_seed, chunk)
            if seed < eval_hi and eval_lo < seed + TRAIN_CHUNK:  # would share an RNG state with an eval item
                continue
            yield seed

    def _raw_train_items(self, start: int) -> Iterator[TaskItem]:
        first_chunk, offset = divmod(start, TRAIN_CHUNK)
        seeds = itertools.islice(self._train_chunk_seeds(), first_chunk, None)
        for chunk, seed in enumerate(seeds, start=first_chunk):
            dataset = self._dataset(seed, TRAIN_CHUNK)
            for i in range(offset if chunk == first_chunk else 0, TRAIN_CHUNK):
                yield self._item(dataset[i], chunk * TRAIN_CHUNK + i)

    def score(self, answer: str | None, row: Mapping[str, Any]) -> float:
        """reasoning-gym's ``score_answer(answer=answer, entry=row)`` (the data set's scorer, in [0, 1])."""
        return float(self.__dict__["_scorer"].score_answer(answer=answer, entry=dict(row)))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class JsonlTask(Task):
    """Problems from a JSONL file: a JSON object a line with ``prompt`` (str) and ``answer`` (str or number).

    The rows are shuffled with ``random.Random(eval_seed)``; the first ``eval_size`` form the held-out set and
    the rest the training pool (disjoint by row). The training stream walks the pool in epochs, each
    reshuffled with a seed derived from ``(train_seed, epoch)``. Other columns reach reward functions.
    Blank lines are skipped. Scoring: :func:`normalized_match` against ``answer``.

    Raises (at construction):
        FileNotFoundError: no such file.
        ValueError: a line that is not a JSON object (with its line number), missing ``prompt``/``answer``
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
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(
                        f"{self.path}:{lineno}: invalid JSON: {err.msg} (column {err.colno})"
                    ) from None
                problem = _row_problem(row)
                if problem is not None:
                    raise ValueError(f"{self.path}:{lineno}: {problem}")
                rows.append(row)
        if len(rows) <= self.eval_size:
            raise ValueError(
                f"task file {self.path!r} has {len(rows)} rows; eval_size={self.eval_size} must leave "
                "at least one "
                "training row"
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
            random.Random(_derive_seed("jsonl-train", self.train_seed, epoch)).shuffle(order)
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


def load_task(
    name_or_path: str,
    *,
    kwargs: Mapping[str, Any] | None = None,
    train_seed: int = 1,
    eval_seed: int = 1000,
    eval_size: int = 200,
    exclude_eval_questions: bool = False,
) -> Task:
    """A task from a reasoning-gym data set name (with its config ``kwargs``) or a ``.jsonl`` file path.

    Raises:
        UnknownNameError: neither a ``.jsonl`` path nor a reasoning-gym name (lists the available names).
        ValueError: ``kwargs`` given for a JSONL task, or the errors of :class:`ReasoningGymTask` /
            :class:`JsonlTask`.
    """
    if name_or_path.endswith(".jsonl") or os.path.sep in name_or_path:
        if kwargs:
            raise ValueError(
                f"task options {dict(kwargs)} only apply to reasoning-gym tasks, not {name_or_path!r}"
            )
        return JsonlTask(
            path=name_or_path,
            train_seed=train_seed,
            eval_seed=eval_seed,
            eval_size=eval_size,
            exclude_eval_questions=exclude_eval_questions,
        )
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

    Wraps a :class:`Task` with the answer extraction and the position in the training stream; the
    position is the trainer's checkpointed state (:meth:`state_dict`).

    Args:
        task: the task.
        answer_extraction: how completions become answers (:data:`EXTRACTIONS`).

    Raises:
        UnknownNameError: unknown ``answer_extraction`` (lists the valid ones).
    """

    def __init__(self, task: Task, *, answer_extraction: str = DEFAULT_EXTRACTION) -> None:
        if answer_extraction not in EXTRACTIONS:
            raise UnknownNameError(
                f"unknown answer_extraction {answer_extraction!r}; valid: {', '.join(EXTRACTIONS)}"
            )
        self.task = task
        self.answer_extraction = answer_extraction
        self.position = 0
        self._iterator: Iterator[TaskItem] | None = None

    @property
    def eval_items(self) -> list[TaskItem]:
        """The fixed held-out items."""
        return self.task.eval_items()

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

    def prompt(
        self, tokenizer: PreTrainedTokenizerBase, item: TaskItem, system_prompt: str | None = None
    ) -> str:
        """:func:`format_prompt` of the item's question (TRL's prompt string)."""
        return format_prompt(tokenizer, item.question, system_prompt)

    def question(self, item: TaskItem) -> str:
        """The item's question (for logs)."""
        return item.question

    def score(self, completion: str, item: TaskItem) -> float:
        """``task.score(extract_answer(completion, answer_extraction), item.columns)``, in [0, 1]."""
        return self.task.score(extract_answer(completion, self.answer_extraction), item.columns)

    def _identity(self) -> dict[str, Any]:
        task = self.task
        kwargs = dict(getattr(task, "kwargs", {}))
        return {
            "name": task.name,
            "kwargs": kwargs,
            "train_seed": task.train_seed,
            "exclude_eval_questions": task.exclude_eval_questions,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the training position and what identifies the stream."""
        return {"position": self.position, **self._identity()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the training position.

        Raises:
            ValueError: the state belongs to a different stream (task name, options, train seed); names the
                differing keys.
        """
        mine = self._identity()
        theirs = {k: state.get(k) for k in mine}
        theirs["kwargs"] = dict(theirs["kwargs"] or {})
        differ = sorted(
            k
            for k in mine
            if json.dumps(mine[k], sort_keys=True, default=str)
            != json.dumps(theirs[k], sort_keys=True, default=str)
        )
        if differ:
            details = ", ".join(f"{k}={theirs[k]!r} (now {mine[k]!r})" for k in differ)
            raise ValueError(f"task state is from a different training stream: {details}")
        position = state.get("position")
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"task state 'position' must be an int >= 0, got {position!r}")
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
