r"""The loss slots: what every part of a :class:`~rlzoo.losses.PolicyLoss` receives, returns and declares.

A loss is a pipeline over ``[B, T]`` tensors with one abstract base per slot::

    RatioLevel -> Correction -> Surrogate -> TokenWeight* -> + Penalty* -> Aggregation

=============  =============================================  ======================  ===================
slot (base)    call                                           registry                option that swaps it
=============  =============================================  ======================  ===================
RatioLevel     ``(x) -> PartOutput(log_weight [B, T], m)``    ``ratio_levels``        importance_sampling_level
Correction     ``(x) -> PartOutput(is_weight [B, T], m)``     ``is_corrections``      (added by its options)
Surrogate      ``(x) -> PartOutput(loss [B, T], m)``          ``surrogates``          -
TokenWeight    ``(x) -> PartOutput(weight [B, T], m)``        ``token_weights``       (added by its options)
Penalty        ``(x) -> PartOutput(term [B, T], m)``          ``penalties``           (added by its options)
Aggregation    ``(loss, mask, normalizer, L) -> loss []``     ``aggregations``        aggregation
=============  =============================================  ======================  ===================

``x`` is a frozen :class:`LossInputs`; a stage returns what it computed (a :class:`PartOutput`) and the
pipeline builds the next stage's inputs from it. A new member of a slot is a subclass with a name::

    class TanhClip(Surrogate, name="tanh_clip"):
        '''l = -A (1 + tanh(w - 1)).'''
        scale: float = 1.0

        def __call__(self, x: LossInputs) -> PartOutput:
            return PartOutput(-x.advantages * (1 + torch.tanh(self.scale * (x.weight - 1))), {})

Capabilities are class attributes declared on the slot's base (read by the pipeline and by the zoo-wide
conformance suite, never probed with ``getattr``): ``batch_coupled`` on every part;
``example_options`` on optional parts; ``needs_max_completion_length`` on aggregations; ``mixes_tokens`` on
ratio levels and surrogates, ``per_sequence`` on ratio levels; ``folds_is_weight``, ``sequence_is_weight`` and ``on_policy`` on surrogates.
"""

import abc
import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import BatchError, Normalizer, PolicyBatch
from rlzoo.registry import Component, Registry

__all__ = [
    "Aggregation",
    "Correction",
    "LossInputs",
    "Metrics",
    "OnPolicy",
    "Part",
    "PartOutput",
    "Penalty",
    "RatioLevel",
    "Surrogate",
    "TokenWeight",
    "aggregations",
    "is_corrections",
    "kl_estimators",
    "masked_max",
    "masked_mean",
    "masked_min",
    "penalties",
    "ratio_levels",
    "require",
    "surrogates",
    "token_weights",
]

Metrics = dict[str, Tensor]

ratio_levels: Registry[type["RatioLevel"]] = Registry("ratio level (importance_sampling_level)")
is_corrections: Registry[type["Correction"]] = Registry("IS correction")
surrogates: Registry[type["Surrogate"]] = Registry("surrogate")
token_weights: Registry[type["TokenWeight"]] = Registry("token weight")
penalties: Registry[type["Penalty"]] = Registry("penalty")
aggregations: Registry[type["Aggregation"]] = Registry("aggregation")
kl_estimators: Registry[Any] = Registry("KL estimator (kl_estimator)")


# ---------------------------------------------------------------------------------------- reductions
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


def _at_most_zero(x: Tensor) -> Tensor:
    """``x`` with values above 0 (log-probs rounded up, :func:`rlzoo.batch.logprob_tolerance`) read as 0; the
    gradient passes unchanged (straight-through), so a token of probability ~1 keeps its gradient. Values
    <= 0 are returned bit for bit."""
    return x - (x - torch.clamp(x, max=0.0)).detach() if x.requires_grad else torch.clamp(x, max=0.0)


