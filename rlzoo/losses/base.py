r"""What every part of a :class:`~rlzoo.losses.PolicyLoss` reads, returns and is (:class:`LossInputs`,
:class:`PartOutput`, :class:`Part`), and how the pipeline ends: the aggregations (:class:`Aggregation`), which
turn the per-token loss into the scalar with the global counts of a :class:`~rlzoo.Normalizer`.

A loss is a pipeline over ``[B, T]`` tensors with one abstract base per slot, each in the module of the slot's
shared members (a slot's contract sits above its members)::

    RatioLevel -> Correction -> Surrogate -> TokenWeight* -> + Penalty* -> Aggregation

=============  =============================================  ===========================  =========================
slot (base)    call                                           module (registry)            option that swaps it
=============  =============================================  ===========================  =========================
RatioLevel     ``(x) -> PartOutput(log_weight [B, T], m)``    surrogate                    importance_sampling_level
                                                              (``ratio_levels``)
Correction     ``(x) -> PartOutput(is_weight [B, T], m)``     correction                   (added by its options)
                                                              (``is_corrections``)
Surrogate      ``(x) -> PartOutput(loss [B, T], m)``          surrogate (``surrogates``)   -
TokenWeight    ``(x) -> PartOutput(weight [B, T], m)``        weights (``token_weights``)  (added by its options)
Penalty        ``(x) -> PartOutput(term [B, T], m)``          penalty (``penalties``)      (added by its options)
Aggregation    ``(loss, mask, normalizer, L, g) -> loss []``  base (``aggregations``)      aggregation
Rejection      ``(x) -> PartOutput(keep Bool[B, T], m)``      off_policy (``rejections``)  (added by its options)
=============  =============================================  ===========================  =========================

(modules of :mod:`rlzoo.losses`). Rollout rejection, verl's bypass mode and AReaL's proximal policy change
which tokens and which old policy the stages see: they are stages of their own in :mod:`rlzoo.losses.off_policy`,
which the pipeline enters only for a loss that uses them. A rejection's dropped tokens leave the loss mask:
every later stage, and the counts the :class:`~rlzoo.Normalizer` holds
(:meth:`~rlzoo.losses.PolicyLoss.loss_mask`), as verl's modified response mask; in bypass mode
(``bypass_mode=True``) they leave the policy term only (verl's ``bypass_mode``).

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

The slot bases and their registries are importable from here too (``rlzoo.losses.base.Surrogate``), as are the
helpers of :mod:`rlzoo.losses.functional` (``masked_mean``...).
"""

import abc
import dataclasses
import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.batch import Normalizer, PolicyBatch
from rlzoo.losses.functional import (
    at_most_zero,
    finite_exp,
    masked_max,
    masked_mean,
    masked_min,
    one_per_token,
    require,
    working_dtype,
    zero_masked,
)
from rlzoo.registry import Component, Registry

__all__ = [
    "Aggregation",
    "LossInputs",
    "Metrics",
    "Part",
    "PartOutput",
    "PromptMean",
    "SeqMeanTokenMean",
    "SeqMeanTokenSum",
    "SeqMeanTokenSumNorm",
    "TokenMean",
    "TokenSum",
    "aggregations",
    "masked_max",
    "masked_mean",
    "masked_min",
    "require",
]

Metrics = dict[str, Tensor]


