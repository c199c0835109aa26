"""Private Triton kernels over one logits tile (imported lazily: rlzoo imports without Triton).

Two kernels, one program per token row, looping over the tile's columns in ``BLOCK`` steps:

* ``fold`` - online log-sum-exp + target gather + entropy and sum-of-squared-probabilities accumulators:
  folds a ``[R, C]`` logits tile into the running ``(m, s, t, zy, q)`` state of :mod:`rlzoo.kernels._tiles`
  (same math, same state layout);
* ``grad`` - the matching backward: writes ``dL/draw`` for the tile (in place, or into another buffer of
  another dtype), given the final ``lse``/entropy and the upstream gradients.

Both apply the logit transform ``z = softcap * tanh(scale * raw / softcap) / temperature`` on load.
Rows are addressed as ``group * stride_group + (row % rows_per_group) * stride_row`` so that a
``[B, T, V]`` logits view with a sliced T (``logits[:, :-1]``) is read without a copy.

Triton launches on the *current* CUDA device; :func:`fold` and :func:`grad` make the tensors' device
current first (a model split across GPUs has tensors on several devices).

``no_type_check`` keeps the jaxtyping import hook (tests) off the kernels. With ``TRITON_INTERPRET=1``
in the environment *before triton is first imported*, ``triton.jit`` builds interpreter functions
that run on CPU tensors (how the tests exercise these kernels without a GPU).
"""

import contextlib
import functools
from typing import no_type_check

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # optional dependency; the module stays importable (doctest collection imports it)
    triton = None

from rlzoo.kernels._tiles import LOG_FLOOR as _LOG_FLOOR

