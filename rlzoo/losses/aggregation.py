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

from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import Normalizer
from rlzoo.losses.base import Aggregation

__all__ = ["SeqMeanTokenMean", "SeqMeanTokenSum", "SeqMeanTokenSumNorm", "TokenMean", "TokenSum"]


def _at_least_one(count: float | Tensor) -> float | Tensor:
    return count.clamp(min=1) if isinstance(count, Tensor) else max(float(count), 1.0)


class TokenMean(Aggregation, name="token-mean"):
    """Mean over every counted token of the optimizer-step batch: ``sum_it m l / N``.

    DAPO's normalisation: Yu et al. 2025, "DAPO", arXiv:2503.14476, the objective of sec. 3 and the
    token-level policy-gradient loss of sec. 3.3, eq. (12). verl ``loss_agg_mode="token-mean"``; TRL 1.16
    ``loss_type="dapo"``/``"bnpo"``/``"cispo"`` (with the token count of the optimizer-step batch here).
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None) -> Float[Tensor, ""]:
        return loss.sum() / _at_least_one(normalizer.num_tokens)


class TokenSum(Aggregation, name="token-sum"):
    """Sum over counted tokens: ``sum_it m l`` (no normalisation; the learning rate absorbs the scale).

    verl ``loss_agg_mode="token-sum"``. Does not read the normalizer: micro-batch sums add up to the
    full-batch sum as they are.
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None) -> Float[Tensor, ""]:
        return loss.sum()


class SeqMeanTokenMean(Aggregation, name="seq-mean-token-mean"):
    """Mean over sequences of each sequence's token mean: ``(1/S) sum_i (1/n_i) sum_t m l``.

    GRPO's objective: Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. (3) (``1/G sum_i 1/|o_i|
    sum_t``). verl ``loss_agg_mode="seq-mean-token-mean"``; TRL 1.16 ``loss_type="grpo"``/``"sapo"`` (with
    ``S`` the sequences of the optimizer-step batch here).
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None) -> Float[Tensor, ""]:
        per_seq = loss.sum(-1) / mask.sum(-1).clamp(min=1).to(loss.dtype)
        return per_seq.sum() / _at_least_one(normalizer.num_sequences)


class SeqMeanTokenSum(Aggregation, name="seq-mean-token-sum"):
    """Mean over sequences of each sequence's token sum: ``(1/S) sum_i sum_t m l``.

    verl ``loss_agg_mode="seq-mean-token-sum"``; TRL 1.16 ``loss_type="luspo"``, LUSPO's length-weighted
    sequence loss (Liu et al. 2026, arXiv:2602.05261; the ``luspo`` preset). Like
    :class:`SeqMeanTokenSumNorm` without the constant divisor, so the loss scale grows with the length.
    """

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None) -> Float[Tensor, ""]:
        return loss.sum() / _at_least_one(normalizer.num_sequences)


class SeqMeanTokenSumNorm(Aggregation, name="seq-mean-token-sum-norm"):
    """Token sum over sequences / (sequences * max_completion_length): Dr. GRPO's constant normaliser.

    Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783, eq. (3). Needs the loss's
    ``max_completion_length`` (a constant, so that the result does not depend on how the batch was padded;
    verl falls back to the padded length T).
    """

    needs_max_completion_length = True

    def reduce(self, loss: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], normalizer: Normalizer,
               max_completion_length: int | None) -> Float[Tensor, ""]:
        assert max_completion_length is not None  # Aggregation.__call__ checked it
        total = loss.sum()
        return total / (_at_least_one(normalizer.num_sequences) * float(max_completion_length))