# ---------------------------------------------------------------------------------------- stage values
@dataclasses.dataclass(frozen=True, kw_only=True)
class LossInputs:
    """The per-token tensors every part reads, sanitized and broadcast once per call (frozen).

    Every tensor is in the dtype of ``PolicyBatch.logprobs``, or float32 for a bf16 / fp16 batch (a loss sums over
    the batch: fp16 overflows at 65504, a sum of 65536 ratios of 1; bf16 keeps 8 bits of it), so a loss and its
    metrics are float32 or float64; the gradient reaches the half-precision log-probs through the cast.

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
        logprobs = at_most_zero(zero_masked(batch.logprobs.to(working_dtype(batch.logprobs.dtype)), mask))
        old_source = batch.old_logprobs if old_logprobs is None else old_logprobs
        if old_source is None:
            old = logprobs.detach()
        else:
            old = at_most_zero(zero_masked(old_source.detach().to(logprobs.dtype), mask))
        adv = batch.advantages.detach().to(logprobs.dtype)
        if adv.ndim == 1:
            adv = adv.unsqueeze(-1).expand_as(logprobs)
        adv = zero_masked(adv, mask)

        def aux(x: Tensor | None) -> Tensor | None:  # enter only as log-ratios: used as given
            return None if x is None else zero_masked(x.detach().to(logprobs.dtype), mask)

        entropies = None if batch.entropies is None else zero_masked(batch.entropies.to(logprobs.dtype), mask)
        rows = mask.any(dim=-1)  # per-sequence fields: 0 for a row without a counted token
        group_index = None if batch.group_index is None else zero_masked(batch.group_index.long(), rows)
        rewards = None if batch.rewards is None else zero_masked(batch.rewards.detach().to(logprobs.dtype), rows)
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
            return zero_masked(x, mask)

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
        the correction's ``is_weight``.

        Raises:
            ValueError: ``log_weight`` or ``is_weight`` is not one value per token (shape of the batch's mask).
        """
        return dataclasses.replace(
            self, log_weight=one_per_token(log_weight, self.mask, "the ratio level"), weight_per_sequence=per_sequence,
            is_weight=None if is_weight is None else one_per_token(is_weight, self.mask, "the IS correction"))

    @property
    def weight(self) -> Float[Tensor, "B T"]:
        """The importance weight ``exp(log_weight)`` (carries the gradient; :func:`finite_exp`: never inf).

        Raises:
            RuntimeError: read before the ratio stage set ``log_weight`` (a part-ordering bug).
        """
        if self.log_weight is None:
            raise RuntimeError("log_weight is set by the ratio level before the surrogate runs")
        return finite_exp(self.log_weight)

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


# -------------------------------------------------------------------------------------------- parts
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
        ``batch_coupled``, or an option that couples. (verl's ``rollout_is_batch_normalize`` does not: its
        mean comes from the :class:`~rlzoo.Normalizer`, see :meth:`rlzoo.losses.PolicyLoss.coupled_parts`.)"""
        return type(self).batch_coupled

    @property
    def active(self) -> bool:
        """False when the part is a no-op with its current options (``beta=0``...): kept in the loss, so its
        other options are kept too, but skipped when the loss runs."""
        return True

    def required_fields(self) -> frozenset[str]:
        """Names of the optional :class:`PolicyBatch` fields this part needs (when active)."""
        return frozenset()


# ------------------------------------------------------------------------------------- aggregations (slot 6)
aggregations: Registry[type["Aggregation"]] = Registry("aggregation")


class Aggregation(Part, abc.ABC):
    r"""Slot 6: per-token loss ``[B, T]`` -> scalar, dividing by the counts of a :class:`~rlzoo.Normalizer`.

    The counts are those of the whole optimizer-step batch, never the micro-batch's own, so summing micro-batch
    losses gives the full-batch loss exactly. Names are verl's ``loss_agg_mode`` values. With ``l`` the per-token
    loss, ``m`` the mask, ``n_i = sum_t m_it``, ``N = sum_i n_i`` and ``S`` the normalizer's ``num_sequences`` (the
    sequences with ``n_i > 0`` by default, :meth:`~rlzoo.Normalizer.from_batch`; every row in ``rlzoo train`` and
    the TRL integration, as TRL's and verl's trainers divide):

    =========================  ==================================================  =====================
    name                       value                                               TRL loss_type
    =========================  ==================================================  =====================
    token-mean                 sum_it m l / N                                      dapo, bnpo, cispo
    token-sum                  sum_it m l                                          -
    seq-mean-token-mean        (1/S) sum_i (1/n_i) sum_t m l                       grpo, sapo
    seq-mean-token-sum         (1/S) sum_i sum_t m l                               luspo
    seq-mean-token-sum-norm    (1/S) sum_i sum_t m l / max_completion_length       dr_grpo
    prompt-mean                (1/P) sum_g (1/N_g) sum_{i in g} sum_t m l          - (SkyRL prompt_mean)
    =========================  ==================================================  =====================

    For "prompt-mean", ``g`` runs over the groups (prompts: ``PolicyBatch.group_index``), ``N_g`` is the counted
    tokens of group ``g`` in the optimizer-step batch and ``P`` the groups with ``N_g > 0``
    (``Normalizer.group_num_tokens``, :attr:`~rlzoo.Normalizer.num_groups`). Counts of 0 are clamped to 1 (an
    all-masked batch has loss 0).

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

    def __call__(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
                 max_completion_length: int | None = None,
                 group_index: Int[Tensor, " B"] | None = None) -> Float[Tensor, ""]:
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
        if (self.needs_max_completion_length and max_completion_length is None) or (self.needs_group_index and (
                group_index is None or normalizer.group_num_tokens is None)):
            raise ValueError(_missing_input(self, max_completion_length, group_index))
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        return self.reduce(torch.where(mask, loss, zero), mask, normalizer, max_completion_length, group_index)

    @abc.abstractmethod
    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        """The reduction of ``loss``, which is already 0 at masked positions (the inputs the capabilities declare
        are not None)."""


