"""``rlzoo eval``: greedy held-out accuracy of a model or of a run's checkpoint, with only evaluation options.

``rlzoo eval --run RUN`` evaluates the run's newest checkpoint (or ``--checkpoint``) on the task, prompts (system
prompt), answer extraction and held-out set it was trained with, read from ``RUN/config.json``; any option given
overrides the run's (a run trained on a data set given from Python needs ``--task``; a ``--task`` other than the
run's leaves out the run's task options, which are that task's). ``rlzoo eval --model M
--task T`` evaluates any model (not a run directory: that is ``--run``). The result is one JSON object
(:func:`eval_result`), printed and, with ``--output FILE``, written to a file. ``--config FILE`` gives the file's
evaluation settings (:func:`eval_args_from_file`), under the flags; with ``--run`` the file's model and task
(the run's own) give way to the run's checkpoint and held-out set (:func:`with_run`).
"""

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Literal

from rlzoo.trainer.config import OptionalDottedOptions, TrainConfig
from rlzoo.trainer.config_files import load_config_file
from rlzoo.trainer.run_config import absolute_paths, settings_for_task
from rlzoo.trainer.tasks import check_loadable_task, list_reasoning_gym_tasks

__all__ = ["EvalArgs", "eval_args_from_file", "eval_config", "eval_result", "with_run"]

log = logging.getLogger("rlzoo.train")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalArgs:
    """Evaluate a model's greedy accuracy on a task's held-out set (unset options: the run's, else rlzoo train's
    defaults)."""

    run: str | None = None
    """A run directory: evaluate its newest checkpoint with the run's task, prompts and answer extraction."""
    checkpoint: str | None = None
    """A checkpoint of --run to evaluate: its path, or its name (step-000020); default: the run's newest."""
    model: str | None = None
    """A model, as rlzoo train's --model (instead of --run; with --run: this model on the run's task and held-out
    set)."""
    task: str | None = None
    """The task, as rlzoo train's --task."""
    task_kwargs: OptionalDottedOptions = None
    """The task's options, e.g. --task.max_terms 3."""
    answer_extraction: str | None = None
    """How a completion becomes an answer: last_number, first_number, full, first_line, tag."""
    system_prompt: str | None = None
    """System message for the chat template."""
    eval_size: int | None = None
    """Held-out problems to evaluate."""
    eval_seed: int | None = None
    """Seed of the held-out set."""
    eval_batch_size: int | None = None
    """Prompts per greedy batch."""
    reward_funcs: tuple[str, ...] | None = None
    """Reward functions that also score the greedy completions (the result's reward), as rlzoo train's
    --reward-funcs (default: the run's, else accuracy; none: accuracy only); a task without reference answers is
    scored only by them."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward function (default: the run's with its reward functions, else all 1)."""
    max_completion_length: int | None = None
    """Maximum completion tokens."""
    max_prompt_length: int | None = None
    """Truncate prompts (from the left) to this many tokens."""
    device: str | None = None
    """'auto', 'cpu', 'cuda', ..."""
    dtype: Literal["auto", "float32", "bf16-mixed", "bfloat16", "float16"] | None = None
    """Precision."""
    num_threads: int | None = None
    """CPU threads for torch."""
    output: str | None = None
    """Also write the JSON result to this file."""


def eval_args_from_file(settings: dict[str, Any], source: str, *, python_rewards: bool = False) -> EvalArgs:
    """The :class:`EvalArgs` defaults a ``--config`` file gives ``rlzoo eval``: its evaluation settings (the fields of
    :class:`EvalArgs`, e.g. ``model``, ``task``, ``eval_size``); its training settings (``learning_rate``,
    ``max_steps``, ...) are checked as ``rlzoo train`` checks them and not used, so a run's config file evaluates
    with its model, task and prompts.

    Args:
        python_rewards: the file is a run's ``config.json`` whose rewards included Python callables
            (``resolved_python_reward_funcs``): the weights after the named functions' were theirs and are left
            out (a warning says so), as ``--run`` does.

    Raises:
        ValueError: a key neither command takes, or a value ``rlzoo train`` refuses (prefixed with ``source``); an
            evaluation-only key (``run``, ``checkpoint``, ``output``) that is not a string.
    """
    fields = {f.name for f in dataclasses.fields(EvalArgs)}
    settings = dict(settings)
    names, weights = settings.get("reward_funcs"), settings.get("reward_weights")
    if python_rewards and isinstance(names, list) and isinstance(weights, list) and len(weights) > len(names):
        # a run's config.json whose rewards included Python callables (their weights come last): as --run does
        settings["reward_weights"] = weights[:len(names)] or None
        log.warning("%s: reward_weights has %d entries for the %d reward_funcs %s: the others weighted Python "
                    "callables of the run, which rlzoo eval cannot load, and are left out", source, len(weights),
                    len(names), names)
    own = {key for key in fields if not hasattr(TrainConfig, key) and key in settings}
    for key in sorted(own):
        if settings[key] is not None and not isinstance(settings[key], str):
            raise ValueError(f"{source}: {key} must be a path (a string), got {settings[key]!r}")
    try:
        checked = TrainConfig.from_dict({key: value for key, value in settings.items() if key not in own})
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    values = {key: getattr(checked, key) for key in settings if key in fields and key not in own}
    return EvalArgs(**values, **{key: settings[key] for key in own})


