"""logprobs_from_logits / entropy_from_logits (torch path) against the materializing reference and TRL.

The math: with z = logits / T, log p(y) = z_y - logsumexp(z) and H = logsumexp(z) - sum_v p_v z_v;
dlog p(y)/dz = onehot(y) - p and dH/dz = -p (log p + H). The reference computes log_softmax in float64.
"""

import inspect
import math

import pytest
import torch
from tolerances import assert_grad_close, tol

from rlzoo.kernels import (
    KernelInputError,
    entropy_from_logits,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
)
from rlzoo.kernels.reference import naive_logprobs


def unchecked(fn):
    """``fn`` without the test-time jaxtyping/beartype wrapper, so rlzoo's own argument checks (what users
    get at run time) are what is tested."""
    return inspect.unwrap(fn)


SHAPES = [(1, 1), (1, 5), (7, 3), (3, 4, 17), (2, 3, 5, 11)]


def _logits(shape, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def _ids(shape, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape[:-1], generator=g)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 2, None])
def test_matches_reference_float64(shape, temperature, chunk_size):
    """Values and both gradients equal the float64 log_softmax reference, for every chunking."""
    x = _logits(shape, torch.float64).requires_grad_()
    ids = _ids(shape, shape[-1])
    lp, ent = logprobs_and_entropy_from_logits(x, ids, temperature, chunk_size=chunk_size, backend="torch")
    ref_lp, ref_ent = naive_logprobs(x, ids, temperature, return_entropy=True)
    torch.testing.assert_close(lp, ref_lp, **tol(torch.float64))
    torch.testing.assert_close(ent, ref_ent, **tol(torch.float64))
    w1, w2 = torch.randn_like(lp), torch.randn_like(lp)
    (g,) = torch.autograd.grad((w1 * lp + w2 * ent).sum(), x)
    (g_ref,) = torch.autograd.grad((w1 * ref_lp + w2 * ref_ent).sum(), x)
    torch.testing.assert_close(g, g_ref, **tol(torch.float64))


def test_single_outputs_match_pair():
    x = _logits((4, 9), torch.float64)
    ids = _ids((4, 9), 9)
    lp, ent = logprobs_and_entropy_from_logits(x, ids)
    assert torch.equal(logprobs_from_logits(x, ids), lp)
    assert torch.equal(entropy_from_logits(x), ent)


