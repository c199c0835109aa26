"""Private torch math shared by the logits and the fused-linear paths: one tile of logits at a time.

A *tile* is a ``[R, C]`` block of transformed logits ``z`` (rows = tokens, columns = a contiguous
range of the vocabulary starting at ``col_offset``), in the compute dtype (float32, or float64 for
float64 inputs). Per row we keep the running statistics of an online log-sum-exp:

* ``m``  - running max of ``z`` (initialised to the dtype's lowest finite value, not -inf, so that no
  ``-inf - -inf`` ever appears);
* ``s``  - ``sum exp(z - m)``;
* ``t``  - ``sum exp(z - m) * (z - m)`` (entropy accumulator, kept relative to ``m`` so it stays small);
* ``zy`` - the target logit ``z[token_id]`` (0 until the tile holding the target is folded).

From them: ``lse = m + log s``, ``logprob = (zy - m) - log s`` and ``entropy = log s - t / s`` (the
log-prob is formed as ``(zy - m) - log s``, not ``zy - lse``, so large logits lose no precision; for the
same reason backward forms ``log p = (z - m) - log s``).
Rescaling ``t`` when the max moves from ``m`` to ``m'`` (``d = m - m' <= 0``):
``t' = exp(d) * (t + s * d)``.

Gradients with respect to ``z`` (``p = softmax(z)``, ``g_l``/``g_h`` the upstream gradients of the
log-prob and of the entropy of that row):
``dL/dz_j = g_l * (1[j = y] - p_j) - g_h * p_j * (log p_j + H)``.

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
    """``[4, n]`` running state ``(m, s, t, zy)``."""
    state = torch.zeros(4, n, dtype=dtype, device=device)
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


def fold_tile_(z: Tensor, col_offset: int, ids: Tensor, state: Tensor, *, with_entropy: bool,
               maybe_inf: bool, scratch: Tensor | None = None) -> None:
    """Fold one tile ``z`` ``[R, C]`` into ``state`` ``[4, R]`` in place. Destroys ``z``.

    ``maybe_inf``: the tile may hold -inf logits (user logits), so ``0 * -inf`` must be avoided.
    ``scratch``: optional buffer with at least ``R * C`` elements for ``exp(z - m)`` (used with entropy only).
    """
    m, s, t, zy = state[0], state[1], state[2], state[3]
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
        # sum_j e_j * d_j per row as a batched dot product (no [R, C] temporary)
        tile_t = torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).view(-1)
        # shift < LOG_FLOOR means alpha == 0; the clamp keeps s * shift finite (0 * -inf would be NaN)
        t.copy_(alpha * (t + s * shift.clamp(min=LOG_FLOOR)) + tile_t)
    else:
        e = z.exp_()  # no scratch needed without the entropy accumulator
    s.mul_(alpha).add_(e.sum(dim=1))
    m.copy_(m_new)


def finish(state: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(logprob, entropy, m, log_s)`` from a fully folded state (``lse = m + log_s``)."""
    m, s, t, zy = state[0], state[1], state[2], state[3]
    log_s = torch.log(s)
    return (zy - m) - log_s, log_s - t / s, m.clone(), log_s


def grad_z_(z: Tensor, col_offset: int, ids: Tensor, m: Tensor, log_s: Tensor, entropy: Tensor,
            grad_logprob: Tensor | None, grad_entropy: Tensor | None, *, maybe_inf: bool,
            scratch: Tensor | None = None) -> Tensor:
    """Overwrite the tile ``z`` ``[R, C]`` with ``dL/dz`` and return it (see the module docstring)."""
    z.sub_(m.unsqueeze(1)).sub_(log_s.unsqueeze(1))  # log p
    if grad_entropy is not None:
        p = torch.exp(z) if scratch is None else torch.exp(z, out=scratch[: z.numel()].view_as(z))
        if maybe_inf:
            z.clamp_(min=LOG_FLOOR)
        z.add_(entropy.unsqueeze(1)).mul_(p).mul_(grad_entropy.unsqueeze(1).neg())
        if grad_logprob is not None:
            z.addcmul_(p, grad_logprob.unsqueeze(1), value=-1.0)
    else:
        assert grad_logprob is not None
        z.exp_().mul_(grad_logprob.unsqueeze(1).neg())  # in place: no scratch without the entropy term
    if grad_logprob is not None:
        cols = z.shape[1]
        local = ids - col_offset
        hit = (local >= 0) & (local < cols)
        add = torch.where(hit, grad_logprob, torch.zeros((), dtype=z.dtype, device=z.device))
        z.scatter_add_(1, local.clamp(0, cols - 1).unsqueeze(1), add.unsqueeze(1))
    return z


def softcap_derivative(z: Tensor, scale: float, softcap: float, temperature: float) -> Tensor:
    """``dz/draw`` for ``z = softcap * tanh(scale * raw / softcap) / temperature``, from ``z`` itself."""
    u = z * (temperature / softcap)
    return u.mul_(u).neg_().add_(1.0).mul_(scale / temperature)
