r"""The loss slots: what every part of a :class:`~rlzoo.losses.PolicyLoss` receives, returns and declares.

A loss is a pipeline over ``[B, T]`` tensors with one abstract base per slot::

    Rejection* -> RatioLevel -> Correction -> Surrogate -> TokenWeight* -> + Penalty* -> Aggregation

=============  =============================================  ======================  ===================
slot (base)    call                                           registry                option that swaps it
=============  =============================================  ======================  ===================
Rejection      ``(x) -> PartOutput(keep Bool[B, T], m)``      ``rejections``          (added by its options)
RatioLevel     ``(x) -> PartOutput(log_weight [B, T], m)``    ``ratio_levels``        importance_sampling_level
Correction     ``(x) -> PartOutput(is_weight [B, T], m)``     ``is_corrections``      (added by its options)
Surrogate      ``(x) -> PartOutput(loss [B, T], m)``          ``surrogates``          -
TokenWeight    ``(x) -> PartOutput(weight [B, T], m)``        ``token_weights``       (added by its options)
Penalty        ``(x) -> PartOutput(term [B, T], m)``          ``penalties``           (added by its options)
Aggregation    ``(loss, mask, normalizer, L, g) -> loss []``  ``aggregations``        aggregation
=============  =============================================  ======================  ===================

A rejection's dropped tokens leave the loss mask: every later stage, and the counts the
:class:`~rlzoo.Normalizer` holds (:meth:`~rlzoo.losses.PolicyLoss.loss_mask`), as verl's modified response mask;
in bypass mode (``bypass_mode=True``) they leave the policy term only (verl's ``bypass_mode``).

``x`` is a frozen :class:`LossInputs`; a stage returns what it computed (a :class:`PartOutput`) and the
pipeline builds the next stage's inputs from it. A new member of a slot is a subclass with a name::

    class TanhClip(Surrogate, name="tanh_clip"):
        '''l = -A (1 + tanh(w - 1)).'''
        scale: float = 1.0

        def __call__(self, x: LossInputs) -> PartOutput:
            return PartOutput(-x.advantages * (1 + torch.tanh(self.scale * (x.weight - 1))), {})

Capabilities are class attributes declared on the slot's base (read by the pipeline and by the zoo-wide
conformance suite, never probed with ``getattr``): ``batch_coupled`` on every part (and the instance-level
``couples_batch``, for an option that couples); ``example_options`` on optional parts;
``needs_max_completion_length`` and ``needs_group_index`` on aggregations; ``mixes_tokens`` on ratio levels and
surrogates, ``per_sequence`` on ratio levels; ``folds_is_weight``, ``sequence_is_weight``, ``uses_ratio`` and
``on_policy`` on surrogates; ``aggregated`` on penalties.
"""

import abc
import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import torch
from jaxtyping import Bool, Float, Int
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
    "Rejection",
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
    "rejections",
    "require",
    "surrogates",
    "token_weights",
]

Metrics = dict[str, Tensor]

