"""The per-token sum of squared probabilities (``return_sum_pi_squared=True``) of the torch kernels.

The math: with z the transformed logits (scale, soft-cap, then / T) and p = softmax(z),
S = sum_v p_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)), in [1/V, 1]; it is what verl 0.9.1 calls
``sum_pi_squared`` (``verl.utils.torch_functional.calculate_sum_pi_squared_from_logits`` of the
temperature-scaled logits) and feeds to its optimal_token_baseline estimator. The kernels must give the
value of the float64 materialising reference and of verl, over odd shapes and chunkings, without an
[N, V] tensor, and the statistic carries no gradient (as verl uses it: computed without grad).
"""

import math

import pytest
import torch
from kernel_cases import OPTIONS, SHAPES, linear_problem
from oracles import verl_core_algos
from tolerances import tol

from rlzoo.kernels import (
    TokenLogProbs,
    TokenLogProbStats,
    causal_lm_logprobs,
    fused_linear_logprobs,
    logprobs_and_entropy_from_logits,
    sum_pi_squared_from_logits,
)
from rlzoo.kernels.reference import naive_linear_logprobs, naive_logprobs


def _verl_sum_pi_squared():
    verl_core_algos()  # installs the ray stub verl needs at import (skips when verl is absent)
    from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits

    return calculate_sum_pi_squared_from_logits


# ------------------------------------------------------------------------------------------- fused path
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("return_entropy", [True, False])
def test_fused_matches_reference_float64(shape, options, return_entropy):
    """S equals the materialising float64 reference for every transform and chunking; the log-probs,
    entropies and their gradients are unchanged by asking for S."""
    n, h, v, chunk = shape
    opts = dict(options)
    hidden, weight, bias, ids = linear_problem(n, h, v, bias=opts.pop("bias", False))
    out = fused_linear_logprobs(hidden, weight, ids, chunk_size=chunk, bias=bias, return_entropy=return_entropy,
                                return_sum_pi_squared=True, backend="torch", **opts)
    assert isinstance(out, TokenLogProbStats)
    ref = naive_linear_logprobs(hidden, weight, ids, bias=bias, return_entropy=return_entropy,
                                return_sum_pi_squared=True, **opts)
    torch.testing.assert_close(out.sum_pi_squared, ref.sum_pi_squared, **tol(torch.float64))
    plain = fused_linear_logprobs(hidden, weight, ids, chunk_size=chunk, bias=bias, return_entropy=return_entropy,
                                  backend="torch", **opts)
    assert isinstance(plain, TokenLogProbs)
    assert torch.equal(out.logprobs, plain.logprobs)
    assert (out.entropy is None) == (not return_entropy)
    if return_entropy:
        assert torch.equal(out.entropy, plain.entropy)


def test_fused_matches_verl():
    """Equal to verl 0.9.1's calculate_sum_pi_squared_from_logits of the temperature-scaled logits (as verl's
    actor computes it: logits / temperature first), float64."""
    verl_fn = _verl_sum_pi_squared()
    hidden, weight, _, ids = linear_problem(23, 7, 61)
    temperature = 0.7
    got = fused_linear_logprobs(hidden, weight, ids, temperature=temperature, chunk_size=16,
                                return_sum_pi_squared=True).sum_pi_squared
    want = verl_fn((hidden @ weight.T) / temperature)
    torch.testing.assert_close(got, want, **tol(torch.float64))


def test_fused_is_not_differentiable_and_leaves_gradients_unchanged():
    """S is a detached statistic: requires_grad is False and the gradients of a loss on the log-probs and
    entropies are the same with and without it."""
    hidden, weight, _, ids = linear_problem(9, 5, 31)
    out = fused_linear_logprobs(hidden, weight, ids, chunk_size=8, return_sum_pi_squared=True)
    assert not out.sum_pi_squared.requires_grad and out.logprobs.requires_grad
    g1 = torch.autograd.grad(out.logprobs.sum() + 0.3 * out.entropy.sum(), (hidden, weight))
    plain = fused_linear_logprobs(hidden, weight, ids, chunk_size=8)
    g2 = torch.autograd.grad(plain.logprobs.sum() + 0.3 * plain.entropy.sum(), (hidden, weight))
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_low_precision(dtype):
    """bf16/fp16/fp32 inputs: float32 S within float32 tolerance of the float64 reference of the same
    (rounded) inputs (the accumulation is float32)."""
    hidden, weight, bias, ids = linear_problem(19, 16, 300, dtype=dtype, bias=True)
    out = fused_linear_logprobs(hidden, weight, ids, bias=bias, chunk_size=64, logit_softcap=8.0,
                                return_sum_pi_squared=True)
    assert out.sum_pi_squared.dtype == torch.float32
    ref = naive_linear_logprobs(hidden.detach().double(), weight.detach().double(), ids,
                                bias=bias.detach().double(), logit_softcap=8.0, return_sum_pi_squared=True)
    torch.testing.assert_close(out.sum_pi_squared.double(), ref.sum_pi_squared, **tol(torch.float32))


def test_fused_batched_leading_dims_and_empty():
    hidden, weight, _, ids = linear_problem(12, 5, 17)
    out3 = fused_linear_logprobs(hidden.view(3, 4, 5), weight, ids.view(3, 4), chunk_size=6,
                                 return_sum_pi_squared=True)
    out2 = fused_linear_logprobs(hidden, weight, ids, chunk_size=6, return_sum_pi_squared=True)
    assert out3.sum_pi_squared.shape == (3, 4)
    torch.testing.assert_close(out3.sum_pi_squared.reshape(-1), out2.sum_pi_squared, **tol(torch.float64))
    hidden, weight, _, ids = linear_problem(0, 3, 5)
    assert fused_linear_logprobs(hidden, weight, ids, return_sum_pi_squared=True).sum_pi_squared.shape == (0,)


