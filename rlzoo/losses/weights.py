r"""Token weights and masks: detached per-token multipliers of the policy loss.

* :class:`ISCorrection` - the sampler/trainer mismatch weight ``pi_old / pi_sampler`` (truncated or masked,
  per token or per sequence). Handed to the surrogate as ``LossInputs.is_weight``.
* :class:`OffPolicySequenceMask` - DeepSeek-V3.2's OPSM: drop negative-advantage sequences that drifted.
* :class:`EntropyMask` - keep only the top-quantile entropy tokens in the policy term.

Penalties (KL, entropy bonus) are added after these multipliers, so they are not masked.
"""

import dataclasses
from typing import ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.losses._core import (
    LossInputs,
    Metrics,
    Part,
    check_choice,
    check_number,
    is_corrections,
    masked_max,
    masked_mean,
    masked_min,
    require,
    token_weights,
)

__all__ = ["EntropyMask", "ISCorrection", "OffPolicySequenceMask", "masked_quantile"]

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@is_corrections.register("is")
@dataclasses.dataclass(frozen=True, kw_only=True)
class ISCorrection(Part):
    r"""Sampler/trainer importance-sampling correction (truncated or masked IS, per token or sequence).

    .. math::
        \rho_t = \frac{\pi_{old}(o_t)}{\pi_{sampler}(o_t)}\ \text{(token)}, \qquad
        \rho_i = \prod_t \rho_{i,t}\ \text{(sequence, broadcast)}

    ``*_truncate`` clamps rho to ``[is_min, is_max]``; ``*_mask`` sets it to 0 outside that range.
    ``pi_old`` is ``old_logprobs`` (``logprobs.detach()`` when None) and ``pi_sampler`` is
    ``rollout_logprobs``. The weight is detached.

    Args:
        is_correction: "token_truncate", "token_mask", "sequence_truncate", "sequence_mask", or None (off,
            default).
        is_min: finite, >= 0, the lower bound, or None (no lower bound; default).
        is_max: > 0 (inf allowed), the upper bound (default 3.0, TRL's ``vllm_importance_sampling_clip_max``),
            or None (no upper bound). The truncate modes need is_max or is_min (as TRL), and
            ``is_min <= is_max`` when both are set. The bounds are checked only when is_correction is set.

    Metrics: ``sampling/importance_sampling_ratio/{min,mean,max}`` (of rho *after* truncation/masking, as
    TRL; the raw ratio is not reported) and ``sampling/sampling_logp_difference/{mean,max}``.

    Raises:
        ValueError: on construction, naming the option: an unknown is_correction mode (the message lists
            the four), a bound outside its range above, NaN or not a number, a truncate mode with neither
            bound, or ``is_min > is_max``.
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None while is_correction is set.

    References:
        Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
        (truncated IS); Liu et al. 2025, "When Speed Kills Stability" (masked / sequence-level IS).
        Matches TRL 1.16 ``vllm_importance_sampling_correction`` with ``vllm_importance_sampling_mode``,
        ``..._clip_min``, ``..._clip_max``; verl ``rollout_is`` / ``rollout_rs``.
    """

    registry: ClassVar = is_corrections
    is_correction: str | None = None
    is_min: float | None = None
    is_max: float | None = 3.0

    def __post_init__(self) -> None:
        if self.is_correction is None:
            return
        check_choice("is correction", "is_correction", self.is_correction, IS_MODES)
        check_number("is correction", "is_min", self.is_min, low=0.0, allow_none=True)
        check_number("is correction", "is_max", self.is_max, low=0.0, low_open=True, allow_none=True, allow_inf=True)
        if self.is_correction.endswith("truncate") and self.is_max is None and self.is_min is None:
            raise ValueError(f"is correction: {self.is_correction!r} needs is_max or is_min (the truncation bounds)")
        if self.is_min is not None and self.is_max is not None and self.is_min > self.is_max:
            raise ValueError(f"is correction: is_min ({self.is_min}) must be <= is_max ({self.is_max})")

    @property
    def active(self) -> bool:
        return self.is_correction is not None

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        mode = self.is_correction
        rollout = require(x.rollout_logprobs, "rollout_logprobs", f"IS correction ({mode})")
        diff = x.old_logprobs - rollout  # both 0 at masked positions
        sequence = mode.startswith("sequence")
        log_rho = x.seq_sum(diff).expand_as(diff) if sequence else diff
        rho = torch.exp(log_rho)
        if mode.endswith("truncate"):
            rho = torch.clamp(rho, min=self.is_min, max=self.is_max)
        else:
            low = -torch.inf if self.is_min is None else self.is_min
            high = torch.inf if self.is_max is None else self.is_max
            rho = torch.where((rho < low) | (rho > high), torch.zeros_like(rho), rho)
        stat_mask = x.mask if not sequence else (x.mask & (torch.cumsum(x.mask, -1) == 1))  # one per sequence
        abs_diff = diff.abs()
        metrics = {
            "sampling/importance_sampling_ratio/min": masked_min(rho, stat_mask),
            "sampling/importance_sampling_ratio/mean": masked_mean(rho, stat_mask),
            "sampling/importance_sampling_ratio/max": masked_max(rho, stat_mask),
            "sampling/sampling_logp_difference/mean": masked_mean(abs_diff, x.mask),
            "sampling/sampling_logp_difference/max": masked_max(abs_diff, x.mask),
        }
        return rho.detach(), metrics


