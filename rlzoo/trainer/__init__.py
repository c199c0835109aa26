"""The trainer harness: train a Hugging Face causal LM on verifiable tasks with any loss of the zoo.

Components, each built from its own config section (:mod:`rlzoo.trainer.config`):

- :class:`~rlzoo.trainer.rollouts.RolloutSource`: the generation cycle, rewards, advantages, old / reference
  log-probs (:mod:`~rlzoo.trainer.generation`, :mod:`~rlzoo.trainer.rewards`, :mod:`~rlzoo.trainer.tasks`);
- :class:`~rlzoo.trainer.scorer.Scorer`: log-probs and entropies of a micro-batch;
- :class:`~rlzoo.trainer.optim.OptimizerStep`: AdamW, schedule, clipping;
- :class:`~rlzoo.trainer.evaluation.Evaluator`, :class:`~rlzoo.trainer.checkpoint.Checkpointer`,
  :class:`~rlzoo.trainer.metrics.MetricsLogger`, :class:`~rlzoo.trainer.run_dir.RunDirectory`;
- :mod:`~rlzoo.trainer.components` builds them (``build_models``, ``build_components``), and
  :class:`~rlzoo.trainer.loop.Trainer` runs the loop over them.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlzoo.trainer.config import TrainConfig
    from rlzoo.trainer.evaluation import EvalResult
    from rlzoo.trainer.interrupts import RunInterrupted
    from rlzoo.trainer.loop import Trainer, train

__all__ = ["EvalResult", "RunInterrupted", "TrainConfig", "Trainer", "train"]

_HOMES = {"TrainConfig": "config", "EvalResult": "evaluation", "RunInterrupted": "interrupts", "Trainer": "loop",
          "train": "loop"}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (PEP 562): ``rlzoo list``, ``explain`` and ``plot`` import the CLI,
    which imports ``rlzoo.trainer.flags``, on an install without the ``train`` extra (transformers, yaml, tyro)."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"rlzoo.trainer.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'rlzoo.trainer' has no attribute {name!r}")