def with_run(args: EvalArgs, from_file: EvalArgs, flags: set[str], source: str) -> EvalArgs:
    """``args`` with ``--run``: the file's ``model`` is not what is evaluated (the run's checkpoint is; ``--model``
    given as a flag still is), and its ``task``, when it is the run's, is the run's own (its held-out set, not an
    override): both are left out, an INFO line saying so for the model.

    Raises:
        FileNotFoundError: a ``--run`` without ``config.json`` (names it).
    """
    run = Path(str(args.run))
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"--run {run}: not an rlzoo run directory (no config.json)")
    recorded = load_config_file(run / "config.json")
    changes: dict[str, Any] = {}
    if from_file.model is not None and "--model" not in flags:
        changes["model"] = None
        log.info("%s: model %s is not evaluated: --run %s evaluates its checkpoint (--model MODEL evaluates another)",
                 source, from_file.model, run)
    if from_file.task is not None and "--task" not in flags and (  # a data file: relative in a train config
            absolute_paths({"task": from_file.task})["task"] == absolute_paths({"task": recorded.get("task")})["task"]):
        changes["task"] = None
    return dataclasses.replace(args, **changes)


def eval_config(args: EvalArgs) -> tuple[TrainConfig, str | None]:
    """The :class:`TrainConfig` to evaluate with (the run's settings, then ``args``), and the checkpoint evaluated.

    Raises:
        ValueError: neither ``--run`` nor ``--model``, ``--checkpoint`` without ``--run`` or with ``--model``, or
            a ``--checkpoint`` outside ``--run``; a ``--model`` that is
            a run directory (names ``--run``; a checkpoint directory stands for its ``model/``); a run that trained
            on a data set given from Python, without ``--task``; a run trained without a held-out set
            (``eval_size`` 0), without ``--eval-size`` (names it); ``--reward-weights`` not one per reward function.
        FileNotFoundError: a run without ``config.json`` or checkpoints, or a ``--checkpoint`` that is not one
            (names it, in ``rlzoo eval``'s flags).
    """
    if args.run is None and args.model is None:
        raise ValueError("rlzoo eval needs --run RUN (a training run) or --model MODEL")
    if args.checkpoint is not None and args.run is None:
        raise ValueError("--checkpoint evaluates a checkpoint of --run RUN (to evaluate a checkpoint on its own, "
                         "give it as --model)")
    if args.checkpoint is not None and args.model is not None:
        raise ValueError("--checkpoint and --model both name the model to evaluate; give one of them")
    settings: dict[str, Any] = {}
    checkpoint: str | None = None
    if args.model is not None:
        _check_is_model(Path(args.model))
        if _is_checkpoint(Path(args.model)):  # its model/ is evaluated (as train and export read it)
            checkpoint = args.model
    if args.run is not None:
        run = Path(args.run)
        if not (run / "config.json").is_file():
            raise FileNotFoundError(f"--run {run}: not an rlzoo run directory (no config.json)")
        settings = settings_for_task(load_config_file(run / "config.json"), args.task, source=f"--run {run}")
        if args.task is None:
            try:
                check_loadable_task(str(settings.get("task", "")))
            except ValueError as err:
                raise ValueError(f"--run {run}: {err}") from None
        if args.eval_size is None:
            _check_held_out_set(run, settings, own_task=args.task is None)
        if args.task is None:
            _warn_beyond_held_out(run, settings, args)
        if args.model is None:  # (else --model is evaluated, on the run's task and held-out set)
            path = _run_checkpoint(run, args.checkpoint)
            checkpoint = str(path)
            settings["model"] = str(path / "model")
        settings.pop("peft", None)  # the checkpoint's model/ holds the adapter and names its base
        if args.reward_funcs is None:
            _named_rewards_only(run, settings, json.loads((run / "config.json").read_text()))
    if args.reward_funcs is not None and args.reward_weights is None:
        settings.pop("reward_weights", None)  # the run's weights are its own reward functions'
    if args.reward_funcs is not None and [f.lower() for f in args.reward_funcs] == ["none"]:
        args = dataclasses.replace(args, reward_funcs=())  # accuracy only
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
                 if f.name not in ("run", "checkpoint", "output") and getattr(args, f.name) is not None}
    weights, funcs = overrides.get("reward_weights"), overrides.get("reward_funcs", settings.get("reward_funcs"))
    funcs = TrainConfig.reward_funcs if funcs is None else funcs
    if weights is not None and isinstance(funcs, list | tuple) and len(weights) != len(funcs):  # (none Python's here)
        whose = "" if "reward_funcs" in overrides else f" ({'the run' if args.run else 'the default'}'s; " \
                                                       "--reward-funcs gives others)"
        raise ValueError(f"--reward-weights gives {len(weights)} weight(s) for {len(funcs)} reward function(s) "
                         f"{list(funcs)}{whose}: give one weight per reward function")
    if isinstance(settings.get("task_kwargs"), dict) and "task_kwargs" in overrides:  # --task.X: option by option,
        overrides["task_kwargs"] = {**settings["task_kwargs"], **overrides["task_kwargs"]}  # as train --config
    return TrainConfig.from_dict({**settings, **overrides}), checkpoint


