"""The config sections of the run around training: evaluation, checkpoints, the run itself, a PEFT adapter and
live tracking (joined into :class:`~rlzoo.trainer.config.TrainConfig`, importable from there)."""

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlzoo.trainer.section import OptionalDottedOptions, Section

__all__ = ["REPORT_TO", "AdapterConfig", "CheckpointConfig", "EvalConfig", "RunConfig", "TrackingConfig",
           "absolute_paths", "named_checkpoint", "resolved_settings", "settings_for_task"]

log = logging.getLogger("rlzoo.train")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig(Section):
    """When and how the held-out set is evaluated."""

    eval_steps: int = 10
    """Evaluate every N optimizer steps, besides before and after training (0: only those two)."""
    eval_batch_size: int = 200
    """Prompts per greedy evaluation batch."""

    def checks(self) -> list[tuple[str, bool, str]]:
        return [("eval_steps", self.eval_steps >= 0, ">= 0"), ("eval_batch_size", self.eval_batch_size >= 1, ">= 1"),
                *super().checks()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Section):
    """When checkpoints are written, how many are kept, and where a run resumes from."""

    save_steps: int = 10
    """Checkpoint every N optimizer steps (and at the end); 0: only at the end."""
    save_total_limit: int = 2
    """Keep this many most recent checkpoints."""
    resume: str | None = None
    """Resume: 'latest' (the output dir's newest checkpoint), 'auto' (latest if there is one, else start fresh), a
    checkpoint directory, or the name of one of the output dir's checkpoints (step-000020 or step-20). On the command
    line the checkpoint's settings are the defaults that flags override."""

    def __post_init__(self) -> None:
        # a bare name that is no path here: the output dir's checkpoint of that name, as a path (what is recorded)
        object.__setattr__(self, "resume", named_checkpoint(self.resume, getattr(self, "output_dir", None)))
        super().__post_init__()

    def checks(self) -> list[tuple[str, bool, str]]:
        resume_ok = self.resume is None or self.resume in ("latest", "auto") or Path(self.resume).is_dir()
        return [
            ("save_steps", self.save_steps >= 0, ">= 0"),
            ("save_total_limit", self.save_total_limit >= 1, ">= 1"),
            ("resume", resume_ok, ("'latest', 'auto', an existing checkpoint directory or the name of one of "
                                   "output_dir's checkpoints")),
            *super().checks(),
        ]


