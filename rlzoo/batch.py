"""The shared rollout / log-prob interface: :class:`PolicyBatch`, :class:`Normalizer`, :class:`LossOutput`.

Notation (used in every docstring of rlzoo):

* ``B`` - sequences (completions) in the batch; ``T`` - completion tokens per sequence (right padded);
* ``G`` - completions per prompt (``num_generations``); ``V`` - vocabulary; ``H`` - hidden size;
* ``r = exp(logprobs - old_logprobs)`` - the importance ratio pi_theta / pi_old.

Every tensor a loss sees is ``[B, T]`` (or ``[B]`` for sequence-level advantages); log-probs are natural-log
probabilities (nats), so they are <= 0 (up to rounding: :func:`logprob_tolerance`).
"""

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["BatchError", "LossMasker", "LossOutput", "Normalizer", "PolicyBatch", "logprob_tolerance"]

_TOKEN_FIELDS = ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies", "teacher_logprobs")
_LOGPROB_FIELDS = ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs", "teacher_logprobs")


def logprob_tolerance(dtype: torch.dtype) -> float:
    """How far above 0 a log-prob may be and still count as rounding, in nats: ``max(1e-5, 4 eps(dtype))``.

    A token of probability ~1 can come out slightly positive: vLLM's float32 log-probs (``logit - logsumexp``
    of logits in the tens, so +1e-7 .. +1e-6), or bf16 / fp16 arithmetic (a few ulps). :class:`PolicyBatch`
    accepts such values; the losses read ``logprobs`` and ``old_logprobs`` as ``min(x, 0)`` (the gradient
    passes), so a probability ``exp(logp)`` never exceeds 1, and use the reference and sampler log-probs,
    which enter only as log-ratios, as given. Larger positive values are a bug (probabilities or logits passed
    as log-probs) and raise.

    Args:
        dtype: a floating-point dtype.

    Returns:
        1e-5 for float32 and float64, 2^-8 (0.0039) for float16, 2^-5 (0.03125) for bfloat16.
    """
    return max(1e-5, 4.0 * torch.finfo(dtype).eps)


