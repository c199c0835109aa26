"""fused_linear_logprobs (torch path) against the materializing reference, in float64 and low precision.

The math: z = (c/T) tanh(s (h W^T + b) / c) (or (s/T)(h W^T + b)); log p(y) = z_y - logsumexp(z) and
H = -sum p log p. The fused function must equal log_softmax(z)[y] and H in value and in the gradients of
h, W and b from BOTH outputs (dH/dz = -p (log p + H): TRL once shipped without it), while never
allocating an [N, V] tensor.
"""

import inspect
import math

import pytest
import torch
from kernel_cases import OPTIONS, SHAPES, linear_problem
from tolerances import assert_grad_close, tol
from torch.utils._python_dispatch import TorchDispatchMode

from rlzoo.kernels import KernelInputError, default_chunk_size, fused_linear_logprobs
from rlzoo.kernels.reference import naive_linear_logprobs


def unchecked(fn):
    """``fn`` without the test-time jaxtyping/beartype wrapper (tests rlzoo's own run-time checks)."""
    return inspect.unwrap(fn)


def _grads(outputs, inputs, seed=3):
    g = torch.Generator().manual_seed(seed)
    lp, ent = outputs
    loss = (torch.randn(lp.shape, generator=g, dtype=torch.float64).to(lp.dtype) * lp).sum()
    if ent is not None:
        loss = loss + (torch.randn(ent.shape, generator=g, dtype=torch.float64).to(ent.dtype) * ent).sum()
    return torch.autograd.grad(loss, [t for t in inputs if t is not None])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("return_entropy", [True, False])
def test_matches_reference_float64(shape, options, return_entropy):
    n, h, v, chunk = shape
    opts = dict(options)
    hidden, weight, bias, ids = linear_problem(n, h, v, bias=opts.pop("bias", False))
    out = fused_linear_logprobs(hidden, weight, ids, chunk_size=chunk, bias=bias, return_entropy=return_entropy,
                                backend="torch", **opts)
    ref = naive_linear_logprobs(hidden, weight, ids, bias=bias, return_entropy=return_entropy, **opts)
    torch.testing.assert_close(out.logprobs, ref.logprobs, **tol(torch.float64))
    if return_entropy:
        torch.testing.assert_close(out.entropy, ref.entropy, **tol(torch.float64))
    else:
        assert out.entropy is None
    for got, want in zip(_grads(out, (hidden, weight, bias)), _grads(ref, (hidden, weight, bias)), strict=True):
        torch.testing.assert_close(got, want, **tol(torch.float64))


def test_gradcheck_float64_all_inputs_both_outputs():
    """float64 gradcheck of hidden, weight and bias through log-prob AND entropy, with every transform."""
    hidden, weight, bias, ids = linear_problem(4, 3, 7, bias=True)

    def f(h, w, b):
        return tuple(fused_linear_logprobs(h, w, ids, bias=b, chunk_size=3, temperature=0.8, logit_scale=1.5,
                                           logit_softcap=2.5, backend="torch"))

    torch.autograd.gradcheck(f, (hidden, weight, bias))


def test_entropy_gradient_is_not_dropped():
    """An entropy-only loss (entropy bonus) gets the full gradient: the TRL bug class of a missing dH/dz."""
    hidden, weight, _, ids = linear_problem(6, 4, 11)
    ent = fused_linear_logprobs(hidden, weight, ids, chunk_size=5, backend="torch").entropy
    g_h, g_w = torch.autograd.grad(ent.sum(), (hidden, weight))
    ref = naive_linear_logprobs(hidden, weight, ids).entropy
    r_h, r_w = torch.autograd.grad(ref.sum(), (hidden, weight))
    assert g_h.abs().max() > 1e-3
    torch.testing.assert_close(g_h, r_h, **tol(torch.float64))
    torch.testing.assert_close(g_w, r_w, **tol(torch.float64))


