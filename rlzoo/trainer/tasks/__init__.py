"""Tasks: a deterministic stream of training problems, a fixed held-out set, prompt formatting and scoring.

Two sources (:func:`load_task`):

- any reasoning-gym data set by name with its config keyword arguments (scored by the data set's own
  ``score_answer(answer=..., entry=...)``, which may give partial credit in [0, 1]):
  :mod:`~rlzoo.trainer.tasks.reasoning_gym_source`;
- anything ``datasets`` loads (data files, ``save_to_disk`` and hub-style directories, hub ids, ``Dataset``
  objects) with a prompt column in TRL's standard or conversational format and an answer column (scored by
  normalised exact match, :func:`normalized_match`): :mod:`~rlzoo.trainer.tasks.datasets_source`.

:class:`TaskStream` is what the trainer holds: the task, the answer extraction
(:mod:`~rlzoo.trainer.tasks.extraction`), the prompt format (:mod:`~rlzoo.trainer.tasks.prompts`) and the
position in the training stream.
"""

from rlzoo.trainer.tasks.base import Task, TaskItem
from rlzoo.trainer.tasks.datasets_source import DATASET_OPTIONS, DatasetTask, load_dataset_source
from rlzoo.trainer.tasks.extraction import DEFAULT_EXTRACTION, EXTRACTIONS, extract_answer, normalized_match
from rlzoo.trainer.tasks.prompts import format_prompt, is_conversational, prompt_messages, render_prompt
from rlzoo.trainer.tasks.reasoning_gym_source import ReasoningGymTask, list_reasoning_gym_tasks
from rlzoo.trainer.tasks.stream import (
    PYTHON_DATASET,
    TaskStream,
    build_task,
    check_loadable_task,
    check_python_dataset,
    dataset_task_name,
    load_task,
    make_task,
    recorded_task,
)

__all__ = [
    "DATASET_OPTIONS",
    "DEFAULT_EXTRACTION",
    "EXTRACTIONS",
    "PYTHON_DATASET",
    "DatasetTask",
    "ReasoningGymTask",
    "Task",
    "TaskItem",
    "TaskStream",
    "build_task",
    "check_loadable_task",
    "check_python_dataset",
    "dataset_task_name",
    "extract_answer",
    "format_prompt",
    "is_conversational",
    "list_reasoning_gym_tasks",
    "load_dataset_source",
    "load_task",
    "make_task",
    "normalized_match",
    "prompt_messages",
    "recorded_task",
    "render_prompt",
]