def _missing_input(aggregation: Aggregation, max_completion_length: int | None,
                   group_index: Int[Tensor, " B"] | None) -> str:
    """The error message for the first input ``aggregation``'s capabilities need that is None."""
    name = aggregation.label()
    if aggregation.needs_max_completion_length and max_completion_length is None:
        return f"aggregation {name!r} needs max_completion_length"
    if group_index is None:
        return f"aggregation {name!r} needs the group id of each row (PolicyBatch.group_index)"
    return (f"aggregation {name!r} needs Normalizer.group_num_tokens: build the normalizer with "
            "Normalizer.from_batch(...) or Normalizer.from_masks(..., group_index=[...])")


def _at_least_one(count: float | Tensor) -> float | Tensor:
    return count.clamp(min=1) if isinstance(count, Tensor) else max(float(count), 1.0)


class TokenMean(Aggregation, name="token-mean"):
    """Mean over every counted token of the optimizer-step batch: ``sum_it m l / N``.

    DAPO's normalisation: Yu et al. 2025, "DAPO", arXiv:2503.14476, the objective of sec. 3 and the
    token-level policy-gradient loss of sec. 3.3, eq. (12). verl ``loss_agg_mode="token-mean"``; TRL 1.16
    ``loss_type="dapo"``/``"bnpo"``/``"cispo"`` (with the token count of the optimizer-step batch here).
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        return loss.sum() / _at_least_one(normalizer.num_tokens)


class TokenSum(Aggregation, name="token-sum"):
    """Sum over counted tokens: ``sum_it m l`` (no normalisation; the learning rate absorbs the scale).

    verl ``loss_agg_mode="token-sum"``. Does not read the normalizer: micro-batch sums add up to the
    full-batch sum as they are.
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        return loss.sum()


class SeqMeanTokenMean(Aggregation, name="seq-mean-token-mean"):
    """Mean over sequences of each sequence's token mean: ``(1/S) sum_i (1/n_i) sum_t m l``.

    GRPO's objective: Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. (3) (``1/G sum_i 1/|o_i|
    sum_t``). verl ``loss_agg_mode="seq-mean-token-mean"``; TRL 1.16 ``loss_type="grpo"``/``"sapo"`` (with
    ``S`` the sequences of the optimizer-step batch here).
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        per_seq = loss.sum(-1) / mask.sum(-1).clamp(min=1).to(loss.dtype)
        return per_seq.sum() / _at_least_one(normalizer.num_sequences)


class SeqMeanTokenSum(Aggregation, name="seq-mean-token-sum"):
    """Mean over sequences of each sequence's token sum: ``(1/S) sum_i sum_t m l``.

    verl ``loss_agg_mode="seq-mean-token-sum"``; TRL 1.16 ``loss_type="luspo"``, LUSPO's length-weighted
    sequence loss (Liu et al. 2026, arXiv:2602.05261; the ``luspo`` preset). Like
    :class:`SeqMeanTokenSumNorm` without the constant divisor, so the loss scale grows with the length.
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        return loss.sum() / _at_least_one(normalizer.num_sequences)


