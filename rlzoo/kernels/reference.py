"""The materializing reference: full logits -> log_softmax -> gather (the "naive" path).

This is what a trainer does without rlzoo.kernels, and the oracle the kernels are tested against
(in float64) and benchmarked against. It allocates ``[N, V]`` logits, their log-softmax and, in
backward, the same again: use :func:`~rlzoo.kernels.fused_linear_logprobs` in training.
"""

from jaxtyping import Float, Int
from torch import Tensor

from rlzoo.kernels._common import TokenLogProbs, TokenLogProbStats, result_tuple
from rlzoo.kernels._tiles import compute_dtype
from rlzoo.kernels.lm_head import LMHeadSpec

__all__ = ["naive_linear_logprobs", "naive_logprobs"]


def naive_logprobs(
    logits: Float[Tensor, "*batch V"],
    token_ids: Int[Tensor, "*batch"],
    temperature: float = 1.0,
    *,
    return_entropy: bool = False,
    return_sum_pi_squared: bool = False,
) -> TokenLogProbs | TokenLogProbStats:
    """``log_softmax(logits / temperature)`` gathered at ``token_ids`` (and ``-sum p log p``), materialized.

    Args:
        logits: ``Float[*batch, V]``; float16/bfloat16 are upcast to float32 first (a full copy).
        token_ids: ``Int[*batch]`` in ``[0, V)``.
        temperature: > 0 (not checked: this is the reference).
        return_entropy: also return the entropy.
        return_sum_pi_squared: also return ``sum_v p_v^2`` (computed as ``(p * p).sum(-1)``, no grad).

    Returns:
        :class:`~rlzoo.kernels.TokenLogProbs` of ``Float[*batch]`` tensors (nats), entropy None unless asked;
        :class:`~rlzoo.kernels.TokenLogProbStats` with ``return_sum_pi_squared``.

    Raises:
        RuntimeError: from ``torch.gather`` for out-of-range ids (no checks here).

    Source: TRL 1.16 ``selective_log_softmax`` docstring ("equivalent to the naive implementation").

    Example:
        >>> import torch
        >>> from rlzoo.kernels.reference import naive_logprobs
        >>> naive_logprobs(torch.zeros(1, 4), torch.tensor([2])).logprobs
        tensor([-1.3863])
    """
    z = logits.to(compute_dtype(logits.dtype))
    if temperature != 1.0:
        z = z / temperature
    logp = z.log_softmax(dim=-1)
    lp = logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if return_entropy else None
    sum_sq = logp.detach().exp().square().sum(-1) if return_sum_pi_squared else None
    return result_tuple(tuple(lp.shape), lp, ent, sum_sq)


def naive_linear_logprobs(
    hidden: Float[Tensor, "*batch H"],
    weight: Float[Tensor, "V H"],
    token_ids: Int[Tensor, "*batch"],
    *,
    temperature: float = 1.0,
    return_entropy: bool = True,
    return_sum_pi_squared: bool = False,
    bias: Float[Tensor, " V"] | None = None,
    logit_scale: float | None = None,
    logit_softcap: float | None = None,
) -> TokenLogProbs | TokenLogProbStats:
    """Full logits ``lm_head(hidden)`` then :func:`naive_logprobs`: the reference for ``fused_linear_logprobs``.

    Args:
        hidden, weight, token_ids, temperature, return_entropy, return_sum_pi_squared, bias, logit_scale,
            logit_softcap: as in :func:`~rlzoo.kernels.fused_linear_logprobs`.

    Returns:
        :class:`~rlzoo.kernels.TokenLogProbs` ``(logprobs, entropy)``, ``Float[*batch]`` each (nats);
        :class:`~rlzoo.kernels.TokenLogProbStats` with ``return_sum_pi_squared``.

    Raises:
        RuntimeError: from torch for mismatched shapes (no checks here).

    Example:
        >>> import torch
        >>> from rlzoo.kernels.reference import naive_linear_logprobs
        >>> lp, ent = naive_linear_logprobs(torch.zeros(2, 3), torch.ones(5, 3), torch.tensor([0, 4]))
        >>> torch.allclose(lp, -ent)
        True
    """
    logits = LMHeadSpec(weight=weight, bias=bias, logit_scale=logit_scale, logit_softcap=logit_softcap).logits(hidden)
    return naive_logprobs(logits, token_ids, temperature, return_entropy=return_entropy,
                          return_sum_pi_squared=return_sum_pi_squared)
