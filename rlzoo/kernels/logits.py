r"""Log-probs and entropies of chosen tokens from logits, without materializing ``log_softmax``.

Notation: ``N`` token positions (any leading ``*batch`` dims), ``V`` vocabulary. With
``z = logits / temperature``:

.. math::

    \log p(y) = z_y - \operatorname{logsumexp}(z), \qquad H = \operatorname{logsumexp}(z) - \sum_v p_v z_v

Both are computed in one streaming pass per row (online log-sum-exp), in float32 for
float16/bfloat16 inputs (float64 for float64), so the only ``[N, V]`` tensor ever allocated is the
gradient of the logits in backward. The same pass can also return the sum of squared probabilities
``sum_v p_v^2`` (verl's ``sum_pi_squared``; a statistic without gradient). On CUDA the pass is a Triton kernel; elsewhere it is torch over
row chunks of ``chunk_size`` rows.

Source: the log-softmax/gather identity as in TRL 1.16 ``trl.trainer.utils.selective_log_softmax`` and
``entropy_from_logits`` (same values; here exact in float32 for bf16 logits, with the entropy gradient);
online softmax: Milakov & Gimelshein (2018), arXiv:1805.02867.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.autograd.function import once_differentiable

from rlzoo.kernels import _tiles
from rlzoo.kernels._common import (
    Backend,
    KernelInputError,
    TokenLogProbs,
    TokenLogProbStats,
    check_chunk_size,
    check_finite_result,
    check_float,
    check_ids,
    check_positive,
    resolve_backend,
    result_tuple,
    row_layout,
    rows,
)

__all__ = [
    "entropy_from_logits",
    "logprobs_and_entropy_from_logits",
    "logprobs_from_logits",
    "sum_pi_squared_from_logits",
]

# Torch path: elements of one float32 row chunk (rows = max(1, budget // V)); measured in docs/benchmarks.md.
CPU_CHUNK_ELEMENTS = 1 << 21


def default_row_chunk(vocab: int) -> int:
    """Rows of logits per chunk of the torch path: ``max(1, 2**21 // V)`` (8 MiB of float32)."""
    return max(1, CPU_CHUNK_ELEMENTS // max(1, vocab))


class _LogitsFunction(torch.autograd.Function):
    """``(logits, ids) -> (logprob, entropy, sum_pi_squared)``; backward writes ``dL/dlogits`` one row chunk
    at a time. ``sum_pi_squared`` is never differentiable (nor the entropy when it was not asked for)."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, with_entropy, with_sum_sq, row_chunk, backend, interpret, check):
        ctx.set_materialize_grads(False)
        vocab = logits.shape[-1]
        cdt = _tiles.compute_dtype(logits.dtype)
        base, n, rpg, sg, sr = row_layout(logits)
        state = _tiles.init_state(n, cdt, logits.device)
        if backend == "triton":
            from rlzoo.kernels import _triton

            _triton.fold(base, rpg, sg, sr, n, vocab, 0, ids, state, scale=1.0, softcap=None,
                         temperature=temperature, with_entropy=with_entropy, with_sum_sq=with_sum_sq)
        else:
            zbuf = torch.empty(min(n, row_chunk) * vocab, dtype=cdt, device=logits.device)
            scratch = torch.empty_like(zbuf) if with_entropy else None
            for r0 in range(0, n, row_chunk):
                for i0, view in rows(base, r0, min(n, r0 + row_chunk), rpg):
                    k = view.shape[0]
                    z = zbuf[: k * vocab].view(k, vocab)
                    z.copy_(view)
                    _tiles.transform_(z, 1.0, None, temperature)
                    _tiles.fold_tile_(z, 0, ids[i0 : i0 + k], state[:, i0 : i0 + k], with_entropy=with_entropy,
                                      maybe_inf=True, scratch=scratch, with_sum_sq=with_sum_sq)
        logprob, entropy, sum_sq, m, log_s = _tiles.finish(state)
        if check:
            check_finite_result(m + log_s, ids, vocab, "logits")
        ctx.save_for_backward(logits, ids, m, log_s, entropy)
        ctx.cfg = (temperature, row_chunk, backend, interpret)
        # one call: each call replaces the set of non-differentiable outputs
        ctx.mark_non_differentiable(*((sum_sq,) if with_entropy else (sum_sq, entropy)))
        return logprob, entropy, sum_sq

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises, never wrong
    def backward(ctx, grad_logprob, grad_entropy, _grad_sum_sq):
        logits, ids, m, log_s, entropy = ctx.saved_tensors
        temperature, row_chunk, backend, _ = ctx.cfg
        if grad_logprob is None and grad_entropy is None:
            return (None,) * 9
        cdt = m.dtype
        gl = None if grad_logprob is None else grad_logprob.reshape(-1).to(cdt).contiguous()
        ge = None if grad_entropy is None else grad_entropy.reshape(-1).to(cdt).contiguous()
        vocab = logits.shape[-1]
        base, n, rpg, sg, sr = row_layout(logits)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        out = grad.view(-1, vocab)
        if backend == "triton":
            from rlzoo.kernels import _triton

            _triton.grad(base, rpg, sg, sr, out, vocab, n, vocab, 0, ids, m, log_s, entropy, gl, ge,
                         scale=1.0, softcap=None, temperature=temperature)
        else:
            zbuf = torch.empty(min(n, row_chunk) * vocab, dtype=cdt, device=logits.device)
            scratch = torch.empty_like(zbuf) if ge is not None else None
            for r0 in range(0, n, row_chunk):
                for i0, view in rows(base, r0, min(n, r0 + row_chunk), rpg):
                    k = view.shape[0]
                    sl = slice(i0, i0 + k)
                    z = zbuf[: k * vocab].view(k, vocab)
                    z.copy_(view)
                    _tiles.transform_(z, 1.0, None, temperature)
                    _tiles.grad_z_(z, 0, ids[sl], m[sl], log_s[sl], entropy[sl], None if gl is None else gl[sl],
                                   None if ge is None else ge[sl], maybe_inf=True, scratch=scratch,
                                   factor=1.0 / temperature)
                    out[sl].copy_(z)
        return grad, None, None, None, None, None, None, None, None


def _run(logits: Tensor, token_ids: Tensor | None, temperature: float, with_entropy: bool, with_sum_sq: bool,
         chunk_size: int | None, backend: str, check: bool) -> TokenLogProbs | TokenLogProbStats:
    check_float("logits", logits)
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise KernelInputError(f"logits must have shape [*batch, V] with V >= 1, got {tuple(logits.shape)}")
    check_positive("temperature", temperature)
    check_chunk_size(chunk_size)
    batch_shape = tuple(logits.shape[:-1])
    if token_ids is None:
        ids = torch.zeros(batch_shape, dtype=torch.int64, device=logits.device).reshape(-1)
    else:
        ids = check_ids(token_ids, batch_shape, logits.device, "logits")
    name, interpret = resolve_backend(backend, logits.device, logits.dtype)
    row_chunk = chunk_size if chunk_size is not None else default_row_chunk(logits.shape[-1])
    logprob, entropy, sum_sq = _LogitsFunction.apply(logits, ids, float(temperature), with_entropy, with_sum_sq,
                                                     row_chunk, name, interpret, check)
    return result_tuple(batch_shape, logprob, entropy if with_entropy else None, sum_sq if with_sum_sq else None)


def logprobs_from_logits(
    logits: Float[Tensor, "*batch V"],
    token_ids: Int[Tensor, "*batch"],
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    backend: Backend = "auto",
    check: bool = True,
) -> Float[Tensor, "*batch"]:
    """``log_softmax(logits / temperature)[token_ids]`` without materializing the log-softmax.

    Args:
        logits: ``Float[*batch, V]`` unnormalised scores (any float dtype; a sliced ``[B, T, V]`` view
            such as ``logits[:, :-1]`` is read without a copy). May hold -inf (masked vocabulary).
        token_ids: ``Int[*batch]``, the chosen tokens, each in ``[0, V)``.
        temperature: > 0; the logits are divided by it (as the sampler did).
        chunk_size: rows per chunk on the torch path (default ``2**21 // V``); ignored by Triton.
        backend: "auto" (Triton on CUDA when installed, else torch), "torch", or "triton" (on a CPU
            tensor: the Triton interpreter, for tests).
        check: check token ids and that every row's log-sum-exp is finite (one device sync).

    Returns:
        ``Float[*batch]`` log-probabilities in nats (<= 0); float32 for float16/bfloat16/float32 input,
        float64 for float64. Differentiable with respect to ``logits`` (the gradient has the logits' dtype).

    Raises:
        KernelInputError: (a ``ValueError``) naming the argument: non-tensor or non-float logits, V == 0,
            token_ids of the wrong shape/dtype/device or outside ``[0, V)``, temperature <= 0, a bad
            chunk_size or backend, or a row whose log-sum-exp is NaN/inf (NaN or +inf logits, or no
            finite logit) when ``check`` is True.

    Source: same values as TRL 1.16 ``selective_log_softmax``; online log-sum-exp (arXiv:1805.02867).

    Example:
        >>> import torch
        >>> from rlzoo.kernels import logprobs_from_logits
        >>> logits = torch.tensor([[2.0, 0.0, -1.0]])
        >>> lp = logprobs_from_logits(logits, torch.tensor([0]))
        >>> torch.allclose(lp, logits.log_softmax(-1)[:, 0])
        True
    """
    return _run(logits, token_ids, temperature, False, False, chunk_size, backend, check).logprobs


def entropy_from_logits(
    logits: Float[Tensor, "*batch V"],
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    backend: Backend = "auto",
    check: bool = True,
) -> Float[Tensor, "*batch"]:
    """Entropy ``-sum_v p_v log p_v`` of ``softmax(logits / temperature)`` per row, streaming.

    Args:
        logits: ``Float[*batch, V]``; may hold -inf (contributes 0, as ``0 log 0 = 0``).
        temperature: > 0.
        chunk_size, backend, check: as in :func:`logprobs_from_logits`.

    Returns:
        ``Float[*batch]`` entropies in nats, in ``[0, log V]``; float32 (float64 for float64 input).
        Differentiable: ``dH/dz_v = -p_v (log p_v + H)``.

    Raises:
        KernelInputError: as in :func:`logprobs_from_logits` (no token_ids here).

    Source: same values as TRL 1.16 ``entropy_from_logits`` (without its [N, V] log-softmax).

    Example:
        >>> import math, torch
        >>> from rlzoo.kernels import entropy_from_logits
        >>> round(float(entropy_from_logits(torch.zeros(4))), 6) == round(math.log(4), 6)
        True
    """
    return _run(logits, None, temperature, True, False, chunk_size, backend, check).entropy


def logprobs_and_entropy_from_logits(
    logits: Float[Tensor, "*batch V"],
    token_ids: Int[Tensor, "*batch"],
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    backend: Backend = "auto",
    check: bool = True,
    return_sum_pi_squared: bool = False,
) -> TokenLogProbs | TokenLogProbStats:
    """Both :func:`logprobs_from_logits` and :func:`entropy_from_logits` in a single pass over the logits.

    Args:
        logits, token_ids, temperature, chunk_size, backend, check: as in :func:`logprobs_from_logits`.
        return_sum_pi_squared: also return :func:`sum_pi_squared_from_logits` from the same pass (not
            differentiable); the result is then a :class:`TokenLogProbStats`.

    Returns:
        :class:`TokenLogProbs` ``(logprobs, entropy)``, each ``Float[*batch]`` (nats), both differentiable;
        with ``return_sum_pi_squared``, :class:`TokenLogProbStats` ``(logprobs, entropy, sum_pi_squared)``.

    Raises:
        KernelInputError: as in :func:`logprobs_from_logits`.

    Source: TRL 1.16 ``selective_log_softmax_and_entropy`` (same values); verl 0.9.1
    ``calculate_sum_pi_squared_from_logits`` for the sum of squared probabilities.

    Example:
        >>> import torch
        >>> from rlzoo.kernels import logprobs_and_entropy_from_logits
        >>> lp, ent = logprobs_and_entropy_from_logits(torch.zeros(2, 8), torch.tensor([1, 7]))
        >>> torch.allclose(lp, -ent)  # uniform: log p = -log V = -H
        True
    """
    return _run(logits, token_ids, temperature, True, return_sum_pi_squared, chunk_size, backend, check)


def sum_pi_squared_from_logits(
    logits: Float[Tensor, "*batch V"],
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    backend: Backend = "auto",
    check: bool = True,
) -> Float[Tensor, "*batch"]:
    r"""Sum of squared probabilities ``sum_v p_v^2`` of ``p = softmax(logits / temperature)`` per row, streaming.

    .. math::

        S = \sum_v p_v^2 = \exp\big(\operatorname{logsumexp}(2z) - 2\operatorname{logsumexp}(z)\big),
        \qquad z = \text{logits} / T

    The collision probability of the sampling distribution (``exp`` of minus its Renyi-2 entropy); verl's
    ``optimal_token_baseline`` uses it in its path-variance proxy ``w_t = 1 - 2 pi_t + S_t``.

    Args:
        logits: ``Float[*batch, V]``; may hold -inf (contributes 0).
        temperature: > 0; the logits are divided by it first (as verl's actor does before its Σπ²).
        chunk_size, backend, check: as in :func:`logprobs_from_logits`.

    Returns:
        ``Float[*batch]`` in ``[1/V, 1]`` (``1/V`` for uniform logits, 1 for a one-hot row); float32
        (float64 for float64 input). Not differentiable (a detached statistic: ``requires_grad`` is False).

    Raises:
        KernelInputError: as in :func:`logprobs_from_logits` (no token_ids here).

    Source: verl 0.9.1 ``verl.utils.torch_functional.calculate_sum_pi_squared_from_logits`` (same values,
    without its ``[N, V]`` temporaries), used by ``compute_optimal_token_baseline_advantage``.

    Example:
        >>> import torch
        >>> from rlzoo.kernels import sum_pi_squared_from_logits
        >>> sum_pi_squared_from_logits(torch.zeros(2, 4))  # uniform over 4: 4 * (1/4)^2
        tensor([0.2500, 0.2500])
    """
    return _run(logits, None, temperature, False, True, chunk_size, backend, check).sum_pi_squared
