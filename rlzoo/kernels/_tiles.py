"""Private torch math shared by the logits and the fused-linear paths: one tile of logits at a time.

A *tile* is a ``[R, C]`` block of transformed logits ``z`` (rows = tokens, columns = a contiguous
range of the vocabulary starting at ``col_offset``), in the compute dtype (float32, or float64 for
float64 inputs). Per row we keep the running statistics of an online log-sum-exp:

* ``m``  - running max of ``z`` (initialised to the dtype's lowest finite value, not -inf, so that no
  ``-inf - -inf`` ever appears);
* ``s``  - ``sum exp(z - m)``;
* ``t``  - ``sum exp(z - m) * (z - m)`` (entropy accumulator, kept relative to ``m`` so it stays small);
* ``zy`` - the target logit ``z[token_id]`` (0 until the tile holding the target is folded);
* ``q``  - ``sum exp(2 (z - m))`` (sum of squared probabilities accumulator; rescaled by ``exp(d)^2``).

From them: ``lse = m + log s``, ``logprob = (zy - m) - log s``, ``entropy = log s - t / s`` and
``sum_v p_v^2 = q / s^2`` (the log-prob is formed as ``(zy - m) - log s``, not ``zy - lse``, so large
logits lose no precision; for the same reason backward forms ``log p = (z - m) - log s``).
Rescaling ``t`` when the max moves from ``m`` to ``m'`` (``d = m - m' <= 0``):
``t' = exp(d) * (t + s * d)``.

Gradients with respect to ``z`` (``p = softmax(z)``, ``g_l``/``g_h`` the upstream gradients of the
log-prob and of the entropy of that row):
``dL/dz_j = g_l * (1[j = y] - p_j) - g_h * p_j * (log p_j + H)``; the sum of squared probabilities is
a statistic without a gradient. Backward returns ``dL/draw = dL/dz * dz/draw`` for the logit transform
``z = c/T tanh(s raw / c)`` (``dz/draw = s/T (1 - (T z / c)^2)``) or ``z = s/T raw``.

Nothing here is public; the math is documented in docs/benchmarks.md and in the public docstrings.
"""

import torch
from torch import Tensor

