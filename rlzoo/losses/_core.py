"""What every loss part shares: the sanitized per-token inputs, masked reductions, registries, the part base.

A loss is a pipeline over ``[B, T]`` tensors::

    ratio level -> IS correction -> surrogate -> token weights (masks) -> + penalties -> aggregation

Each stage is a small frozen dataclass registered by name. This module holds what they share.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import BatchError, PolicyBatch
from rlzoo.registry import Configurable, Registry

__all__ = [
    "LossInputs",
    "Metrics",
    "Part",
    "aggregations",
    "is_corrections",
    "kl_estimators",
    "masked_max",
    "masked_mean",
    "masked_min",
    "penalties",
    "ratio_levels",
    "surrogates",
    "token_weights",
]

Metrics = dict[str, Tensor]

ratio_levels: Registry[type] = Registry("ratio level (importance_sampling_level)")
surrogates: Registry[type] = Registry("surrogate")
aggregations: Registry[type] = Registry("aggregation")
kl_estimators: Registry[Any] = Registry("KL estimator (kl_estimator)")
is_corrections: Registry[type] = Registry("IS correction")
token_weights: Registry[type] = Registry("token weight")
penalties: Registry[type] = Registry("penalty")


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


def _zero_masked(x: Tensor | None, mask: Tensor) -> Tensor | None:
    """``x`` with every masked position replaced by 0, so NaN/inf padding never reaches a gradient."""
    if x is None:
        return None
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


@dataclasses.dataclass(kw_only=True)
class LossInputs:
    """The per-token tensors every part reads, sanitized and broadcast once per call.

    Masked positions hold 0 in every tensor (whatever the batch held there), so parts can compute
    freely and only the aggregation looks at ``mask``; gradients at masked positions are exactly 0.

    Attributes:
        logprobs: ``Float[B, T]``, carries the gradient.
        old_logprobs: ``Float[B, T]``, detached; ``logprobs.detach()`` when the batch had None.
        log_ratio: ``Float[B, T]``, ``logprobs - old_logprobs`` (token level, carries the gradient).
        advantages: ``Float[B, T]``, detached, broadcast from ``[B]`` when per-sequence.
        mask: ``Bool[B, T]``, the completion mask.
        lengths: ``Float[B]``, counted tokens per sequence.
        ref_logprobs, rollout_logprobs: ``Float[B, T]`` or None, detached.
        entropies: ``Float[B, T]`` or None (keeps its gradient, if any).
        log_weight: ``Float[B, T]``, log of the importance weight chosen by the ratio level (set by
            :class:`~rlzoo.losses.PolicyLoss` before the surrogate runs).
        is_weight: ``Float[B, T]`` or None, the sampler/trainer correction weight (detached; set by
            :class:`~rlzoo.losses.PolicyLoss` from its IS correction). Parts read, never write, these.
    """

    logprobs: Float[Tensor, "B T"]
    old_logprobs: Float[Tensor, "B T"]
    log_ratio: Float[Tensor, "B T"]
    advantages: Float[Tensor, "B T"]
    mask: Bool[Tensor, "B T"]
    lengths: Float[Tensor, " B"]
    ref_logprobs: Float[Tensor, "B T"] | None = None
    rollout_logprobs: Float[Tensor, "B T"] | None = None
    entropies: Float[Tensor, "B T"] | None = None
    log_weight: Float[Tensor, "B T"] | None = None
    is_weight: Float[Tensor, "B T"] | None = None

    @classmethod
    def from_batch(cls, batch: PolicyBatch) -> "LossInputs":
        """Sanitize and broadcast a :class:`PolicyBatch` (no device sync)."""
        mask = batch.completion_mask
        logprobs = _zero_masked(batch.logprobs, mask)
        if batch.old_logprobs is None:
            old = logprobs.detach()
        else:
            old = _zero_masked(batch.old_logprobs.detach().to(logprobs.dtype), mask)
        adv = batch.advantages.detach().to(logprobs.dtype)
        if adv.ndim == 1:
            adv = adv.unsqueeze(-1).expand_as(logprobs)
        adv = _zero_masked(adv, mask)

        def aux(x: Tensor | None) -> Tensor | None:
            return None if x is None else _zero_masked(x.detach().to(logprobs.dtype), mask)

        entropies = batch.entropies
        if entropies is not None:
            entropies = _zero_masked(entropies.to(logprobs.dtype), mask)
        return cls(
            logprobs=logprobs,
            old_logprobs=old,
            log_ratio=logprobs - old,
            advantages=adv,
            mask=mask,
            lengths=mask.sum(dim=-1).to(logprobs.dtype),
            ref_logprobs=aux(batch.ref_logprobs),
            rollout_logprobs=aux(batch.rollout_logprobs),
            entropies=entropies,
        )

    @property
    def weight(self) -> Float[Tensor, "B T"]:
        """The importance weight ``exp(log_weight)`` (carries the gradient)."""
        if self.log_weight is None:
            raise RuntimeError("log_weight is set by the ratio level before the surrogate runs")
        return torch.exp(self.log_weight)

    def seq_sum(self, x: Float[Tensor, "B T"]) -> Float[Tensor, "B 1"]:
        """Per-sequence sum over counted tokens, shape ``[B, 1]`` (inputs are already 0 at masked slots)."""
        return torch.where(self.mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(-1, keepdim=True)

    def seq_mean(self, x: Float[Tensor, "B T"]) -> Float[Tensor, "B 1"]:
        """Per-sequence mean over counted tokens, shape ``[B, 1]``; 0 for a fully masked row."""
        return self.seq_sum(x) / self.lengths.clamp(min=1).unsqueeze(-1)

    def mean(self, x: Float[Tensor, "B T"]) -> Float[Tensor, ""]:
        """Masked mean over the batch (for metrics)."""
        return masked_mean(x, self.mask)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _from_jsonable(value: Any) -> Any:
    if value == "inf":
        return math.inf
    if value == "-inf":
        return -math.inf
    return value


class Part(Configurable):
    """Base of every loss part (a frozen, keyword-only dataclass with one job).

    Class attributes a part may set:

    * ``registry`` - the :class:`~rlzoo.registry.Registry` it is registered in (for config round-trips);
    * ``batch_coupled`` - True when its output at one token depends on other sequences of the batch
      (a batch quantile, a covariance top-k), so micro-batch splitting changes it;
    * ``handles_is_weight`` (surrogates) - True when it consumes ``LossInputs.is_weight`` itself
      instead of having the per-token loss multiplied by it.
    """

    registry: ClassVar[Registry[type]]
    batch_coupled: ClassVar[bool] = False

    def required_fields(self) -> frozenset[str]:
        """Names of the optional :class:`PolicyBatch` fields this part needs."""
        return frozenset()

    @property
    def active(self) -> bool:
        """False when the part is a no-op with its current parameters (dropped from the loss)."""
        return True

    @classmethod
    def registered_name(cls) -> str:
        """The name this part class is registered under."""
        for name, obj in cls.registry.items():
            if obj is cls:
                return name
        raise LookupError(f"{cls.__name__} is not registered in {cls.registry!r}")

    def to_config(self) -> dict[str, Any]:
        """JSON-able ``{"name": ..., **options}``."""
        return {"name": self.registered_name(), **{k: _jsonable(v) for k, v in self.options().items()}}

    @staticmethod
    def from_config(registry: Registry[type], config: Mapping[str, Any]) -> "Part":
        """Inverse of :meth:`to_config` for a part of ``registry``."""
        config = dict(config)
        cls = registry.get(config.pop("name"))
        return cls(**{k: _from_jsonable(v) for k, v in config.items()})

    def describe(self) -> str:
        """``name(option=value, ...)``, as printed by ``rlzoo explain``."""
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{self.registered_name()}({opts})"


def check_number(owner: str, name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, allow_none: bool = False, allow_inf: bool = False) -> None:
    """Raise ``ValueError`` naming ``owner.name`` unless ``value`` is a real number in range."""
    if value is None:
        if allow_none:
            return
        raise ValueError(f"{owner}: {name} must be a number, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{owner}: {name} must be a number, got {type(value).__name__} {value!r}")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{owner}: {name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{owner}: {name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{owner}: {name} must be <= {high}, got {value}")


def check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...] | list[str]) -> None:
    """Raise ``ValueError`` naming ``owner.name`` and the valid choices unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def require(x: Tensor | None, field: str, owner: str) -> Tensor:
    """``x``, or a :class:`~rlzoo.batch.BatchError` naming the missing batch field and who needs it."""
    if x is None:
        raise BatchError(f"{owner} needs PolicyBatch.{field}, which is None")
    return x