def test_batched_leading_dims():
    """hidden [B, T, H] and token_ids [B, T] give [B, T] outputs equal to the flattened call."""
    hidden, weight, _, ids = linear_problem(12, 5, 17)
    out3 = fused_linear_logprobs(hidden.view(3, 4, 5), weight, ids.view(3, 4), chunk_size=6)
    out2 = fused_linear_logprobs(hidden, weight, ids, chunk_size=6)
    assert out3.logprobs.shape == (3, 4)
    torch.testing.assert_close(out3.logprobs.reshape(-1), out2.logprobs, **tol(torch.float64))


def test_tied_embeddings_gradient_accumulates():
    """With tied embeddings the weight gets the embedding gradient plus the head gradient, as in the plain path."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(13, 6, dtype=torch.float64)
    inputs = torch.randint(0, 13, (9,))
    targets = torch.randint(0, 13, (9,))

    def loss(fn):
        emb.zero_grad()
        hidden = torch.tanh(emb(inputs))
        lp, ent = fn(hidden, emb.weight, targets)
        (lp.sum() + 0.1 * ent.sum()).backward()
        return emb.weight.grad.clone()

    fused = loss(lambda h, w, y: fused_linear_logprobs(h, w, y, chunk_size=4))
    naive = loss(naive_linear_logprobs)
    torch.testing.assert_close(fused, naive, **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    """float32/bf16/fp16 inputs: float32 outputs within float32 tolerance of the float64 reference of the same
    (rounded) inputs; gradients in the input dtype within that dtype's tolerance."""
    hidden, weight, bias, ids = linear_problem(19, 16, 300, dtype=dtype, bias=True)
    out = fused_linear_logprobs(hidden, weight, ids, bias=bias, chunk_size=64, logit_softcap=8.0)
    assert out.logprobs.dtype == torch.float32 and out.entropy.dtype == torch.float32
    ref_inputs = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    ref = naive_linear_logprobs(ref_inputs[0], ref_inputs[1], ids, bias=ref_inputs[2], logit_softcap=8.0)
    torch.testing.assert_close(out.logprobs.double(), ref.logprobs, **tol(torch.float32))
    torch.testing.assert_close(out.entropy.double(), ref.entropy, **tol(torch.float32))
    got = _grads(out, (hidden, weight, bias))
    want = _grads(ref, ref_inputs)
    for g, r in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert_grad_close(g, r)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (numel)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_allocates_n_by_v():
    """Forward (with the sum of squared probabilities) + backward allocate nothing larger than max(N * chunk, V * H) (weight-sized grads), never [N, V].
    The same probe sees the [N, V] logits of the naive path (so the probe can fail)."""
    n, h, v, chunk = 64, 8, 1000, 100
    hidden, weight, _, ids = linear_problem(n, h, v, dtype=torch.float32)
    with _LargestTensor() as probe:
        lp, ent, _ = fused_linear_logprobs(hidden, weight, ids, chunk_size=chunk, return_sum_pi_squared=True)
        (lp.sum() + ent.sum()).backward()
    assert probe.largest <= max(n * chunk, v * h) < n * v
    with _LargestTensor() as probe:
        lp, ent = naive_linear_logprobs(hidden, weight, ids)
        (lp.sum() + ent.sum()).backward()
    assert probe.largest >= n * v


def test_empty_and_singleton():
    hidden, weight, _, ids = linear_problem(0, 3, 5)
    lp, ent = fused_linear_logprobs(hidden, weight, ids)
    assert lp.shape == (0,) and ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()
    assert torch.all(weight.grad == 0)
    hidden, weight, _, ids = linear_problem(3, 2, 1)
    lp, ent = fused_linear_logprobs(hidden, weight, ids)
    assert torch.all(lp == 0) and torch.all(ent == 0)


