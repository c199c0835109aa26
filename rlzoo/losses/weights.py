r"""Token weights and masks (slot :class:`~rlzoo.losses.TokenWeight`): detached per-token multipliers of the
policy loss, applied after the IS correction weight (:mod:`rlzoo.losses.correction`).

* :class:`OffPolicySequenceMask` - DeepSeek-V3.2's OPSM: drop negative-advantage sequences that drifted.
* :class:`EntropyMask` - keep only the top-quantile entropy tokens in the policy term.
* :class:`OutlierTokenVeto`, :class:`GeometricSequenceMask` - SkyRL's off-policy masks: drop sequences whose
  sampler/trainer ratio is out of bounds (verl's counterparts are rejections, :mod:`rlzoo.losses.rollout_correction`).

Penalties (KL, entropy bonus) are added after these multipliers, so they are not masked.
"""

import abc
from types import MappingProxyType
from typing import ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.losses.base import LossInputs, Part, PartOutput
from rlzoo.losses.correction import SAFETY_BOUND
from rlzoo.losses.functional import require
from rlzoo.registry import Registry, check_number

__all__ = [
    "EntropyMask",
    "GeometricSequenceMask",
    "OffPolicySequenceMask",
    "OutlierTokenVeto",
    "TokenWeight",
    "masked_quantile",
    "token_weights",
]

token_weights: Registry[type["TokenWeight"]] = Registry("token weight")


class TokenWeight(Part, abc.ABC):
    """Slot 4: a detached per-token multiplier (mask) of the policy loss (after the IS weight)."""

    registry: ClassVar[Registry[type["TokenWeight"]]] = token_weights

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Weight ``Float[B, T]`` and metrics."""

class OffPolicySequenceMask(TokenWeight, name="off_policy_mask"):
    r"""Off-policy sequence masking (OPSM): drop sequences with A < 0 whose policy drifted too far.

    .. math::
        M_i = \mathbb{1}\Big[A_i \ge 0\ \lor\ \frac{1}{|o_i|}\sum_t \big(\log\pi_{s}(o_{i,t}) -
        \log\pi_\theta(o_{i,t})\big) \le \delta\Big]

    with :math:`\pi_s` the sampler (``rollout_logprobs`` when given, else ``old_logprobs``) and
    :math:`\pi_\theta` detached. The advantage is compared per token (equal to per sequence for
    sequence advantages). A token whose sampler log-prob is NaN or +inf adds 0 to the sum and still counts in
    :math:`|o_i|` (no evidence, as TRL counts a token vLLM could not score, NaN).

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
        token_drift = sampling - x.logprobs.detach()  # a token with a NaN / +inf sampler log-prob: no evidence
        unknown = torch.isnan(sampling) | torch.isposinf(sampling)
        drift = x.seq_mean(torch.where(unknown, torch.zeros_like(token_drift), token_drift))
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


# --------------------------------------------------------------------------------------- SkyRL's masks
def _ratio(log_ratio: Float[Tensor, "B T"]) -> Float[Tensor, "B T"]:
    """SkyRL's ``safe_exp_delta``: ``exp`` of the log-ratio clamped to +-20 (in the input's dtype here)."""
    return torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))


def _outside(value: Tensor, low: float | None, high: float | None) -> Bool[Tensor, "..."]:
    out = torch.zeros_like(value, dtype=torch.bool)
    if high is not None:
        out = out | (value > high)
    if low is not None:
        out = out | (value < low)
    return out


