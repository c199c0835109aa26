"""The trainer harness: train a Hugging Face causal LM on verifiable tasks with any loss of the zoo."""

from rlzoo.trainer.config import TrainConfig
from rlzoo.trainer.loop import EvalResult, Trainer, train

__all__ = ["EvalResult", "TrainConfig", "Trainer", "train"]
