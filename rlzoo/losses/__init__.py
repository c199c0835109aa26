"""The loss zoo: parts (ratio levels, surrogates, token weights, penalties, aggregations), their
composition :class:`PolicyLoss`, and the registered presets."""

from rlzoo.losses._core import (
    LossInputs,
    Part,
    aggregations,
    is_corrections,
    kl_estimators,
    masked_mean,
    penalties,
    ratio_levels,
    surrogates,
    token_weights,
)
from rlzoo.losses.aggregation import (
    SeqMeanTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenSumNorm,
    TokenMean,
    TokenSum,
)
from rlzoo.losses.penalty import EntropyBonus, KLPenalty, kl_estimate
from rlzoo.losses.policy_loss import PolicyLoss
from rlzoo.losses.presets import Preset, algorithms_markdown, get_loss, list_losses, preset, presets
from rlzoo.losses.ratio import GeometricRatio, SequenceRatio, SequenceTokenRatio, TokenRatio
from rlzoo.losses.surrogate import (
    CISPO,
    DRO,
    GMPO,
    SAPO,
    VESPO,
    ClipCov,
    DPPOBinaryKL,
    DPPOBinaryTV,
    KLCov,
    PPOClip,
    Reinforce,
)
from rlzoo.losses.weights import EntropyMask, ISCorrection, OffPolicySequenceMask, masked_quantile

__all__ = [
    "CISPO",
    "DRO",
    "GMPO",
    "SAPO",
    "VESPO",
    "ClipCov",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "EntropyBonus",
    "EntropyMask",
    "GeometricRatio",
    "ISCorrection",
    "KLCov",
    "KLPenalty",
    "LossInputs",
    "OffPolicySequenceMask",
    "PPOClip",
    "Part",
    "PolicyLoss",
    "Preset",
    "Reinforce",
    "SeqMeanTokenMean",
    "SeqMeanTokenSum",
    "SeqMeanTokenSumNorm",
    "SequenceRatio",
    "SequenceTokenRatio",
    "TokenMean",
    "TokenRatio",
    "TokenSum",
    "aggregations",
    "algorithms_markdown",
    "get_loss",
    "is_corrections",
    "kl_estimate",
    "kl_estimators",
    "list_losses",
    "masked_mean",
    "masked_quantile",
    "penalties",
    "preset",
    "presets",
    "ratio_levels",
    "surrogates",
    "token_weights",
]
