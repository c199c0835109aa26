r"""Token weights and masks (slot :class:`~rlzoo.losses.TokenWeight`): detached per-token multipliers of the
policy loss, applied after the IS correction weight (:mod:`rlzoo.losses.correction`).

* :class:`OffPolicySequenceMask` - DeepSeek-V3.2's OPSM: drop negative-advantage sequences that drifted.
* :class:`EntropyMask` - keep only the top-quantile entropy tokens in the policy term.

Penalties (KL, entropy bonus) are added after these multipliers, so they are not masked.
"""

from types import MappingProxyType

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.losses.base import LossInputs, PartOutput, TokenWeight, require
from rlzoo.registry import check_number

__all__ = ["EntropyMask", "OffPolicySequenceMask", "masked_quantile"]

class OffPolicySequenceMask(TokenWeight, name="off_policy_mask"):
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

    example_options = MappingProxyType({"off_policy_mask_threshold": 0.05})
    off_policy_mask_threshold: float | None = None

    def check(self) -> None:
        check_number("off-policy mask", "off_policy_mask_threshold", self.off_policy_mask_threshold,
                     allow_none=True, allow_inf=True)

    @property
    def active(self) -> bool:
        return self.off_policy_mask_threshold is not None

    def __call__(self, x: LossInputs) -> PartOutput:
        sampling = x.rollout_logprobs if x.rollout_logprobs is not None else x.old_logprobs
        drift = x.seq_mean(sampling - x.logprobs.detach())
        keep = (x.advantages >= 0) | (drift <= self.off_policy_mask_threshold)
        weight = keep.to(x.logprobs.dtype)
        return PartOutput(weight, {"off_policy_mask/dropped_mean": x.mean(1.0 - weight)})


def masked_quantile(values: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], q: float) -> Float[Tensor, ""]:
    """``torch.quantile(values[mask], q)`` (linear interpolation) without a data-dependent shape.

    Computed in float32 at least (``values`` of a lower precision are upcast, as TRL upcasts entropies with
    ``.float()`` before ``torch.quantile``): in bf16 the index ``q * (N - 1)`` is not representable beyond 256
    counted tokens (2048 in fp16), which picked the wrong element, NaN, or an index out of range. float64 stays
    float64. In float32 the index is exact up to 2^24 counted tokens (as ``torch.quantile``'s).

    Args:
        values: ``Float[B, T]``; values at masked positions are ignored.
        mask: ``Bool[B, T]``; True where a value counts.
        q: the quantile, a number in [0, 1] (0 = the minimum, 1 = the maximum of the counted values).

    Returns:
        0-d tensor in ``promote_types(values.dtype, float32)``: the ``q``-quantile of the counted values, or 0
        when no position is counted.

    Raises:
        ValueError: naming q if it is not a finite number in [0, 1].
    """
    check_number("masked_quantile", "q", q, low=0.0, high=1.0)
    dtype = torch.promote_types(values.dtype, torch.float32)
    values = values.to(dtype)
    flat = torch.where(mask, values, torch.full_like(values, torch.inf)).flatten()
    ordered = torch.sort(flat).values
    n = mask.sum()
    pos = q * (n - 1).clamp(min=0).to(dtype)
    lo = torch.floor(pos).long()
    hi = torch.ceil(pos).long()
    v_lo = ordered.gather(0, lo.reshape(1)).squeeze(0)
    v_hi = ordered.gather(0, hi.reshape(1)).squeeze(0)
    out = v_lo + (pos - lo.to(dtype)) * (v_hi - v_lo)
    return torch.where(n > 0, out, torch.zeros_like(out))


class EntropyMask(TokenWeight, name="entropy_mask"):
    r"""Keep only the highest-entropy tokens: those at or above the ``1 - q`` quantile of the batch.

    .. math:: M_t = \mathbb{1}[H_t \ge \mathrm{quantile}(\{H\}, 1 - q)]

    Args:
        top_entropy_quantile: q in [0, 1]; 1.0 (default) disables (keeps every token); 0.0 keeps only the
            highest-entropy token(s) (as TRL); the paper uses 0.2.

    Batch-coupled: the quantile is over the batch's counted tokens, computed in float32 at least (bf16
    entropies are compared with a float32 threshold, as TRL). Needs ``PolicyBatch.entropies``.
    Metrics: ``entropy_mask/kept_mean``.

    Raises:
        ValueError: naming top_entropy_quantile when it is outside [0, 1], NaN, or not a number.
        BatchError: when called with ``PolicyBatch.entropies`` None while ``top_entropy_quantile < 1``.

    References:
        Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for
        LLM Reasoning", arXiv:2506.01939. Matches TRL 1.16 ``top_entropy_quantile`` (one process).
    """

    example_options = MappingProxyType({"top_entropy_quantile": 0.2})
    batch_coupled = True
    top_entropy_quantile: float = 1.0

    def check(self) -> None:
        check_number("entropy mask", "top_entropy_quantile", self.top_entropy_quantile, low=0.0,
                     high=1.0)

    @property
    def active(self) -> bool:
        return self.top_entropy_quantile < 1.0

    def required_fields(self) -> frozenset[str]:
        return frozenset({"entropies"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        entropies = require(x.entropies, "entropies", "the entropy mask (top_entropy_quantile)").detach()
        threshold = masked_quantile(entropies, x.mask, 1.0 - self.top_entropy_quantile)
        keep = (entropies.to(threshold.dtype) >= threshold) & x.mask  # in float32 at least (a 0-d threshold
        # would otherwise be rounded to the entropies' bf16)
        weight = keep.to(x.logprobs.dtype)
        return PartOutput(weight, {"entropy_mask/kept_mean": x.mean(weight)})