def _run_checkpoint(run: Path, checkpoint: str | None) -> Path:
    """The checkpoint of ``--run`` to evaluate: ``--checkpoint`` (a path, or the name of one of the run's:
    ``step-000020``), else the run's newest.

    Raises:
        FileNotFoundError: the run has no checkpoint (trained with ``--max-steps 0``, or stopped before its first
            one), or ``--checkpoint`` is not a checkpoint; says what ``rlzoo eval`` takes instead.
        ValueError: ``--checkpoint`` is another run's checkpoint (outside ``run``).
    """
    from rlzoo.trainer.checkpoint import Checkpointer
    from rlzoo.trainer.config import CheckpointConfig

    found = Checkpointer(CheckpointConfig(), run / "checkpoints").all()
    if checkpoint is None:
        if not found:
            where = "holds no complete checkpoint" if (run / "checkpoints").is_dir() else "does not exist"
            raise FileNotFoundError(f"rlzoo eval --run {run}: the run has no checkpoint ({run / 'checkpoints'} {where}): "
                                    "train it first, or evaluate a model with --model MODEL")
        return found[-1]
    path = Path(checkpoint)
    if not path.exists() and _is_checkpoint(run / "checkpoints" / checkpoint):  # a name the listing below shows
        path = run / "checkpoints" / checkpoint
    if path.name == "model" and _is_checkpoint(path.parent):  # the checkpoint's model/: the checkpoint
        path = path.parent
    if _is_checkpoint(path) and run.resolve() not in path.resolve().parents:
        raise ValueError(f"rlzoo eval --checkpoint {checkpoint}: not a checkpoint of --run {run} (it would be evaluated "
                         f"with that run's task and held-out set); give its own run as --run, or evaluate it on its "
                         f"own with --model {checkpoint}")
    if not _is_checkpoint(path):
        there = (f"; {run / 'checkpoints'} holds {', '.join(p.name for p in found)}" if found
                 else f"; --run {run} has no checkpoint")
        what = "not an rlzoo checkpoint (no trainer_state.json and model/)" if path.exists() else "no such checkpoint"
        raise FileNotFoundError(f"rlzoo eval --checkpoint {checkpoint}: {what}{there}")
    return path