rejections: Registry[type["Rejection"]] = Registry("rollout rejection")
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
        old_logprobs: ``Float[B, T]``, detached: the ratio's reference policy. ``PolicyBatch.old_logprobs``, or
            ``logprobs.detach()`` when None; the sampler's log-probs in bypass mode; AReaL's log-linear
            proximal policy with ``prox_logp_method="loglinear"``.
        log_ratio: ``Float[B, T]``, ``logprobs - old_logprobs`` (token level, carries the gradient).
        advantages: ``Float[B, T]``, detached, broadcast from ``[B]`` when per-sequence.
        mask: ``Bool[B, T]``, the tokens the loss counts (the completion mask minus rejected tokens).
        lengths: ``Float[B]``, counted tokens per sequence.
        ref_logprobs, rollout_logprobs, teacher_logprobs: ``Float[B, T]`` or None, detached.
        entropies: ``Float[B, T]`` or None (keeps its gradient, if any).
        log_weight: ``Float[B, T]``, log of the importance weight chosen by the ratio level; None before the
            ratio stage ran (the pipeline sets it with :meth:`with_weights` before the surrogate runs).
        is_weight: ``Float[B, T]`` or None, the sampler/trainer correction weight (detached), from the
            :class:`Correction` stage.
        advantages_per_sequence: the batch's advantages were ``[B]`` (one per sequence).
        weight_per_sequence: ``log_weight`` is one value per sequence (``RatioLevel.per_sequence``).
        bypass_mode: verl's bypass mode: the sampler's log-probs are the old log-probs, and the rollout
            correction compares the current policy (detached) with the sampler (:attr:`trainer_logprobs`).
        group_index: ``Int[B]`` or None, the group (prompt) id of each sequence (0 for a fully masked row).
        rewards: ``Float[B]`` or None, detached (0 for a fully masked row).
        normalizer: the counts of the optimizer-step batch the loss is called with (parts that normalise a
            term of their own read it, e.g. VAPO's NLL term).
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
    bypass_mode: bool = False
    group_index: Int[Tensor, " B"] | None = None
    rewards: Float[Tensor, " B"] | None = None
    normalizer: Normalizer | None = None

    @classmethod
    def from_batch(
        cls,
        batch: PolicyBatch,
        *,
        old_logprobs: Float[Tensor, "B T"] | None = None,
        bypass_mode: bool = False,
        normalizer: Normalizer | None = None,
    ) -> "LossInputs":
        """Sanitize and broadcast a :class:`PolicyBatch` (no device sync).

        Args:
            batch: the batch.
            old_logprobs: the ratio's reference log-probs when they are not ``batch.old_logprobs`` (bypass mode:
                the sampler's; the log-linear proximal approximation); detached here.
            bypass_mode: see :attr:`bypass_mode`.
            normalizer: the counts to expose as :attr:`normalizer`; default: the batch's own (completion mask,
                and ``num_positive_tokens`` when the batch has rewards).
        """
        mask = batch.completion_mask
        logprobs = _at_most_zero(_zero_masked(batch.logprobs, mask))
        old_source = batch.old_logprobs if old_logprobs is None else old_logprobs
        if old_source is None:
            old = logprobs.detach()
        else:
            old = _at_most_zero(_zero_masked(old_source.detach().to(logprobs.dtype), mask))
        adv = batch.advantages.detach().to(logprobs.dtype)
        if adv.ndim == 1:
            adv = adv.unsqueeze(-1).expand_as(logprobs)
        adv = _zero_masked(adv, mask)

        def aux(x: Tensor | None) -> Tensor | None:  # enter only as log-ratios: used as given
            return None if x is None else _zero_masked(x.detach().to(logprobs.dtype), mask)

        entropies = batch.entropies
        if entropies is not None:
            entropies = _zero_masked(entropies.to(logprobs.dtype), mask)
        rows = mask.any(dim=-1)
        group_index = None
        if batch.group_index is not None:
            group_index = torch.where(rows, batch.group_index.long(), torch.zeros((), dtype=torch.long,
                                                                                  device=mask.device))
        rewards = None
        if batch.rewards is not None:
            rewards = torch.where(rows, batch.rewards.detach().to(logprobs.dtype),
                                  torch.zeros((), dtype=logprobs.dtype, device=mask.device))
        if normalizer is None:
            normalizer = Normalizer.from_masks(mask, rewards=None if rewards is None else [rewards])
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
            bypass_mode=bypass_mode,
            group_index=group_index,
            rewards=rewards,
            normalizer=normalizer,
        )

    def with_mask(self, mask: Bool[Tensor, "B T"]) -> "LossInputs":
        """A copy counting only ``mask`` (a subset of :attr:`mask`: rejected tokens removed): every per-token
        tensor is 0 at the newly masked positions (gradients there exactly 0) and :attr:`lengths` recounted."""
        mask = mask & self.mask

        def zero(x: Tensor | None) -> Tensor | None:
            return _zero_masked(x, mask)

        return dataclasses.replace(
            self, mask=mask, lengths=mask.sum(dim=-1).to(self.logprobs.dtype), logprobs=zero(self.logprobs),
            old_logprobs=zero(self.old_logprobs), log_ratio=zero(self.log_ratio), advantages=zero(self.advantages),
            ref_logprobs=zero(self.ref_logprobs), rollout_logprobs=zero(self.rollout_logprobs),
            entropies=zero(self.entropies), log_weight=zero(self.log_weight), is_weight=zero(self.is_weight),
        )

    @property
    def trainer_logprobs(self) -> Float[Tensor, "B T"]:
        """The trainer-side log-probs a rollout correction compares with the sampler's (detached):
        ``old_logprobs`` (verl's decoupled mode), or the current ``logprobs`` in bypass mode (where the old
        log-probs *are* the sampler's)."""
        return self.logprobs.detach() if self.bypass_mode else self.old_logprobs

    def sampler_log_ratio(self, owner: str) -> Float[Tensor, "B T"]:
        """``log(pi_trainer / pi_sampler)`` per token (:attr:`trainer_logprobs` - ``rollout_logprobs``),
        detached, 0 at masked positions.

        Raises:
            BatchError: ``rollout_logprobs`` is None (names ``owner``, the part that needs them).
        """
        rollout = require(self.rollout_logprobs, "rollout_logprobs", owner)
        return self.trainer_logprobs - rollout

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
    def couples_batch(self) -> bool:
        """True when this part, with its current options, couples sequences of the batch: the class's
        ``batch_coupled``, or an option that couples (verl's ``rollout_is_batch_normalize``)."""
        return type(self).batch_coupled

    @property
    def active(self) -> bool:
        """False when the part is a no-op with its current options (``beta=0``...): kept in the loss, so its
        other options are kept too, but skipped when the loss runs."""
        return True

    def required_fields(self) -> frozenset[str]:
        """Names of the optional :class:`PolicyBatch` fields this part needs (when active)."""
        return frozenset()