if triton is not None:
    # a jit'ed kernel may read a module global only as a constexpr (Triton >= 3 refuses plain floats at
    # compile time; the interpreter does not check, so this is easy to get wrong without a GPU)
    LOG_FLOOR = tl.constexpr(_LOG_FLOOR)

    @triton.jit
    @no_type_check
    def _fold_kernel(
        x_ptr, rows_per_group, stride_group, stride_row, n_cols, col_offset,
        ids_ptr, state_ptr, n_rows,
        scale_over_cap, cap_over_t, factor,
        HAS_SOFTCAP: tl.constexpr, WITH_ENTROPY: tl.constexpr, WITH_SUMSQ: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + (row // rows_per_group) * stride_group + (row % rows_per_group) * stride_row
        target = tl.load(ids_ptr + row) - col_offset
        m = tl.load(state_ptr + row)
        s = tl.load(state_ptr + n_rows + row)
        t = tl.load(state_ptr + 2 * n_rows + row)
        zy = tl.load(state_ptr + 3 * n_rows + row)
        q = tl.load(state_ptr + 4 * n_rows + row)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < n_cols
            x = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32)
            if HAS_SOFTCAP:
                z = cap_over_t * (2.0 * tl.sigmoid(2.0 * scale_over_cap * x) - 1.0)
            else:
                z = x * factor
            zy += tl.sum(tl.where(valid & (cols == target), z, 0.0), axis=0)
            z = tl.where(valid, z, float("-inf"))
            m_new = tl.maximum(m, tl.max(z, axis=0))
            shift = m - m_new
            alpha = tl.exp(shift)
            d = z - m_new
            e = tl.exp(d)
            if WITH_ENTROPY:
                # clamping at LOG_FLOOR (where exp underflows to 0) turns 0 * -inf into 0
                tile_t = tl.sum(e * tl.maximum(d, LOG_FLOOR), axis=0)
                t = alpha * (t + s * tl.maximum(shift, LOG_FLOOR)) + tile_t
            if WITH_SUMSQ:
                q = q * (alpha * alpha) + tl.sum(e * e, axis=0)
            s = s * alpha + tl.sum(e, axis=0)
            m = m_new
        tl.store(state_ptr + row, m)
        tl.store(state_ptr + n_rows + row, s)
        tl.store(state_ptr + 2 * n_rows + row, t)
        tl.store(state_ptr + 3 * n_rows + row, zy)
        tl.store(state_ptr + 4 * n_rows + row, q)


    @triton.jit
    @no_type_check
    def _grad_kernel(
        x_ptr, rows_per_group, stride_group, stride_row, out_ptr, out_stride_row, n_cols, col_offset,
        ids_ptr, m_ptr, logs_ptr, ent_ptr, gl_ptr, ge_ptr,
        scale_over_cap, cap_over_t, factor,
        HAS_SOFTCAP: tl.constexpr, HAS_GL: tl.constexpr, HAS_GE: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + (row // rows_per_group) * stride_group + (row % rows_per_group) * stride_row
        out = out_ptr + row * out_stride_row
        target = tl.load(ids_ptr + row) - col_offset
        m = tl.load(m_ptr + row)
        log_s = tl.load(logs_ptr + row)
        if HAS_GL:
            gl = tl.load(gl_ptr + row).to(tl.float32)
        if HAS_GE:
            ge = tl.load(ge_ptr + row).to(tl.float32)
            ent = tl.load(ent_ptr + row)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            valid = cols < n_cols
            x = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32)
            if HAS_SOFTCAP:
                u = 2.0 * tl.sigmoid(2.0 * scale_over_cap * x) - 1.0
                z = cap_over_t * u
                dz = factor * (1.0 - u * u)
            else:
                z = x * factor
                dz = factor
            logp = (z - m) - log_s
            p = tl.exp(logp)
            g = tl.zeros((BLOCK,), tl.float32)
            if HAS_GL:
                g = gl * (tl.where(cols == target, 1.0, 0.0) - p)
            if HAS_GE:
                g -= ge * p * (tl.maximum(logp, LOG_FLOOR) + ent)
            g = g * dz
            tl.store(out + cols, g.to(out_ptr.dtype.element_ty), mask=valid)


@functools.cache  # fixed once triton is imported
def interpreting() -> bool:
    """True when the kernels were built for the Triton interpreter (``TRITON_INTERPRET=1`` at import)."""
    if triton is None:
        return False
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - very old Triton
        return False
    return isinstance(_fold_kernel, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)


def _block(n_cols: int) -> int:
    return max(16, min(2048, 1 << (max(1, n_cols) - 1).bit_length()))


def _warps(n_cols: int) -> int:
    return 8 if _block(n_cols) >= 2048 else 4


def _transform_args(scale: float, softcap: float | None, temperature: float) -> tuple[float, float, float, bool]:
    if softcap is None:
        return 1.0, 1.0, scale / temperature, False
    # z = cap/T * tanh(scale * x / cap) and dz/dx = scale/T * (1 - tanh^2)
    return scale / softcap, softcap / temperature, scale / temperature, True


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` the current CUDA device for a launch (Triton launches on the current device and its
    current stream); nothing for other devices (the interpreter runs on CPU tensors)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def fold(x, rows_per_group, stride_group, stride_row, n_rows, n_cols, col_offset, ids, state, *,
         scale, softcap, temperature, with_entropy, with_sum_sq=False):
    """Launch the fold kernel on a tile addressed as described in the module docstring, on ``x``'s device."""
    if n_rows == 0 or n_cols == 0:
        return
    soc, cot, factor, has_softcap = _transform_args(scale, softcap, temperature)
    with device_guard(x.device):
        _fold_kernel[(n_rows,)](
            x, rows_per_group, stride_group, stride_row, n_cols, col_offset, ids, state, n_rows,
            soc, cot, factor, HAS_SOFTCAP=has_softcap, WITH_ENTROPY=with_entropy, WITH_SUMSQ=with_sum_sq,
            BLOCK=_block(n_cols), num_warps=_warps(n_cols),
        )


def grad(x, rows_per_group, stride_group, stride_row, out, out_stride_row, n_rows, n_cols, col_offset, ids,
         m, log_s, entropy, grad_logprob, grad_entropy, *, scale, softcap, temperature):
    """Launch the grad kernel on ``x``'s device; ``out`` may alias ``x`` (same layout) or be another buffer."""
    if n_rows == 0 or n_cols == 0:
        return
    soc, cot, factor, has_softcap = _transform_args(scale, softcap, temperature)
    dummy = m
    with device_guard(x.device):
        _grad_kernel[(n_rows,)](
            x, rows_per_group, stride_group, stride_row, out, out_stride_row, n_cols, col_offset,
            ids, m, log_s, entropy, grad_logprob if grad_logprob is not None else dummy,
            grad_entropy if grad_entropy is not None else dummy,
            soc, cot, factor,
            HAS_SOFTCAP=has_softcap, HAS_GL=grad_logprob is not None, HAS_GE=grad_entropy is not None,
            BLOCK=_block(n_cols), num_warps=_warps(n_cols),
        )
