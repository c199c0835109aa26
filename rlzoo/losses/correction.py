r"""Rollout / importance-sampling correction: the slot :class:`Correction` and TRL's :class:`ISCorrection`.

:class:`ISCorrection` weights each token by ``rho = pi_old / pi_sampler``, the mismatch between the policy
the trainer scored (``old_logprobs``) and the sampler that generated the tokens (``rollout_logprobs``, e.g.
vLLM). How ``rho`` is formed and bounded is a registered alternative, an :class:`ISMode`, named by the
option ``is_correction``:

=================  =============================================  ====================================
is_correction      rho                                            outside ``[is_min, is_max]``
=================  =============================================  ====================================
token_truncate     ``exp(old_t - rollout_t)`` per token           clamped to the bounds
token_mask         ``exp(old_t - rollout_t)`` per token           0
sequence_truncate  ``exp(sum_t (old_t - rollout_t))`` per sequence clamped to the bounds
sequence_mask      ``exp(sum_t (old_t - rollout_t))`` per sequence 0
=================  =============================================  ====================================

A new mode is a subclass of :class:`ISMode` with a name (``class MyMode(ISMode, name="my_mode")``).
"""

import abc
import math
from types import MappingProxyType
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.losses.base import LossInputs, Part, PartOutput
from rlzoo.losses.functional import masked_max, masked_mean, masked_min
from rlzoo.registry import Component, Registry, check_number, choice

__all__ = [
    "SAFETY_BOUND",
    "Correction",
    "ISCorrection",
    "ISMode",
    "SequenceMask",
    "SequenceTruncate",
    "TokenMask",
    "TokenTruncate",
    "is_corrections",
    "is_modes",
]

SAFETY_BOUND = 20.0
"""verl's clamp of log-ratios before ``exp`` (``rollout_corr_helper.SAFETY_BOUND``), SkyRL's ``safe_exp_delta``'s."""

is_corrections: Registry[type["Correction"]] = Registry("IS correction")
is_modes: Registry[type["ISMode"]] = Registry("IS correction mode (is_correction)")


class Correction(Part, abc.ABC):
    """Slot 2: rollout / importance-sampling correction of the sampler/trainer mismatch.

    Returns a detached per-token weight ``is_weight`` ``Float[B, T]``, which multiplies the surrogate's
    per-token loss unless the surrogate folds it in itself (``Surrogate.folds_is_weight``).
    """

    registry: ClassVar[Registry[type["Correction"]]] = is_corrections

    @property
    def sequence_level(self) -> bool:
        """True when one weight covers a whole sequence (broadcast over its tokens) with these options."""
        return False

    def token_level_hint(self) -> str:
        """How to configure this part for a token-level weight (ends the error of a surrogate that needs one)."""
        return "use a token-level correction"

    @property
    def normalizes_over_batch(self) -> bool:
        """True when, with these options, the weights are divided by their mean over a batch (verl's
        ``rollout_is_batch_normalize``): the one the normalizer's :attr:`Normalizer.is_weight_sum
        <rlzoo.Normalizer.is_weight_sum>` / ``num_is_weights`` count when it holds them, else the batch given."""
        return False

    def batch_sums(self, x: LossInputs) -> Float[Tensor, "2"] | None:
        """``(sum, number)`` of the weights :attr:`normalizes_over_batch` averages, over ``x`` (summed over the
        micro-batches and ranks of the normalised batch into :attr:`Normalizer.is_weight_sum
        <rlzoo.Normalizer.is_weight_sum>` and ``num_is_weights``); None when this part does not normalise over a
        batch."""
        return None

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """``is_weight`` ``Float[B, T]`` (detached) and metrics."""