def named_checkpoint(resume: str | None, output_dir: str | os.PathLike[str] | None) -> str | None:
    """``resume`` as a path: a bare name that is no path here (``step-000020``, or ``step-20``) names the checkpoint
    of that name or step under ``output_dir/checkpoints`` when there is one, as ``rlzoo eval --checkpoint`` takes
    names; a checkpoint's ``model/`` names the checkpoint (as ``rlzoo eval`` and ``rlzoo export`` take it); anything
    else is returned unchanged (``latest``, ``auto``, a path, a name with no such checkpoint: ``rlzoo train`` then
    fails naming the run's checkpoints, ``TrainConfig`` with "resume must be ...")."""
    if isinstance(resume, str) and Path(resume).name == "model" and (Path(resume).parent / "trainer_state.json").is_file():
        return str(Path(resume).parent)  # a checkpoint's model/ (as rlzoo eval and export take it): the checkpoint
    if (not isinstance(resume, str) or resume in ("latest", "auto") or not isinstance(output_dir, str | os.PathLike)
            or Path(resume).name != resume or Path(resume).exists()):
        return resume
    directory = Path(output_dir) / "checkpoints"
    step = re.fullmatch(r"step-(\d+)", resume)
    for candidate in (directory / resume, *([directory / f"step-{int(step.group(1)):06d}"] if step else [])):
        if (candidate / "trainer_state.json").is_file():
            return str(candidate)
    return resume


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(Section):
    """The run as a whole: its length, seed, directory and console output."""

    max_steps: int = 20
    """Optimizer steps."""
    seed: int = 0
    """Seed of model sampling and shuffling."""
    output_dir: str | None = None
    """Run directory (None: runs/ALGORITHM-TASK-TIMESTAMP-PID)."""
    overwrite: bool = False
    """Start a fresh run in an output dir that already holds one, deleting it (without it, such a start is refused)."""
    progress: bool = True
    """Show a live progress bar (on a terminal; never into a log file or pipe, e.g. a Slurm log)."""

    def checks(self) -> list[tuple[str, bool, str]]:
        return [("max_steps", self.max_steps >= 0, ">= 0"), *super().checks()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterConfig(Section):
    """A PEFT adapter (LoRA) trained instead of the whole model."""

    peft: OptionalDottedOptions = None
    """LoRA: fields of peft.LoraConfig as dotted options, e.g. --peft.r 16 --peft.lora_alpha 32
    --peft.target_modules all-linear (None: train the whole model)."""


REPORT_TO = ("tensorboard", "trackio", "wandb")
"""Trackers ``report_to`` accepts (besides ``none`` and ``all``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrackingConfig(Section):
    """Live logging: trackers and the completions table."""

    report_to: str = "none"
    """Trackers, comma-separated: tensorboard, trackio, wandb, all or none."""
    run_name: str | None = None
    """The run's name in the trackers (None: the output directory with its parent, e.g. exp1/seed0)."""
    project: str | None = None
    """The trackio / wandb project (TRL's project; None: $WANDB_PROJECT for wandb, as transformers, else rlzoo)."""
    log_completions: bool = False
    """Write each generation batch's prompts, completions, rewards and advantages (run dir and trackers)."""

    def checks(self) -> list[tuple[str, bool, str]]:
        names = [n.strip() for n in self.report_to.split(",") if n.strip()]
        ok = bool(names) and all(n in (*REPORT_TO, "none", "all") for n in names)
        return [("report_to", ok, f"a comma-separated list of {', '.join(REPORT_TO)}, all or none"),
                ("project", self.project is None or bool(self.project.strip()), "a non-empty name or None"),
                *super().checks()]

    def project_of(self, tracker: str) -> str:
        """The project ``tracker`` logs to: :attr:`project`, else ``$WANDB_PROJECT`` for wandb, else ``rlzoo``."""
        fallback = os.environ.get("WANDB_PROJECT") if tracker == "wandb" else None
        return self.project or fallback or "rlzoo"

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers to report to (``all``: every one of :data:`REPORT_TO`; ``none``: none)."""
        names = [n.strip() for n in self.report_to.split(",") if n.strip()]
        if "all" in names:
            return REPORT_TO
        return tuple(dict.fromkeys(n for n in names if n != "none"))


def absolute_paths(settings: Any) -> dict[str, Any]:
    """``settings`` (a ``TrainConfig``, its ``to_dict()`` or a dict of its fields) as a dict with its local paths
    made absolute, so that the ``config.json``
    that records them works from any directory (``rlzoo eval --run /abs/RUN``, ``--config RUN/config.json``).

    Made absolute: ``model`` and ``teacher`` (an existing directory or ``.gguf`` file; not a built-in name),
    ``task`` (an existing data file or directory; not a reasoning-gym name), and in ``reward_funcs`` the file of
    ``file.py:function``, a reward model directory and a module of the working directory (as its file:
    :func:`~rlzoo.trainer.reward_loading.recorded_module_reward`). Everything else, hub ids, registered names,
    installed modules and paths that do not exist (left for the loaders to report), is kept as given; so is a
    path that is absolute already.
    """
    out = dict(settings.to_dict() if callable(getattr(settings, "to_dict", None)) else settings)
    for key in ("model", "teacher"):
        value = out.get(key)
        local = isinstance(value, str) and (Path(value).is_dir() or value.lower().endswith(".gguf") and Path(value).is_file())
        if local:
            from rlzoo.trainer.models import list_builtin_models

            if value not in list_builtin_models():
                out[key] = os.path.abspath(value)
    task = out.get("task")
    if isinstance(task, str) and Path(task).exists():
        from rlzoo.trainer.tasks import list_reasoning_gym_tasks

        if task not in list_reasoning_gym_tasks():
            out["task"] = os.path.abspath(task)
    if isinstance(out.get("reward_funcs"), (list, tuple)):
        out["reward_funcs"] = [_absolute_reward(spec) for spec in out["reward_funcs"]]
    return out


def _absolute_reward(spec: Any) -> Any:
    """A reward spec with its local file (``file.py:function``), reward model directory or module of the working
    directory made absolute."""
    from rlzoo.trainer.reward_functions import BUILTIN_REWARDS
    from rlzoo.trainer.reward_loading import TRL_REWARD_NAMES, recorded_module_reward

    if not isinstance(spec, str) or spec in BUILTIN_REWARDS or spec in TRL_REWARD_NAMES:
        return spec
    module, sep, function = spec.rpartition(":")
    if sep and module.endswith(".py") and Path(module).is_file():
        return f"{os.path.abspath(module)}:{function}"
    if not sep and Path(spec).is_dir():
        return os.path.abspath(spec)
    return recorded_module_reward(spec)


def settings_for_task(settings: Mapping[str, Any], task: str | None, *, source: str) -> dict[str, Any]:
    """``settings`` (a config file's or a run's ``config.json``) to be used with ``task``, a ``--task`` given anew:
    when it names another task than ``settings["task"]``, the settings' ``task_kwargs`` are dropped, with an INFO
    line naming them and ``source``: they are the other task's options (chain_sum's ``max_terms`` is no option of
    a data set). ``--task.NAME`` flags, laid over the result, still apply. Kept: the settings of the same task (a
    path compared as :func:`absolute_paths` records it), and those that name no task. Never raises.
    """
    old, options = settings.get("task"), settings.get("task_kwargs")
    if not (isinstance(task, str) and isinstance(old, str) and options):
        return dict(settings)
    if absolute_paths({"task": task})["task"] == absolute_paths({"task": old})["task"]:
        return dict(settings)
    log.info("%s: task options %s dropped: they are those of its task %r, not of --task %s (--task.NAME VALUE "
             "sets that task's)", source, dict(options) if isinstance(options, Mapping) else options, old, task)
    return {k: v for k, v in settings.items() if k != "task_kwargs"}


def settings_for_algorithm(settings: Mapping[str, Any], algorithm: str | None, advantage: str | None, *,
                           source: str) -> dict[str, Any]:
    """``settings`` (a config file's, a run's ``config.json`` or a checkpoint's) to be used with ``algorithm`` and
    ``advantage`` given anew, as :func:`settings_for_task` for tasks: another preset than ``settings["algorithm"]``
    drops the settings' ``loss`` options (``--loss.epsilon_high`` of dapo is no option of dro), and another advantage
    estimator than the settings' (theirs: ``advantage``, else their preset's recommended one; the new one: the given,
    else the settings', else the new preset's) drops their ``advantage_options``, each with an INFO line naming them
    and ``source``. Names compare as the registries spell them (``DR-GRPO`` is ``dr_grpo``). Settings that name no
    algorithm (a shared config file) keep their loss options, and their advantage options unless they name the
    estimator; an unknown name drops nothing (its error comes later). Never raises."""
    from rlzoo.advantages import advantage_estimators
    from rlzoo.losses import presets

    def canonical(registry: Any, name: Any) -> str | None:  # None: not a registered name
        try:
            spelt = registry.canonical(name) if isinstance(name, str) else None
        except ValueError:
            return None
        return spelt if spelt in registry.names() else None

    def recommended(name: Any) -> str | None:
        preset = canonical(presets, name)
        return presets.get(preset).advantage if preset else None

    out = dict(settings)
    old_algorithm = canonical(presets, settings.get("algorithm"))
    new_algorithm = canonical(presets, algorithm)
    if out.get("loss") and old_algorithm and new_algorithm and new_algorithm != old_algorithm:
        log.info("%s: loss options %s dropped: they are those of its algorithm %r, not of --algorithm %s "
                 "(--loss.NAME VALUE sets that one's)", source, dict(out.pop("loss")), old_algorithm, algorithm)
    old_advantage = canonical(advantage_estimators, settings.get("advantage")) or recommended(old_algorithm)
    new_advantage = (canonical(advantage_estimators, advantage) or canonical(advantage_estimators,
                     settings.get("advantage")) or recommended(new_algorithm or old_algorithm))
    if out.get("advantage_options") and old_advantage and new_advantage and new_advantage != old_advantage:
        log.info("%s: advantage options %s dropped: they are those of its advantage estimator %r, not of %r "
                 "(--advantage.NAME VALUE sets that one's)", source, dict(out.pop("advantage_options")),
                 old_advantage, new_advantage)
    return out


def resolved_settings(config: Any, loss: Any, *, advantage: str, precision: Any, policy: Any, dist: Any,
                      python_loss: bool, python_rewards: Any, output_dir: Path) -> dict[str, Any]:
    """What a run resolved from its settings, recorded in ``config.json`` beside them (``resolved_*``): the loss as
    built (:meth:`~rlzoo.losses.PolicyLoss.to_config`) and the advantage estimator's name, whether the loss and which
    reward functions came from Python, the task's options, ``steps_per_generation``, the device and dtypes
    (:class:`~rlzoo.trainer.precision.Precision`), the world size and parallelism (``fsdp``, ``ddp``, or None for one
    process) and the run directory."""
    return {"resolved_loss": loss.to_config(), "resolved_advantage": advantage,
            "resolved_python_loss": python_loss, "resolved_python_reward_funcs": python_rewards,
            "resolved_task_kwargs": config.resolved_task_kwargs,
            "resolved_steps_per_generation": config.effective_steps_per_generation,
            "resolved_device": str(precision.device),
            "resolved_dtype": str(precision.param_dtype).removeprefix("torch."),
            "resolved_autocast_dtype": (str(precision.autocast_dtype).removeprefix("torch.")
                                        if precision.autocast_dtype else None),
            "resolved_world_size": dist.world_size,
            "resolved_parallelism": "fsdp" if policy.sharded else "ddp" if dist.enabled else None,
            "output_dir": str(output_dir)}
