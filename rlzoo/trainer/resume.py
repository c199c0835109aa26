"""What a resume may change: settings that can be honoured are applied (one log line each), the others refused.

A run resumes with the settings it is given now, not the checkpoint's: the optimizer's learning rate, betas,
weight decay and schedule (including ``max_steps``, the schedule's horizon) are put into the restored
optimizer and scheduler; everything read afresh at each step or generation (loss, rewards, sampling,
evaluation, checkpointing) simply takes the new value. What the restored state depends on is refused: the
model, the task's training stream, the batch shape and generation cycle, the sampler, and the seed (the
random state comes from the checkpoint).
"""

import logging
from collections.abc import Mapping
from typing import Any

from rlzoo.trainer.config import TaskConfig, TrainConfig

__all__ = ["OPTIMIZER_SETTINGS", "REFUSED_SETTINGS", "compare_settings"]

log = logging.getLogger("rlzoo.train")

_STREAM = "the task's training stream is part of the checkpoint"
_CYCLE = "the batch shape and generation cycle are part of the checkpoint (an unfinished generation batch)"
REFUSED_SETTINGS: Mapping[str, str] = {
    "model": "the checkpoint holds weights of the model it was trained from",
    "task": _STREAM,
    "task_kwargs": _STREAM,
    "train_seed": _STREAM,
    "exclude_eval_questions": _STREAM,
    "num_generations": _CYCLE,
    "per_device_train_batch_size": _CYCLE + "; the global batch (per_device_train_batch_size x ranks) must stay",
    "gradient_accumulation_steps": _CYCLE,
    "steps_per_generation": _CYCLE,
    "num_iterations": _CYCLE,
    "backend": "the sampler decides which log-probs the generation cycle stores",
    "seed": "the random state is restored from the checkpoint, so a new seed would have no effect",
}
"""Settings a resume refuses to change, with the reason."""

OPTIMIZER_SETTINGS = frozenset({"learning_rate", "lr_scheduler", "warmup_steps", "weight_decay", "adam_beta1",
                                "adam_beta2", "max_steps"})
"""Settings applied to the restored optimizer and scheduler (the schedule is rebuilt at the resumed step)."""

_NOT_SETTINGS = frozenset({"resume", "overwrite", "output_dir", "progress"})  # how this segment starts
# ``world_size`` (the number of ranks, not a flag) is compared too: a change is applied (DCP reshards the model
# and optimizer) as long as the global batch stays.


def compare_settings(saved: Mapping[str, Any], config: TrainConfig, *, world_size: int = 1) -> dict[str, tuple[Any, Any]]:
    """The settings ``config`` changes relative to a checkpoint's (``saved``: its ``TrainConfig.to_dict()``, with
    the ``world_size`` that wrote it).

    Resuming on another number of ranks is a change of ``world_size``; it is honoured when the global batch
    stays (``per_device_train_batch_size`` x ranks), which is then what is compared.

    Logs one line per applied change. Returns ``{field: (saved value, new value)}`` of the applied changes; an
    empty ``saved`` (a checkpoint from before rlzoo recorded settings) compares as unchanged.

    Raises:
        ValueError: a change that cannot be honoured: names every such field, its two values and why.
    """
    if not saved:
        return {}
    saved = dict(saved)
    saved_world = int(saved.pop("world_size", 1))
    now = {**config.to_dict(), "world_size": world_size}
    if saved_world != world_size and "per_device_train_batch_size" in saved:  # compare the global batch
        old, new = saved["per_device_train_batch_size"], config.per_device_train_batch_size
        if old * saved_world == new * world_size:
            saved["per_device_train_batch_size"] = new
        else:
            saved["per_device_train_batch_size"] = f"{old} per rank x {saved_world} ranks"
            now["per_device_train_batch_size"] = f"{new} per rank x {world_size} ranks"
    saved["world_size"] = saved_world
    changes: dict[str, tuple[Any, Any]] = {}
    for name, new in now.items():
        if name in _NOT_SETTINGS or name not in saved:
            continue
        old = saved[name]
        if name == "task_kwargs":  # None means the default options: compare what the task is built with
            old = TaskConfig(task=saved.get("task", config.task), task_kwargs=old).resolved_task_kwargs
            new = config.resolved_task_kwargs
        if _normal(old) != _normal(new):
            changes[name] = (old, new)
    refused = {k: v for k, v in changes.items() if k in REFUSED_SETTINGS}
    if config.exclude_eval_questions:  # the training stream skips the held-out questions
        refused.update({k: v for k, v in changes.items() if k in ("eval_seed", "eval_size")})
    if refused:
        reasons = "; ".join(f"{k} {v[0]!r} -> {v[1]!r} ({REFUSED_SETTINGS.get(k, _STREAM)})" for k, v in refused.items())
        raise ValueError(f"cannot resume with changed settings: {reasons}. Resume with the checkpoint's values, or "
                         "start a new run in another --output-dir")
    for name, (old, new) in changes.items():
        where = "applied to the restored optimizer and schedule" if name in OPTIMIZER_SETTINGS else "applied"
        log.info("resume: %s changed %r -> %r (%s)", name, old, new, where)
    return changes


def _normal(value: Any) -> Any:
    """Lists and tuples compare alike (JSON has no tuples); mappings by content."""
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items()}
    return value