class ISMode(Component, abc.ABC):
    """How :class:`ISCorrection` forms and bounds the correction weight (the alternatives of ``is_correction``).

    Capabilities: ``sequence_level`` (one weight per sequence, the product of its token ratios, broadcast over
    its tokens) and ``needs_a_bound`` (the mode is meaningless without ``is_min`` or ``is_max``).
    """

    registry: ClassVar[Registry[type["ISMode"]]] = is_modes
    sequence_level: ClassVar[bool] = False
    needs_a_bound: ClassVar[bool] = False

    @abc.abstractmethod
    def bound(self, rho: Float[Tensor, "B T"], is_min: float | None, is_max: float | None) -> Float[Tensor, "B T"]:
        """``rho`` with the bounds applied (None = unbounded on that side)."""


class _Truncate(ISMode):
    """Truncated IS: ``clamp(rho, is_min, is_max)``."""

    needs_a_bound = True

    def bound(self, rho: Float[Tensor, "B T"], is_min: float | None, is_max: float | None) -> Float[Tensor, "B T"]:
        return torch.clamp(rho, min=is_min, max=is_max)


class _Mask(ISMode):
    """Masked IS: ``rho`` where ``is_min <= rho <= is_max``, else 0."""

    def bound(self, rho: Float[Tensor, "B T"], is_min: float | None, is_max: float | None) -> Float[Tensor, "B T"]:
        low = -torch.inf if is_min is None else is_min
        high = torch.inf if is_max is None else is_max
        return torch.where((rho < low) | (rho > high), torch.zeros_like(rho), rho)


class TokenTruncate(_Truncate, name="token_truncate"):
    """Per-token ratio, clamped to ``[is_min, is_max]`` (Yao et al. 2025's truncated IS)."""


class TokenMask(_Mask, name="token_mask"):
    """Per-token ratio, 0 outside ``[is_min, is_max]`` (masked IS)."""


class SequenceTruncate(_Truncate, name="sequence_truncate"):
    """Per-sequence ratio (product over its tokens), clamped to ``[is_min, is_max]``."""

    sequence_level = True


class SequenceMask(_Mask, name="sequence_mask"):
    """Per-sequence ratio (product over its tokens), 0 outside ``[is_min, is_max]`` (TRL's default mode)."""

    sequence_level = True


