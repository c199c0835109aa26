"""What a resume starts from and what it may change: settings that can be honoured are applied (one log line
each), the others refused.

Where the settings come from. ``rlzoo train --resume`` takes the checkpoint's settings as the defaults and lays
the config file and flags given now over them (:func:`checkpoint_settings`), as TRL and verl users expect: ``rlzoo
train --output-dir RUN --resume latest`` continues RUN as it was, and only what is given again can be a change.
The Python API takes a whole :class:`~rlzoo.trainer.TrainConfig` as the user's (a dataclass cannot tell a default
from a value set to it; transformers' ``Trainer`` likewise resumes with the ``TrainingArguments`` it is given);
:func:`resume_config` builds one from the checkpoint with overrides, as the command line does.

What a change does. Optimizer settings and schedule (with ``max_steps``, its horizon) go into the restored optimizer
and scheduler; what is read afresh each step or generation (loss, rewards, sampling, evaluation, checkpointing) takes
the new value (inside a cycle from its next generation batch: :mod:`~rlzoo.trainer.mid_cycle`). What the restored
state depends on (model and LoRA options, the task's training stream, batch shape and generation cycle, sampler,
seed, a ``max_steps`` already reached) is refused before the model loads (:func:`check_resume`); inside a cycle,
what its stored batch depends on, once the checkpoint is read.

``--resume auto`` resumes from the newest checkpoint of the output directory if it holds one and else starts
fresh (verl's ``resume_mode=auto``), so one command serves a job's first start and every requeue.
"""

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.checkpoint import Checkpointer, step_of
from rlzoo.trainer.config import CheckpointConfig, TaskConfig, TrainConfig
from rlzoo.trainer.mid_cycle import NEXT_BATCH, ranks
from rlzoo.trainer.run_config import absolute_paths, settings_for_algorithm
from rlzoo.trainer.run_dir import RunDirectory, inside_a_run
from rlzoo.trainer.tasks.datasets_source import without_dataset_defaults
from rlzoo.trainer.tasks.stream import holds_out_training_rows

__all__ = ["OPTIMIZER_SETTINGS", "PYTHON_LOSS", "PYTHON_REWARDS", "REFUSED_SETTINGS", "check_resume", "check_run_length",
           "checkpoint_settings", "compare_settings", "find_checkpoint", "log_setting_changes", "loss_summary", "ranks",
           "resume_config", "saved_settings"]

log = logging.getLogger("rlzoo.train")

_STREAM = "the task's training stream is part of the checkpoint"
_HELD_OUT = ("the data set's held-out rows are cut from its training rows, so they decide which rows it trains on (a "
             "separate --task.eval_split would not)")
