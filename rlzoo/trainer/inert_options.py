"""Options that act only under a switch: ``--kl-coef`` weighs the KL in the reward only with ``--use-kl-in-reward``,
``--max-sampling-rounds`` caps DAPO's dynamic sampling only with ``--dynamic-sampling``. One table,
:data:`DEPENDENT_OPTIONS`, says which; :func:`warn_inert_options` logs one warning line per such option set away
from its default while its switch is off, and the run goes on (as ``--parallelism fsdp`` without torchrun). So for a
``--loss.NAME`` option of a loss part that is off (``--loss.rollout_rs_threshold`` without ``--loss.rollout_rs``).
"""

import dataclasses
import logging
import shlex
from collections.abc import Callable
from typing import Any

__all__ = ["DEPENDENT_OPTIONS", "Dependent", "Switch", "inert_options", "warn_inert_options"]

log = logging.getLogger("rlzoo.train")
_UNSET = object()


@dataclasses.dataclass(frozen=True)
class Switch:
    """What turns options on: the field ``field`` with a value for which ``on`` holds, given as ``flag``."""

    field: str
    """The switch's config field."""
    on: Callable[[Any], bool]
    """Whether a value of the field turns the switch on."""
    flag: str
    """How the switch is turned on on the command line (named in the warning)."""


@dataclasses.dataclass(frozen=True)
class Dependent:
    """An option that has an effect only while every one of its switches is on."""

    option: str
    """The option's config field."""
    switches: tuple[Switch, ...]
    """What must be on for the option to act."""
    note: str = ""
    """Added to the warning in parentheses (e.g. the option a user likely meant)."""


KL_IN_REWARD = Switch("use_kl_in_reward", bool, "--use-kl-in-reward")
ADAPTIVE_KL = Switch("kl_ctrl", lambda value: value == "adaptive", "--kl-ctrl adaptive")
DYNAMIC_SAMPLING = Switch("dynamic_sampling", bool, "--dynamic-sampling")
OVERLONG_BUFFER = Switch("overlong_buffer", lambda value: value > 0, "--overlong-buffer N (N > 0)")
VLLM = Switch("backend", lambda value: value == "vllm", "--backend vllm")
FSDP = Switch("parallelism", lambda value: value == "fsdp", "--parallelism fsdp")
TRACKERS = Switch("report_to", lambda value: any(n.strip() not in ("", "none") for n in value.split(",")),
                  "--report-to TRACKERS")
PROJECT_TRACKERS = Switch("report_to", lambda value: bool({"trackio", "wandb", "all"} & {n.strip() for n in value.split(",")}),
                          "--report-to trackio or wandb")
HELD_OUT = Switch("eval_size", lambda value: value > 0, "--eval-size N (N > 0)")

DEPENDENT_OPTIONS: tuple[Dependent, ...] = (
    Dependent("kl_ctrl", (KL_IN_REWARD,)),
    Dependent("kl_coef", (KL_IN_REWARD,), "the loss's KL coefficient is --loss.beta"),
    Dependent("kl_penalty", (KL_IN_REWARD,), "the loss's KL estimator is --loss.kl_estimator"),
    Dependent("target_kl", (KL_IN_REWARD, ADAPTIVE_KL)),
    Dependent("kl_horizon", (KL_IN_REWARD, ADAPTIVE_KL)),
    Dependent("max_sampling_rounds", (DYNAMIC_SAMPLING,)),
    Dependent("overlong_penalty", (OVERLONG_BUFFER,)),
    Dependent("vllm_gpu_memory_utilization", (VLLM,)),
    Dependent("fsdp_cpu_offload", (FSDP,)),
    Dependent("run_name", (TRACKERS,), "it names the run in the trackers"),
    Dependent("project", (PROJECT_TRACKERS,), "the trackio / wandb project"),
    Dependent("eval_steps", (HELD_OUT,)),
    Dependent("exclude_eval_questions", (HELD_OUT,)),
)
"""The options that act only under a switch (fields of :class:`~rlzoo.trainer.TrainConfig`)."""


def _flag(field: str, value: Any) -> str:
    flag = "--" + field.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {shlex.quote(str(value))}"


def inert_options(config: Any, loss: Any = None) -> list[str]:
    """One line per option of :data:`DEPENDENT_OPTIONS` that ``config`` (a :class:`~rlzoo.trainer.TrainConfig`) sets
    away from its default while a switch it needs is off, naming the option, its value and the switches; with the
    run's ``loss`` (a :class:`~rlzoo.losses.PolicyLoss`), one per ``--loss.NAME`` option of a part that is off
    (``--loss.rollout_rs_threshold`` without ``--loss.rollout_rs``, ``--loss.kl_estimator`` with ``beta`` 0), naming
    the part's switch and its value. Never raises."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    lines = []
    for dependent in DEPENDENT_OPTIONS:
        value = getattr(config, dependent.option)
        off = [s.flag for s in dependent.switches if not s.on(getattr(config, s.field))]
        if off and value != defaults[dependent.option]:
            note = f" ({dependent.note})" if dependent.note else ""
            lines.append(f"{_flag(dependent.option, value)} has no effect without {' '.join(off)}{note}")
    for option, value in (config.loss or {}).items() if loss is not None else ():
        parts = [p for p in loss.all_parts() if option in p.option_names()]
        if not parts or any(p.active for p in parts) or option == parts[0].option_names()[0]:
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(parts[0])} if dataclasses.is_dataclass(parts[0]) else {}
        if value is None or value == defaults.get(option, _UNSET):  # set at its default (or off): nothing asked of it
            continue
        switch = parts[0].option_names()[0]  # the option that turns the part on (its first)
        lines.append(f"--loss.{option} {shlex.quote(str(value))} has no effect while --loss.{switch} is "
                     f"{getattr(parts[0], switch, None)!r} (the part {parts[0].label()!r} is off)")
    return lines


def warn_inert_options(config: Any, loss: Any = None) -> None:
    """Log :func:`inert_options` as warnings, one line each (rank 0 calls it, once, before the model loads)."""
    for line in inert_options(config, loss):
        log.warning("%s", line)
