r"""Per-token log-probs and entropies straight from hidden states and the lm_head weight.

Notation: ``N`` token positions (any leading ``*batch`` dims), ``H`` hidden size, ``V`` vocabulary,
``C`` vocabulary columns per chunk. The logits of one chunk are

.. math::

    z = \frac{c}{\tau}\tanh\!\Big(\frac{s\,(h W_{[v_0:v_1]}^\top + b_{[v_0:v_1]})}{c}\Big)
    \quad\text{(or } \tfrac{s}{\tau}(hW^\top + b)\text{ without soft-capping)}

with ``s`` the model's logit scale, ``c`` its final-logit soft-cap and ``tau`` the sampling
temperature. The forward pass walks the vocabulary in chunks of ``C`` columns, folding each
``[N, C]`` logits chunk into an online log-sum-exp (plus the target logit and the entropy
accumulator); backward recomputes each chunk, turns it into ``dL/dz`` from both outputs and does
the two GEMMs ``dL/dh += dz W_c`` (float32 accumulator) and ``dL/dW_c = dz^T h``. At most one
``[N, C]`` chunk is alive at any time (plus, on the torch path with the entropy or a soft-cap, one
scratch buffer of the same size; plus a bf16 copy of ``dz`` for bf16 GEMMs on CUDA): no ``[N, V]``
tensor is ever allocated. Cost: four ``N x H x V`` GEMMs (the plain path does three) and two
streaming passes over the logits. The forward can also return the per-token sum of squared
probabilities ``sum_v p_v^2`` (``return_sum_pi_squared``), accumulated online in the same pass.

On CUDA the per-chunk streaming passes are Triton kernels (:mod:`rlzoo.kernels._triton`); elsewhere
the same math runs in torch.

Source: chunked cross-entropy over the vocabulary with recomputation, as in Liger-Kernel's fused
linear cross-entropy (Hsu et al. 2024, arXiv:2410.10989) and TRL 1.16's chunked log-prob kernel; the
entropy gradient ``dH/dz_v = -p_v (log p_v + H)`` is included (TRL once shipped without it).
"""

import dataclasses
import functools
import warnings
from typing import Literal

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
)

__all__ = ["default_chunk_size", "fused_linear_logprobs"]

# Elements (N * C) of one float32 logits chunk. CPU: measured on the SmolLM2 shape (docs/benchmarks.md).
# CUDA: not measured (no GPU in the session that wrote this); 2**26 floats = 256 MiB keeps the GEMMs
# large (C = 2048 at N = 32768, C = 8192 at N = 8192) while staying well below the [N, V] logits.
CPU_CHUNK_ELEMENTS = 1 << 24
CUDA_CHUNK_ELEMENTS = 1 << 26
_MIN_CHUNK = 256


def default_chunk_size(n_rows: int, vocab: int, device: torch.device | str) -> int:
    """Vocabulary columns per chunk when ``chunk_size=None``.

    ``budget // n_rows`` rounded down to a multiple of 256 (at least 256, at most ``vocab``), with a
    budget of ``2**24`` elements (64 MiB of float32) on CPU - measured on the SmolLM2 shape, see
    docs/benchmarks.md - and ``2**26`` (256 MiB) on CUDA (chosen by reasoning, not measured yet).

    Example:
        >>> from rlzoo.kernels import default_chunk_size
        >>> default_chunk_size(4096, 49152, "cpu")
        4096
    """
    budget = CUDA_CHUNK_ELEMENTS if torch.device(device).type == "cuda" else CPU_CHUNK_ELEMENTS
    cols = budget // max(1, n_rows)
    cols = max(_MIN_CHUNK, cols - cols % _MIN_CHUNK)
    return max(1, min(vocab, cols))


