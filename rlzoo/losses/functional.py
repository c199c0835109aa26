"""Small functions every part uses, read by their names: masked reductions, the sanitising of padded positions,
and the check that an optional batch field is present.

Each is a few lines of torch with no loss semantics of its own (the reading-path test in tests/test_layers.py
holds them to that), so that the slot contracts (:mod:`rlzoo.losses.base`) and the pipeline
(:mod:`rlzoo.losses.policy_loss`) read without them.
"""

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import BatchError

__all__ = ["at_most_zero", "finite_exp", "masked_max", "masked_mean", "masked_min", "one_per_token", "require",
           "weighted", "working_dtype", "zero_masked"]


def masked_mean(x: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"]) -> Float[Tensor, ""]:
    """Mean of ``x`` over positions where ``mask`` is True; 0 when none is. NaN-safe at masked positions."""
    total = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    return total / mask.sum().clamp(min=1)


def masked_max(x: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"]) -> Float[Tensor, ""]:
    """Max of ``x`` over counted positions; 0 when none is counted."""
    lowest = torch.finfo(x.dtype).min
    value = torch.where(mask, x, torch.full((), lowest, dtype=x.dtype, device=x.device)).amax()
    return torch.where(mask.any(), value, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_min(x: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"]) -> Float[Tensor, ""]:
    """Min of ``x`` over counted positions; 0 when none is counted."""
    highest = torch.finfo(x.dtype).max
    value = torch.where(mask, x, torch.full((), highest, dtype=x.dtype, device=x.device)).amin()
    return torch.where(mask.any(), value, torch.zeros((), dtype=x.dtype, device=x.device))


def zero_masked(x: Tensor | None, mask: Tensor) -> Tensor | None:
    """``x`` with every masked position replaced by 0, so NaN/inf padding never reaches a gradient (None: None)."""
    if x is None:
        return None
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def weighted(x: Float[Tensor, "B T"], weight: Float[Tensor, "B T"]) -> Float[Tensor, "B T"]:
    """``x * weight``, exactly 0 where ``weight`` is 0: a token that a mask or a truncated IS weight drops adds
    nothing, also where ``x`` overflowed to +-inf (``0 * inf`` is NaN); its gradient w.r.t. ``x`` is 0 there."""
    product = x * weight
    return torch.where(weight == 0, torch.zeros((), dtype=product.dtype, device=product.device), product)


def at_most_zero(x: Tensor) -> Tensor:
    """``x`` with values above 0 (log-probs rounded up, :func:`rlzoo.batch.logprob_tolerance`) read as 0; the
    gradient passes unchanged (straight-through), so a token of probability ~1 keeps its gradient. Values
    <= 0 are returned bit for bit."""
    return x - (x - torch.clamp(x, max=0.0)).detach() if x.requires_grad else torch.clamp(x, max=0.0)


def require(x: Tensor | None, field: str, owner: str) -> Tensor:
    """``x``, or a :class:`~rlzoo.batch.BatchError` naming the missing batch field and who needs it."""
    if x is None:
        raise BatchError(f"{owner} needs PolicyBatch.{field}, which is None")
    return x


def one_per_token(x: Tensor, mask: Bool[Tensor, "B T"], owner: str) -> Tensor:
    """``x``, or a ValueError naming ``owner`` (the part that returned it) when ``x`` is not one value per token: a
    ``[B]`` or ``[B, 1]`` value would broadcast against the batch silently (or fail in torch without a name)."""
    if x.shape != mask.shape:
        raise ValueError(f"{owner} returned shape {tuple(x.shape)}; a per-token value has the batch's {tuple(mask.shape)}")
    return x


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a loss computes in: ``dtype``, or float32 for bf16 / fp16 (fp16 sums overflow at 65504; a loss sums
    over the batch). Every view of a batch (the loss, its mask of counted tokens) judges in it alike."""
    return torch.promote_types(dtype, torch.float32)


def _largest_finite_exponent(dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` whose ``exp`` is finite in ``dtype`` (88.72283 in float32)."""
    bound = torch.tensor(math.log(torch.finfo(dtype).max), dtype=dtype)
    if torch.isinf(torch.exp(bound)):  # log(max) rounded up
        bound = torch.nextafter(bound, torch.zeros((), dtype=dtype))
    return float(bound)


_EXP_BOUNDS = {dtype: _largest_finite_exponent(dtype) for dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                                    torch.float64)}


def finite_exp(x: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """``exp(x)`` with ``x`` clamped at the largest exponent whose exp is finite in its dtype (88.72283 in float32,
    709.78 in float64): equal to ``exp(x)`` wherever that is finite, never inf, so a clip or gate that selects another
    branch at such an importance weight leaves a gradient of 0 (not ``0 * inf = NaN``); the gradient is 0 where
    clamped (as verl's clamp of the log-ratio at 20)."""
    bound = _EXP_BOUNDS[x.dtype] if x.dtype in _EXP_BOUNDS else _largest_finite_exponent(x.dtype)
    return torch.exp(x.clamp(max=bound))