@token_weights.register("off_policy_mask")
@dataclasses.dataclass(frozen=True, kw_only=True)
class OffPolicySequenceMask(Part):
    r"""Off-policy sequence masking (OPSM): drop sequences with A < 0 whose policy drifted too far.

    .. math::
        M_i = \mathbb{1}\Big[A_i \ge 0\ \lor\ \frac{1}{|o_i|}\sum_t \big(\log\pi_{s}(o_{i,t}) -
        \log\pi_\theta(o_{i,t})\big) \le \delta\Big]

    with :math:`\pi_s` the sampler (``rollout_logprobs`` when given, else ``old_logprobs``) and
    :math:`\pi_\theta` detached. The advantage is compared per token (equal to per sequence for
    sequence advantages).

    Args:
        off_policy_mask_threshold: delta, in nats per token: any number but NaN (inf keeps every sequence,
            -inf drops every ``A < 0`` sequence); None (default) disables.

    Metrics: ``off_policy_mask/dropped_mean`` (fraction of counted tokens dropped).

    Raises:
        ValueError: naming off_policy_mask_threshold when it is NaN or neither a number nor None.

    References:
        DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv:2512.02556, sec. 3.1 (Off-Policy Sequence Masking).
        Matches TRL 1.16 ``off_policy_mask_threshold``.
    """

    registry: ClassVar = token_weights
    off_policy_mask_threshold: float | None = None

    def __post_init__(self) -> None:
        check_number("off-policy mask", "off_policy_mask_threshold", self.off_policy_mask_threshold,
                     allow_none=True, allow_inf=True)

    @property
    def active(self) -> bool:
        return self.off_policy_mask_threshold is not None

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        sampling = x.rollout_logprobs if x.rollout_logprobs is not None else x.old_logprobs
        drift = x.seq_mean(sampling - x.logprobs.detach())
        keep = (x.advantages >= 0) | (drift <= self.off_policy_mask_threshold)
        weight = keep.to(x.logprobs.dtype)
        return weight, {"off_policy_mask/dropped_mean": x.mean(1.0 - weight)}


def masked_quantile(values: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], q: float) -> Float[Tensor, ""]:
    """``torch.quantile(values[mask], q)`` (linear interpolation) without a data-dependent shape.

    Args:
        values: ``Float[B, T]``; values at masked positions are ignored.
        mask: ``Bool[B, T]``; True where a value counts.
        q: the quantile, a number in [0, 1] (0 = the minimum, 1 = the maximum of the counted values).

    Returns:
        0-d tensor: the ``q``-quantile of the counted values, or 0 when no position is counted.

    Raises:
        ValueError: naming q if it is not a finite number in [0, 1].
    """
    check_number("masked_quantile", "q", q, low=0.0, high=1.0)
    flat = torch.where(mask, values, torch.full_like(values, torch.inf)).flatten()
    ordered = torch.sort(flat).values
    n = mask.sum()
    pos = q * (n - 1).clamp(min=0).to(values.dtype)
    lo = torch.floor(pos).long()
    hi = torch.ceil(pos).long()
    v_lo = ordered.gather(0, lo.reshape(1)).squeeze(0)
    v_hi = ordered.gather(0, hi.reshape(1)).squeeze(0)
    out = v_lo + (pos - lo.to(values.dtype)) * (v_hi - v_lo)
    return torch.where(n > 0, out, torch.zeros_like(out))


@token_weights.register("entropy_mask")
@dataclasses.dataclass(frozen=True, kw_only=True)
class EntropyMask(Part):
    r"""Keep only the highest-entropy tokens: those at or above the ``1 - q`` quantile of the batch.

    .. math:: M_t = \mathbb{1}[H_t \ge \mathrm{quantile}(\{H\}, 1 - q)]

    Args:
        top_entropy_quantile: q in [0, 1]; 1.0 (default) disables (keeps every token); 0.0 keeps only the
            highest-entropy token(s) (as TRL); the paper uses 0.2.

    Batch-coupled: the quantile is over the batch's counted tokens. Needs ``PolicyBatch.entropies``.
    Metrics: ``entropy_mask/kept_mean``.

    Raises:
        ValueError: naming top_entropy_quantile when it is outside [0, 1], NaN, or not a number.
        BatchError: when called with ``PolicyBatch.entropies`` None while ``top_entropy_quantile < 1``.

    References:
        Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for
        LLM Reasoning", arXiv:2506.01939. Matches TRL 1.16 ``top_entropy_quantile`` (one process).
    """

    registry: ClassVar = token_weights
    batch_coupled: ClassVar[bool] = True
    top_entropy_quantile: float = 1.0

    def __post_init__(self) -> None:
        check_number("entropy mask", "top_entropy_quantile", self.top_entropy_quantile, low=0.0,
                     high=1.0)

    @property
    def active(self) -> bool:
        return self.top_entropy_quantile < 1.0

    def required_fields(self) -> frozenset[str]:
        return frozenset({"entropies"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> tuple[Float[Tensor, "B T"], Metrics]:
        entropies = require(x.entropies, "entropies", "the entropy mask (top_entropy_quantile)").detach()
        threshold = masked_quantile(entropies, x.mask, 1.0 - self.top_entropy_quantile)
        keep = (entropies >= threshold) & x.mask
        weight = keep.to(x.logprobs.dtype)
        return weight, {"entropy_mask/kept_mean": x.mean(weight)}