def _check_held_out_set(run: Path, settings: dict[str, Any], *, own_task: bool) -> None:
    """Refuse to evaluate with a run's ``eval_size`` below 1 (trained without a held-out set), saying where the
    value came from and what to give.

    Args:
        own_task: the run's own task is evaluated (no ``--task``): of a data set without an ``eval_split``, the
            message says that the rows ``--eval-size`` draws were trained on.

    Raises:
        ValueError: names the run, its ``eval_size`` and ``--eval-size N``.
    """
    size = settings.get("eval_size")
    if not isinstance(size, int) or size >= 1:
        return
    task, options = settings.get("task"), settings.get("task_kwargs")
    split = isinstance(options, dict) and options.get("eval_split")
    seen = (f" (of {task!r}, a data set the run trained on in full, those are rows it trained on)"
            if own_task and task not in list_reasoning_gym_tasks() and not split else "")
    raise ValueError(f"--run {run} was trained with eval_size {size} (its config.json): it has no held-out set to "
                     f"evaluate; pass --eval-size N to evaluate N problems{seen}")


def _warn_beyond_held_out(run: Path, settings: dict[str, Any], args: EvalArgs) -> None:
    """Warn when ``--eval-size`` (for a run without a held-out set) or ``--eval-seed`` (another) draws rows of a
    run's own data set that it trained on: its held-out rows were cut from the data by those two (no
    ``eval_split``)."""
    task, options = settings.get("task"), settings.get("task_kwargs")
    if task in list_reasoning_gym_tasks() or (isinstance(options, dict) and options.get("eval_split")):
        return
    size, seed = settings.get("eval_size", TrainConfig.eval_size), settings.get("eval_seed", TrainConfig.eval_seed)
    changed = []  # (a larger --eval-size than a run's with a held-out set may draw only held-out rows: its own
    if size == 0 and args.eval_size:  # split may have been capped at MAX_EVAL_FRACTION; not said, not known here)
        changed.append(f"--eval-size {args.eval_size} (the run's: {size})")
    if args.eval_seed not in (None, seed):
        changed.append(f"--eval-seed {args.eval_seed} (the run's: {seed})")
    if changed:
        log.warning("%s on --run %s: the rows drawn from %r include rows the run trained on (its held-out rows, if "
                    "any, were cut by eval_size and eval_seed): the accuracy is not a held-out one", " and ".join(changed),
                    run, task)


def _named_rewards_only(run: Path, settings: dict[str, Any], recorded: dict[str, Any]) -> None:
    """Leave out of ``settings`` the weights of a run's reward functions given as Python callables (``recorded``,
    the run's whole config.json, names them), which cannot be loaded by name: the held-out reward is then of its
    named functions only (a warning says so)."""
    python = recorded.get("resolved_python_reward_funcs") or []
    if not python:
        return
    names = list(settings.get("reward_funcs") or [])
    weights = settings.get("reward_weights")
    if isinstance(weights, list):
        settings["reward_weights"] = weights[:len(names)] or None
    log.warning("--run %s: its reward functions %s were Python callables, which rlzoo eval cannot load: the reward "
                "is %s (pass --reward-funcs to score with others)", run, python,
                f"of {names} only" if names else "not scored")


def _trained_eval_size(run: Path) -> int:
    """The ``eval_size`` run ``run`` was trained with (its config.json; the default when it holds none)."""
    size = load_config_file(run / "config.json").get("eval_size", TrainConfig.eval_size)
    return size if isinstance(size, int) else TrainConfig.eval_size


