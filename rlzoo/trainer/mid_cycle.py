"""What a resume from a checkpoint inside a generation cycle may change.

A checkpoint written between the optimizer steps that one generation batch feeds (``steps_per_generation`` or
``num_iterations`` > 1) holds that unfinished batch: its completions, rewards, advantages and old / reference /
sampler log-probs, made with the settings of the run that wrote it. The resumed run trains its remaining steps on
it (as the uninterrupted run would have), so:

- a setting the stored log-probs or completions depend on is refused (:data:`MID_CYCLE_REFUSED`): the policy would
  be scored at a new temperature against old log-probs scored at the old one, or the length-normalised losses
  would divide completions cut at the old length by the new one;
- a setting that shapes a batch before the loss (prompts, sampling, rewards, advantages: :data:`NEXT_BATCH`) is
  applied from the next generation batch, and its log line says so.

Resuming from a checkpoint at a generation boundary (none stored) applies every change at once.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MID_CYCLE_REFUSED", "NEXT_BATCH", "check_mid_cycle_changes", "ranks"]

MID_CYCLE_REFUSED: Mapping[str, str] = {
    "temperature": "its old, reference and sampler log-probs were scored at the old temperature, and the policy "
                   "would be scored at the new one",
    "max_completion_length": "its completions were cut at the old length, which the length-normalised losses and "
                             "the overlong shaping divide by",
}
"""Settings a resume from inside a generation cycle refuses to change, with the reason."""

NEXT_BATCH = frozenset({"system_prompt", "answer_extraction", "max_prompt_length", "top_p", "top_k", "reward_funcs",
                        "reward_weights", "multi_reward_aggregation", "overlong_buffer", "overlong_penalty",
                        "dynamic_sampling", "max_sampling_rounds", "use_kl_in_reward", "kl_ctrl", "kl_coef",
                        "target_kl", "kl_horizon", "kl_penalty", "advantage", "advantage_options"})
"""Settings that shape a generation batch before the loss: changed inside a cycle, they apply from the next batch."""


def check_mid_cycle_changes(changes: Mapping[str, tuple[Any, Any]], checkpoint: str | Path, *, written_by: int,
                            world_size: int) -> None:
    """Refuse what a resume from ``checkpoint``, which holds an unfinished generation batch, cannot honour: another
    number of ranks than the ``written_by`` that split the batch, and the :data:`MID_CYCLE_REFUSED` settings among
    ``changes`` (:func:`~rlzoo.trainer.resume.compare_settings`'s result).

    Raises:
        ValueError: names the world sizes, or the first such setting with its old and new values, why, and the
            ways out.
    """
    if written_by != world_size:
        raise ValueError(
            f"checkpoint {checkpoint} was written by {ranks(written_by)} in the middle of a generation cycle (an "
            f"unfinished batch split across its ranks); it resumes only on {ranks(written_by)}. Resume on other "
            "world sizes from a checkpoint at a generation boundary")
    for name, why in MID_CYCLE_REFUSED.items():
        if name in changes:
            old, new = changes[name]
            raise ValueError(
                f"cannot change {name} ({old!r} -> {new!r}) on this resume: checkpoint {checkpoint} holds an "
                f"unfinished generation batch, and {why}; resume from a checkpoint at a generation boundary, or keep "
                f"--{name.replace('_', '-')} {old} until then")


def ranks(n: int) -> str:
    """``n`` ranks in words: ``1 rank``, ``2 ranks`` (for messages)."""
    return f"{n} rank{'s' if n != 1 else ''}"