class BatchError(ValueError):
    """A :class:`PolicyBatch` or :class:`Normalizer` field is missing, mis-shaped, mis-typed or not finite.

    The message names the field and says what was expected.
    """


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class PolicyBatch:
    """One (micro-)batch of completions, as every loss of the zoo consumes it.

    Validated on construction: shapes agree, ``completion_mask`` is bool, the other tensors are floating
    point, every tensor is on the device of ``logprobs``, ``B >= 1`` and ``T >= 1``, and every value at a
    counted position (``completion_mask`` True) is finite, with log-probs <= 0 up to rounding
    (:func:`logprob_tolerance`: 1e-5 in float32 / float64, 2^-5 in bf16; the losses read such a current or
    old log-prob as 0).
    Values at masked positions are never read: they may be anything, NaN and inf included (padding is inert).

    Args:
        logprobs: ``Float[B, T]``, log pi_theta(o_t | q, o_<t) in nats; carries the gradient.
        advantages: ``Float[B]`` (one per sequence, broadcast over tokens) or ``Float[B, T]`` (per token).
        completion_mask: ``Bool[B, T]``; True on the completion tokens that count.
        old_logprobs: ``Float[B, T]`` or None; the policy that sampled the data, as scored by the trainer.
            None means on-policy: ``logprobs.detach()`` is used, so the ratio is exactly 1.
        ref_logprobs: ``Float[B, T]`` or None; the frozen reference policy; needed when ``beta > 0``.
        rollout_logprobs: ``Float[B, T]`` or None; the sampler's own log-probs (vLLM), for
            sampler/trainer importance-sampling correction and off-policy sequence masking.
        entropies: ``Float[B, T]`` or None; per-token entropy of pi_theta in nats (may carry a
            gradient); needed by the entropy bonus and the top-entropy-quantile mask.
        teacher_logprobs: ``Float[B, T]`` or None; a frozen teacher's log-probs of the sampled tokens (nats),
            scored at generation time; needed by on-policy distillation (``rlzoo.get_loss("opd")``).
        check_values: when True (default) check finiteness and the sign of log-probs at counted
            positions. This costs one device synchronisation; set False inside ``torch.compile``-d code
            or when the producer already guarantees it.
        group_index: ``Int[B]`` or None; the prompt (group of ``num_generations`` completions) each sequence
            answers, an id >= 0 shared by every micro-batch and rank of one optimizer step (ids index
            :attr:`Normalizer.group_num_tokens`); needed by ``aggregation="prompt-mean"``.
        rewards: ``Float[B]`` or None; each sequence's scalar reward. VAPO's positive-example NLL term
            (``positive_nll_coef``) treats a sequence with reward > 0 as positive (a correct answer).
        versions: ``Int[B]`` or ``Int[B, T]`` or None; the policy version that generated each sequence (or
            token), AReaL's ``versions``; needed by ``prox_logp_method="loglinear"``.
        current_version: int or None; the version of the policy being trained (AReaL's ``current_version``,
            the proximal policy is ``current_version - 1``); needed by ``prox_logp_method="loglinear"``.

    Raises:
        BatchError: naming the offending field: wrong type, dtype, shape or device (the message names both
            devices), ``B == 0`` or ``T == 0``, a non-bool mask, or a NaN/inf at a counted position, or a
            log-prob above 0 by more than the rounding tolerance there; a non-integer or negative
            ``group_index`` (of a sequence with a counted token), a NaN/inf reward of such a sequence, a
            non-integer ``versions`` or a ``current_version`` that is not an int.

    Example:
        >>> import torch, rlzoo
        >>> lp = -torch.rand(2, 3, dtype=torch.float64)
        >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
        ...                           completion_mask=torch.ones(2, 3, dtype=torch.bool))
        >>> batch.shape
        (2, 3)
    """

    logprobs: Float[Tensor, "B T"]
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"]
    completion_mask: Bool[Tensor, "B T"]
    old_logprobs: Float[Tensor, "B T"] | None = None
    ref_logprobs: Float[Tensor, "B T"] | None = None
    rollout_logprobs: Float[Tensor, "B T"] | None = None
    entropies: Float[Tensor, "B T"] | None = None
    teacher_logprobs: Float[Tensor, "B T"] | None = None
    check_values: bool = True
    # Inputs of the prompt-mean aggregation, VAPO's NLL term and AReaL's log-linear proximal policy (checked by
    # _check_structure_fields; kept apart from the log-prob fields above).
    group_index: Int[Tensor, " B"] | None = None
    rewards: Float[Tensor, " B"] | None = None
    versions: Int[Tensor, " B"] | Int[Tensor, "B T"] | None = None
    current_version: int | None = None

    def __post_init__(self) -> None:
        lp = self.logprobs
        if not isinstance(lp, Tensor):
            raise BatchError(f"logprobs must be a torch.Tensor of shape [B, T], got {type(lp).__name__}")
        if lp.ndim != 2:
            raise BatchError(f"logprobs must have shape [B, T] (2 dims), got shape {tuple(lp.shape)}")
        b, t = lp.shape
        if b < 1 or t < 1:
            raise BatchError(f"logprobs must have B >= 1 and T >= 1, got shape {tuple(lp.shape)}")
        mask = self.completion_mask
        if not isinstance(mask, Tensor):
            raise BatchError(f"completion_mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise BatchError(
                f"completion_mask must have dtype torch.bool (True = token counts), got {mask.dtype}; "
                "convert with completion_mask.bool()"
            )
        if tuple(mask.shape) != (b, t):
            raise BatchError(f"completion_mask must have shape {(b, t)} like logprobs, got {tuple(mask.shape)}")
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, Tensor):
                raise BatchError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")
            if not value.is_floating_point():
                raise BatchError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
            if tuple(value.shape) != (b, t):
                raise BatchError(f"{name} must have shape {(b, t)} like logprobs, got {tuple(value.shape)}")
            if value.device != lp.device:
                raise BatchError(f"{name} is on {value.device} but logprobs is on {lp.device}")
        if mask.device != lp.device:
            raise BatchError(f"completion_mask is on {mask.device} but logprobs is on {lp.device}")
        adv = self.advantages
        if not isinstance(adv, Tensor):
            raise BatchError(f"advantages must be a torch.Tensor, got {type(adv).__name__}")
        if not adv.is_floating_point():
            raise BatchError(f"advantages must be a floating-point tensor, got dtype {adv.dtype}")
        if tuple(adv.shape) not in ((b,), (b, t)):
            raise BatchError(
                f"advantages must have shape [B]={(b,)} (per sequence) or [B, T]={(b, t)} (per token), "
                f"got {tuple(adv.shape)}"
            )
        if adv.device != lp.device:
            raise BatchError(f"advantages is on {adv.device} but logprobs is on {lp.device}")
        self._check_structure_fields()
        if self.check_values:
            self._check_values()

    def _check_structure_fields(self) -> None:
        """Type, dtype, shape and device of ``group_index``, ``rewards``, ``versions``, ``current_version``."""
        b, t = self.shape
        device = self.logprobs.device
        for name, shapes, integer in (("group_index", ((b,),), True), ("rewards", ((b,),), False),
                                      ("versions", ((b,), (b, t)), True)):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, Tensor):
                raise BatchError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")
            kind = "an integer" if integer else "a floating-point"
            ok = (not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool) if integer \
                else value.is_floating_point()
            if not ok:
                raise BatchError(f"{name} must be {kind} tensor, got dtype {value.dtype}")
            if tuple(value.shape) not in shapes:
                want = " or ".join(str(s) for s in shapes)
                raise BatchError(f"{name} must have shape {want}, got {tuple(value.shape)}")
            if value.device != device:
                raise BatchError(f"{name} is on {value.device} but logprobs is on {device}")
        cv = self.current_version
        if cv is not None and (isinstance(cv, bool) or not isinstance(cv, int)):
            raise BatchError(f"current_version must be an int or None, got {type(cv).__name__} {cv!r}")

    def _check_values(self) -> None:
        """Raise if a counted position holds NaN/inf, or a log-prob > 0. One device sync in total."""
        mask = self.completion_mask
        checks: list[tuple[str, Tensor]] = []
        for name in _TOKEN_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            v = value.detach()
            bad = ~torch.isfinite(v)
            if name in _LOGPROB_FIELDS:
                bad = bad | (v > logprob_tolerance(v.dtype))
            checks.append((name, (bad & mask).any()))
        adv = self.advantages.detach()
        adv_mask = mask if adv.ndim == 2 else mask.any(dim=-1)
        checks.append(("advantages", (~torch.isfinite(adv) & adv_mask).any()))
        counted_rows = mask.any(dim=-1)
        if self.rewards is not None:
            checks.append(("rewards", (~torch.isfinite(self.rewards.detach()) & counted_rows).any()))
        if self.group_index is not None:
            checks.append(("group_index", ((self.group_index < 0) & counted_rows).any()))
        flags = torch.stack([flag for _, flag in checks]).cpu()
        if not bool(flags.any()):
            return
        for (name, _), flag in zip(checks, flags.tolist(), strict=True):
            if flag:
                value = getattr(self, name)
                if name == "group_index":
                    raise BatchError("group_index holds a negative id for a sequence with a counted token; ids are >= 0")
                what = "NaN/inf" if name in ("advantages", "entropies", "rewards") else (
                    f"NaN/inf or a log-prob above 0 beyond the rounding tolerance "
                    f"{logprob_tolerance(value.dtype):g} ({value.dtype})"
                )
                raise BatchError(
                    f"{name} holds {what} at a counted position (completion_mask True); "
                    "only masked positions may hold arbitrary values"
                )

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)``."""
        return (int(self.logprobs.shape[0]), int(self.logprobs.shape[1]))

    def split(self, micro_batch_size: int) -> list["PolicyBatch"]:
        """Split along ``B`` into micro-batches of at most ``micro_batch_size`` sequences (views, no copies).

        Raises:
            ValueError: if ``micro_batch_size < 1``.
        """
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        out = []
        for start in range(0, self.shape[0], micro_batch_size):
            sl = slice(start, start + micro_batch_size)
            fields = {
                f.name: (getattr(self, f.name)[sl] if isinstance(getattr(self, f.name), Tensor) else getattr(self, f.name))
                for f in dataclasses.fields(self)
            }
            fields["check_values"] = False  # the parent was already checked
            out.append(PolicyBatch(**fields))
        return out


def _check_count(name: str, value: float) -> None:
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise BatchError(f"Normalizer.{name} must be a finite number >= 0, got {value}")


def _as_count(name: str, value: "numbers.Real | Tensor") -> "float | Tensor":
    """``value`` as a float or a 0-d tensor, or a :class:`BatchError` naming ``Normalizer.<name>``.

    A tensor count is checked for its value (negative, NaN, inf) only on the CPU and outside
    ``torch.compile`` tracing: reading an accelerator tensor's value would be a device sync, and a
    data-dependent check a graph break. Its shape and dtype are checked everywhere.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise BatchError(f"Normalizer.{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        if value.dtype == torch.bool or value.is_complex():
            raise BatchError(f"Normalizer.{name} must be a real-valued count, got a {value.dtype} tensor")
        value = value.reshape(())
        if value.device.type == "cpu" and not torch.compiler.is_compiling():
            _check_count(name, value.detach().item())
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numbers.Real: numpy's scalars too
        raise BatchError(f"Normalizer.{name} must be a number or a 0-d tensor, got {type(value).__name__}")
    _check_count(name, value)
    return float(value)


@runtime_checkable
class LossMasker(Protocol):
    """What :meth:`Normalizer.from_batch` asks of a loss: the tokens it counts (:meth:`rlzoo.losses.PolicyLoss.loss_mask`);
    and, when the loss has it, ``is_weight_sums`` (:meth:`rlzoo.losses.PolicyLoss.is_weight_sums`: the sums of its
    batch-normalised IS weights)."""

    def loss_mask(
        self,
        completion_mask: Bool[Tensor, "B T"],
        *,
        logprobs: Float[Tensor, "B T"] | None = None,
        old_logprobs: Float[Tensor, "B T"] | None = None,
        rollout_logprobs: Float[Tensor, "B T"] | None = None,
        versions: Int[Tensor, " B"] | Int[Tensor, "B T"] | None = None,
        current_version: int | None = None,
    ) -> Bool[Tensor, "B T"]: ...


def _check_group_counts(value: object) -> Tensor | None:
    if value is None:
        return None
    if not isinstance(value, Tensor):
        raise BatchError(f"Normalizer.group_num_tokens must be a 1-D tensor or None, got {type(value).__name__}")
    if value.ndim != 1 or value.dtype == torch.bool or value.is_complex():
        raise BatchError(
            f"Normalizer.group_num_tokens must be a real 1-D tensor (counted tokens per group id), got a "
            f"{value.dtype} tensor of shape {tuple(value.shape)}"
        )
    if value.device.type == "cpu" and not torch.compiler.is_compiling():
        bad = ~torch.isfinite(value.detach().double()) | (value.detach() < 0)
        if bool(bad.any()):
            raise BatchError("Normalizer.group_num_tokens must hold finite counts >= 0")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Normalizer:
    """Counts of the whole optimizer-step batch, so that micro-batch losses sum to the full-batch loss.

    A loss called on a micro-batch divides by these global counts instead of the micro-batch's own, so
    ``sum(loss_fn(mb, normalizer=n).loss for mb in batch.split(k)) == loss_fn(batch).loss`` for every
    aggregation, in value and gradient. Under data parallelism with gradient averaging (DDP/FSDP),
    multiply each rank's loss by the world size. Every count is a sum over sequences, so the counts of
    micro-batches and of ranks add up (all-reduce each field with a sum).

    The counts are of the tokens the loss counts: the completion mask minus the tokens a rollout rejection
    removes (verl's modified response mask). Build them with :meth:`from_batch` (``loss=loss_fn``) or, before
    the forward pass, with :meth:`from_masks` over ``loss_fn.loss_mask(completion_mask, old_logprobs=...,
    rollout_logprobs=...)`` of every micro-batch (:meth:`rlzoo.losses.PolicyLoss.loss_mask`).

    Args:
        num_tokens: counted tokens (``completion_mask.sum()``) of the whole optimizer-step batch, finite and
            >= 0. Used by "token-mean". It is the divisor as given: at least the batch's own counted tokens for a
            loss that is the batch's share (not checked, which would synchronise the device on every call); 0
            is clamped to 1, so a batch without a counted token gives a loss of 0.
        num_sequences: the sequences of the whole optimizer-step batch, finite and >= 0; the divisor of the
            "seq-mean-*" aggregations. :meth:`from_masks` counts those with at least one counted token (a fully
            masked row is inert, as in verl's ``agg_loss`` without ``global_batch_info``); TRL's and verl's
            trainers, and ``rlzoo train``, count every row (a fully masked row adds 0 to the sum).
        group_num_tokens: ``Int[G]`` (or ``Float[G]``) or None; the counted tokens of each group (prompt) of the optimizer-step
            batch, indexed by :attr:`PolicyBatch.group_index`. Used by "prompt-mean"; groups with 0 counted
            tokens are inert (see :attr:`num_groups`).
        num_positive_tokens: counted tokens of the sequences with reward > 0 (:attr:`PolicyBatch.rewards`) in
            the optimizer-step batch, or None. VAPO's positive-example NLL term divides by it.
        is_weight_sum, num_is_weights: the sum of the rollout IS weights (before normalisation, >= 0) of the
            batch they are normalised over (the optimizer step's; in the trainer the whole generation batch's, verl's
            training batch) and their number (tokens of the completion masks, or sequences with a counted token
            for sequence-level weights), or both None. verl's ``rollout_is_batch_normalize`` divides the weights
            by ``is_weight_sum / num_is_weights``, the batch's mean weight, so that it does not depend on the
            micro-batch split; without them each call uses the mean of the batch it is given. Counted by
            :meth:`from_batch` / :meth:`from_masks` (``is_weight_sums``) from
            :meth:`rlzoo.losses.PolicyLoss.is_weight_sums`.

    A count is a Python number or a one-element tensor (kept as a 0-d tensor, on its device). The value of
    a tensor count is checked only when it is on the CPU (outside ``torch.compile`` tracing): checking a
    CUDA tensor's value would cost a device sync, so a negative, NaN or inf count on an accelerator is the
    caller's responsibility (:meth:`from_masks` counts are valid by construction).

    Raises:
        BatchError: naming the count: negative, NaN or inf (a number, or a tensor on the CPU), neither a
            number nor a real-valued tensor, or not a scalar (``group_num_tokens``: not a real 1-D tensor).
    """

    num_tokens: int | float | Tensor
    num_sequences: int | float | Tensor
    group_num_tokens: Int[Tensor, " G"] | Float[Tensor, " G"] | None = None
    num_positive_tokens: int | float | Tensor | None = None
    is_weight_sum: int | float | Tensor | None = None
    num_is_weights: int | float | Tensor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_tokens", _as_count("num_tokens", self.num_tokens))
        object.__setattr__(self, "num_sequences", _as_count("num_sequences", self.num_sequences))
        object.__setattr__(self, "group_num_tokens", _check_group_counts(self.group_num_tokens))
        for name in ("num_positive_tokens", "is_weight_sum", "num_is_weights"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _as_count(name, getattr(self, name)))
        if (self.is_weight_sum is None) != (self.num_is_weights is None):
            raise BatchError("Normalizer.is_weight_sum and Normalizer.num_is_weights go together: give both or neither")

    @property
    def num_groups(self) -> Int[Tensor, ""] | None:
        """Groups (prompts) with at least one counted token, a 0-d tensor; None without ``group_num_tokens``.

        A prompt whose completions are all masked is inert, as fully masked sequences are in the seq-mean
        aggregations (SkyRL's ``prompt_mean`` counts it in the number of prompts; see "prompt-mean").
        """
        if self.group_num_tokens is None:
            return None
        return (self.group_num_tokens > 0).sum()

    @classmethod
    def from_masks(
        cls,
        *masks: Bool[Tensor, "_ _"],
        group_index: Sequence[Int[Tensor, " _"]] | None = None,
        num_groups: int | None = None,
        rewards: Sequence[Float[Tensor, " _"]] | None = None,
        is_weight_sums: Sequence[Float[Tensor, "2"]] | None = None,
    ) -> "Normalizer":
        """Counts over one or more loss masks (e.g. all micro-batches of one optimizer step).

        Args:
            *masks: ``Bool[B_k, T_k]`` masks of the tokens the loss counts (the completion masks, or
                ``loss_fn.loss_mask(...)`` when the loss rejects tokens), all on one device (``B_k`` and
                ``T_k`` may differ).
            group_index: one ``Int[B_k]`` per mask, the group id of each row (:attr:`PolicyBatch.group_index`),
                to count :attr:`group_num_tokens` (for "prompt-mean"); None: not counted.
            num_groups: the length of ``group_num_tokens`` (> every id); default: the largest id + 1 (one
                device sync), refused above both the number of rows and 2**20 (ids are prompt indices, not
                labels). Under data parallelism pass the number of group ids of the whole step, so every
                rank's vector has the same length for the all-reduce.
            rewards: one ``Float[B_k]`` per mask (:attr:`PolicyBatch.rewards`), to count
                :attr:`num_positive_tokens` (tokens of rows with reward > 0); None: not counted.
            is_weight_sums: one ``Float[2]`` per mask, ``(sum, number)`` of its rollout IS weights
                (:meth:`rlzoo.losses.PolicyLoss.is_weight_sums`), summed into :attr:`is_weight_sum` and
                :attr:`num_is_weights`; None: not counted.

        Returns:
            A :class:`Normalizer` holding 0-d tensors (and ``group_num_tokens``) on the masks' device.

        Raises:
            ValueError: if no mask is given.
            BatchError: naming the mask's position if one is not a tensor, not ``torch.bool``, not 2-D, or
                on another device than the first; naming ``group_index`` / ``rewards`` / ``is_weight_sums`` when
                their number or a shape does not match the masks, or an id of a counted row is negative or >=
                num_groups, or (num_groups not given) the largest id exceeds both the rows and 2**20.
        """
        if not masks:
            raise ValueError("Normalizer.from_masks needs at least one completion mask")
        for i, m in enumerate(masks):
            if not isinstance(m, Tensor):
                raise BatchError(
                    f"Normalizer.from_masks: mask {i} must be a torch.Tensor, got {type(m).__name__}"
                )
            if m.dtype != torch.bool:
                raise BatchError(
                    f"Normalizer.from_masks: mask {i} must have dtype torch.bool (True = token counts), got "
                    f"{m.dtype}; convert with mask.bool()"
                )
            if m.ndim != 2:
                raise BatchError(
                    f"Normalizer.from_masks: mask {i} must have shape [B, T] (2 dims), got {tuple(m.shape)}"
                )
            if m.device != masks[0].device:
                raise BatchError(
                    f"Normalizer.from_masks: mask {i} is on {m.device} but mask 0 is on {masks[0].device}"
                )
        for name, per_row in (("group_index", group_index), ("rewards", rewards)):
            if per_row is None:
                continue
            if len(per_row) != len(masks):
                raise BatchError(f"Normalizer.from_masks: {name} needs one tensor per mask ({len(masks)}), "
                                 f"got {len(per_row)}")
            for i, (m, v) in enumerate(zip(masks, per_row, strict=True)):
                if not isinstance(v, Tensor) or tuple(v.shape) != (m.shape[0],):
                    shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                    raise BatchError(f"Normalizer.from_masks: {name} {i} must be a tensor of shape "
                                     f"{(m.shape[0],)} (one per row of mask {i}), got {shape}")
        num_tokens = sum(m.sum() for m in masks)
        num_sequences = sum(m.any(dim=-1).sum() for m in masks)
        group_num_tokens = None
        if group_index is not None:
            group_num_tokens = _group_token_counts(masks, group_index, num_groups)
        num_positive_tokens = None
        if rewards is not None:
            num_positive_tokens = sum((m & (r > 0).unsqueeze(-1).to(m.device)).sum()
                                      for m, r in zip(masks, rewards, strict=True))
        is_weight_sum = num_is_weights = None
        if is_weight_sums is not None:
            if len(is_weight_sums) != len(masks) or any(tuple(w.shape) != (2,) for w in is_weight_sums):
                raise BatchError(f"Normalizer.from_masks: is_weight_sums needs one (sum, number) tensor of shape "
                                 f"(2,) per mask ({len(masks)})")
            is_weight_sum, num_is_weights = sum(w.to(masks[0].device) for w in is_weight_sums).unbind()
        return cls(num_tokens=num_tokens, num_sequences=num_sequences, group_num_tokens=group_num_tokens,
                   num_positive_tokens=num_positive_tokens, is_weight_sum=is_weight_sum, num_is_weights=num_is_weights)

    @classmethod
    def from_batch(cls, *batches: PolicyBatch, loss: LossMasker | None = None) -> "Normalizer":
        """The counts of ``batches`` (one batch: what a loss uses when no normalizer is given).

        Args:
            *batches: one or more :class:`PolicyBatch` (e.g. every micro-batch of an optimizer step).
            loss: the loss the counts are for; its :meth:`~rlzoo.losses.PolicyLoss.loss_mask` removes the tokens
                its rollout rejection drops (verl's modified response mask), its
                :meth:`~rlzoo.losses.PolicyLoss.is_weight_sums` give the IS weights' batch mean
                (``rollout_is_batch_normalize``). None: the completion masks. Pass it whenever the loss has a
                rejection part (``rollout_rs``, ``m2_threshold``) or normalises its IS weights over the batch.

        ``group_num_tokens`` is counted when every batch has ``group_index`` (one device sync for the number of
        group ids), ``num_positive_tokens`` when every batch has ``rewards``.

        Raises:
            ValueError: if no batch is given.
            ValueError: ``loss`` has no ``loss_mask`` (names its type; for a wrapper of a loss in ``.loss``, such as
                rlzoo.compat.trl's TRLGRPOLoss, which counts as TRL does, says what to pass instead).
        """
        if not batches:
            raise ValueError("Normalizer.from_batch needs at least one PolicyBatch")
        if loss is not None and not callable(getattr(loss, "loss_mask", None)):
            raise ValueError(
                f"Normalizer.from_batch: loss must be an rlzoo PolicyLoss (it has loss_mask), got {type(loss).__name__}"
                + ("; it wraps one in .loss: from_batch(..., loss=loss_fn.loss) (rlzoo.compat.trl's TRLGRPOLoss, "
                   "if it is one, itself counts as TRL does, every row: Normalizer(num_tokens=mask.sum(), num_sequences=B) over the "
                   "step's micro-batches)" if callable(getattr(getattr(loss, "loss", None), "loss_mask", None)) else "")
            )
        if loss is None:
            masks = [b.completion_mask for b in batches]
        else:
            masks = [loss.loss_mask(b.completion_mask, logprobs=b.logprobs, old_logprobs=b.old_logprobs,
                                    rollout_logprobs=b.rollout_logprobs, versions=b.versions,
                                    current_version=b.current_version) for b in batches]
        groups = [b.group_index for b in batches]
        rewards = [b.rewards for b in batches]
        counter = getattr(loss, "is_weight_sums", None)  # optional for a LossMasker (PolicyLoss has it)
        sums = [] if counter is None else [counter(b.completion_mask, logprobs=b.logprobs, old_logprobs=b.old_logprobs,
                                                   rollout_logprobs=b.rollout_logprobs) for b in batches]
        return cls.from_masks(
            *masks,
            group_index=groups if all(g is not None for g in groups) else None,
            rewards=rewards if all(r is not None for r in rewards) else None,
            is_weight_sums=sums if sums and all(w is not None for w in sums) else None,
        )


_MAX_DERIVED_GROUPS = 1 << 20
"""The most group ids :meth:`Normalizer.from_masks` derives from the largest id without ``num_groups`` (a vector of
8 MiB); a larger id than this and than the number of rows is a label, not a prompt index (10**12 allocated 8 TB)."""


def _group_token_counts(masks: Sequence[Tensor], group_index: Sequence[Tensor], num_groups: int | None) -> Tensor:
    """``Int[G]``: counted tokens per group id over every mask (rows without a counted token are skipped)."""
    device = masks[0].device
    lengths = [m.sum(dim=-1) for m in masks]
    ids = [torch.where(n > 0, g.to(device).long(), torch.zeros((), dtype=torch.long, device=device))
           for n, g in zip(lengths, group_index, strict=True)]
    if num_groups is None:
        num_groups = int(max(int(i.max()) if i.numel() else -1 for i in ids)) + 1
        rows = sum(int(m.shape[0]) for m in masks)
        if num_groups > max(rows, _MAX_DERIVED_GROUPS):  # a vector of num_groups counts is allocated
            raise BatchError(
                f"Normalizer.from_masks: group_index holds id {num_groups - 1} for {rows} rows; ids number the "
                "step's prompts from 0 (dense ids of arbitrary labels such as verl's uids: "
                "torch.unique(uids, return_inverse=True)[1]), or pass num_groups"
            )
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise BatchError(f"Normalizer.from_masks: num_groups must be an int >= 0, got {num_groups!r}")
    counts = torch.zeros(num_groups, dtype=torch.long, device=device)
    for i, n in zip(ids, lengths, strict=True):
        if i.numel() and device.type == "cpu" and not torch.compiler.is_compiling():
            counted = n > 0
            if bool(((i < 0) & counted).any()) or bool(((i >= num_groups) & counted).any()):
                raise BatchError(f"Normalizer.from_masks: group_index holds an id outside [0, {num_groups}) "
                                 "for a row with a counted token")
        if num_groups:
            counts = counts.index_add(0, i, n.to(counts.dtype))
    return counts


@dataclasses.dataclass(frozen=True)
class LossOutput:
    """What every loss returns.

    Attributes:
        loss: 0-d tensor, differentiable with respect to ``PolicyBatch.logprobs`` (and ``entropies``
            when an entropy term is used).
        metrics: detached 0-d tensors keyed by TRL's metric names (``clip_ratio/low_mean``, ``kl``,
            ``entropy``, ``ratio/mean``, ...). No ``.item()`` happens inside a loss: call it when logging.
        metric_tokens: for the metrics taken over other tokens than the batch's ``completion_mask``, the number of
            those tokens (0-d tensors; empty by default: every metric is over the completion tokens). Under a
            rollout rejection the policy term's metrics (``ratio/*``, ``clip_ratio/*``, ...) are over the tokens it
            keeps, the rejection's and the IS correction's (``rollout_corr/*``) over every completion token. Who
            merges the metrics of several micro-batches weights a mean by these counts and skips a micro-batch's
            extremes where its count is 0 (the loss reports a placeholder 0 there), as ``rlzoo train`` does.
    """

    loss: Float[Tensor, ""]
    metrics: Mapping[str, Tensor]
    metric_tokens: Mapping[str, Tensor] = dataclasses.field(default_factory=dict)