def require(x: Tensor | None, field: str, owner: str) -> Tensor:
    """``x``, or a :class:`~rlzoo.batch.BatchError` naming the missing batch field and who needs it."""
    if x is None:
        raise BatchError(f"{owner} needs PolicyBatch.{field}, which is None")
    return x


# ---------------------------------------------------------------------------------------- stage values
@dataclasses.dataclass(frozen=True, kw_only=True)
class LossInputs:
    """The per-token tensors every part reads, sanitized and broadcast once per call (frozen).

    Masked positions hold 0 in every tensor (whatever the batch held there), so parts can compute freely
    and only the aggregation looks at ``mask``; gradients at masked positions are exactly 0. ``logprobs`` and
    ``old_logprobs`` rounded above 0 (accepted by :class:`PolicyBatch` within
    :func:`rlzoo.batch.logprob_tolerance`) are read as 0, ``logprobs`` keeping its gradient, so that
    ``p = exp(logp) <= 1`` where a part reads probabilities (DPPO's ``1 - p``); ``ref_logprobs`` and
    ``rollout_logprobs`` enter only as log-ratios and are used as given (an integration may pass synthetic
    sampler log-probs that encode IS weights, e.g. ``rlzoo.integrations.verl``).

    Attributes:
        logprobs: ``Float[B, T]``, carries the gradient.
        old_logprobs: ``Float[B, T]``, detached; ``logprobs.detach()`` when the batch had None.
        log_ratio: ``Float[B, T]``, ``logprobs - old_logprobs`` (token level, carries the gradient).
        advantages: ``Float[B, T]``, detached, broadcast from ``[B]`` when per-sequence.
        mask: ``Bool[B, T]``, the completion mask.
        lengths: ``Float[B]``, counted tokens per sequence.
        ref_logprobs, rollout_logprobs, teacher_logprobs: ``Float[B, T]`` or None, detached.
        entropies: ``Float[B, T]`` or None (keeps its gradient, if any).
        log_weight: ``Float[B, T]``, log of the importance weight chosen by the ratio level; None before the
            ratio stage ran (the pipeline sets it with :meth:`with_weights` before the surrogate runs).
        is_weight: ``Float[B, T]`` or None, the sampler/trainer correction weight (detached), from the
            :class:`Correction` stage.
        advantages_per_sequence: the batch's advantages were ``[B]`` (one per sequence).
        weight_per_sequence: ``log_weight`` is one value per sequence (``RatioLevel.per_sequence``).
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
    teacher_logprobs: Float[Tensor, "B T"] | None = None
    log_weight: Float[Tensor, "B T"] | None = None
    is_weight: Float[Tensor, "B T"] | None = None
    advantages_per_sequence: bool = False
    weight_per_sequence: bool = False

    @classmethod
    def from_batch(cls, batch: PolicyBatch) -> "LossInputs":
        """Sanitize and broadcast a :class:`PolicyBatch` (no device sync)."""
        mask = batch.completion_mask
        logprobs = _at_most_zero(_zero_masked(batch.logprobs, mask))
        if batch.old_logprobs is None:
            old = logprobs.detach()
        else:
            old = _at_most_zero(_zero_masked(batch.old_logprobs.detach().to(logprobs.dtype), mask))
        adv = batch.advantages.detach().to(logprobs.dtype)
        if adv.ndim == 1:
            adv = adv.unsqueeze(-1).expand_as(logprobs)
        adv = _zero_masked(adv, mask)

        def aux(x: Tensor | None) -> Tensor | None:  # enter only as log-ratios: used as given
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
            teacher_logprobs=aux(batch.teacher_logprobs),
            advantages_per_sequence=batch.advantages.ndim == 1,
        )

    def with_weights(
        self,
        log_weight: Float[Tensor, "B T"],
        is_weight: Float[Tensor, "B T"] | None = None,
        *,
        per_sequence: bool = False,
    ) -> "LossInputs":
        """A copy carrying the ratio level's ``log_weight`` (one value per sequence when ``per_sequence``) and
        the correction's ``is_weight``."""
        return dataclasses.replace(self, log_weight=log_weight, is_weight=is_weight, weight_per_sequence=per_sequence)

    @property
    def weight(self) -> Float[Tensor, "B T"]:
        """The importance weight ``exp(log_weight)`` (carries the gradient).

        Raises:
            RuntimeError: read before the ratio stage set ``log_weight`` (a part-ordering bug).
        """
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

    def fraction(self, flag: Bool[Tensor, "B T"]) -> Float[Tensor, ""]:
        """The fraction of decisions ``flag`` marks, for clip metrics (TRL's definitions).

        A decision on the weight and the advantage is made once per sequence when both are one per sequence
        (a sequence-level ratio, ``[B]`` advantages: TRL's ``importance_sampling_level="sequence"``), so it is
        counted once per sequence: the mean over the sequences with a counted token. Otherwise the mean over
        counted tokens. (TRL's sequence-level mean also counts fully masked rows, whose flag is 0.)
        """
        f = flag.to(self.logprobs.dtype)
        if not (self.weight_per_sequence and self.advantages_per_sequence):
            return self.mean(f)
        has = self.lengths > 0
        per_seq = self.seq_mean(f).squeeze(-1)
        return torch.where(has, per_seq, torch.zeros((), dtype=f.dtype, device=f.device)).sum() / has.sum().clamp(min=1)