class Rejection(Part, abc.ABC):
    """Slot 0: rollout rejection: the tokens the loss keeps (verl's modified response mask).

    Returns a detached ``keep`` mask ``Bool[B, T]`` (its values at already masked positions are ignored). It
    reads only detached inputs known before the forward pass in verl's decoupled mode: the trainer-side
    log-probs :attr:`LossInputs.trainer_logprobs` (``old_logprobs``), the sampler's ``rollout_logprobs``, the
    mask. The pipeline then removes the rejected tokens from the loss mask of every later stage and from the
    counts (:meth:`~rlzoo.losses.PolicyLoss.loss_mask`); in bypass mode (the comparison is with the current
    policy, unknown before the forward pass) from the policy term only, the counts unchanged (verl's
    ``bypass_mode``). Several rejections combine with AND (verl's comma-combined ``rollout_rs``).
    """

    registry: ClassVar[Registry[type["Rejection"]]] = rejections

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """``keep`` ``Bool[B, T]`` (detached) and metrics."""


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
    * ``uses_ratio`` - False when it ignores the importance weight ``x.weight`` (REINFORCE): in bypass mode
      the ratio of any other surrogate already is ``pi_theta / pi_sampler``, so the rollout IS weight is not
      applied to it (reported only), as verl's ``bypass_mode`` with ``loss_type="ppo_clip"``; a surrogate that
      ignores the ratio gets it, as verl's ``loss_type="reinforce"``.
    * ``on_policy`` - what it promises at ratio 1 (:class:`OnPolicy`).
    """

    registry: ClassVar[Registry[type["Surrogate"]]] = surrogates
    folds_is_weight: ClassVar[bool] = False
    sequence_is_weight: ClassVar[bool] = True
    mixes_tokens: ClassVar[bool] = False
    uses_ratio: ClassVar[bool] = True
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
    """Slot 5: a per-token term added to the policy loss after the token weights (so they do not mask it).

    ``aggregated``: True (default) when the term is aggregated like the policy term (the loss's aggregation);
    False when the term is already normalised by counts of its own (read from ``x.normalizer``) and the
    pipeline adds its sum over counted tokens (VAPO's NLL term, a mean over positive tokens).
    """

    registry: ClassVar[Registry[type["Penalty"]]] = penalties
    aggregated: ClassVar[bool] = True

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Term ``Float[B, T]`` and metrics."""


class Aggregation(Part, abc.ABC):
    """Slot 6: per-token loss ``[B, T]`` -> scalar, dividing by the counts of a :class:`~rlzoo.Normalizer`.

    ``needs_max_completion_length``: True when :meth:`reduce` divides by the loss's constant
    ``max_completion_length`` (the pipeline raises before the call when it is None).
    ``needs_group_index``: True when :meth:`reduce` reads each row's group id (``PolicyBatch.group_index``) and
    ``normalizer.group_num_tokens`` ("prompt-mean").
    """

    registry: ClassVar[Registry[type["Aggregation"]]] = aggregations
    needs_max_completion_length: ClassVar[bool] = False
    needs_group_index: ClassVar[bool] = False

    def required_fields(self) -> frozenset[str]:
        return frozenset({"group_index"}) if self.needs_group_index else frozenset()

    def __call__(
        self,
        loss: Float[Tensor, "B T"],
        mask: Bool[Tensor, "B T"],
        normalizer: Normalizer,
        max_completion_length: int | None = None,
        group_index: Int[Tensor, " B"] | None = None,
    ) -> Float[Tensor, ""]:
        """Aggregate ``loss`` over counted tokens with the global counts of ``normalizer``.

        Args:
            loss: ``Float[B, T]`` per-token loss (values at masked positions are ignored, even NaN).
            mask: ``Bool[B, T]`` the tokens the loss counts.
            normalizer: counts of the whole optimizer-step batch.
            max_completion_length: needed when ``needs_max_completion_length``.
            group_index: ``Int[B]`` group id of each row; needed when ``needs_group_index`` (ids of rows without a
                counted token are ignored).

        Returns:
            0-d tensor.

        Raises:
            ValueError: ``max_completion_length`` is None and the aggregation needs it; ``group_index`` or
                ``normalizer.group_num_tokens`` is None and the aggregation needs them.
        """
        if self.needs_max_completion_length and max_completion_length is None:
            raise ValueError(f"aggregation {self.label()!r} needs max_completion_length")
        if self.needs_group_index:
            if group_index is None:
                raise ValueError(f"aggregation {self.label()!r} needs the group id of each row (PolicyBatch.group_index)")
            if normalizer.group_num_tokens is None:
                raise ValueError(
                    f"aggregation {self.label()!r} needs Normalizer.group_num_tokens: build the normalizer with "
                    "Normalizer.from_batch(...) or Normalizer.from_masks(..., group_index=[...])"
                )
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        return self.reduce(torch.where(mask, loss, zero), mask, normalizer, max_completion_length, group_index)

    @abc.abstractmethod
    def reduce(
        self,
        loss: Float[Tensor, "B T"],
        mask: Bool[Tensor, "B T"],
        normalizer: Normalizer,
        max_completion_length: int | None,
        group_index: Int[Tensor, " B"] | None,
    ) -> Float[Tensor, ""]:
        """The reduction of ``loss``, which is already 0 at masked positions."""
