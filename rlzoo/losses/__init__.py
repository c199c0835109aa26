"""The loss zoo's shared layer: what every part reads and is, and the aggregations (:mod:`rlzoo.losses.base`), one
abstract base per slot beside the parts several algorithms share (:mod:`~rlzoo.losses.surrogate`: ratio levels and
surrogates; :mod:`~rlzoo.losses.correction`, :mod:`~rlzoo.losses.weights`, :mod:`~rlzoo.losses.penalty`,
:mod:`~rlzoo.losses.off_policy`), their composition :class:`PolicyLoss` (the pipeline,
:mod:`rlzoo.losses.policy_loss`), and the preset registry.

The algorithms themselves (their cards, compositions and own parts) are in :mod:`rlzoo.algorithms`, one
file per family; ``import rlzoo`` registers them.
"""

from rlzoo.losses.base import (
    Aggregation,
    LossInputs,
    Part,
    PartOutput,
    PromptMean,
    SeqMeanTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenSumNorm,
    TokenMean,
    TokenSum,
    aggregations,
)
from rlzoo.losses.correction import Correction, ISCorrection, ISMode, is_corrections, is_modes
from rlzoo.losses.functional import masked_max, masked_mean, masked_min
from rlzoo.losses.off_policy import PROX_LOGP_METHODS, Rejection, loglinear_proximal_logprobs, rejections
from rlzoo.losses.penalty import EntropyBonus, KLPenalty, Penalty, kl_estimate, kl_estimators, penalties
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.losses.presets import Preset, algorithms_markdown, get_loss, list_losses, preset, presets
from rlzoo.losses.rollout_correction import RS_CRITERIA, RolloutCorrection, RolloutRejection
from rlzoo.losses.surrogate import (
    OnPolicy,
    PPOClip,
    RatioLevel,
    SequenceRatio,
    SequenceTokenRatio,
    Surrogate,
    TokenRatio,
    clip_metrics,
    ratio_levels,
    surrogates,
)
from rlzoo.losses.weights import (
    EntropyMask,
    GeometricSequenceMask,
    OffPolicySequenceMask,
    OutlierTokenVeto,
    TokenWeight,
    masked_quantile,
    token_weights,
)

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