def _check_is_model(path: Path) -> None:
    """Refuse a run directory given as ``--model`` (its ``config.json`` is rlzoo's, not a model's); a checkpoint
    (``RUN/checkpoints/step-N``) stands for its ``model/``, as for ``rlzoo train --model``.

    Raises:
        ValueError: names ``--run`` to evaluate the run's newest checkpoint with the run's task.
    """
    if (path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file():
        raise ValueError(f"--model {path} is an rlzoo run directory, not a model: evaluate its newest checkpoint with "
                         f"--run {path} (or one checkpoint with --run {path} --checkpoint CHECKPOINT)")


def _is_checkpoint(path: Path) -> bool:
    return (path / "trainer_state.json").is_file() and (path / "model").is_dir()


def eval_result(args: EvalArgs) -> dict[str, Any]:
    """Evaluate and return the JSON-able result: ``model``, ``checkpoint``, ``task``, ``answer_extraction``,
    ``accuracy``, ``ci_low``, ``ci_high`` (95 % Wilson; all three null for a task without reference answers),
    ``n``, ``reward`` (the mean combined reward of the greedy completions, TRL's ``eval_reward``; null when no reward
    function scored them), ``reward_metrics`` (``rewards/NAME/mean`` per function and what the functions logged:
    :attr:`~rlzoo.trainer.evaluation.EvalResult.rewards` without the ``eval/`` prefix; a mean over nothing scored
    is null) and a few ``samples``; written to ``args.output`` (atomically) when given.

    Raises:
        ValueError: ``--output`` is a directory, a training run's own file (its ``config.json``, ...) or an existing
            file that is not an earlier result of ``rlzoo eval``.
        the errors of :func:`eval_config` and :func:`rlzoo.trainer.evaluation.evaluate`.
    """
    from rlzoo.trainer.evaluation import evaluate
    from rlzoo.trainer.io import atomic_write_text

    if args.output:
        _check_output(Path(args.output))  # before the evaluation, which takes minutes
    config, checkpoint = eval_config(args)
    # nothing trains: a data set's held-out set is not capped to keep training rows, but for a run's own task,
    # whose held-out set is the one it was trained with (if it had one: one trained with eval_size 0 is evaluated on
    # the --eval-size rows asked for, uncapped)
    own_held_out = args.run is not None and args.task is None and _trained_eval_size(Path(args.run)) >= 1
    step = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("step", 0) if checkpoint else 0
    result = evaluate(config, evaluation_only=not own_held_out, global_step=int(step),
                      inherited_rewards=args.run is not None and args.reward_funcs is None)
    answers = result.accuracy is not None
    rewards = {key.removeprefix("eval/"): _json_number(v) for key, v in result.rewards.items()}
    out = {"model": config.model, "checkpoint": checkpoint, "task": config.task,
           "task_kwargs": config.resolved_task_kwargs, "answer_extraction": config.answer_extraction,
           "eval_size": result.n, "accuracy": _json_number(result.accuracy),
           "ci_low": result.ci_low if answers else None, "ci_high": result.ci_high if answers else None,
           "n": result.n, "reward": rewards.pop("reward", None), "reward_metrics": rewards,
           "samples": [{"question": q, "completion": c, "score": _json_number(s), "answer": a if answers else None}
                       for q, c, s, a in result.samples]}
    if args.output:
        atomic_write_text(args.output, json.dumps(out, indent=2, allow_nan=False) + "\n")
    return out


def _check_output(output: Path) -> None:
    """Refuse an ``--output`` that is a directory, lies among a training run's own files (its ``config.json``: the run
    could no longer be resumed or evaluated by name; its checkpoints), is an existing file other than an earlier
    result (a task's data, a model's weights) or cannot be written, naming the flag: before the evaluation, which
    takes minutes."""
    from rlzoo.trainer.io import check_writable, is_stream
    from rlzoo.trainer.run_dir import inside_a_run

    if output.is_dir():
        raise ValueError(f"--output {str(output)!r} is a directory; name a file (e.g. {str(output / 'eval.json')!r})")
    if is_stream(output):  # /dev/null, /dev/stdout, a FIFO: written in place (its directory need not be writable)
        if not os.access(output, os.W_OK):
            raise PermissionError(f"--output {str(output)!r} is not writable")
        return
    target = output.parent.resolve() / output.name  # a link named as the output is replaced, not written through
    inside = inside_a_run(target)
    if inside is not None:
        where, owner = inside
        raise ValueError(f"--output {str(output)!r} {where}; write the result beside them, e.g. "
                         f"{str(owner.parent / 'eval.json' if (owner / 'model').is_dir() else owner / 'eval.json')!r}")
    # a task's data, a model's weights, notes (a link is replaced, not written through: what it names is kept)
    if output.is_file() and not output.is_symlink() and output.stat().st_size and not _is_eval_result(output):
        raise ValueError(f"--output {str(output)!r} exists and is not a result of rlzoo eval, which would replace it; "
                         "name a new file (an earlier result is replaced)")
    try:
        check_writable(output.parent, "its directory")
    except OSError as err:
        raise OSError(err.errno, f"--output {str(output)!r}: {err.strerror}", err.filename) from None


def _is_eval_result(path: Path) -> bool:
    """Whether ``path`` holds what :func:`evaluate` writes (a small JSON object naming the model, its eval size and
    accuracy), which a new ``--output`` may replace."""
    if path.stat().st_size > 1 << 20:
        return False
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return False
    return isinstance(result, dict) and {"model", "eval_size", "accuracy"} <= result.keys()


def _json_number(value: float | None) -> float | None:
    """``value``, or None for NaN (a mean over nothing) and +-inf (a metric a function logged): JSON has neither."""
    return None if value is None or not math.isfinite(value) else value