class SeqMeanTokenSumNorm(Aggregation, name="seq-mean-token-sum-norm"):
    """Token sum over sequences / (sequences * max_completion_length): Dr. GRPO's constant normaliser.

    Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783, eq. (3). Needs the loss's
    ``max_completion_length`` (a constant, so that the result does not depend on how the batch was padded;
    verl falls back to the padded length T).
    """

    needs_max_completion_length = True

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        assert max_completion_length is not None  # Aggregation.__call__ checked it
        total = loss.sum()
        return total / (_at_least_one(normalizer.num_sequences) * float(max_completion_length))


class PromptMean(Aggregation, name="prompt-mean"):
    r"""Mean over prompts of each prompt's token mean: ``(1/P) sum_g (1/N_g) sum_{i in g} sum_t m l``.

    .. math:: \mathcal{L} = \frac{1}{P}\sum_{g} \frac{1}{N_g}\sum_{i \in g}\sum_t m_{it}\,\ell_{it}

    Every prompt weighs the same whatever its completions' lengths (a token mean within the group, as
    DAPO's, then a mean over prompts). ``g`` is ``PolicyBatch.group_index``; ``N_g`` (the group's counted
    tokens in the whole optimizer-step batch) and ``P`` (the groups with ``N_g > 0``) come from
    ``Normalizer.group_num_tokens``, so the loss is exact under any split into micro-batches or ranks, even one
    that splits a group: build it with ``Normalizer.from_batch(*micro_batches, loss=loss_fn)`` or
    ``Normalizer.from_masks(*loss_masks, group_index=[...], num_groups=G)``.

    Matches SkyRL's ``loss_reduction="prompt_mean"`` (skyrl/backends/skyrl_train/utils/ppo_utils.py,
    ``apply_loss_reduction_to_advantages_minibatch``: token ``[i, t]`` of prompt ``p`` weighted
    ``1 / (num_prompts * tokens_in_prompt_p)``) whenever every prompt has a counted token. SkyRL counts a prompt
    whose completions are all masked in ``num_prompts`` (and clamps its tokens to 1); here such a prompt is
    inert, as a fully masked sequence is in verl's seq-mean modes, so rejected or masked groups do not dilute
    the others.
    """

    needs_group_index = True

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None, group_index: Int[Tensor, " B"] | None) -> Float[Tensor, ""]:
        assert group_index is not None and normalizer.group_num_tokens is not None  # Aggregation.__call__ checked
        counts = normalizer.group_num_tokens
        rows = mask.any(dim=-1)
        ids = torch.where(rows, group_index.to(counts.device).long(), torch.zeros((), dtype=torch.long,
                                                                                  device=counts.device))
        if (ids.device.type == "cpu" and not torch.compiler.is_compiling() and ids.numel()
                and bool(((ids < 0) | (ids >= counts.numel())).any())):
            raise ValueError(
                f"aggregation 'prompt-mean': a group_index is outside [0, {counts.numel()}), the groups counted "
                "by Normalizer.group_num_tokens (build the normalizer from the same batches)"
            )
        n_g = counts.to(loss.dtype).index_select(0, ids).to(loss.device)
        per_row = loss.sum(-1) / n_g.clamp(min=1)
        num_groups = normalizer.num_groups
        assert num_groups is not None
        return per_row.sum() / _at_least_one(num_groups.to(loss.dtype))


# The slot bases live beside their shared members; these names stay importable from here.
_MOVED = {
    "RatioLevel": "surrogate", "ratio_levels": "surrogate",
    "Correction": "correction", "is_corrections": "correction",
    "OnPolicy": "surrogate", "Surrogate": "surrogate", "surrogates": "surrogate",
    "TokenWeight": "weights", "token_weights": "weights",
    "Penalty": "penalty", "penalties": "penalty", "kl_estimators": "penalty",
    "Rejection": "off_policy", "rejections": "off_policy",
}


def __getattr__(name: str) -> Any:
    """The slot bases and registries by their old address (``rlzoo.losses.base.Surrogate``), imported on use
    (their modules import this one)."""
    if name in _MOVED:
        return getattr(importlib.import_module(f"rlzoo.losses.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