def test_gradcheck_float64():
    """float64 gradcheck of both outputs (entropy included) with temperature and several chunks."""
    x = _logits((5, 7), torch.float64, scale=1.0).requires_grad_()
    ids = torch.tensor([0, 6, 3, 3, 1])
    torch.autograd.gradcheck(
        lambda t: logprobs_and_entropy_from_logits(t, ids, 1.3, chunk_size=2, backend="torch"), (x,)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_accumulates_in_float32(dtype):
    """bf16/fp16 logits give float32 outputs within float32 tolerance of the float64 reference of the same
    (rounded) logits: the accumulation is float32, not the input dtype. The logits gradient has the input
    dtype and matches within that dtype's tolerance."""
    x = _logits((6, 1000), dtype, scale=4.0).requires_grad_()
    ids = _ids((6, 1000), 1000)
    lp, ent = logprobs_and_entropy_from_logits(x, ids, backend="torch")
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    x64 = x.detach().double().requires_grad_()
    ref_lp, ref_ent = naive_logprobs(x64, ids, return_entropy=True)
    torch.testing.assert_close(lp, ref_lp.float(), **tol(torch.float32))
    torch.testing.assert_close(ent, ref_ent.float(), **tol(torch.float32))
    (g,) = torch.autograd.grad((lp + ent).sum(), x)
    (g_ref,) = torch.autograd.grad((ref_lp + ref_ent).sum(), x64)
    assert g.dtype == dtype
    assert_grad_close(g, g_ref)


def test_sliced_view_is_read_without_copy_and_matches():
    """logits[:, :-1] (a [B, T-1, V] view that cannot be flattened) gives the same values."""
    full = _logits((3, 6, 13), torch.float64).requires_grad_()
    view = full[:, :-1]
    ids = _ids((3, 5, 13), 13)
    lp, ent = logprobs_and_entropy_from_logits(view, ids, chunk_size=4, backend="torch")
    ref_lp, ref_ent = naive_logprobs(view, ids, return_entropy=True)
    torch.testing.assert_close(lp, ref_lp, **tol(torch.float64))
    torch.testing.assert_close(ent, ref_ent, **tol(torch.float64))
    (g,) = torch.autograd.grad(lp.sum() + ent.sum(), full)
    assert torch.all(g[:, -1] == 0)


def test_masked_vocabulary_minus_inf():
    """-inf logits (masked vocabulary) contribute p = 0 and 0 log 0 = 0; gradients stay finite and are 0 there."""
    x = _logits((4, 10), torch.float64)
    x[:, 7:] = -math.inf
    x = x.requires_grad_()
    ids = torch.tensor([0, 1, 2, 6])
    lp, ent = logprobs_and_entropy_from_logits(x, ids, chunk_size=3)
    ref_lp, ref_ent = naive_logprobs(x.detach()[:, :7], ids, return_entropy=True)
    torch.testing.assert_close(lp, ref_lp, **tol(torch.float64))
    torch.testing.assert_close(ent, ref_ent, **tol(torch.float64))
    (g,) = torch.autograd.grad(lp.sum() + ent.sum(), x)
    assert torch.isfinite(g).all() and torch.all(g[:, 7:] == 0)


def test_entropy_bounds_and_uniform():
    """0 <= H <= log V; uniform logits give H = log V and log p = -log V; a one-hot-like row gives H ~ 0."""
    x = _logits((50, 33), torch.float64, scale=10.0)
    ent = entropy_from_logits(x)
    assert torch.all(ent >= -1e-12) and torch.all(ent <= math.log(33) + 1e-12)
    u = torch.zeros(2, 33, dtype=torch.float64)
    torch.testing.assert_close(entropy_from_logits(u), torch.full((2,), math.log(33), dtype=torch.float64))
    peaked = torch.tensor([[0.0, -1e4, -1e4]], dtype=torch.float64)
    assert float(entropy_from_logits(peaked)) < 1e-12


def test_extreme_logits_do_not_overflow():
    """Logits of +-1e4 in float32 stay finite (online max-shift), matching float64."""
    x = torch.tensor([[1e4, -1e4, 9999.0, 0.0]], dtype=torch.float32)
    ids = torch.tensor([2])
    lp, ent = logprobs_and_entropy_from_logits(x, ids)
    ref_lp, ref_ent = naive_logprobs(x.double(), ids, return_entropy=True)
    torch.testing.assert_close(lp.double(), ref_lp, **tol(torch.float32))
    torch.testing.assert_close(ent.double(), ref_ent, **tol(torch.float32))


def test_matches_trl():
    """Same values as TRL 1.16 selective_log_softmax / entropy_from_logits (float32, with temperature)."""
    trl_utils = pytest.importorskip("trl.trainer.utils")
    x = _logits((3, 5, 301), torch.float32)
    ids = _ids((3, 5, 301), 301)
    torch.testing.assert_close(logprobs_from_logits(x, ids, 0.9),
                               trl_utils.selective_log_softmax(x, ids, temperature=0.9), **tol(torch.float32))
    torch.testing.assert_close(entropy_from_logits(x), trl_utils.entropy_from_logits(x), **tol(torch.float32))


def test_empty_batch():
    x = torch.zeros(0, 5, requires_grad=True)
    lp = logprobs_from_logits(x, torch.zeros(0, dtype=torch.long))
    assert lp.shape == (0,)
    lp.sum().backward()
    assert x.grad.shape == (0, 5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"token_ids": torch.tensor([0, 5])}, "token_ids must lie in"),
        ({"token_ids": torch.tensor([-1, 0])}, "token_ids must lie in"),
        ({"token_ids": torch.tensor([0, 1, 2])}, "token_ids must have shape"),
        ({"token_ids": torch.tensor([0.0, 1.0])}, "token_ids must be an integer"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"backend": "cuda"}, "backend"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    args = {"logits": torch.zeros(2, 5), "token_ids": torch.tensor([0, 1]), **kwargs}
    with pytest.raises(KernelInputError, match=match):
        unchecked(logprobs_from_logits)(**args)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_logits_raise_instead_of_nan(bad):
    x = torch.zeros(3, 4)
    x[1, 2] = bad
    with pytest.raises(KernelInputError, match="row 1"):
        logprobs_from_logits(x, torch.tensor([0, 0, 0]))


def test_row_without_finite_logit_raises():
    x = torch.zeros(2, 4)
    x[0] = -math.inf
    with pytest.raises(KernelInputError, match="row 0"):
        entropy_from_logits(x)


def test_non_float_logits_raise():
    with pytest.raises(KernelInputError, match="logits must be"):
        unchecked(logprobs_from_logits)(torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1]))
