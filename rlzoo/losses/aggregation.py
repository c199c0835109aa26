r"""Aggregations (slot :class:`Aggregation`): per-token loss ``[B, T]`` -> scalar, with explicit global denominators.

Every aggregation divides by counts from a :class:`~rlzoo.batch.Normalizer` (of the whole optimizer-step
batch), never by the micro-batch's own, so summing micro-batch losses gives the full-batch loss exactly.
Names are verl's ``loss_agg_mode`` values. With ``l`` the per-token loss, ``m`` the mask,
``n_i = sum_t m_it``, ``N = sum_i n_i`` and ``S`` the sequences with ``n_i > 0``:

=========================  ==========================================================  =====================
name                       value                                                       TRL loss_type
=========================  ==========================================================  =====================
token-mean                 sum_it m l / N                                              dapo, bnpo, cispo
token-sum                  sum_it m l                                                  -
seq-mean-token-mean        (1/S) sum_i (1/n_i) sum_t m l                               grpo, sapo
seq-mean-token-sum         (1/S) sum_i sum_t m l                                       luspo
seq-mean-token-sum-norm    (1/S) sum_i sum_t m l / max_completion_length               dr_grpo
prompt-mean                (1/P) sum_g (1/N_g) sum_{i in g} sum_t m l                  - (SkyRL prompt_mean)
=========================  ==========================================================  =====================

For "prompt-mean", ``g`` runs over the groups (prompts: ``PolicyBatch.group_index``), ``N_g`` is the counted
tokens of group ``g`` in the optimizer-step batch and ``P`` the groups with ``N_g > 0``
(``Normalizer.group_num_tokens``, :attr:`~rlzoo.Normalizer.num_groups`).

Counts of 0 are clamped to 1 (an all-masked batch has loss 0).
"""

import abc
from typing import ClassVar

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlzoo.batch import Normalizer
from rlzoo.losses.base import Part
from rlzoo.registry import Registry

__all__ = [
    "Aggregation",
    "PromptMean",
    "SeqMeanTokenMean",
    "SeqMeanTokenSum",
    "SeqMeanTokenSumNorm",
    "TokenMean",
    "TokenSum",
    "aggregations",
]

aggregations: Registry[type["Aggregation"]] = Registry("aggregation")


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