class ISCorrection(Correction, name="is"):
    r"""Sampler/trainer importance-sampling correction (truncated or masked IS, per token or sequence).

    .. math::
        \rho_t = \frac{\pi_{old}(o_t)}{\pi_{sampler}(o_t)}\ \text{(token)}, \qquad
        \rho_i = \prod_t \rho_{i,t}\ \text{(sequence, broadcast)}

    ``*_truncate`` clamps rho to ``[is_min, is_max]``; ``*_mask`` sets it to 0 outside that range (the
    token still counts in the denominators: an IS weight, not a rejection; for rejection see ``rollout_rs``).
    ``pi_old`` is ``old_logprobs`` (``logprobs.detach()`` when None; the current policy, detached, in bypass
    mode) and ``pi_sampler`` is ``rollout_logprobs``. The weight is detached. Without a finite upper bound
    (``is_max`` None or inf) the log-weight is clamped at :data:`SAFETY_BOUND` (20, verl's clamp), so the weight
    stays finite: the ``exp`` of a summed log-ratio overflows float32 past 88 (a sequence of 200 tokens 0.5 nats
    apart) and made the loss NaN. With a finite ``is_max`` nothing is clamped: an overflowing weight is masked or
    truncated by the bound, as TRL's.

    TRL's names. verl's names for the same slot are :class:`~rlzoo.losses.RolloutCorrection`'s (``rollout_is``,
    ``rollout_is_threshold``, ``rollout_is_batch_normalize``); a loss holds one of the two (setting an option of
    the other while one is configured raises). ``token_mask`` with ``is_min``/``is_max`` is verl's token IcePop
    (``rollout_is="token"``, ``rollout_is_threshold="is_min_is_max"``), ``token_truncate`` with ``is_max`` only
    is verl's token TIS (up to verl's clamp of the log-ratio at +-20).

    Args:
        is_correction: a registered :class:`ISMode` name: "token_truncate", "token_mask", "sequence_truncate",
            "sequence_mask"; or None (off, default: the part is inactive, its bounds are kept).
        is_min: finite, >= 0, the lower bound, or None (no lower bound; default).
        is_max: > 0 (inf allowed), the upper bound (default 3.0, TRL's ``vllm_importance_sampling_clip_max``),
            or None (no upper bound: the weight is then at most ``e^20``, see above). The truncate modes need
            is_max or is_min (as TRL), and
            ``is_min <= is_max`` when both are set. The bounds are checked only when is_correction is set.

    Metrics: ``sampling/importance_sampling_ratio/{min,mean,max}`` (of rho *after* truncation/masking, as
    TRL; the raw ratio is not reported) and ``sampling/sampling_logp_difference/{mean,max}``.

    Raises:
        ValueError: on construction, naming the option: an unknown is_correction mode (the message lists
            the modes), a bound outside its range above, NaN or not a number, a truncate mode with neither
            bound, or ``is_min > is_max``.
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None while is_correction is set.

    References:
        Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
        (truncated IS); Liu et al. 2025, "When Speed Kills Stability" (masked / sequence-level IS).
        Matches TRL 1.16 ``vllm_importance_sampling_correction`` with ``vllm_importance_sampling_mode``,
        ``..._clip_min``, ``..._clip_max``; verl ``rollout_is`` / ``rollout_rs``.
    """

    example_options = MappingProxyType({"is_correction": "token_truncate", "is_max": 2.0})
    is_correction: str | None = choice(None, is_modes, allow_none=True)
    is_min: float | None = None
    is_max: float | None = 3.0

    def check(self) -> None:
        if self.is_correction is None:
            return
        check_number("is correction", "is_min", self.is_min, low=0.0, allow_none=True)
        check_number("is correction", "is_max", self.is_max, low=0.0, low_open=True, allow_none=True, allow_inf=True)
        if self.mode().needs_a_bound and self.is_max is None and self.is_min is None:
            raise ValueError(f"is correction: {self.is_correction!r} needs is_max or is_min (the truncation bounds)")
        if self.is_min is not None and self.is_max is not None and self.is_min > self.is_max:
            raise ValueError(f"is correction: is_min ({self.is_min}) must be <= is_max ({self.is_max})")

    def mode(self) -> ISMode:
        """The :class:`ISMode` named by ``is_correction``.

        Raises:
            UnknownNameError: is_correction is None or not registered.
        """
        return is_modes.get(self.is_correction)()

    @property
    def active(self) -> bool:
        return self.is_correction is not None

    @property
    def sequence_level(self) -> bool:
        return self.active and self.mode().sequence_level

    def token_level_hint(self) -> str:
        modes = [name for name, mode in is_modes.items() if not mode.sequence_level]
        return f"use is_correction={' or '.join(map(repr, modes))}"

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        mode = self.mode()
        diff = x.sampler_log_ratio(f"IS correction ({self.is_correction})")  # 0 at masked positions
        log_rho = x.seq_sum(diff).expand_as(diff) if mode.sequence_level else diff
        if self.is_max is None or math.isinf(self.is_max):  # no upper bound: inf would make the loss NaN
            log_rho = log_rho.clamp(max=SAFETY_BOUND)
        rho = mode.bound(torch.exp(log_rho), self.is_min, self.is_max)
        # sequence modes: one statistic per sequence (its first counted token)
        stat_mask = x.mask if not mode.sequence_level else (x.mask & (torch.cumsum(x.mask, -1) == 1))
        abs_diff = diff.abs()
        metrics = {
            "sampling/importance_sampling_ratio/min": masked_min(rho, stat_mask),
            "sampling/importance_sampling_ratio/mean": masked_mean(rho, stat_mask),
            "sampling/importance_sampling_ratio/max": masked_max(rho, stat_mask),
            "sampling/sampling_logp_difference/mean": masked_mean(abs_diff, x.mask),
            "sampling/sampling_logp_difference/max": masked_max(abs_diff, x.mask),
        }
        return PartOutput(rho.detach(), metrics)