def test_default_chunk_size():
    assert default_chunk_size(4096, 49152, "cpu") == 4096
    assert default_chunk_size(2048, 49152, "cpu") == 8192
    assert default_chunk_size(1, 100, "cpu") == 100
    assert default_chunk_size(10**9, 49152, "cpu") == 256
    assert default_chunk_size(32768, 151936, "cuda") == 2048
    assert default_chunk_size(8192, 128256, "cuda") == 8192


def _args(**over):
    hidden, weight, _, ids = linear_problem(4, 3, 6, dtype=torch.float32)
    return {"hidden": hidden, "weight": weight, "token_ids": ids, **over}


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"weight": torch.zeros(6, 4)}, "hidden must have shape"),
        ({"weight": torch.zeros(6, 3, dtype=torch.float64)}, "same dtype"),
        ({"weight": torch.zeros(6)}, "weight must have shape"),
        ({"bias": torch.zeros(5)}, "bias must be"),
        ({"token_ids": torch.tensor([0, 1, 2, 6])}, "token_ids must lie in"),
        ({"token_ids": torch.tensor([0, 1, 2])}, "token_ids must have shape"),
        ({"token_ids": torch.tensor([0.0, 1.0, 2.0, 3.0])}, "token_ids must be an integer"),
        ({"temperature": -1.0}, "temperature"),
        ({"logit_scale": 0.0}, "logit_scale"),
        ({"logit_softcap": math.inf}, "logit_softcap"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 2.5}, "chunk_size"),
        ({"backend": "cuda"}, "backend"),
        ({"hidden": torch.zeros(4, 3, dtype=torch.long)}, "hidden must be"),
    ],
)
def test_bad_arguments_name_the_argument(over, match):
    with pytest.raises(KernelInputError, match=match):
        unchecked(fused_linear_logprobs)(**_args(**over))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_hidden_raises_instead_of_nan(bad):
    args = _args()
    hidden = args["hidden"].detach().clone()
    hidden[2, 1] = bad
    with pytest.raises(KernelInputError, match="row 2"):
        fused_linear_logprobs(hidden, args["weight"], args["token_ids"])


def test_triton_on_cpu_without_interpreter_is_a_clear_error():
    pytest.importorskip("triton")
    from rlzoo.kernels import _triton

    if _triton.interpreting():
        pytest.skip("the Triton interpreter is active in this process")
    with pytest.raises(KernelInputError, match="TRITON_INTERPRET=1"):
        fused_linear_logprobs(**_args(backend="triton"))