class PartOutput(NamedTuple):
    """What a stage returns: its per-token tensor and its metrics (detached 0-d tensors, TRL's names).

    A plain ``(value, metrics)`` tuple is accepted wherever a ``PartOutput`` is (it unpacks the same way).
    """

    value: Float[Tensor, "B T"]
    metrics: Metrics


class OnPolicy(enum.Enum):
    """What a surrogate promises at ratio 1 (first iteration, ``old_logprobs`` None), per token.

    The zoo-wide conformance suite checks the promise for every registered surrogate.
    """

    UNDECLARED = "undeclared"
    """Nothing is promised (the default for user surrogates)."""
    REINFORCE_GRADIENT = "grad = -A"
    """The gradient w.r.t. logp is REINFORCE's ``-A``; the value is the part's own (SAPO: ``-2A / tau``)."""
    MINUS_ADVANTAGE = "-A"
    """Value ``-A`` and gradient ``-A``: a ratio times the advantage (PPO clip family)."""
    MINUS_ADVANTAGE_LOGP = "-A logp"
    """Value ``-A logp`` and gradient ``-A``: a detached weight (1 at ratio 1) times REINFORCE (CISPO)."""


# -------------------------------------------------------------------------------------------- slots
class Part(Component):
    """Base of every loss part: a frozen keyword-only dataclass with one job (see :class:`Component`).

    Class attributes (capabilities):

    * ``batch_coupled`` - True when its output at one token depends on other sequences of the batch (a
      batch quantile, a covariance top-k), so micro-batch splitting changes it.
    * ``example_options`` - options that make the part active (for a part inactive with its defaults, such
      as ``beta=0``): a small working configuration, used by the docs and the zoo-wide conformance suite.
    """

    batch_coupled: ClassVar[bool] = False
    example_options: ClassVar[Mapping[str, Any]] = MappingProxyType({})

    @property
    def active(self) -> bool:
        """False when the part is a no-op with its current options (``beta=0``...): kept in the loss, so its
        other options are kept too, but skipped when the loss runs."""
        return True

    def required_fields(self) -> frozenset[str]:
        """Names of the optional :class:`PolicyBatch` fields this part needs (when active)."""
        return frozenset()