@functools.cache
def _cuda_mm_modes(device_index: int, dtype: torch.dtype) -> tuple[bool, bool, bool]:
    """Probe once per device and dtype which float32-output GEMMs torch supports for ``dtype`` inputs:
    ``(mm(out_dtype=float32), the same into an out= buffer, addmm(out_dtype=float32) accumulating in place)``.
    Each is checked for the right value, not only for not raising. torch >= 2.8 (the floor in pyproject)
    has all three on CUDA; the probe guards devices whose backend lacks them."""
    dev = torch.device("cuda", device_index)
    a = torch.full((32, 64), 0.5, dtype=dtype, device=dev)
    b = torch.full((64, 16), 0.25, dtype=dtype, device=dev)
    mm_ok = mm_out_ok = addmm_ok = False
    try:
        c = torch.mm(a, b, out_dtype=torch.float32)
        mm_ok = c.dtype == torch.float32 and bool((c == 8.0).all())
    except (RuntimeError, TypeError):
        pass
    try:
        c = torch.zeros(32, 16, dtype=torch.float32, device=dev)
        torch.mm(a, b, out_dtype=torch.float32, out=c)
        mm_out_ok = bool((c == 8.0).all())
    except (RuntimeError, TypeError):
        pass
    try:
        acc = torch.ones(32, 16, dtype=torch.float32, device=dev)
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        addmm_ok = bool((acc == 9.0).all())
    except (RuntimeError, TypeError):
        pass
    if not mm_ok:  # once per device and dtype (cached)
        warnings.warn(f"rlzoo.kernels: torch.mm(out_dtype=torch.float32) is unavailable for {dtype} on {dev} "
                      f"(torch {torch.__version__}); fused_linear_logprobs runs its GEMMs in float32 there (slower)",
                      stacklevel=4)
    return mm_ok, mm_out_ok, addmm_ok


GemmPolicy = Literal["native", "fp32_output", "upcast"]


def gemm_policy(dtype: torch.dtype, device_type: str, *, fp32_output_gemms: bool) -> GemmPolicy:
    """How the fused path runs its GEMMs for inputs of ``dtype`` on ``device_type``.

    * ``"native"`` - float32/float64: in that dtype.
    * ``"fp32_output"`` - float16/bfloat16 on CUDA where torch has low-precision GEMMs with float32 output
      (``torch.mm(out_dtype=torch.float32)``, torch >= 2.8): tensor-core GEMMs, float32 logits.
    * ``"upcast"`` - float16/bfloat16 elsewhere: the GEMMs run in float32 on upcast copies (a float32
      copy of ``hidden`` once, of ``W_c`` per chunk); exact float32 logits, never logits rounded to the
      input dtype.
    """
    if _tiles.compute_dtype(dtype) == dtype:
        return "native"
    return "fp32_output" if device_type == "cuda" and fp32_output_gemms else "upcast"


class _Gemms:
    """The three GEMMs of one chunk, in the :func:`gemm_policy` for ``hidden``'s dtype and device."""

    def __init__(self, hidden: Tensor, weight: Tensor):
        self.cdt = _tiles.compute_dtype(hidden.dtype)
        modes = (False, False, False)
        if hidden.device.type == "cuda" and hidden.dtype != self.cdt:
            modes = _cuda_mm_modes(hidden.device.index or 0, hidden.dtype)
        self.mm_ok, self.mm_out_ok, self.addmm_ok = modes
        policy = gemm_policy(hidden.dtype, hidden.device.type, fp32_output_gemms=self.mm_ok)
        self.fp32_output = policy == "fp32_output"
        self.upcast = policy == "upcast"
        self.h = hidden.float() if self.upcast else hidden
        self.grad_dtype = weight.dtype if self.fp32_output else self.cdt  # dtype of dz fed to the grad GEMMs

    def w(self, w_c: Tensor) -> Tensor:
        return w_c.float() if self.upcast else w_c

    def logits_into(self, out: Tensor, w_c: Tensor, b_c: Tensor | None) -> None:
        """``out[N, C] (compute dtype) = h W_c^T + b_c``."""
        if self.fp32_output:
            if self.mm_out_ok:
                torch.mm(self.h, w_c.t(), out_dtype=torch.float32, out=out)
            else:
                out.copy_(torch.mm(self.h, w_c.t(), out_dtype=torch.float32))
        else:
            torch.mm(self.h, self.w(w_c).t(), out=out)
        if b_c is not None:
            out.add_(b_c)

    def acc_grad_hidden(self, acc: Tensor, g: Tensor, w_c: Tensor) -> None:
        """``acc[N, H] (float32/float64) += g W_c``."""
        if self.fp32_output:
            if self.addmm_ok:
                torch.addmm(acc, g, w_c, out_dtype=torch.float32, out=acc)
            else:
                acc.add_(torch.mm(g, w_c, out_dtype=torch.float32))
        else:
            acc.addmm_(g, self.w(w_c))

    def grad_weight_into(self, out: Tensor, g: Tensor) -> None:
        """``out[C, H] (weight dtype) = g^T h``."""
        if self.upcast:
            out.copy_(torch.mm(g.t(), self.h))
        else:
            torch.mm(g.t(), self.h, out=out)


@dataclasses.dataclass(frozen=True)
class _Config:
    temperature: float
    scale: float
    softcap: float | None
    chunk: int
    backend: str
    interpret: bool
    with_entropy: bool
    with_sum_sq: bool
    check: bool


