"""rlzoo: a modular zoo of policy-optimization losses for LLM reinforcement learning.

Pick an algorithm by name (``rlzoo.get_loss("dapo")``; each is one file under ``rlzoo/algorithms/``), compose
your own from parts (``rlzoo.losses``), compute advantages (``rlzoo.get_advantage("grpo")``), and train a Hugging Face
causal LM with any of them (``rlzoo train``).
"""

from rlzoo import algorithms, compat
from rlzoo.advantages import get_advantage, list_advantages
from rlzoo.batch import BatchError, LossOutput, Normalizer, PolicyBatch
from rlzoo.losses import PolicyLoss, get_loss, list_losses
from rlzoo.registry import Registry, UnknownNameError

__version__ = "0.1.0"

__all__ = [
    "BatchError",
    "LossOutput",
    "Normalizer",
    "PolicyBatch",
    "PolicyLoss",
    "Registry",
    "UnknownNameError",
    "algorithms",
    "compat",
    "get_advantage",
    "get_loss",
    "list_advantages",
    "list_losses",
]
