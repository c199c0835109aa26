"""The loss zoo's shared layer: one abstract base per slot (:mod:`rlzoo.losses.base`), the parts several
algorithms share, their composition :class:`PolicyLoss`, and the preset registry.

The algorithms themselves (their cards, compositions and own parts) are in :mod:`rlzoo.algorithms`, one
file per family; ``import rlzoo`` registers them.
"""

from rlzoo.losses.aggregation import (
    PromptMean,
    SeqMeanTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenSumNorm,
    TokenMean,
    TokenSum,
)
from rlzoo.losses.base import (
    Aggregation,
    Correction,
    LossInputs,
    OnPolicy,
    Part,
    PartOutput,
    Penalty,
    RatioLevel,
    Rejection,
    Surrogate,
    TokenWeight,
    aggregations,
    is_corrections,
    kl_estimators,
    masked_max,
    masked_mean,
    masked_min,
    penalties,
    ratio_levels,
    rejections,
    surrogates,
    token_weights,
)
from rlzoo.losses.correction import ISCorrection, ISMode, is_modes
from rlzoo.losses.penalty import EntropyBonus, KLPenalty, kl_estimate
from rlzoo.losses.policy_loss import PROX_LOGP_METHODS, PolicyLoss, loglinear_proximal_logprobs
from rlzoo.losses.presets import Preset, algorithms_markdown, get_loss, list_losses, preset, presets
from rlzoo.losses.ratio import SequenceRatio, SequenceTokenRatio, TokenRatio
from rlzoo.losses.rollout_correction import (
    RS_CRITERIA,
    GeometricSequenceMask,
    OutlierTokenVeto,
    RolloutCorrection,
    RolloutRejection,
)
from rlzoo.losses.surrogate import PPOClip, clip_metrics
from rlzoo.losses.weights import EntropyMask, OffPolicySequenceMask, masked_quantile

__all__ = [
    "PROX_LOGP_METHODS",
    "RS_CRITERIA",
    "Aggregation",
    "Correction",
    "EntropyBonus",
    "EntropyMask",
    "GeometricSequenceMask",
    "ISCorrection",
    "ISMode",
    "KLPenalty",
    "LossInputs",
    "OffPolicySequenceMask",
    "OnPolicy",
    "OutlierTokenVeto",
    "PPOClip",
    "Part",
    "PartOutput",
    "Penalty",
    "PolicyLoss",
    "Preset",
    "PromptMean",
    "RatioLevel",
    "Rejection",
    "RolloutCorrection",
    "RolloutRejection",
    "SeqMeanTokenMean",
    "SeqMeanTokenSum",
    "SeqMeanTokenSumNorm",
    "SequenceRatio",
    "SequenceTokenRatio",
    "Surrogate",
    "TokenMean",
    "TokenRatio",
    "TokenSum",
    "TokenWeight",
    "aggregations",
    "algorithms_markdown",
    "clip_metrics",
    "get_loss",
    "is_corrections",
    "is_modes",
    "kl_estimate",
    "kl_estimators",
    "list_losses",
    "loglinear_proximal_logprobs",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_quantile",
    "penalties",
    "preset",
    "presets",
    "ratio_levels",
    "rejections",
    "surrogates",
    "token_weights",
]