class OutlierTokenVeto(TokenWeight, name="outlier_token_veto"):
    r"""SkyRL's outlier-token veto: a sequence in which any counted token's IS ratio leaves
    ``[low, high]`` gets weight 0 (all its tokens).

    .. math:: M_i = \mathbb{1}\big[\forall t:\ \mathrm{low} \le \rho_{i,t} \le \mathrm{high}\big], \qquad
        \rho_{i,t} = \exp(\mathrm{clip}(\log\pi_{old} - \log\pi_{rollout}, \pm 20))

    A weight of the policy term, as SkyRL applies it: the vetoed tokens stay in the denominators (SkyRL scales
    the advantages by its loss reduction before masking) and penalties still see them. It differs from verl's
    ``rollout_rs="seq_max_k2"`` (a symmetric bound on :math:`|\log\rho|`, which removes the tokens from the
    counts) by its asymmetric, one-sided-capable bounds on the ratio itself.

    Args:
        outlier_token_is_threshold_low: None (no lower bound, default) or a number >= 0.
        outlier_token_is_threshold_high: None (no upper bound, default) or a number > 0; the veto is active when
            either bound is set; low <= high.

    Metrics: ``outlier_token_veto/seq_masked_mean`` (fraction of the sequences with a counted token vetoed).

    Raises:
        ValueError: naming the option: a bound out of range, NaN, or low > high.
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None.

    References:
        Matches SkyRL ``off_policy_correction_utils.compute_outlier_token_mask`` (``off_policy_correction.
        outlier_token_is_threshold_low`` / ``_high``; SkyRL computes the ratio in float32).
    """

    example_options = MappingProxyType({"outlier_token_is_threshold_low": 0.2, "outlier_token_is_threshold_high": 5.0})
    outlier_token_is_threshold_low: float | None = None
    outlier_token_is_threshold_high: float | None = None

    def check(self) -> None:
        owner = "outlier token veto"
        check_number(owner, "outlier_token_is_threshold_low", self.outlier_token_is_threshold_low, low=0.0,
                     allow_none=True)
        check_number(owner, "outlier_token_is_threshold_high", self.outlier_token_is_threshold_high, low=0.0,
                     low_open=True, allow_none=True, allow_inf=True)
        lo, hi = self.outlier_token_is_threshold_low, self.outlier_token_is_threshold_high
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"{owner}: outlier_token_is_threshold_low ({lo}) must be <= outlier_token_is_threshold_high ({hi})")

    @property
    def active(self) -> bool:
        return self.outlier_token_is_threshold_low is not None or self.outlier_token_is_threshold_high is not None

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        rho = _ratio(x.sampler_log_ratio("the outlier-token veto"))
        bad = _outside(rho, self.outlier_token_is_threshold_low, self.outlier_token_is_threshold_high) & x.mask
        vetoed = bad.any(dim=-1, keepdim=True)
        weight = (~vetoed).to(rho.dtype).expand_as(rho)
        rows = x.lengths > 0
        fraction = (vetoed.squeeze(-1) & rows).to(rho.dtype).sum() / rows.sum().clamp(min=1)
        return PartOutput(weight, {"outlier_token_veto/seq_masked_mean": fraction})


class GeometricSequenceMask(TokenWeight, name="geo_mask"):
    r"""SkyRL's geometric sequence mask: a sequence whose geometric-mean IS ratio leaves ``[low, high]`` gets
    weight 0.

    .. math:: M_i = \mathbb{1}\Big[\mathrm{low} \le \exp\Big(\frac{1}{|o_i|}\sum_t \log\frac{\pi_{old}(o_{i,t})}
        {\pi_{rollout}(o_{i,t})}\Big) \le \mathrm{high}\Big]

    (the exponent clamped to +-20). The geometric mean is over the tokens the loss counts. A weight of the policy
    term, as SkyRL applies it (the masked tokens keep counting in the denominators); verl's Geo-RS
    (``rollout_rs="seq_mean_k1"``) is the same test as a rejection that removes them from the counts, with
    bounds on :math:`\pi_{rollout}/\pi_{old}`: SkyRL's ``[low, high]`` is verl's ``"{1/high}_{1/low}"``.

    Args:
        geo_mask_low: None (no lower bound, default) or a number > 0 (SkyRL's default 0.99).
        geo_mask_high: None (no upper bound, default) or a number > 0 (SkyRL's default 1.01); the mask is active
            when either bound is set; low <= high.

    Metrics: ``geo_mask/seq_masked_mean`` (fraction of the sequences with a counted token masked).

    Raises:
        ValueError: naming the option: a bound out of range, NaN, or low > high.
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None.

    References:
        Matches SkyRL ``off_policy_correction_utils.compute_sequence_mask`` with ``sequence_mask_metric=
        "geometric"`` (``geo_mask_low``, ``geo_mask_high``; SkyRL computes the ratio in float32).
    """

    example_options = MappingProxyType({"geo_mask_low": 0.9, "geo_mask_high": 1.1})
    geo_mask_low: float | None = None
    geo_mask_high: float | None = None

    def check(self) -> None:
        check_number("geo mask", "geo_mask_low", self.geo_mask_low, low=0.0, allow_none=True)
        check_number("geo mask", "geo_mask_high", self.geo_mask_high, low=0.0, low_open=True, allow_none=True,
                     allow_inf=True)
        if self.geo_mask_low is not None and self.geo_mask_high is not None and self.geo_mask_low > self.geo_mask_high:
            raise ValueError(f"geo mask: geo_mask_low ({self.geo_mask_low}) must be <= geo_mask_high ({self.geo_mask_high})")

    @property
    def active(self) -> bool:
        return self.geo_mask_low is not None or self.geo_mask_high is not None

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        geo = _ratio(x.seq_mean(x.sampler_log_ratio("the geometric sequence mask")))  # [B, 1]
        masked = _outside(geo, self.geo_mask_low, self.geo_mask_high)
        weight = (~masked).to(geo.dtype).expand_as(x.mask)
        rows = x.lengths > 0
        fraction = (masked.squeeze(-1) & rows).to(geo.dtype).sum() / rows.sum().clamp(min=1)
        return PartOutput(weight, {"geo_mask/seq_masked_mean": fraction})
