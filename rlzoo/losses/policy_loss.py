r"""``PolicyLoss``: the pipeline ratio level -> IS correction -> surrogate -> token weights -> + penalties ->
aggregation, read top to bottom in :meth:`PolicyLoss.__call__`.

Build one from parts, from a preset (:func:`rlzoo.get_loss`), or from a saved config::

    >>> import rlzoo
    >>> from rlzoo.losses import PolicyLoss, PPOClip
    >>> loss_fn = PolicyLoss(surrogate=PPOClip(epsilon_high=0.28), ratio="sequence",
    ...                      aggregation="seq-mean-token-mean")
    >>> loss_fn.with_options(beta=0.04).required_fields()
    frozenset({'ref_logprobs'})

What changes which tokens and which old policy the stages see (rollout rejection, verl's bypass mode, AReaL's
proximal policy) is in :mod:`rlzoo.losses.off_policy`; how a loss is built from names and options, configs and
descriptions are in :mod:`rlzoo.losses.composition`.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.batch import LossOutput, Normalizer, PolicyBatch
from rlzoo.losses import composition, functional, off_policy
from rlzoo.losses.base import Aggregation, LossInputs, Metrics, Part
from rlzoo.losses.composition import SLOTS  # re-exported: rlzoo.losses.policy_loss.SLOTS
from rlzoo.losses.correction import Correction
from rlzoo.losses.functional import finite_exp, masked_max, masked_mean, masked_min, one_per_token, require
from rlzoo.losses.off_policy import PROX_LOGP_METHODS, Rejection, loglinear_proximal_logprobs
from rlzoo.losses.penalty import Penalty
from rlzoo.losses.surrogate import RatioLevel, Surrogate
from rlzoo.losses.weights import TokenWeight

__all__ = ["PROX_LOGP_METHODS", "SLOTS", "PolicyLoss", "loglinear_proximal_logprobs"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLoss:
    r"""A policy-optimization loss composed of registered parts, one per slot (the slots: :mod:`rlzoo.losses.base`).

    Pipeline, per token: ``keep = AND(rejection(x))`` (the loss mask loses the rejected tokens);
    ``log_w = ratio(x)``; ``rho = is_correction(x)``; ``l = surrogate(x)`` (times ``rho`` unless the surrogate
    folds it in); ``l *= weight`` for each token weight; ``l += term`` for each penalty; finally
    ``loss = aggregation(l, mask, normalizer)`` (plus the sum of the penalties that normalise themselves).

    Args:
        surrogate: a :class:`~rlzoo.losses.Surrogate` or its name in ``rlzoo.losses.surrogates``.
        ratio: a :class:`~rlzoo.losses.RatioLevel` or its name (``importance_sampling_level``): "token"
            (default), "sequence", "sequence_token", "geometric".
        aggregation: an :class:`~rlzoo.losses.Aggregation` or its name: "token-mean" (default), "token-sum",
            "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm".
        is_correction: a :class:`~rlzoo.losses.Correction` (e.g. :class:`~rlzoo.losses.ISCorrection`) or None.
        weights: :class:`~rlzoo.losses.TokenWeight` parts (e.g. :class:`~rlzoo.losses.OffPolicySequenceMask`).
        penalties: :class:`~rlzoo.losses.Penalty` parts (e.g. :class:`~rlzoo.losses.KLPenalty`).
        rejections: :class:`~rlzoo.losses.Rejection` parts (e.g. :class:`~rlzoo.losses.RolloutRejection`,
            ``rollout_rs``): their rejected tokens leave the loss mask and its counts (:meth:`loss_mask`).
        max_completion_length: > 0; needed by "seq-mean-token-sum-norm" (and accepted by every loss).
        bypass_mode: verl's bypass mode (default False): the sampler's log-probs are the old log-probs
            (``PolicyBatch.old_logprobs`` must be None, ``rollout_logprobs`` is required); rollout corrections
            compare the current policy (detached) with the sampler; rejected tokens leave the policy term only
            (the counts and the penalties keep them); an IS weight is applied only to a surrogate that ignores the
            ratio (``Surrogate.uses_ratio`` False, verl's ``loss_type="reinforce"``), and reported otherwise
            (``"ppo_clip"``).
        prox_logp_method: AReaL's name: "recompute" (default: ``old_logprobs`` as given are the proximal
            policy) or "loglinear" (``old_logprobs`` must be None; the proximal policy is approximated from
            ``rollout_logprobs``, the current policy, ``versions`` and ``current_version``:
            :func:`loglinear_proximal_logprobs`).
        name: optional label (the preset name), used in messages.

    Inactive optional parts (``beta=0``, ``top_entropy_quantile=1``, ``is_correction=None``...) are kept, with
    their options, but skipped when the loss runs, and left out of :meth:`parts`, :meth:`required_fields` and
    :meth:`describe`.

    Raises:
        UnknownNameError: an unknown part name (lists the valid ones).
        TypeError: a part in the wrong slot (a surrogate given as a token weight...).
        ValueError: invalid options, two parts of one class in a slot, an IS correction the surrogate
            cannot take, a non-bool bypass_mode, an unknown prox_logp_method, or bypass_mode with
            prox_logp_method="loglinear". (An aggregation that needs ``max_completion_length`` without it raises
            when called.)
    """

    surrogate: Surrogate | str
    ratio: RatioLevel | str = "token"
    aggregation: Aggregation | str = "token-mean"
    is_correction: Correction | None = None
    weights: tuple[TokenWeight, ...] = ()
    penalties: tuple[Penalty, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    max_completion_length: int | None = None
    bypass_mode: bool = False
    prox_logp_method: str = "recompute"
    name: str | None = None

    def __post_init__(self) -> None:
        composition.resolve(self)  # parts given by name become registered parts; options are validated

    # ------------------------------------------------------------------------------------------ the loss
    def __call__(self, batch: PolicyBatch, normalizer: Normalizer | None = None) -> LossOutput:
        """Compute the loss of one (micro-)batch.

        Args:
            batch: the :class:`~rlzoo.batch.PolicyBatch`.
            normalizer: counts of the whole optimizer-step batch (over :meth:`loss_mask`); default: this batch's
                own counts. Its IS weight sums are ignored unless :attr:`counts_is_weights`.

        Returns:
            :class:`~rlzoo.batch.LossOutput` with the 0-d loss and detached 0-d metrics.

        Raises:
            TypeError: ``batch`` is not a :class:`~rlzoo.PolicyBatch`.
            BatchError: a field this loss needs is None (names the field and the part needing it), or
                ``old_logprobs`` is given in bypass mode / with the log-linear proximal policy.
            ValueError: ``normalizer`` is not a :class:`~rlzoo.Normalizer`; the aggregation needs
                ``max_completion_length`` (or the normalizer's group counts, or a part its positive-token count)
                and the loss has none; a part returned other than one value per token (names the stage).
        """
        self.check_batch(batch, normalizer)
        if normalizer is not None and normalizer.is_weight_sum is not None and not self.counts_is_weights:
            # the IS weights' batch mean needs the current policy here (bypass, loglinear): this batch's
            normalizer = dataclasses.replace(normalizer, is_weight_sum=None, num_is_weights=None)
        if self.off_policy:  # rollout rejection, bypass mode, a proximal policy: off_policy.py
            return off_policy.policy_loss(self, batch, normalizer)
        if normalizer is None:
            normalizer = self.default_normalizer(batch, batch.completion_mask)
        x = LossInputs.from_batch(batch, normalizer=normalizer)
        log_weight, ratio_metrics = self.ratio(x)                     # 1. log w: token or sequence level
        is_weight, is_metrics = self.is_weight(x)                     # 2. rho = pi_old / pi_sampler, or None
        x = x.with_weights(log_weight, is_weight, per_sequence=self.ratio.per_sequence)
        per_token, policy_metrics = self.policy_term(x, is_weight)    # 3-4. surrogate (x rho) x token weights
        penalty, own, penalty_metrics = self.penalty_terms(x, per_token)  # 5. + KL, entropy, ...
        loss = self.aggregation(per_token + penalty, x.mask, normalizer, self.max_completion_length, x.group_index)
        metrics = {**ratio_metrics, **is_metrics, **policy_metrics, **penalty_metrics}
        return self.loss_output(loss + own, metrics, log_weight, policy=x, terms=x)  # 6. aggregated

    # ---------------------------------------------------------------------------------------- the stages
    def check_batch(self, batch: PolicyBatch, normalizer: Normalizer | None = None) -> None:
        """Raise before any stage runs when ``batch`` (and ``normalizer``) cannot be this loss's input.

        Raises:
            TypeError: ``batch`` is not a :class:`~rlzoo.PolicyBatch`.
            ValueError: ``normalizer`` is neither None nor a :class:`~rlzoo.Normalizer`.
            BatchError: a field this loss needs is None (names the field and the part needing it).
            ValueError: the aggregation needs ``max_completion_length`` and the loss has none.
        """
        if not isinstance(batch, PolicyBatch):
            raise TypeError(f"a loss takes a rlzoo.PolicyBatch, got {type(batch).__name__}")
        if normalizer is not None and not isinstance(normalizer, Normalizer):
            raise ValueError(f"normalizer must be a rlzoo.Normalizer (Normalizer.from_batch(batch, loss=loss)) or None, "
                            f"got {type(normalizer).__name__}")
        for field in sorted(self.required_fields()):
            if getattr(batch, field) is None:
                raise composition.missing_field(self, field)
        if self.max_completion_length is None and self.aggregation.needs_max_completion_length:
            raise ValueError(
                f"aggregation {self.aggregation.registered_name()!r} needs max_completion_length: "
                f"{f'get_loss({self.name!r}, ' if self.name else 'PolicyLoss(..., '}max_completion_length=...)"
            )

    @property
    def off_policy(self) -> bool:
        """True when a stage of :mod:`rlzoo.losses.off_policy` changes the tokens or the old policy the other
        stages see: an active rejection, ``bypass_mode``, or a proximal policy other than the recomputed one."""
        return self.bypass_mode or self.prox_logp_method != "recompute" or any(p.active for p in self.rejections)

    def default_normalizer(self, batch: PolicyBatch, counted: Bool[Tensor, "B T"]) -> Normalizer:
        """The counts of ``batch`` alone over its ``counted`` tokens (the normalizer of an unsplit batch)."""
        return Normalizer.from_masks(
            counted,
            group_index=[batch.group_index] if self.aggregation.needs_group_index else None,
            rewards=[batch.rewards] if batch.rewards is not None else None,
        )

    def is_weight(self, x: LossInputs) -> tuple[Float[Tensor, "B T"] | None, Metrics]:
        """The IS correction's detached weight ``rho`` and metrics; ``(None, {})`` without an active one."""
        if self.is_correction is None or not self.is_correction.active:
            return None, {}
        return self.is_correction(x)

    def policy_term(self, x: LossInputs, is_weight: Float[Tensor, "B T"] | None) -> tuple[Float[Tensor, "B T"], Metrics]:
        """The surrogate's per-token loss, times ``is_weight`` (unless the surrogate folds it in itself) and the
        active token weights, and their metrics. ``x`` carries the ratio level's weight."""
        per_token, metrics = self.surrogate(x)
        per_token = one_per_token(per_token, x.mask, f"surrogate {self.surrogate.label()!r}")
        metrics = dict(metrics)
        if is_weight is not None and not self.surrogate.folds_is_weight:
            per_token = functional.weighted(per_token, is_weight)
        for part in self.weights:
            if part.active:
                weight, part_metrics = part(x)
                per_token = functional.weighted(per_token, one_per_token(weight, x.mask, f"token weight {part.label()!r}"))
                metrics.update(part_metrics)
        return per_token, metrics

    def penalty_terms(
        self, x: LossInputs, like: Float[Tensor, "B T"]
    ) -> tuple[Float[Tensor, "B T"], Float[Tensor, ""], Metrics]:
        """The active penalties: the sum of those aggregated like the policy term (``Float[B, T]``, 0 without
        one), the sum over ``x.mask`` of those that normalise themselves (0-d), and their metrics. ``like``
        (the policy term) gives the dtype and device."""
        aggregated = torch.zeros_like(like)
        own = torch.zeros((), dtype=like.dtype, device=like.device)
        metrics: Metrics = {}
        for part in self.penalties:
            if part.active:
                term, part_metrics = part(x)
                term = one_per_token(term, x.mask, f"penalty {part.label()!r}")
                metrics.update(part_metrics)
                if type(part).aggregated:
                    aggregated = aggregated + term
                else:
                    own = own + torch.where(x.mask, term, torch.zeros_like(term)).sum()
        return aggregated, own, metrics

    def loss_output(self, loss: Float[Tensor, ""], metrics: Metrics, log_weight: Float[Tensor, "B T"], *,
               policy: LossInputs, terms: LossInputs) -> LossOutput:
        """The :class:`~rlzoo.LossOutput`: ``loss`` and the detached ``metrics``, with the ratio's statistics over
        the policy term's tokens (``ratio/mean``, ``ratio/min``, ``ratio/max``) and, with entropies, their mean
        over every term's tokens (``entropy``)."""
        with torch.no_grad():
            ratio = finite_exp(log_weight.detach())  # as the weight: never inf
            metrics["ratio/mean"] = masked_mean(ratio, policy.mask)
            metrics["ratio/min"] = masked_min(ratio, policy.mask)
            metrics["ratio/max"] = masked_max(ratio, policy.mask)
            if terms.entropies is not None:
                metrics["entropy"] = masked_mean(terms.entropies.detach(), terms.mask)
        return LossOutput(loss=loss, metrics={k: v.detach() for k, v in metrics.items()})

    # ----------------------------------------------------------------------------------------------- parts
    def all_parts(self) -> list[Part]:
        """Every part, active or not, in pipeline order."""
        out: list[Part] = [*self.rejections, self.ratio]
        if self.is_correction is not None:
            out.append(self.is_correction)
        return [*out, self.surrogate, *self.weights, *self.penalties, self.aggregation]

    def parts(self) -> list[Part]:
        """Every active part, in pipeline order (what runs)."""
        return [p for p in self.all_parts() if p.active]

    def required_fields(self) -> frozenset[str]:
        """Optional :class:`PolicyBatch` fields this loss needs (e.g. ``ref_logprobs`` when beta > 0)."""
        own = off_policy.required_fields(self) if self.off_policy else frozenset()
        return own.union(*(p.required_fields() for p in self.parts()))

    def needed_by(self, field: str) -> list[str]:
        """What needs the optional :class:`PolicyBatch` ``field``, for error messages of trainers that cannot fill
        it: the active parts, named by kind (``"its sampler/trainer IS correction is(...)"``, ``"its rollout
        rejection m2po(...)"``), and the loss's own options (``bypass_mode``, ``prox_logp_method``); ``[field]``
        when nothing is found."""
        uses = []
        for part in self.parts():
            if field in part.required_fields():
                kind = ("its sampler/trainer IS correction " if isinstance(part, Correction)
                        else "its rollout rejection " if isinstance(part, Rejection) else "")
                uses.append(kind + part.describe())
        if self.bypass_mode and field == "rollout_logprobs":
            uses.append("bypass_mode=True (the sampler's log-probs are the old policy)")
        if self.prox_logp_method != "recompute" and field in ("rollout_logprobs", "versions", "current_version"):
            uses.append(f"prox_logp_method={self.prox_logp_method!r}")
        return uses or [field]

    @property
    def batch_coupled(self) -> bool:
        """True when micro-batch splits change the loss even with the whole step's :class:`~rlzoo.Normalizer`
        (:meth:`coupled_parts`)."""
        return bool(self.coupled_parts())

    def coupled_parts(self, *, is_weight_sums: bool = True) -> list[Part]:
        """The active parts whose output at one token depends on other sequences of the batch the loss is called
        with (covariance top-k, entropy quantile, M2PO's mask), with an IS correction normalised over the batch
        (``rollout_is_batch_normalize``) when its mean is not the Normalizer's: when :attr:`counts_is_weights` is False
        (bypass mode or the log-linear proximal policy: the weights need the current policy), or when the caller's
        normalizer does not count :meth:`is_weight_sums` (``is_weight_sums=False``)."""
        return [p for p in self.parts() if p.couples_batch or (
            isinstance(p, Correction) and p.normalizes_over_batch and not (self.counts_is_weights and is_weight_sums))]

    @property
    def counts_is_weights(self) -> bool:
        """True when :meth:`is_weight_sums` counts something: the IS weights are normalised over the batch
        (``rollout_is_batch_normalize``) and depend only on the old and the sampler's log-probs, known before the
        forward pass (not in bypass mode, not with ``prox_logp_method="loglinear"``)."""
        return (not self.bypass_mode and self.prox_logp_method == "recompute" and self.is_correction is not None
                and self.is_correction.active and self.is_correction.normalizes_over_batch)

    def is_weight_sums(
        self,
        completion_mask: Bool[Tensor, "B T"],
        *,
        logprobs: Float[Tensor, "B T"] | None = None,
        old_logprobs: Float[Tensor, "B T"] | None = None,
        rollout_logprobs: Float[Tensor, "B T"] | None = None,
    ) -> Float[Tensor, "2"] | None:
        """``(sum, number)`` of this batch's IS weights before their batch normalisation, for
        :attr:`Normalizer.is_weight_sum <rlzoo.Normalizer.is_weight_sum>` / ``num_is_weights`` (summed over the
        micro-batches and ranks of the batch the weights are normalised over: the step's in
        :meth:`Normalizer.from_batch <rlzoo.Normalizer.from_batch>`, the whole generation batch's in the trainer),
        so that ``rollout_is_batch_normalize`` divides by that batch's mean weight, as verl divides by its training
        batch's. None unless :attr:`counts_is_weights`.

        Args:
            completion_mask: ``Bool[B, T]``, the tokens before any rejection (verl's IS weights read the response
                mask before its rejection).
            logprobs, old_logprobs, rollout_logprobs: ``Float[B, T]`` or None, as in :class:`PolicyBatch` (values
                at masked positions are ignored); ``logprobs`` are read only when ``old_logprobs`` is None
                (on-policy: the old policy is the current one, detached, as the loss and :meth:`loss_mask` read it).

        Raises:
            BatchError: ``old_logprobs`` or ``rollout_logprobs`` is None while the weights need them.
        """
        if not self.counts_is_weights:
            return None
        assert self.is_correction is not None  # counts_is_weights
        if old_logprobs is None and logprobs is not None:
            old_logprobs = logprobs.detach()
        old = require(old_logprobs, "old_logprobs", "rollout_is_batch_normalize (the batch's mean IS weight)")
        rollout = require(rollout_logprobs, "rollout_logprobs", "rollout_is_batch_normalize")
        batch = PolicyBatch(logprobs=old, old_logprobs=old, rollout_logprobs=rollout,
                            advantages=torch.zeros(old.shape[0], dtype=old.dtype, device=old.device),
                            completion_mask=completion_mask, check_values=False)  # the loss's own batch is checked
        return self.is_correction.batch_sums(LossInputs.from_batch(batch))

    def loss_mask(
        self,
        completion_mask: Bool[Tensor, "B T"],
        *,
        logprobs: Float[Tensor, "B T"] | None = None,
        old_logprobs: Float[Tensor, "B T"] | None = None,
        rollout_logprobs: Float[Tensor, "B T"] | None = None,
        versions: Int[Tensor, " B"] | Int[Tensor, "B T"] | None = None,
        current_version: int | None = None,
    ) -> Bool[Tensor, "B T"]:
        """The tokens this loss counts: ``completion_mask`` minus the tokens its rollout rejection drops.

        The counts of a split batch's :class:`~rlzoo.Normalizer` must be taken over these masks (verl's modified
        ``response_mask`` sets its ``batch_num_tokens``), so that micro-batch losses still sum to the full-batch
        loss: ``Normalizer.from_masks(*(loss_fn.loss_mask(m, old_logprobs=..., rollout_logprobs=...) for each
        micro-batch), group_index=[...])`` (plus ``is_weight_sums=[...]`` from :meth:`is_weight_sums` for
        ``rollout_is_batch_normalize``), or ``Normalizer.from_batch(*micro_batches, loss=loss_fn)``. Without an
        active rejection, and in bypass mode (where rejection acts on the policy term only, the counts unchanged,
        as verl's ``bypass_mode``), it is ``completion_mask`` itself. The rejection compares ``old_logprobs``
        with ``rollout_logprobs``, both known before the forward pass; ``logprobs`` are read only when
        ``old_logprobs`` is None (on-policy: the old policy is the current one) or for the log-linear proximal
        policy (with ``versions`` and ``current_version``). Values at masked positions are ignored. A batch-coupled
        rejection (M2PO's second-moment mask) judges the rows it is given: call it on the batch the loss is
        called on.

        Args:
            completion_mask: ``Bool[B, T]`` the tokens that count before rejection (the completion mask, minus
                whatever the caller masks itself).
            logprobs, old_logprobs, rollout_logprobs: ``Float[B, T]`` or None, as in :class:`PolicyBatch`.
            versions, current_version: as in :class:`PolicyBatch` (``prox_logp_method="loglinear"``).

        Returns:
            ``Bool[B, T]``, a subset of ``completion_mask`` (``completion_mask`` itself when nothing is rejected).

        Raises:
            BatchError: a field the rejection needs is None (naming it).
        """
        return off_policy.loss_mask(self, completion_mask, logprobs=logprobs, old_logprobs=old_logprobs,
                                    rollout_logprobs=rollout_logprobs, versions=versions,
                                    current_version=current_version)

    # ---------------------------------------------------------------------------------------------- options
    def options(self) -> dict[str, Any]:
        """Every keyword option of this loss and its current value (what :meth:`with_options` accepts)."""
        return composition.options(self)

    def with_options(self, **overrides: Any) -> "PolicyLoss":
        """A copy with keyword options changed (the field's standard names).

        Routing: ``importance_sampling_level`` / ``aggregation`` swap that part by name;
        ``max_completion_length``, ``bypass_mode`` and ``prox_logp_method`` are the loss's own; any other name
        sets that option on every part that has it (e.g. ``epsilon_high``), active or not, or adds the optional
        part that owns it (``beta`` adds a :class:`~rlzoo.losses.KLPenalty`, ``is_correction`` an
        :class:`~rlzoo.losses.ISCorrection`, ``rollout_is`` a :class:`~rlzoo.losses.RolloutCorrection`,
        ``rollout_rs`` a :class:`~rlzoo.losses.RolloutRejection`, ...). An option of a part that is inactive at
        the time is kept (``kl_estimator`` before ``beta``, ``is_max`` before ``is_correction``); an option of an
        absent optional part at that part's default adds nothing, so ``get_loss(name, **loss.options())`` is ``loss``.

        Warns:
            UserWarning: ``importance_sampling_level`` replaces a ratio level whose options no part of the new loss
                has (gmpo's clip lives in its ``geometric`` level); an option given is declared by two active parts
                (the ``geometric`` level's log-ratio clip and PPO's ratio clip are both ``epsilon_high``): it sets
                both.

        Raises:
            UnknownNameError: an option no part of this loss accepts; lists the valid options.
            ValueError: an invalid value (from the part's own validation); or options of two different parts
                of a one-part slot (TRL's ``is_correction`` and verl's ``rollout_is`` both configure the IS
                correction), given together or one while the other is configured; an option no part of this
                loss has that several registered optional parts declare (a part of your own reusing a name).
        """
        return composition.with_options(self, overrides)

    def to_config(self) -> dict[str, Any]:
        """JSON-able description (inactive parts included, with their options); :meth:`from_config` rebuilds
        an equal loss."""
        return composition.to_config(self)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "PolicyLoss":
        """Inverse of :meth:`to_config`.

        Raises:
            UnknownNameError: a part name that is not registered.
            ValueError: a missing or invalid entry.
        """
        return composition.from_config(cls, config)

    def describe(self) -> str:
        """One line per active part, as ``rlzoo explain`` prints them."""
        return composition.describe(self)

    @property
    def called(self) -> str:
        """How a message names this loss: ``loss 'dapo'``, or ``the loss`` for a composed one without a name."""
        return f"loss {self.name!r}" if self.name else "the loss"