class RatioLevel(Part, abc.ABC):
    """Slot 1: how the log importance weight ``log w`` is formed from the token log-ratios.

    ``mixes_tokens``: True when ``log w`` at one token depends on the other tokens of its sequence
    (sequence-level ratios), so a per-token advantage does not act on its own token only.
    ``per_sequence``: True when ``log w`` is one value per sequence (broadcast over its tokens), so clip
    decisions with per-sequence advantages are counted once per sequence (:meth:`LossInputs.fraction`).
    """

    registry: ClassVar[Registry[type["RatioLevel"]]] = ratio_levels
    mixes_tokens: ClassVar[bool] = False
    per_sequence: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """``log_weight`` ``Float[B, T]`` (sequence-level weights broadcast over the tokens) and metrics."""


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

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """``is_weight`` ``Float[B, T]`` (detached) and metrics."""


class Surrogate(Part, abc.ABC):
    """Slot 3: the per-token policy objective, as a loss to minimise, from ``x.weight`` and ``x.advantages``.

    Capabilities:

    * ``folds_is_weight`` - True when it consumes ``x.is_weight`` itself instead of having its per-token loss
      multiplied by it (VESPO, GMPO).
    * ``sequence_is_weight`` - False when it cannot take a sequence-level IS weight (VESPO sums token
      log-weights): the pipeline then rejects sequence-level corrections.
    * ``mixes_tokens`` - True when its value at a token reads other tokens of the sequence (GMPO's
      sequence-mean advantage).
    * ``on_policy`` - what it promises at ratio 1 (:class:`OnPolicy`).
    """

    registry: ClassVar[Registry[type["Surrogate"]]] = surrogates
    folds_is_weight: ClassVar[bool] = False
    sequence_is_weight: ClassVar[bool] = True
    mixes_tokens: ClassVar[bool] = False
    on_policy: ClassVar[OnPolicy] = OnPolicy.UNDECLARED

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Per-token loss ``Float[B, T]`` (values at masked positions are ignored) and metrics."""


class TokenWeight(Part, abc.ABC):
    """Slot 4: a detached per-token multiplier (mask) of the policy loss (after the IS weight)."""

    registry: ClassVar[Registry[type["TokenWeight"]]] = token_weights

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Weight ``Float[B, T]`` and metrics."""


class Penalty(Part, abc.ABC):
    """Slot 5: a per-token term added to the policy loss after the token weights (so they do not mask it)."""

    registry: ClassVar[Registry[type["Penalty"]]] = penalties

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Term ``Float[B, T]`` and metrics."""


class Aggregation(Part, abc.ABC):
    """Slot 6: per-token loss ``[B, T]`` -> scalar, dividing by the counts of a :class:`~rlzoo.Normalizer`.

    ``needs_max_completion_length``: True when :meth:`reduce` divides by the loss's constant
    ``max_completion_length`` (the pipeline raises before the call when it is None).
    """

    registry: ClassVar[Registry[type["Aggregation"]]] = aggregations
    needs_max_completion_length: ClassVar[bool] = False

    def __call__(
        self,
        loss: Float[Tensor, "B T"],
        mask: Bool[Tensor, "B T"],
        normalizer: Normalizer,
        max_completion_length: int | None = None,
    ) -> Float[Tensor, ""]:
        """Aggregate ``loss`` over counted tokens with the global counts of ``normalizer``.

        Args:
            loss: ``Float[B, T]`` per-token loss (values at masked positions are ignored, even NaN).
            mask: ``Bool[B, T]`` completion mask.
            normalizer: counts of the whole optimizer-step batch.
            max_completion_length: needed when ``needs_max_completion_length``.

        Returns:
            0-d tensor.

        Raises:
            ValueError: ``max_completion_length`` is None and the aggregation needs it.
        """
        if self.needs_max_completion_length and max_completion_length is None:
            raise ValueError(f"aggregation {self.label()!r} needs max_completion_length")
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        return self.reduce(torch.where(mask, loss, zero), mask, normalizer, max_completion_length)

    @abc.abstractmethod
    def reduce(
        self,
        loss: Float[Tensor, "B T"],
        mask: Bool[Tensor, "B T"],
        normalizer: Normalizer,
        max_completion_length: int | None,
    ) -> Float[Tensor, ""]:
        """The reduction of ``loss``, which is already 0 at masked positions."""
