"""The Triton kernels against the torch path: on CPU through the Triton interpreter, on CUDA compiled.

The interpreter must be selected before triton is first imported (``TRITON_INTERPRET=1``), and the
default test process imports triton early (TRL imports it), so on CPU these tests run in a child
pytest process started by :func:`test_kernels_in_triton_interpreter` with ``TRITON_INTERPRET=1``.
Run them directly with ``TRITON_INTERPRET=1 python -m pytest tests/kernels/test_triton_kernels.py``.

What is compared: log-probs, entropies, sums of squared probabilities (``return_sum_pi_squared``) and the
gradients of every input from both differentiable outputs, kernel vs
the torch path of the same dtype (float32 outputs: float32 row of the tolerance table; gradients: the
row of their dtype), and against the float64 reference. Odd shapes (N, H, V not multiples of anything,
V smaller than one block, chunks that split V unevenly), every logit transform, fp32 and bf16.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tolerances import assert_grad_close, tol

triton = pytest.importorskip("triton")

from rlzoo.kernels import (
    fused_linear_logprobs,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)
from rlzoo.kernels.reference import naive_linear_logprobs, naive_logprobs

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(
    not INTERPRETING, reason="runs in a child process with TRITON_INTERPRET=1 (test_kernels_in_triton_interpreter)"
)
REPO = Path(__file__).resolve().parents[2]

SHAPES = [(1, 1, 1, None), (2, 3, 5, 2), (7, 5, 13, 4), (19, 8, 130, 47), (5, 4, 300, 128)]
OPTIONS = [
    {},
    {"temperature": 0.7, "logit_scale": 0.5},
    {"bias": True, "logit_softcap": 3.0, "temperature": 1.2},
]


def _problem(n, h, v, dtype, device, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(v, h, generator=g) * (2.0 / h**0.5)
    b = torch.randn(v, generator=g) if bias else None
    ids = torch.randint(0, v, (n,), generator=g)

    def leaf(t):
        return None if t is None else t.to(device=device, dtype=dtype).requires_grad_()

    return leaf(hidden), leaf(weight), leaf(b), ids.to(device)


def _loss_weights(n, device, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).to(device), torch.randn(n, generator=g).to(device)


def _run_fused(backend, hidden, weight, bias, ids, chunk, options, which):
    inputs = [t.detach().clone().requires_grad_() for t in (hidden, weight) + ((bias,) if bias is not None else ())]
    b = inputs[2] if bias is not None else None
    out = fused_linear_logprobs(inputs[0], inputs[1], ids, bias=b, chunk_size=chunk, backend=backend,
                                return_sum_pi_squared=True, **options)
    wl, we = _loss_weights(ids.numel(), ids.device)
    loss = 0.0
    if which in ("both", "logprob"):
        loss = loss + (wl * out.logprobs).sum()
    if which in ("both", "entropy") and out.entropy is not None:
        loss = loss + (we * out.entropy).sum()
    grads = torch.autograd.grad(loss, inputs)
    return out, grads


def _compare_fused(device, shape, options, dtype, which="both"):
    n, h, v, chunk = shape
    opts = dict(options)
    hidden, weight, bias, ids = _problem(n, h, v, dtype, device, bias=opts.pop("bias", False))
    k_out, k_grads = _run_fused("triton", hidden, weight, bias, ids, chunk, opts, which)
    t_out, t_grads = _run_fused("torch", hidden, weight, bias, ids, chunk, opts, which)
    torch.testing.assert_close(k_out.logprobs, t_out.logprobs, **tol(torch.float32))
    torch.testing.assert_close(k_out.sum_pi_squared, t_out.sum_pi_squared, **tol(torch.float32))
    assert not k_out.sum_pi_squared.requires_grad
    if opts.get("return_entropy", True):
        torch.testing.assert_close(k_out.entropy, t_out.entropy, **tol(torch.float32))
    else:
        assert k_out.entropy is None and t_out.entropy is None
    for kg, tg in zip(k_grads, t_grads, strict=True):
        assert kg.dtype == dtype
        assert_grad_close(kg, tg)
    # and the float64 reference of the same (rounded) inputs; on CUDA, bf16 logits come from a bf16 GEMM
    # (float32 output where torch supports it), so there the bf16 row applies
    ref_opts = {k: v for k, v in opts.items() if k != "return_entropy"}
    ref = naive_linear_logprobs(*(t.detach().double() for t in (hidden, weight)), ids,
                                bias=None if bias is None else bias.detach().double(), return_sum_pi_squared=True,
                                **ref_opts)
    ref_tol = tol(torch.float32 if device == "cpu" else dtype)
    torch.testing.assert_close(k_out.logprobs.double(), ref.logprobs, **ref_tol)
    torch.testing.assert_close(k_out.sum_pi_squared.double(), ref.sum_pi_squared, **ref_tol)
    if k_out.entropy is not None:
        torch.testing.assert_close(k_out.entropy.double(), ref.entropy, **ref_tol)


def _compare_logits(device, dtype, sliced, temperature, masked, entropy=True):
    g = torch.Generator().manual_seed(0)
    full = (3 * torch.randn(3, 6, 77, generator=g)).to(device=device, dtype=dtype)
    if masked:
        full[..., 60:] = float("-inf")
    ids = torch.randint(0, 60, (3, 6), generator=g).to(device)
    x = full[:, :-1] if sliced else full
    ids = ids[:, :-1] if sliced else ids
    results = []
    for backend in ("triton", "torch"):
        leaf = x.detach().clone().requires_grad_()
        if entropy:
            lp, ent = logprobs_and_entropy_from_logits(leaf, ids, temperature, backend=backend)
        else:  # the kernel's WITH_ENTROPY=False branch (the trainer's default)
            lp = logprobs_from_logits(leaf, ids, temperature, backend=backend)
            ent = torch.zeros_like(lp)
        wl, we = _loss_weights(lp.numel(), device)
        (grad,) = torch.autograd.grad((wl.view_as(lp) * lp + we.view_as(ent) * ent).sum(), leaf)
        results.append((lp, ent, grad))
    (k_lp, k_ent, k_g), (t_lp, t_ent, t_g) = results
    k_sq, t_sq = (sum_pi_squared_from_logits(x, temperature, backend=b) for b in ("triton", "torch"))
    torch.testing.assert_close(k_sq, t_sq, **tol(torch.float32))
    torch.testing.assert_close(k_lp, t_lp, **tol(torch.float32))
    torch.testing.assert_close(k_ent, t_ent, **tol(torch.float32))
    assert k_g.dtype == dtype and torch.isfinite(k_g).all()
    assert_grad_close(k_g, t_g)
    ref_lp, ref_ent, ref_sq = naive_logprobs(x.detach().double()[..., :60] if masked else x.detach().double(), ids,
                                             temperature, return_entropy=True, return_sum_pi_squared=True)
    torch.testing.assert_close(k_lp.double(), ref_lp, **tol(torch.float32))
    torch.testing.assert_close(k_sq.double(), ref_sq, **tol(torch.float32))
    if entropy:
        torch.testing.assert_close(k_ent.double(), ref_ent, **tol(torch.float32))


# ------------------------------------------------------------------------------------- interpreter (CPU)
@needs_interpreter
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_interpreter_matches_torch(shape, options, dtype):
    _compare_fused("cpu", shape, options, dtype)


@needs_interpreter
@pytest.mark.parametrize("which", ["logprob", "entropy"])
def test_fused_interpreter_single_output_gradients(which):
    """Only one output used: the kernel's HAS_GL / HAS_GE branches."""
    _compare_fused("cpu", (9, 6, 70, 32), {"logit_softcap": 4.0}, torch.float32, which=which)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_interpreter_without_entropy(dtype):
    """return_entropy=False: the kernel's WITH_ENTROPY=False branch (the trainer's default)."""
    _compare_fused("cpu", (19, 8, 130, 47), {"return_entropy": False, "temperature": 0.9}, dtype, which="logprob")


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("sliced", "temperature", "masked"), [(False, 1.0, False), (True, 0.8, False), (True, 1.0, True)])
@pytest.mark.parametrize("entropy", [True, False])
def test_logits_interpreter_matches_torch(dtype, sliced, temperature, masked, entropy):
    _compare_logits("cpu", dtype, sliced, temperature, masked, entropy)


