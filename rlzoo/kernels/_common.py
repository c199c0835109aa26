"""Private helpers of rlzoo.kernels: argument checks, backend choice, row layouts, the result type."""

import functools
import importlib.util
import math
import warnings
from typing import Literal, NamedTuple

import torch
from torch import Tensor

Backend = Literal["auto", "torch", "triton"]
BACKENDS = ("auto", "torch", "triton")

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class TokenLogProbs(NamedTuple):
    """Per-token log-probabilities and entropies (a named pair: ``logprobs, entropy = result``).

    Attributes:
        logprobs: ``Float[*batch]``, ``log softmax(z)[token_id]`` in nats (<= 0).
        entropy: ``Float[*batch]``, ``-sum_v p_v log p_v`` in nats (in ``[0, log V]``), or None when
            it was not requested.
    """

    logprobs: Tensor
    entropy: Tensor | None


class TokenLogProbStats(NamedTuple):
    """Per-token log-probabilities, entropies and sums of squared probabilities (``return_sum_pi_squared=True``).

    Attributes:
        logprobs: ``Float[*batch]``, ``log softmax(z)[token_id]`` in nats (<= 0).
        entropy: ``Float[*batch]``, ``-sum_v p_v log p_v`` in nats, or None when it was not requested.
        sum_pi_squared: ``Float[*batch]``, ``sum_v p_v^2`` in ``[1/V, 1]`` (verl's ``sum_pi_squared``; the
            collision probability, ``exp`` of minus the Renyi-2 entropy); not differentiable.
    """

    logprobs: Tensor
    entropy: Tensor | None
    sum_pi_squared: Tensor


def result_tuple(batch_shape: tuple[int, ...], logprob: Tensor, entropy: Tensor | None,
                 sum_sq: Tensor | None) -> TokenLogProbs | TokenLogProbStats:
    """Flat kernel outputs reshaped to ``batch_shape``: a :class:`TokenLogProbStats` when ``sum_sq`` was asked
    for, else a :class:`TokenLogProbs`."""
    lp = logprob.view(batch_shape)
    ent = None if entropy is None else entropy.view(batch_shape)
    if sum_sq is None:
        return TokenLogProbs(lp, ent)
    return TokenLogProbStats(lp, ent, sum_sq.view(batch_shape))


class KernelInputError(ValueError):
    """A kernel argument is mis-shaped, mis-typed, out of range or produced a non-finite log-sum-exp.

    The message names the argument.
    """


def check_positive(name: str, value: object, *, allow_none: bool = False) -> None:
    """Raise :class:`KernelInputError` naming ``name`` unless it is a finite number > 0."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KernelInputError(f"{name} must be a positive finite number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise KernelInputError(f"{name} must be a positive finite number, got {value!r}")


def check_chunk_size(value: object) -> None:
    """``chunk_size`` is None (auto) or an int >= 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KernelInputError(f"chunk_size must be None (automatic) or an int >= 1, got {value!r}")


def check_float(name: str, x: object) -> Tensor:
    """``x`` is a floating-point tensor."""
    if not isinstance(x, Tensor):
        raise KernelInputError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise KernelInputError(f"{name} must be float16/bfloat16/float32/float64, got {x.dtype}")
    return x