def test_rlzoo_works_without_triton():
    """With triton unimportable, rlzoo and rlzoo.kernels import, the torch path runs, auto picks torch and
    backend='triton' is a clear error (checked in a child process where ``import triton`` fails)."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["triton"] = None  # makes `import triton` raise ImportError
import torch, rlzoo, rlzoo.kernels, rlzoo.kernels._triton
from rlzoo.kernels import fused_linear_logprobs, KernelInputError
from rlzoo.kernels._common import resolve_backend
lp, ent = fused_linear_logprobs(torch.randn(3, 4), torch.randn(7, 4), torch.tensor([0, 6, 2]))
assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16) == ("torch", False)
try:
    fused_linear_logprobs(torch.randn(3, 4), torch.randn(7, 4), torch.tensor([0, 6, 2]), backend="triton")
except KernelInputError as err:
    assert "needs the triton package" in str(err)
else:
    raise AssertionError("no error")
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def test_autocast_runs_the_projection_in_the_autocast_dtype():
    """Under autocast (float32 weight, bf16 activations) the projection runs in bf16 as F.linear would, and the
    float32 weight still gets a float32 gradient through the cast."""
    hidden, weight, _, ids = linear_problem(9, 8, 40, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = fused_linear_logprobs(hidden.to(torch.bfloat16), weight, ids, chunk_size=16)
        (lp.sum() + ent.sum()).backward()
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    h16, w16 = hidden.detach().bfloat16().double(), weight.detach().bfloat16().double()
    ref = naive_linear_logprobs(h16, w16, ids)
    torch.testing.assert_close(lp.double(), ref.logprobs, **tol(torch.float32))
    torch.testing.assert_close(ent.double(), ref.entropy, **tol(torch.float32))


def test_double_backward_raises_instead_of_being_wrong():
    """The custom backward is not differentiable: a second-order gradient raises (never a silent wrong value)."""
    hidden, weight, _, ids = linear_problem(5, 8, 11, dtype=torch.float64)
    out = fused_linear_logprobs(hidden, weight, ids)
    (grad_h,) = torch.autograd.grad(out.logprobs.sum(), hidden, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(grad_h.sum(), weight)


def test_autocast_leaves_float64_inputs_in_float64():
    """Autocast casts only float32/float16/bfloat16 tensors (torch's is_eligible excludes float64), as F.linear does:
    float64 hidden and weight under a bf16 autocast stay float64 and match the float64 reference exactly."""
    hidden, weight, bias, ids = linear_problem(7, 5, 23, bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.linear(hidden, weight, bias).dtype == torch.float64  # what torch does
        out = fused_linear_logprobs(hidden, weight, ids, bias=bias, chunk_size=6, logit_softcap=3.0)
    assert out.logprobs.dtype == torch.float64
    ref = naive_linear_logprobs(hidden, weight, ids, bias=bias, logit_softcap=3.0)
    torch.testing.assert_close(out.logprobs, ref.logprobs, **tol(torch.float64))
    torch.testing.assert_close(out.entropy, ref.entropy, **tol(torch.float64))
    for got, want in zip(_grads(out, (hidden, weight, bias)), _grads(ref, (hidden, weight, bias)), strict=True):
        torch.testing.assert_close(got, want, **tol(torch.float64))


class _LiveLargeStorages(TorchDispatchMode):
    """Tracks the storages of at least ``min_bytes`` that ops allocate (an output whose storage no input shares)
    and the peak of their total size while alive (a storage lives while a Python tensor on it does)."""

    def __init__(self, min_bytes):
        super().__init__()
        self.min_bytes = min_bytes
        self.refs: dict[int, list] = {}  # data_ptr -> [live tensor count, nbytes]
        self.live = 0
        self.peak = 0

    def _release(self, ptr):
        entry = self.refs[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.refs[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref

        out = func(*args, **(kwargs or {}))
        flat = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        inputs = {a.untyped_storage().data_ptr() for a in flat}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            ptr, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            if ptr in self.refs:
                self.refs[ptr][0] += 1
            elif ptr not in inputs and nbytes >= self.min_bytes:
                self.refs[ptr] = [1, nbytes]
                self.live += nbytes
                self.peak = max(self.peak, self.live)
            else:
                continue
            weakref.finalize(t, self._release, ptr)
        return out


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("entropy", [True, False])
def test_backward_holds_at_most_two_chunk_buffers(softcap, entropy):
    """The torch path's backward holds at most two [N, C] float32 buffers (the chunk and one scratch), with
    soft-capping too (it once allocated a third for the tanh derivative). The probe sees that third buffer
    (checked on a deliberate extra allocation)."""
    n, h, v, chunk = 256, 4, 2048, 1024
    hidden, weight, _, ids = linear_problem(n, h, v, dtype=torch.float32)
    out = fused_linear_logprobs(hidden, weight, ids, chunk_size=chunk, logit_softcap=softcap,
                                return_entropy=entropy, backend="torch")
    loss = out.logprobs.sum() + (out.entropy.sum() if entropy else 0)
    buffer = n * chunk * 4
    with _LiveLargeStorages(buffer) as probe:
        torch.autograd.grad(loss, (hidden, weight))
    assert buffer <= probe.peak <= 2 * buffer
    with _LiveLargeStorages(buffer) as probe:  # the probe can fail: three live buffers are seen as three
        kept = [torch.empty(n * chunk) for _ in range(3)]
    assert probe.peak == 3 * buffer and len(kept) == 3


def test_gemm_precision_policy():
    """float16/bfloat16 on CUDA use low-precision GEMMs with float32 output where torch provides them (torch >= 2.8);
    where the device lacks them, the GEMMs run in float32 on upcast copies (exact float32 logits, as on CPU) -
    never on logits rounded to the input dtype. float32/float64 run natively."""
    from rlzoo.kernels.fused import gemm_policy

    assert gemm_policy(torch.bfloat16, "cuda", fp32_output_gemms=True) == "fp32_output"
    assert gemm_policy(torch.float16, "cuda", fp32_output_gemms=False) == "upcast"
    assert gemm_policy(torch.bfloat16, "cpu", fp32_output_gemms=False) == "upcast"
    assert gemm_policy(torch.float32, "cuda", fp32_output_gemms=False) == "native"
    assert gemm_policy(torch.float64, "cpu", fp32_output_gemms=False) == "native"


def test_torch_floor_has_fp32_output_gemms():
    """pyproject's torch floor is at least 2.8, the first release with torch.mm/addmm(out_dtype=float32) for
    fp16/bf16 inputs on CUDA (pytorch#150812), which the fused path's bf16 GEMMs use."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    floors = re.findall(r'"torch\s*>=\s*([\d.]+)', text)
    assert len(floors) == 1, floors
    assert tuple(int(x) for x in floors[0].split(".")[:2]) >= (2, 8), floors


@pytest.mark.cuda
def test_cuda_bf16_gemms_have_float32_output():
    """On CUDA with torch >= 2.8, bf16 inputs take the fp32-output GEMMs (not the upcast fallback), and the values
    match the float64 reference of the rounded inputs within the bf16 row."""
    from rlzoo.kernels.fused import _Gemms

    hidden, weight, _, ids = linear_problem(64, 32, 1000, dtype=torch.bfloat16)
    hidden, weight, ids = (t.detach().cuda() for t in (hidden, weight, ids))
    gemms = _Gemms(hidden, weight)
    assert gemms.fp32_output and not gemms.upcast
    out = fused_linear_logprobs(hidden, weight, ids, chunk_size=256, backend="torch")
    ref = naive_linear_logprobs(hidden.double(), weight.double(), ids)
    torch.testing.assert_close(out.logprobs.double(), ref.logprobs, **tol(torch.bfloat16))


@pytest.mark.cuda
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_cuda_torch_backward_peak_memory(softcap):
    """The torch path's backward on CUDA: peak extra memory at most two float32 [N, C] buffers plus the
    gradients of hidden and weight (and small vectors), with soft-capping too."""
    n, h, v, chunk = 4096, 64, 8192, 2048
    hidden, weight, _, ids = linear_problem(n, h, v, dtype=torch.float32)
    hidden, weight = (t.detach().cuda().requires_grad_() for t in (hidden, weight))
    ids = ids.cuda()
    # warm-up: autograd's CUDA backward runs on its own thread, whose first GEMM allocates that thread's cuBLAS
    # workspace (32 MiB on an H100) through the caching allocator; it is not the kernel's memory
    small = fused_linear_logprobs(hidden[:8], weight, ids[:8], chunk_size=chunk, backend="torch")
    torch.autograd.grad(small.logprobs.sum() + small.entropy.sum(), (hidden, weight))
    out = fused_linear_logprobs(hidden, weight, ids, chunk_size=chunk, logit_softcap=softcap, backend="torch")
    loss = out.logprobs.sum() + out.entropy.sum()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.autograd.grad(loss, (hidden, weight))
    peak = torch.cuda.max_memory_allocated() - base
    budget = 2 * n * chunk * 4 + 2 * (n * h + v * h) * 4 + 64 * n * 4
    assert peak <= budget, (peak, budget)
