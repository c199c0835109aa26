"""Tasks: a deterministic stream of training problems, a fixed held-out set, prompt formatting and scoring.

Two sources (:func:`load_task`):

- any reasoning-gym data set by name with its config keyword arguments (scored by the data set's own
  ``score_answer(answer=..., entry=...)``, which may give partial credit in [0, 1]):
  :mod:`~rlzoo.trainer.tasks.reasoning_gym_source`;
- a JSONL file with ``prompt`` and ``answer`` columns (scored by normalised exact match,
  :func:`normalized_match`): :mod:`~rlzoo.trainer.tasks.file_source`.

:class:`TaskStream` is what the trainer holds: the task, the answer extraction
(:mod:`~rlzoo.trainer.tasks.extraction`), the prompt format (:mod:`~rlzoo.trainer.tasks.prompts`) and the
position in the training stream.
"""

from rlzoo.trainer.tasks.base import Task, TaskItem
from rlzoo.trainer.tasks.extraction import DEFAULT_EXTRACTION, EXTRACTIONS, extract_answer, normalized_match
from rlzoo.trainer.tasks.file_source import JsonlTask
from rlzoo.trainer.tasks.prompts import format_prompt, prompt_messages
from rlzoo.trainer.tasks.reasoning_gym_source import ReasoningGymTask, list_reasoning_gym_tasks
from rlzoo.trainer.tasks.stream import TaskStream, build_task, load_task, make_task

__all__ = [
    "DEFAULT_EXTRACTION",
    "EXTRACTIONS",
    "JsonlTask",
    "ReasoningGymTask",
    "Task",
    "TaskItem",
    "TaskStream",
    "build_task",
    "extract_answer",
    "format_prompt",
    "list_reasoning_gym_tasks",
    "load_task",
    "make_task",
    "normalized_match",
    "prompt_messages",
]