@needs_interpreter
@pytest.mark.parametrize(("shape", "options"), [((19, 8, 130, 47), {"return_entropy": False}),
                                                ((7, 5, 13, 4), {"logit_softcap": 3.0, "temperature": 0.7})])
def test_fused_interpreter_sum_pi_squared_with_and_without_entropy(shape, options):
    """The kernel's WITH_SUMSQ accumulator with WITH_ENTROPY on and off, chunks that split V unevenly."""
    _compare_fused("cpu", shape, options, torch.float32, which="logprob")


def test_launches_make_the_tensors_device_current(monkeypatch):
    """fold/grad launch under torch.cuda.device(x.device), so a tensor on cuda:1 is not launched on the current
    device 0 (a model split across GPUs). Checked without a GPU: fake kernels record the guard they ran under."""
    import contextlib

    from rlzoo.kernels import _triton

    events = []

    @contextlib.contextmanager
    def guard(device):
        events.append(("enter", device))
        yield
        events.append(("exit", device))

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: events.append(("launch", grid))

    monkeypatch.setattr(_triton, "device_guard", guard)
    monkeypatch.setattr(_triton, "_fold_kernel", FakeKernel())
    monkeypatch.setattr(_triton, "_grad_kernel", FakeKernel())
    x, ids, state = torch.zeros(3, 5), torch.zeros(3, dtype=torch.long), torch.zeros(5, 3)
    _triton.fold(x, 3, 0, 5, 3, 5, 0, ids, state, scale=1.0, softcap=None, temperature=1.0, with_entropy=True)
    m = torch.zeros(3)
    _triton.grad(x, 3, 0, 5, x, 5, 3, 5, 0, ids, m, m, m, m, None, scale=1.0, softcap=None, temperature=1.0)
    dev = torch.device("cpu")
    assert events == [("enter", dev), ("launch", (3,)), ("exit", dev)] * 2