def test_fused_bounds_and_identities():
    """1/V <= S <= 1; S >= p_y^2 (one term of the sum); S >= exp(-H) (Renyi-2 entropy <= Shannon entropy);
    uniform logits give S = 1/V exactly; a single-token vocabulary gives S = 1."""
    hidden, weight, _, ids = linear_problem(40, 6, 37)
    out = fused_linear_logprobs(hidden * 4, weight, ids, chunk_size=10, return_sum_pi_squared=True)
    s = out.sum_pi_squared
    assert torch.all(s >= 1 / 37 - 1e-12) and torch.all(s <= 1 + 1e-12)
    assert torch.all(s >= torch.exp(2 * out.logprobs) - 1e-12)
    assert torch.all(s >= torch.exp(-out.entropy) - 1e-12)
    uniform = fused_linear_logprobs(torch.zeros(3, 6, dtype=torch.float64), weight.detach(), ids[:3],
                                    return_sum_pi_squared=True)
    torch.testing.assert_close(uniform.sum_pi_squared, torch.full((3,), 1 / 37, dtype=torch.float64),
                               **tol(torch.float64))
    single = fused_linear_logprobs(hidden, weight[:1], torch.zeros_like(ids), return_sum_pi_squared=True)
    assert torch.all(single.sum_pi_squared == 1)


def test_fused_extreme_logits_stay_finite():
    """Logits of order 1e4 in float32 (the online max shift rescales the accumulator by alpha^2): finite and
    equal to the float64 value."""
    hidden = torch.tensor([[1.0], [-1.0], [0.5]], dtype=torch.float32)
    weight = torch.tensor([[1e4], [9999.0], [0.0], [-1e4]], dtype=torch.float32)
    ids = torch.tensor([0, 1, 2])
    got = fused_linear_logprobs(hidden, weight, ids, chunk_size=1, return_sum_pi_squared=True).sum_pi_squared
    want = torch.softmax(hidden.double() @ weight.double().T, -1).square().sum(-1)
    torch.testing.assert_close(got.double(), want, **tol(torch.float32))


# ------------------------------------------------------------------------------------------ logits path
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 3), (3, 4, 17), (2, 3, 5, 11)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 2, None])
def test_logits_matches_reference_float64(shape, temperature, chunk_size):
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(shape, generator=g, dtype=torch.float64)).requires_grad_()
    ids = torch.randint(0, shape[-1], shape[:-1], generator=g)
    out = logprobs_and_entropy_from_logits(x, ids, temperature, chunk_size=chunk_size, backend="torch",
                                           return_sum_pi_squared=True)
    ref = naive_logprobs(x, ids, temperature, return_entropy=True, return_sum_pi_squared=True)
    torch.testing.assert_close(out.sum_pi_squared, ref.sum_pi_squared, **tol(torch.float64))
    torch.testing.assert_close(out.logprobs, ref.logprobs, **tol(torch.float64))
    torch.testing.assert_close(out.entropy, ref.entropy, **tol(torch.float64))
    alone = sum_pi_squared_from_logits(x, temperature, chunk_size=chunk_size, backend="torch")
    torch.testing.assert_close(alone, ref.sum_pi_squared, **tol(torch.float64))
    assert not out.sum_pi_squared.requires_grad and not alone.requires_grad


def test_logits_matches_verl_and_masked_vocabulary():
    """verl's formula on float32 logits with temperature; -inf logits (masked vocabulary) contribute 0."""
    verl_fn = _verl_sum_pi_squared()
    g = torch.Generator().manual_seed(2)
    x = 4 * torch.randn(3, 5, 211, generator=g)
    torch.testing.assert_close(sum_pi_squared_from_logits(x, 1.3), verl_fn(x / 1.3), **tol(torch.float32))
    x64 = x.double()
    x64[..., 150:] = -math.inf
    torch.testing.assert_close(sum_pi_squared_from_logits(x64, chunk_size=4), verl_fn(x64[..., :150]),
                               **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logits_low_precision(dtype):
    g = torch.Generator().manual_seed(3)
    x = (4 * torch.randn(6, 1000, generator=g)).to(dtype)
    got = sum_pi_squared_from_logits(x)
    assert got.dtype == torch.float32
    want = torch.softmax(x.double(), -1).square().sum(-1)
    torch.testing.assert_close(got.double(), want, **tol(torch.float32))


def test_logits_sliced_view():
    g = torch.Generator().manual_seed(4)
    full = torch.randn(3, 6, 13, generator=g, dtype=torch.float64)
    got = sum_pi_squared_from_logits(full[:, :-1], chunk_size=4)
    torch.testing.assert_close(got, torch.softmax(full[:, :-1], -1).square().sum(-1), **tol(torch.float64))


# ---------------------------------------------------------------------------------- causal_lm_logprobs
@pytest.mark.parametrize("fused", [True, False])
def test_causal_lm_logprobs_passes_it_through(fused):
    """Both paths of causal_lm_logprobs return S of the model's own (temperature-scaled) logits."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=41, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).double().eval()
    ids = torch.randint(0, 41, (2, 7))
    out = causal_lm_logprobs(model, ids, None, 3, temperature=0.8, fused=fused, return_sum_pi_squared=True)
    logits = model(input_ids=ids).logits[:, -4:-1]
    torch.testing.assert_close(out.sum_pi_squared, torch.softmax(logits / 0.8, -1).square().sum(-1),
                               **tol(torch.float64))