def check_ids(token_ids: object, batch_shape: tuple[int, ...], device: torch.device, what: str) -> Tensor:
    """``token_ids`` is an integer tensor of shape ``batch_shape`` on ``device``; returned flat int64."""
    if not isinstance(token_ids, Tensor):
        raise KernelInputError(f"token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
    if token_ids.dtype not in _INT_DTYPES:
        raise KernelInputError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    if tuple(token_ids.shape) != batch_shape:
        raise KernelInputError(
            f"token_ids must have shape {batch_shape} (the leading dims of {what}), got {tuple(token_ids.shape)}"
        )
    if token_ids.device != device:
        raise KernelInputError(f"token_ids is on {token_ids.device} but {what} is on {device}")
    return token_ids.reshape(-1).to(torch.int64).contiguous()


def check_finite_result(lse: Tensor, ids: Tensor, vocab: int, what: str) -> None:
    """One device sync: raise if a token id is outside ``[0, vocab)`` or a row's log-sum-exp is not finite."""
    if lse.numel() == 0:
        return
    flags = torch.stack([((ids < 0) | (ids >= vocab)).any(), (~torch.isfinite(lse)).any()]).cpu()
    if bool(flags[0]):
        bad = ids[(ids < 0) | (ids >= vocab)]
        raise KernelInputError(
            f"token_ids must lie in [0, {vocab}) (the vocabulary of {what}); got e.g. {int(bad[0])}"
        )
    if bool(flags[1]):
        row = int((~torch.isfinite(lse)).nonzero()[0, 0])
        raise KernelInputError(
            f"{what} produced a non-finite log-sum-exp at row {row}: the input holds NaN/+inf, or a row "
            "with no finite logit"
        )


@functools.cache
def triton_importable() -> bool:
    """True when the ``triton`` package can be imported (it is an optional dependency)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        from rlzoo.kernels import _triton
    except Exception as err:  # noqa: BLE001 - a broken Triton install must not break the torch path
        warnings.warn(f"rlzoo.kernels: Triton is installed but failed to import ({err}); using torch",
                      stacklevel=3)
        return False
    return _triton.triton is not None


def resolve_backend(backend: object, device: torch.device, dtype: torch.dtype) -> tuple[str, bool]:
    """``(backend, interpret)``: "auto" is Triton on CUDA (when importable) and torch elsewhere.

    ``backend="triton"`` on a CPU tensor needs the Triton interpreter (``TRITON_INTERPRET=1`` set before
    triton is first imported); it is slow and meant for tests.
    """
    if backend not in BACKENDS:
        raise KernelInputError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    if backend == "torch":
        return "torch", False
    if backend == "auto":
        if device.type == "cuda" and dtype != torch.float64 and triton_importable():
            from rlzoo.kernels import _triton

            if not _triton.interpreting():
                return "triton", False
        return "torch", False
    if not triton_importable():
        raise KernelInputError("backend='triton' needs the triton package: pip install 'rlzoo[kernels]'")
    if dtype == torch.float64:
        raise KernelInputError("backend='triton' computes in float32; use backend='torch' for float64 inputs")
    from rlzoo.kernels import _triton

    interpret = _triton.interpreting()
    if device.type != "cuda" and not interpret:
        raise KernelInputError(
            f"backend='triton' on a {device.type} tensor needs the Triton interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported (or move the tensors to CUDA)"
        )
    return "triton", interpret


def row_layout(x: Tensor) -> tuple[Tensor, int, int, int, int]:
    """View ``x`` ``[*batch, C]`` as rows without copying where possible.

    Returns ``(base, n_rows, rows_per_group, stride_group, stride_row)`` such that row ``i`` starts at
    ``base.data_ptr() + ((i // rows_per_group) * stride_group + (i % rows_per_group) * stride_row)``
    elements and has unit column stride. Covers any view whose leading dims merge into one, and a
    ``[B, T, C]`` view with a sliced ``T`` (``logits[:, :-1]``); anything else is copied.
    """
    if x.ndim == 1:
        x = x.unsqueeze(0)
    if x.stride(-1) != 1:
        x = x.contiguous()
    cols = x.shape[-1]
    n_rows = math.prod(x.shape[:-1])
    try:
        flat = x.view(-1, cols)
        return flat, n_rows, max(1, n_rows), 0, flat.stride(0)
    except RuntimeError:
        pass
    if x.ndim == 3:
        return x, n_rows, x.shape[1], x.stride(0), x.stride(1)
    flat = x.reshape(-1, cols)
    return flat, n_rows, max(1, n_rows), 0, flat.stride(0)


def rows(base: Tensor, start: int, stop: int, rows_per_group: int) -> list[tuple[int, Tensor]]:
    """2-D views ``[r, C]`` covering rows ``[start, stop)`` of a :func:`row_layout`, with their first row."""
    out: list[tuple[int, Tensor]] = []
    if base.ndim == 2:
        return [(start, base[start:stop])]
    i = start
    while i < stop:
        g, r = divmod(i, rows_per_group)
        take = min(stop - i, rows_per_group - r)
        out.append((i, base[g, r : r + take]))
        i += take
    return out