def test_device_guard_selects_the_tensors_cuda_device():
    """The real guard: torch.cuda.device of the tensor's CUDA device (built without a GPU), nothing on CPU."""
    from rlzoo.kernels import _triton

    guard = _triton.device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert not isinstance(_triton.device_guard(torch.device("cpu")), torch.cuda.device)


def test_kernels_in_triton_interpreter():
    """Runs this module's interpreter tests in a child pytest with TRITON_INTERPRET=1 (set before triton is
    imported there). Fails if the child fails or runs no test."""
    if INTERPRETING:
        pytest.skip("this process already runs the interpreter tests")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__).relative_to(REPO)), "-q", "-p", "no:cacheprovider",
           "-k", "interpreter and not test_kernels_in_triton_interpreter", "--no-header"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 30, report


# ------------------------------------------------------------------- compile for CUDA, without a GPU
_FOLD_SIGNATURE = {
    "x_ptr": "*{dt}", "rows_per_group": "i64", "stride_group": "i64", "stride_row": "i64", "n_cols": "i32",
    "col_offset": "i64", "ids_ptr": "*i64", "state_ptr": "*fp32", "n_rows": "i32",
    "scale_over_cap": "fp32", "cap_over_t": "fp32", "factor": "fp32",
}
_GRAD_SIGNATURE = {
    "x_ptr": "*{dt}", "rows_per_group": "i64", "stride_group": "i64", "stride_row": "i64", "out_ptr": "*{dt}",
    "out_stride_row": "i64", "n_cols": "i32", "col_offset": "i64", "ids_ptr": "*i64", "m_ptr": "*fp32",
    "logs_ptr": "*fp32", "ent_ptr": "*fp32", "gl_ptr": "*fp32", "ge_ptr": "*fp32",
    "scale_over_cap": "fp32", "cap_over_t": "fp32", "factor": "fp32",
}


@pytest.mark.skipif(INTERPRETING, reason="the interpreter builds no compilable kernels")
@pytest.mark.parametrize("dt", ["fp32", "bf16"])
@pytest.mark.parametrize("kernel", ["fold", "grad"])
def test_kernels_compile_for_sm90_without_a_gpu(kernel, dt):
    """Ahead-of-time compilation to PTX/cubin for an H100 (sm_90) with Triton's bundled ptxas: catches what the
    interpreter never checks (e.g. a kernel reading a non-constexpr module global, which Triton refuses)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rlzoo.kernels import _triton

    if kernel == "fold":
        fn, signature = _triton._fold_kernel, _FOLD_SIGNATURE
        constexprs = {"HAS_SOFTCAP": True, "WITH_ENTROPY": True, "WITH_SUMSQ": True, "BLOCK": 1024}
    else:
        fn, signature = _triton._grad_kernel, _GRAD_SIGNATURE
        constexprs = {"HAS_SOFTCAP": True, "HAS_GL": True, "HAS_GE": True, "BLOCK": 1024}
    sig = {k: v.format(dt=dt) for k, v in signature.items()} | dict.fromkeys(constexprs, "constexpr")
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32))
    assert ".entry" in compiled.asm["ptx"]


# --------------------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES + [(1000, 64, 5000, 1024)])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cuda_matches_torch(shape, options, dtype):
    _compare_fused("cuda", shape, options, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("sliced", "temperature", "masked"), [(False, 1.0, False), (True, 0.8, False), (True, 1.0, True)])
def test_logits_cuda_matches_torch(dtype, sliced, temperature, masked):
    _compare_logits("cuda", dtype, sliced, temperature, masked)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device_while_first_is_current():
    """Tensors on cuda:1 while cuda:0 is current (a model split across GPUs): the Triton path equals the torch
    path on that device (before the device guard the kernels ran on the current device's stream/context)."""
    torch.cuda.set_device(0)
    hidden, weight, bias, ids = _problem(37, 16, 300, torch.bfloat16, "cuda:1", bias=True)
    k_out, k_grads = _run_fused("triton", hidden, weight, bias, ids, 64, {"logit_softcap": 4.0}, "both")
    t_out, t_grads = _run_fused("torch", hidden, weight, bias, ids, 64, {"logit_softcap": 4.0}, "both")
    assert k_out.logprobs.device == torch.device("cuda", 1)
    torch.testing.assert_close(k_out.logprobs, t_out.logprobs, **tol(torch.float32))
    torch.testing.assert_close(k_out.sum_pi_squared, t_out.sum_pi_squared, **tol(torch.float32))
    for kg, tg in zip(k_grads, t_grads, strict=True):
        assert_grad_close(kg, tg)


@pytest.mark.cuda
def test_auto_backend_is_triton_on_cuda():
    from rlzoo.kernels._common import resolve_backend

    assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16) == ("triton", False)
