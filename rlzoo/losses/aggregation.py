r"""Aggregations: per-token loss ``[B, T]`` -> scalar, with explicit global denominators.

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
=========================  ==========================================================  =====================

Counts of 0 are clamped to 1 (an all-masked batch has loss 0).
"""

import dataclasses
from typing import ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import Normalizer
from rlzoo.losses._core import Part, aggregations

__all__ = ["SeqMeanTokenMean", "SeqMeanTokenSum", "SeqMeanTokenSumNorm", "TokenMean", "TokenSum"]


def _at_least_one(count: float | Tensor) -> float | Tensor:
    return count.clamp(min=1) if isinstance(count, Tensor) else max(float(count), 1.0)


def _masked(loss: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))


class _Aggregation(Part):
    registry: ClassVar = aggregations
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
            max_completion_length: needed by "seq-mean-token-sum-norm" only.

        Returns:
            0-d tensor.
        """
        return self._reduce(_masked(loss, mask), mask, normalizer, max_completion_length)

    def _reduce(self, loss: Tensor, mask: Tensor, normalizer: Normalizer, max_completion_length: int | None) -> Tensor:
        raise NotImplementedError  # pragma: no cover


@aggregations.register("token-mean")
@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenMean(_Aggregation):
    """Mean over every counted token of the optimizer-step batch: ``sum_it m l / N``.

    DAPO's normalisation: Yu et al. 2025, "DAPO", arXiv:2503.14476, the objective of sec. 3 and the
    token-level policy-gradient loss of sec. 3.3, eq. (12). verl ``loss_agg_mode="token-mean"``; TRL 1.16
    ``loss_type="dapo"``/``"bnpo"``/``"cispo"`` (with the token count of the optimizer-step batch here).
    """

    def _reduce(self, loss, mask, normalizer, max_completion_length):
        return loss.sum() / _at_least_one(normalizer.num_tokens)


@aggregations.register("token-sum")
@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenSum(_Aggregation):
    """Sum over counted tokens: ``sum_it m l`` (no normalisation; the learning rate absorbs the scale).

    verl ``loss_agg_mode="token-sum"``. Does not read the normalizer: micro-batch sums add up to the
    full-batch sum as they are.
    """

    def _reduce(self, loss, mask, normalizer, max_completion_length):
        return loss.sum()


@aggregations.register("seq-mean-token-mean")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SeqMeanTokenMean(_Aggregation):
    """Mean over sequences of each sequence's token mean: ``(1/S) sum_i (1/n_i) sum_t m l``.

    GRPO's objective: Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. (3) (``1/G sum_i 1/|o_i|
    sum_t``). verl ``loss_agg_mode="seq-mean-token-mean"``; TRL 1.16 ``loss_type="grpo"``/``"sapo"`` (with
    ``S`` the sequences of the optimizer-step batch here).
    """

    def _reduce(self, loss, mask, normalizer, max_completion_length):
        per_seq = loss.sum(-1) / mask.sum(-1).clamp(min=1).to(loss.dtype)
        return per_seq.sum() / _at_least_one(normalizer.num_sequences)


@aggregations.register("seq-mean-token-sum")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SeqMeanTokenSum(_Aggregation):
    """Mean over sequences of each sequence's token sum: ``(1/S) sum_i sum_t m l``.

    verl ``loss_agg_mode="seq-mean-token-sum"``; TRL 1.16 ``loss_type="luspo"``, LUSPO's length-weighted
    sequence loss (Liu et al. 2026, arXiv:2602.05261; the ``luspo`` preset). Like
    :class:`SeqMeanTokenSumNorm` without the constant divisor, so the loss scale grows with the length.
    """

    def _reduce(self, loss, mask, normalizer, max_completion_length):
        return loss.sum() / _at_least_one(normalizer.num_sequences)


@aggregations.register("seq-mean-token-sum-norm")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SeqMeanTokenSumNorm(_Aggregation):
    """Token sum over sequences / (sequences * max_completion_length): Dr. GRPO's constant normaliser.

    Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783, eq. (3). Needs the loss's
    ``max_completion_length`` (a constant, so that the result does not depend on how the batch was padded;
    verl falls back to the padded length T).
    """

    needs_max_completion_length: ClassVar[bool] = True

    def _reduce(self, loss, mask, normalizer, max_completion_length):
        if max_completion_length is None:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs max_completion_length")
        total = loss.sum()
        return total / (_at_least_one(normalizer.num_sequences) * float(max_completion_length))