# log p below this is exp-underflow in every float dtype: clamping there turns 0 * -inf into 0.
LOG_FLOOR = -1.0e4


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype is accumulated in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def init_state(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[5, n]`` running state ``(m, s, t, zy, q)``."""
    state = torch.zeros(5, n, dtype=dtype, device=device)
    state[0].fill_(torch.finfo(dtype).min)
    return state


def transform_(z: Tensor, scale: float, softcap: float | None, temperature: float) -> Tensor:
    """In place: ``z <- softcap * tanh(scale * z / softcap) / temperature`` (or ``scale * z / temperature``)."""
    if softcap is None:
        factor = scale / temperature
        if factor != 1.0:
            z.mul_(factor)
    else:
        z.mul_(scale / softcap).tanh_().mul_(softcap / temperature)
    return z


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """``sum_j a_ij b_ij`` per row as a batched dot product (no ``[R, C]`` temporary)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def fold_tile_(z: Tensor, col_offset: int, ids: Tensor, state: Tensor, *, with_entropy: bool,
               maybe_inf: bool, scratch: Tensor | None = None, with_sum_sq: bool = False) -> None:
    """Fold one tile ``z`` ``[R, C]`` into ``state`` ``[5, R]`` in place. Destroys ``z``.

    ``maybe_inf``: the tile may hold -inf logits (user logits), so ``0 * -inf`` must be avoided.
    ``scratch``: optional buffer with at least ``R * C`` elements for ``exp(z - m)`` (used with entropy only).
    ``with_sum_sq``: also accumulate ``q`` (for the sum of squared probabilities).
    """
    m, s, t, zy, q = state[0], state[1], state[2], state[3], state[4]
    cols = z.shape[1]
    local = ids - col_offset
    hit = (local >= 0) & (local < cols)
    picked = z.gather(1, local.clamp(0, cols - 1).unsqueeze(1)).squeeze(1)
    zy.add_(torch.where(hit, picked, torch.zeros((), dtype=z.dtype, device=z.device)))
    m_new = torch.maximum(m, z.amax(dim=1))
    shift = m - m_new  # <= 0
    alpha = torch.exp(shift)
    z.sub_(m_new.unsqueeze(1))  # z is now z - m_new
    if with_entropy:
        e = torch.exp(z) if scratch is None else torch.exp(z, out=scratch[: z.numel()].view_as(z))
        if maybe_inf:
            z.clamp_(min=LOG_FLOOR)
        # shift < LOG_FLOOR means alpha == 0; the clamp keeps s * shift finite (0 * -inf would be NaN)
        t.copy_(alpha * (t + s * shift.clamp(min=LOG_FLOOR)) + _rowdot(e, z))
    else:
        e = z.exp_()  # no scratch needed without the entropy accumulator
    if with_sum_sq:
        q.mul_(alpha * alpha).add_(_rowdot(e, e))
    s.mul_(alpha).add_(e.sum(dim=1))
    m.copy_(m_new)


def finish(state: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(logprob, entropy, sum_sq, m, log_s)`` from a fully folded state (``lse = m + log_s``)."""
    m, s, t, zy, q = state[0], state[1], state[2], state[3], state[4]
    log_s = torch.log(s)
    return (zy - m) - log_s, log_s - t / s, q / (s * s), m.clone(), log_s


def grad_z_(z: Tensor, col_offset: int, ids: Tensor, m: Tensor, log_s: Tensor, entropy: Tensor,
            grad_logprob: Tensor | None, grad_entropy: Tensor | None, *, maybe_inf: bool,
            scratch: Tensor | None = None, factor: float = 1.0, softcap_ratio: float | None = None) -> Tensor:
    """Overwrite the tile ``z`` ``[R, C]`` of transformed logits with ``dL/draw`` and return it.

    ``dL/dz`` is in the module docstring; the chain factor ``dz/draw`` is ``factor`` (``s/T``) without
    soft-capping and ``factor * (1 - u^2)``, ``u = softcap_ratio * z`` (``softcap_ratio = T/c``) with it.
    ``scratch`` (``R * C`` elements) holds ``p`` when the entropy gradient or a soft-cap needs it; with a
    soft-cap it then becomes ``1 - u^2``, with ``z = log p + lse`` recovered from ``p`` (where ``p``
    underflows to 0, ``dL/dz`` is 0 off the target column, and the target's factor comes from its own
    logit), so no third ``[R, C]`` buffer is ever allocated.
    """
    assert not (maybe_inf and softcap_ratio is not None)  # -inf logits come only from user logits
    rows_m, rows_log_s = m.unsqueeze(1), log_s.unsqueeze(1)
    cols = z.shape[1]
    if grad_logprob is not None:
        local = ids - col_offset
        hit = (local >= 0) & (local < cols)
        index = local.clamp(0, cols - 1).unsqueeze(1)
        if softcap_ratio is not None:
            u = z.gather(1, index).squeeze(1) * softcap_ratio
            target_factor = 1.0 - u * u
    z.sub_(rows_m).sub_(rows_log_s)  # log p
    p = None
    if grad_entropy is None and softcap_ratio is None:
        assert grad_logprob is not None
        z.exp_().mul_(grad_logprob.unsqueeze(1).neg())  # in place: no scratch without the entropy term
    else:
        assert scratch is not None
        p = torch.exp(z, out=scratch[: z.numel()].view_as(z))
        if grad_entropy is not None:
            if maybe_inf:
                z.clamp_(min=LOG_FLOOR)
            z.add_(entropy.unsqueeze(1)).mul_(p).mul_(grad_entropy.unsqueeze(1).neg())
            if grad_logprob is not None:
                z.addcmul_(p, grad_logprob.unsqueeze(1), value=-1.0)
        else:
            torch.mul(p, grad_logprob.unsqueeze(1).neg(), out=z)
    if grad_logprob is not None:
        add = torch.where(hit, grad_logprob, torch.zeros((), dtype=z.dtype, device=z.device))
        z.scatter_add_(1, index, add.unsqueeze(1))
    if softcap_ratio is not None:
        d = p.log_().clamp_(min=LOG_FLOOR).add_(rows_m).add_(rows_log_s).mul_(softcap_ratio)  # u
        d.mul_(d).neg_().add_(1.0)
        if grad_logprob is not None:
            keep = d.gather(1, index).squeeze(1)
            d.scatter_(1, index, torch.where(hit, target_factor, keep).unsqueeze(1))
        z.mul_(d)
    if factor != 1.0:
        z.mul_(factor)
    return z