_CYCLE = "the batch shape and generation cycle are part of the checkpoint (its generation batch may be unfinished)"
REFUSED_SETTINGS: Mapping[str, str] = {
    "model": "the checkpoint holds weights of the model it was trained from",
    "peft": "the checkpoint holds the adapter these LoRA options shape and scale (and the whole model without them)",
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

PYTHON_REWARDS = "python_reward_funcs"
"""The key of a checkpoint's settings that lists the reward functions given as Python callables (``Trainer(config,
reward_funcs=[fn])``), which a checkpoint cannot hold: a command-line resume gives them again (:func:`checkpoint_settings`)."""

PYTHON_LOSS = "python_loss"
"""The key of a checkpoint's settings that holds the loss given from Python (``Trainer(config, loss=...)``) as its
``to_config()`` (None: ``algorithm``'s): a resume without that loss is refused (:func:`checkpoint_settings`)."""

_NOT_SETTINGS = frozenset({"resume", "overwrite", "output_dir", "progress"})  # how this segment starts


def compare_settings(saved: Mapping[str, Any], config: TrainConfig, *, world_size: int = 1,
                     log_changes: bool = True) -> dict[str, tuple[Any, Any]]:
    """The settings ``config`` changes relative to a checkpoint's (``saved``: its ``TrainConfig.to_dict()``, with
    the ``world_size`` that wrote it).

    Resuming on another number of ranks is a change of ``world_size``; it is honoured when the global batch
    stays (``per_device_train_batch_size`` x ranks), which is then what is compared.

    LoRA options (``peft``) compare as the adapter they build (:func:`~rlzoo.trainer.adapters.built_adapter`):
    ``target_modules`` in another order, or an option given at peft's default, is no change.

    Logs (unless ``log_changes`` is False) one line per applied change, per field and per option of a mapping
    (``resume: loss.beta changed (not set) -> 0.1``). Returns ``{field: (saved value, new value)}`` of the applied
    changes; an empty ``saved`` (a checkpoint from before rlzoo recorded settings) compares as unchanged.

    Raises:
        ValueError: a change that cannot be honoured: names every such field, its two values and why.
    """
    if not saved:
        return {}
    saved = dict(saved)
    saved_world = int(saved.pop("world_size", 1))
    now = {**config.to_dict(), "world_size": world_size}
    keep = ""  # how to keep the global batch on this world size
    rebatched: tuple[Any, Any] | None = None
    if saved_world != world_size and "per_device_train_batch_size" in saved:  # compare the global batch
        old, new = saved["per_device_train_batch_size"], config.per_device_train_batch_size
        if old * saved_world == new * world_size:
            saved["per_device_train_batch_size"] = new  # honoured: a change of the per-rank share, logged below
            rebatched = (old, new) if old != new else None
        else:
            saved["per_device_train_batch_size"] = f"{old} per rank x {ranks(saved_world)}"
            now["per_device_train_batch_size"] = f"{new} per rank x {ranks(world_size)}"
            per_rank, whole = divmod(old * saved_world, world_size)
            groups = per_rank * config.effective_steps_per_generation % config.num_generations == 0
            keep = (f"give --per-device-train-batch-size {per_rank} (the global batch of {old * saved_world} on "
                    f"{ranks(world_size)})" if not whole and groups else
                    f"resume on a number of ranks over which the global batch of {old * saved_world} splits into whole "
                    f"groups of num_generations ({config.num_generations})")
    saved["world_size"] = saved_world
    changes: dict[str, tuple[Any, Any]] = {}
    for name, new in now.items():
        if name in _NOT_SETTINGS or name not in saved:
            continue
        old = saved[name]
        if name in ("algorithm", "advantage") and isinstance(old, str):  # recorded as typed by older versions
            from rlzoo.advantages import advantage_estimators
            from rlzoo.losses import presets

            old = (presets if name == "algorithm" else advantage_estimators).canonical(old)
        if name == "peft" and isinstance(old, Mapping) and isinstance(new, Mapping):  # the adapter they build:
            from rlzoo.trainer.adapters import built_adapter  # peft's defaults, target_modules as a set

            old, new = built_adapter(old), built_adapter(new)
        if name == "loss" and _same_loss(old, new, saved.get("algorithm", config.algorithm), config.algorithm):
            continue  # options at the preset's defaults are no change (a change is logged as given)
        if name == "steps_per_generation" and (old is None) != (new is None):  # None: gradient_accumulation_steps
            old, new = old or saved.get("gradient_accumulation_steps", 1), config.effective_steps_per_generation
        if name == "task_kwargs":  # None means the default options: compare what the task is built with
            old = TaskConfig(task=saved.get("task", config.task), task_kwargs=old).resolved_task_kwargs
            new = config.resolved_task_kwargs
            # a data set's option (of a file, a hub id or train_dataset) given at its default is no change
            old, new = without_dataset_defaults(old), without_dataset_defaults(new)
        if _normal(old) != _normal(new):
            changes[name] = (old, new)
    why = dict(REFUSED_SETTINGS)
    if config.exclude_eval_questions:  # the training stream skips the held-out questions
        why.update(dict.fromkeys(("eval_seed", "eval_size"), _STREAM))
    elif holds_out_training_rows(config.section(TaskConfig)):
        why.update(dict.fromkeys(("eval_seed", "eval_size"), _HELD_OUT))
    refused = {k: v for k, v in changes.items() if k in why}
    if refused:
        reasons = "; ".join(
            ", ".join(f"{label} {old!r} -> {new!r}" for label, old, new in _changed_options(k, *v))
            + f" ({why[k]})" for k, v in refused.items())
        fix = (f"{keep}, or resume on {ranks(saved_world)}"
               if keep and list(refused) == ["per_device_train_batch_size"] else
               "Resume with the checkpoint's values (leave those flags out; in Python: "
               "rlzoo.trainer.resume.resume_config), or start a new run in another --output-dir")
        raise ValueError(f"cannot resume with changed settings: {reasons}. {fix[0].upper()}{fix[1:]}")
    if rebatched is not None:
        changes["per_device_train_batch_size"] = rebatched
    if log_changes:
        log_setting_changes(changes)
    return changes


def log_setting_changes(changes: Mapping[str, tuple[Any, Any]], *, mid_cycle: bool = False) -> None:
    """Log one line per applied change of :func:`compare_settings`'s result: per field, and for a mapping per
    option (``resume: loss.beta changed (not set) -> 0.1 (applied)``); ``mid_cycle``: the checkpoint holds an
    unfinished generation batch, which the :data:`~rlzoo.trainer.mid_cycle.NEXT_BATCH` settings do not change."""
    for name, (old, new) in changes.items():
        where = "applied to the restored optimizer and schedule" if name in OPTIMIZER_SETTINGS else "applied"
        where = "applied from the next generation batch" if mid_cycle and name in NEXT_BATCH else where
        for label, before, after in _changed_options(name, old, new):
            log.info("resume: %s changed %r -> %r (%s)", label, before, after, where)


def _same_loss(old: Any, new: Any, old_algorithm: Any, new_algorithm: Any) -> bool:
    """Whether two ``--loss`` option mappings are the same once options at their preset's default are left out."""
    return (isinstance(old, Mapping) and isinstance(new, Mapping)
            and _normal(_without_defaults(old, old_algorithm)) == _normal(_without_defaults(new, new_algorithm)))


def _without_defaults(options: Mapping[str, Any], algorithm: Any) -> dict[str, Any]:
    """``--loss`` options less those at ``algorithm``'s default (``--loss.beta 0.04`` on grpo builds grpo's loss);
    as they are when the preset cannot be built (a loss given from Python, an older name)."""
    from rlzoo.losses import get_loss

    try:
        defaults = get_loss(algorithm).options()
    except (KeyError, ValueError, TypeError):
        return dict(options)
    return {k: v for k, v in options.items() if k not in defaults or _normal(v) != _normal(defaults[k])}


def check_resume(checkpoints: Path, config: TrainConfig, *, world_size: int = 1) -> None:
    """Refuse, before the model loads (minutes for a large one), a resume that the checkpoint will refuse: a
    changed setting that cannot be honoured (:func:`compare_settings`, without its log lines) or a ``max_steps``
    the checkpoint is past (:func:`check_run_length`). Nothing when ``config`` does not resume or its checkpoint
    is not found yet (the trainer finds it after cleaning up interrupted writes, and says so).

    Raises:
        ValueError: as :func:`compare_settings` and :func:`check_run_length`.
    """
    try:
        path = find_checkpoint(Checkpointer(CheckpointConfig(), checkpoints), config.resume)
    except FileNotFoundError:
        return
    if path is None:
        return
    step = step_of(path)
    if step is not None and config.max_steps < step:
        check_run_length(config.max_steps, step, path)
    compare_settings(saved_settings(path, config), config, world_size=world_size, log_changes=False)


def saved_settings(path: str | os.PathLike[str], config: TrainConfig) -> dict[str, Any]:
    """The settings the checkpoint ``path`` was written with, as :func:`compare_settings` compares them with
    ``config``'s: local paths absolute (older versions recorded them relative); for an adapter checkpoint without a
    recorded ``peft`` (a ``peft_config`` object, before rlzoo recorded it), the options given now.

    Raises:
        FileNotFoundError: not an rlzoo checkpoint.
    """
    saved = absolute_paths(Checkpointer.settings(path))
    if saved.get("peft") is None and config.peft is not None and (Path(path) / "model" / "adapter_config.json").is_file():
        saved["peft"] = config.peft
    return saved


def find_checkpoint(checkpointer: Checkpointer, resume: str | None) -> Path | None:
    """The checkpoint ``resume`` names: ``latest`` or a path (:meth:`Checkpointer.find`), or under ``auto`` the
    newest one if there is one; None: start fresh (no ``resume``, or ``auto`` in a directory without checkpoints).

    Raises:
        FileNotFoundError: ``latest`` without a checkpoint, or a path that is not a checkpoint.
    """
    if resume is None:
        return None
    if resume == "auto":
        found = checkpointer.all()
        return found[-1] if found else None
    return checkpointer.find(resume)


def checkpoint_settings(output_dir: str | os.PathLike[str] | None, resume: str | None, *,
                        rewards_given: bool = True, loss_given: bool = False) -> dict[str, Any] | None:
    """The settings of the checkpoint ``resume`` names (``latest`` / ``auto``: the newest under
    ``OUTPUT_DIR/checkpoints``; or a checkpoint path), as :meth:`TrainConfig.from_dict` takes them: what the
    command line lays the flags given on resume over.

    Left out: how that run's segment was started (``output_dir``, ``resume``, ``overwrite``, ``progress``), the
    world size (not a setting), the names of reward functions given as Python callables (:data:`PYTHON_REWARDS`),
    and keys this version of rlzoo does not know (a warning names them). None: no ``resume``, or no checkpoint
    found for ``latest`` / ``auto`` (the trainer then raises for ``latest`` and starts fresh for ``auto``).

    Args:
        rewards_given: the reward functions are given again (``--reward-funcs`` or a config file's
            ``reward_funcs``; the Python API's ``Trainer(reward_funcs=...)``); if not, a checkpoint of a run
            that had Python-callable rewards is refused.
        loss_given: the loss is given again (the Python API's ``Trainer(loss=...)``, or ``--algorithm``: a choice of
            preset); if not, a checkpoint of a run whose loss was given from Python (:data:`PYTHON_LOSS`) is refused,
            unless that loss is the one its ``algorithm`` and ``loss`` options build.

    Raises:
        ValueError: ``latest`` or ``auto`` without ``output_dir`` (names --output-dir); the checkpoint's run had
            reward functions given as Python callables and ``rewards_given`` is False (names them and
            ``--reward-funcs module:function``); its loss was given from Python and ``loss_given`` is False.
        FileNotFoundError: a path that is not a checkpoint.
    """
    if resume is None:
        return None
    if resume in ("latest", "auto") and output_dir is None:
        raise ValueError(f"--resume {resume} needs --output-dir (the directory of the run to continue)")
    checkpointer = Checkpointer(CheckpointConfig(), RunDirectory(output_dir or ".").checkpoints)
    try:
        path = find_checkpoint(checkpointer, resume)
    except FileNotFoundError:
        if resume == "latest":
            return None  # the trainer says so, after cleaning up what interrupted writes left (a checkpoint put back)
        raise
    if path is None:
        return None
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    saved = {k: v for k, v in Checkpointer.settings(path).items() if k != "world_size" and k not in _NOT_SETTINGS}
    callables = list(saved.pop(PYTHON_REWARDS, None) or [])
    python_loss = saved.pop(PYTHON_LOSS, None)
    if python_loss is not None and not loss_given and not _is_algorithms_loss(python_loss, saved):
        raise ValueError(
            f"checkpoint {path} was trained with a loss given from Python (Trainer(..., loss=...): "
            f"{loss_summary(python_loss)}), which its settings (algorithm {saved.get('algorithm')!r}) do not "
            "rebuild: resume from Python with Trainer(resume_config(RUN), loss=...) and the same loss")
    if callables and not rewards_given:
        spec = " ".join([*(saved.get("reward_funcs") or []), "module:function"])  # the flag lists all of them
        raise ValueError(
            f"checkpoint {path} was trained with the reward function(s) {', '.join(callables)} given as Python "
            f"callables (Trainer(..., reward_funcs=[...])), which a checkpoint cannot hold: give them again with "
            f"--reward-funcs {spec}, or resume from Python: Trainer(resume_config(RUN), reward_funcs=[...])")
    unknown = sorted(set(saved) - fields)
    if unknown:
        log.warning("resume: checkpoint %s has settings this version of rlzoo does not know, ignored: %s", path,
                    ", ".join(unknown))
    return {k: v for k, v in saved.items() if k in fields}


def _is_algorithms_loss(python_loss: Mapping[str, Any], saved: Mapping[str, Any]) -> bool:
    """Whether the loss given from Python is the one the run's ``algorithm`` and ``loss`` options build (then
    resuming by its settings trains the same loss)."""
    from rlzoo.losses import get_loss

    try:
        built = get_loss(saved.get("algorithm", "grpo"), **dict(saved.get("loss") or {}))
    except (KeyError, ValueError, TypeError):
        return False
    mine = dict(built.to_config(), max_completion_length=python_loss.get("max_completion_length"))
    return mine == dict(python_loss)


def loss_summary(config: Mapping[str, Any]) -> str:
    """A loss's ``to_config()`` in a few words for messages: its name, or its surrogate and aggregation."""
    if config.get("name"):
        return f"{config['name']!r}"
    parts = [f"{slot} {(config.get(slot) or {}).get('name')!r}" for slot in ("surrogate", "aggregation")]
    return "a composed loss: " + ", ".join(parts)


def resume_config(output_dir: str | os.PathLike[str], resume: str = "latest", **overrides: Any) -> TrainConfig:
    """The Python analogue of ``rlzoo train --output-dir OUTPUT_DIR --resume RESUME --FIELD VALUE ...``: the
    :class:`TrainConfig` of the checkpoint's settings (:func:`checkpoint_settings`) with ``overrides`` (field
    names) laid over them; under ``auto`` without a checkpoint, the defaults with ``overrides``.

    Example: ``Trainer(resume_config("runs/a", max_steps=200, learning_rate=1e-5)).train()``.

    Raises:
        FileNotFoundError: ``latest`` without a checkpoint under ``OUTPUT_DIR/checkpoints`` (names it), or a
            path that is not a checkpoint.
        ValueError: unknown field names or invalid values (:meth:`TrainConfig.from_dict`).
    """
    saved = checkpoint_settings(output_dir, resume, loss_given=True)  # the Trainer checks the loss it is given
    if saved is None and resume != "auto":
        hint = "resume='auto' resumes if there is one and else starts fresh"
        if inside := inside_a_run(Path(output_dir).resolve()):  # a checkpoint given as the run's directory
            lone = "training run" not in inside[0]
            ckpt = ", " + repr(str(inside[1] if lone else output_dir)) if lone or step_of(Path(output_dir)) is not None else ""
            hint = f"{output_dir} {inside[0]}: e.g. resume_config({'NEW_RUN_DIR' if lone else repr(str(inside[1]))}{ckpt})"
        raise FileNotFoundError(f"no checkpoint under {RunDirectory(output_dir).checkpoints} to resume from; {hint}")
    if saved is not None:  # another algorithm (estimator) drops the checkpoint's loss (advantage) options
        saved = settings_for_algorithm(saved, overrides.get("algorithm"), overrides.get("advantage"), source=resume)
    return TrainConfig.from_dict({**(saved or {}), "output_dir": str(output_dir), "resume": resume, **overrides})


def check_run_length(max_steps: int, step: int, checkpoint: str | os.PathLike[str], *, auto: bool = False,
                     row_missing: bool = False) -> None:
    """Refuse a resume that would not train: ``max_steps`` at or below the checkpoint's ``step``. Under
    ``--resume auto`` a run already at ``max_steps`` is complete rather than wrong (a job requeued after its last
    checkpoint): one log line, and the trainer then trains nothing and records no new segment. So is a run at
    ``max_steps`` whose last step has no metrics row (``row_missing``: killed during its final evaluation, after
    its checkpoint): the trainer evaluates that step and writes the row, then ends.

    Raises:
        ValueError: ``max_steps < step``, or ``max_steps == step`` unless ``auto`` or ``row_missing`` (names
            --max-steps).
    """
    if max_steps == step and row_missing:
        log.info("resume: step %d of checkpoint %s has no metrics row (the run stopped during its final "
                 "evaluation): evaluating it and writing the row", step, checkpoint)
    elif max_steps == step and auto:
        log.info("resume: the run is already complete at step %d (--max-steps %d, checkpoint %s); nothing to train",
                 step, max_steps, checkpoint)
    elif max_steps <= step:
        raise ValueError(f"nothing to train: checkpoint {checkpoint} is at step {step} and max_steps is {max_steps}; "
                         f"continue the run with --max-steps N for an N > {step}")


class _NotSet:
    """An option a mapping does not hold (shown as ``(not set)``: the loss's or task's default applies)."""

    def __repr__(self) -> str:
        return "(not set)"


_NOT_SET = _NotSet()


def _changed_options(name: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """What changed in field ``name``: ``[(name, old, new)]``, or for two mappings one ``("name.option", old,
    new)`` per option that differs (a missing option is :data:`_NOT_SET`), in the order of the new mapping."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return [(name, old, new)]
    options = list(dict.fromkeys([*new, *old]))
    return [(f"{name}.{k}", old.get(k, _NOT_SET), new.get(k, _NOT_SET)) for k in options
            if k not in old or k not in new or _normal(old[k]) != _normal(new[k])]


def _normal(value: Any) -> Any:
    """Lists and tuples compare alike (JSON has no tuples); mappings by content."""
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items()}
    return value