class _FusedFunction(torch.autograd.Function):
    """``(hidden[N, H], weight[V, H], bias[V] | None, ids[N]) -> (logprob[N], entropy[N], sum_pi_squared[N])``;
    the last is never differentiable (and the entropy not when it was not asked for)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, cfg):
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        vocab = weight.shape[0]
        gemms = _Gemms(hidden, weight)
        cdt = gemms.cdt
        state = _tiles.init_state(n, cdt, hidden.device)
        chunk = min(cfg.chunk, vocab)
        buf = torch.empty(n * chunk, dtype=cdt, device=hidden.device)
        scratch = torch.empty_like(buf) if cfg.backend == "torch" and cfg.with_entropy else None
        if cfg.backend == "triton":
            from rlzoo.kernels import _triton
        for v0 in range(0, vocab, chunk):
            v1 = min(vocab, v0 + chunk)
            z = buf[: n * (v1 - v0)].view(n, v1 - v0)
            gemms.logits_into(z, weight[v0:v1], None if bias is None else bias[v0:v1])
            if cfg.backend == "triton":
                _triton.fold(z, max(1, n), 0, v1 - v0, n, v1 - v0, v0, ids, state, scale=cfg.scale,
                             softcap=cfg.softcap, temperature=cfg.temperature, with_entropy=cfg.with_entropy,
                             with_sum_sq=cfg.with_sum_sq)
            else:
                _tiles.transform_(z, cfg.scale, cfg.softcap, cfg.temperature)
                _tiles.fold_tile_(z, v0, ids, state, with_entropy=cfg.with_entropy, maybe_inf=False,
                                  scratch=scratch, with_sum_sq=cfg.with_sum_sq)
        del buf, scratch
        logprob, entropy, sum_sq, m, log_s = _tiles.finish(state)
        if cfg.check:
            check_finite_result(m + log_s, ids, vocab, "hidden @ weight.T")
        ctx.save_for_backward(hidden, weight, bias, ids, m, log_s, entropy)
        ctx.cfg = cfg
        ctx.device_type = hidden.device.type
        # one call: each call replaces the set of non-differentiable outputs
        ctx.mark_non_differentiable(*((sum_sq,) if cfg.with_entropy else (sum_sq, entropy)))
        return logprob, entropy, sum_sq

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: double backward raises, never wrong
    def backward(ctx, grad_logprob, grad_entropy, _grad_sum_sq):
        with torch.autocast(ctx.device_type, enabled=False):
            return _FusedFunction._backward(ctx, grad_logprob, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logprob, grad_entropy):
        hidden, weight, bias, ids, m, log_s, entropy = ctx.saved_tensors
        cfg = ctx.cfg
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if (grad_logprob is None and grad_entropy is None) or not (need_h or need_w or need_b):
            return None, None, None, None, None
        n, vocab = hidden.shape[0], weight.shape[0]
        gemms = _Gemms(hidden, weight)
        cdt = gemms.cdt
        gl = None if grad_logprob is None else grad_logprob.reshape(-1).to(cdt).contiguous()
        ge = None if grad_entropy is None else grad_entropy.reshape(-1).to(cdt).contiguous()
        grad_h = torch.zeros(hidden.shape, dtype=cdt, device=hidden.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b else None
        chunk = min(cfg.chunk, vocab)
        buf = torch.empty(n * chunk, dtype=cdt, device=hidden.device)
        # the torch path needs one scratch buffer for p (with the entropy gradient or a soft-cap); never more
        need_scratch = cfg.backend == "torch" and (ge is not None or cfg.softcap is not None)
        scratch = torch.empty_like(buf) if need_scratch else None
        gbuf = torch.empty(n * chunk, dtype=gemms.grad_dtype, device=hidden.device) if gemms.grad_dtype != cdt else None
        if cfg.backend == "triton":
            from rlzoo.kernels import _triton
        factor = cfg.scale / cfg.temperature
        softcap_ratio = None if cfg.softcap is None else cfg.temperature / cfg.softcap
        for v0 in range(0, vocab, chunk):
            v1 = min(vocab, v0 + chunk)
            cols = v1 - v0
            z = buf[: n * cols].view(n, cols)
            gemms.logits_into(z, weight[v0:v1], None if bias is None else bias[v0:v1])
            g = z if gbuf is None else gbuf[: n * cols].view(n, cols)
            if cfg.backend == "triton":
                _triton.grad(z, max(1, n), 0, cols, g, cols, n, cols, v0, ids, m, log_s, entropy, gl, ge,
                             scale=cfg.scale, softcap=cfg.softcap, temperature=cfg.temperature)
            else:
                _tiles.transform_(z, cfg.scale, cfg.softcap, cfg.temperature)
                _tiles.grad_z_(z, v0, ids, m, log_s, entropy, gl, ge, maybe_inf=False, scratch=scratch,
                               factor=factor, softcap_ratio=softcap_ratio)
                if g is not z:
                    g.copy_(z)
            if grad_h is not None:
                gemms.acc_grad_hidden(grad_h, g, weight[v0:v1])
            if grad_w is not None:
                gemms.grad_weight_into(grad_w[v0:v1], g)
            if grad_b is not None:
                grad_b[v0:v1] = g.sum(dim=0)
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype)
        return grad_h, grad_w, grad_b, None, None


def fused_linear_logprobs(
    hidden: Float[Tensor, "*batch H"],
    weight: Float[Tensor, "V H"],
    token_ids: Int[Tensor, "*batch"],
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    return_entropy: bool = True,
    return_sum_pi_squared: bool = False,
    bias: Float[Tensor, " V"] | None = None,
    logit_scale: float | None = None,
    logit_softcap: float | None = None,
    backend: Backend = "auto",
    check: bool = True,
) -> TokenLogProbs | TokenLogProbStats:
    r"""Log-probs (and entropies) of ``token_ids`` under ``softmax(lm_head(hidden) / temperature)``, chunked.

    Equal to ``log_softmax(z)[token_ids]`` and ``-sum p log p`` of the full logits ``z`` (see the
    module docstring for the transform), but never holds more than one ``[N, chunk_size]`` chunk of
    logits: memory is ``O(N * chunk_size + N * H)`` instead of ``O(N * V)``. A custom autograd
    function recomputes the chunks in backward and returns gradients for ``hidden``, ``weight`` and
    ``bias`` from both outputs. Tied embeddings need nothing special: pass the shared weight.

    With ``return_sum_pi_squared=True`` the same pass also returns, per token, the sum of squared
    probabilities of the distribution the log-probs are taken from (after scale, soft-cap and
    temperature, :math:`p = \operatorname{softmax}(z)`):

    .. math::

        S = \sum_v p_v^2 = \exp\big(\operatorname{logsumexp}(2z) - 2\operatorname{logsumexp}(z)\big)
        \in [1/V, 1]

    - verl 0.9.1's ``sum_pi_squared`` (``verl.utils.torch_functional.calculate_sum_pi_squared_from_logits``
    of the temperature-scaled logits), the input of its ``optimal_token_baseline`` advantage estimator
    (path-variance proxy ``w_t = 1 - 2 pi_t + S_t``). It is a detached statistic: not differentiable
    (``requires_grad`` is False; verl computes it without grad at old-log-prob time).

    Args:
        hidden: ``Float[*batch, H]``, the final hidden states (after the model's last norm), e.g.
            ``model.get_decoder()(...).last_hidden_state`` sliced to the completion positions.
        weight: ``Float[V, H]``, the lm_head (output embedding) weight; same dtype and device as hidden.
        token_ids: ``Int[*batch]``, the tokens to score, each in ``[0, V)``.
        temperature: > 0, divides the (scaled, soft-capped) logits, as the sampler did.
        chunk_size: vocabulary columns per chunk; None = :func:`default_chunk_size`.
        return_entropy: also return the entropy (a differentiable output); False skips its work.
        return_sum_pi_squared: also return ``S`` (not differentiable); the result is then a
            :class:`~rlzoo.kernels.TokenLogProbStats`. One extra multiply-add per logit.
        bias: ``Float[V]`` lm_head bias, or None.
        logit_scale: > 0; multiplies the logits (Cohere ``logit_scale``, Granite ``1/logits_scaling``).
        logit_softcap: > 0; ``z = c * tanh(z / c)`` (Gemma 2/3 ``final_logit_softcapping``).
        backend: "auto" (Triton kernels on CUDA when Triton is installed, torch elsewhere), "torch", or
            "triton" (on CPU tensors this runs the Triton interpreter; slow, for tests).
        check: raise on token ids outside ``[0, V)`` or a non-finite log-sum-exp (one device sync).

    Returns:
        :class:`~rlzoo.kernels.TokenLogProbs` ``(logprobs, entropy)``: ``Float[*batch]`` in nats,
        float32 for float16/bfloat16/float32 input (float64 for float64); ``entropy`` is None when
        ``return_entropy`` is False. With ``return_sum_pi_squared``: :class:`~rlzoo.kernels.TokenLogProbStats`
        ``(logprobs, entropy, sum_pi_squared)``, the last ``Float[*batch]`` in ``[1/V, 1]`` (same dtype).
        Gradients of ``hidden``/``weight``/``bias`` have their dtypes.

    Raises:
        KernelInputError: (a ``ValueError``) naming the argument: non-float or mismatched
            dtypes/devices, a hidden size that differs from ``weight.shape[1]``, ``V == 0`` or ``H == 0``,
            a bias that is not ``[V]``, token_ids of the wrong shape/dtype or outside ``[0, V)``,
            a non-positive temperature / logit_scale / logit_softcap / chunk_size, an unknown backend,
            or NaN/inf in the result's log-sum-exp (NaN/inf in hidden or weight) when ``check`` is True.

    Under autocast, float32/float16/bfloat16 inputs are cast to the autocast dtype as ``F.linear`` would;
    float64 inputs are left alone (torch's autocast does not cast float64 either).

    Source: chunked vocabulary projection with recomputation (Liger-Kernel, arXiv:2410.10989; TRL 1.16
    ``trl.kernels.chunked_logprob``): same values as ``selective_log_softmax(lm_head(hidden), ids)``.

    Example:
        >>> import torch
        >>> from rlzoo.kernels import fused_linear_logprobs
        >>> h, w = torch.randn(5, 8), torch.randn(11, 8)
        >>> ids = torch.tensor([0, 3, 10, 2, 2])
        >>> lp, ent = fused_linear_logprobs(h, w, ids, chunk_size=4)
        >>> ref = (h @ w.T).log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1)
        >>> torch.allclose(lp, ref, atol=1e-5)
        True
        >>> out = fused_linear_logprobs(h, w, ids, chunk_size=4, return_sum_pi_squared=True)
        >>> torch.allclose(out.sum_pi_squared, (h @ w.T).softmax(-1).square().sum(-1), atol=1e-6)
        True
    """
    check_float("hidden", hidden)
    check_float("weight", weight)
    if torch.is_autocast_enabled(hidden.device.type):
        # as F.linear under autocast: the projection runs in the autocast dtype (gradients flow through the
        # casts); like torch's autocast, float64 tensors are not cast
        dt = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight, bias = (t if t is None or t.dtype == torch.float64 else t.to(dt) for t in (hidden, weight, bias))
    if weight.ndim != 2 or weight.shape[0] < 1 or weight.shape[1] < 1:
        raise KernelInputError(f"weight must have shape [V, H] with V, H >= 1, got {tuple(weight.shape)}")
    if hidden.ndim < 1 or hidden.shape[-1] != weight.shape[1]:
        raise KernelInputError(
            f"hidden must have shape [*batch, H] with H = weight.shape[1] = {weight.shape[1]}, "
            f"got {tuple(hidden.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise KernelInputError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    if hidden.device != weight.device:
        raise KernelInputError(f"hidden is on {hidden.device} but weight is on {weight.device}")
    if bias is not None:
        check_float("bias", bias)
        if tuple(bias.shape) != (weight.shape[0],) or bias.dtype != weight.dtype or bias.device != weight.device:
            raise KernelInputError(
                f"bias must be a [{weight.shape[0]}] tensor of weight's dtype and device, got "
                f"{tuple(bias.shape)} {bias.dtype} on {bias.device}"
            )
    check_positive("temperature", temperature)
    check_positive("logit_scale", logit_scale, allow_none=True)
    check_positive("logit_softcap", logit_softcap, allow_none=True)
    check_chunk_size(chunk_size)
    batch_shape = tuple(hidden.shape[:-1])
    ids = check_ids(token_ids, batch_shape, hidden.device, "hidden")
    name, interpret = resolve_backend(backend, hidden.device, hidden.dtype)
    flat = hidden.reshape(-1, hidden.shape[-1])
    n, vocab = flat.shape[0], weight.shape[0]
    chunk = chunk_size if chunk_size is not None else default_chunk_size(n, vocab, hidden.device)
    cfg = _Config(
        temperature=float(temperature),
        scale=1.0 if logit_scale is None else float(logit_scale),
        softcap=None if logit_softcap is None else float(logit_softcap),
        chunk=chunk,
        backend=name,
        interpret=interpret,
        with_entropy=bool(return_entropy),
        with_sum_sq=bool(return_sum_pi_squared),
        check=bool(check),
    )
    with torch.autocast(hidden.device.type, enabled=False):
        logprob, entropy, sum_sq = _FusedFunction.apply(flat, weight, bias, ids, cfg)
    return result_tuple(batch_shape, logprob, entropy if return_entropy else None,
                        sum_sq if return_sum_pi_squared else None)
