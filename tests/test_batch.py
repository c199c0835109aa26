"""PolicyBatch validation, split(), Normalizer counts, LossOutput (rlzoo/batch.py)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import masks, policy_batches, runtime_type_checker_off
from tolerances import tol

import rlzoo
from rlzoo import BatchError, LossOutput, Normalizer, PolicyBatch

OPTIONAL = ("old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies")


@pytest.fixture(autouse=True)
def _users_error_path():
    """Validation errors as users see them (without the test-only jaxtyping checker)."""
    with runtime_type_checker_off():
        yield


# ---------------------------------------------------------------------------------------------- PolicyBatch
@given(batch=policy_batches(garbage_padding=True))
def test_valid_batches_construct_and_report_their_shape(batch):
    """Every valid batch (log-probs <= 0 and finite where counted, anything in padding) constructs;
    shape == (B, T) of logprobs; the fields are kept as given (no copy, no cast)."""
    b, t = batch.logprobs.shape
    assert batch.shape == (b, t)
    assert batch.completion_mask.dtype == torch.bool
    assert batch.logprobs.requires_grad and batch.logprobs.is_leaf


def test_optional_fields_default_to_none():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    batch = PolicyBatch(logprobs=lp, advantages=torch.zeros(1, dtype=torch.float64),
                        completion_mask=torch.ones(1, 2, dtype=torch.bool))
    assert all(getattr(batch, f) is None for f in OPTIONAL)
    assert batch.logprobs is lp
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.logprobs = lp


@pytest.mark.parametrize("field", ["logprobs", *OPTIONAL])
def test_each_error_names_its_field(field):
    """Shape, dtype and value errors of a [B, T] field name that field (and only that field is blamed)."""
    good = torch.full((2, 3), -0.5, dtype=torch.float64)
    base = {"logprobs": good, "advantages": torch.zeros(2, dtype=torch.float64),
            "completion_mask": torch.ones(2, 3, dtype=torch.bool)}
    wrong_shape = good[0] if field == "logprobs" else good[:, :2]  # logprobs defines (B, T) for the others
    for bad in (wrong_shape, good.long(), good.clone().fill_(math.nan)):
        with pytest.raises(BatchError) as err:
            PolicyBatch(**{**base, field: bad})
        assert str(err.value).startswith(field)


def test_advantages_per_sequence_skip_fully_masked_rows():
    """A fully masked row's advantage is padding (may be NaN); a counted row's may not."""
    mask = torch.tensor([[True, False], [False, False]])
    lp = torch.full((2, 2), -1.0, dtype=torch.float64)
    PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, math.nan], dtype=torch.float64), completion_mask=mask)
    with pytest.raises(BatchError, match="advantages"):
        PolicyBatch(logprobs=lp, advantages=torch.tensor([math.nan, 1.0], dtype=torch.float64), completion_mask=mask)


def test_device_mismatch_names_the_field():
    """An optional field on another device than logprobs is a BatchError naming it (meta stands in for CUDA)."""
    lp = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(BatchError, match="ref_logprobs"):
        PolicyBatch(logprobs=lp, advantages=torch.zeros(2, dtype=torch.float64),
                    completion_mask=torch.ones(2, 3, dtype=torch.bool),
                    ref_logprobs=torch.zeros(2, 3, dtype=torch.float64, device="meta"), check_values=False)


# ---------------------------------------------------------------------------------------------------- split
@given(batch=policy_batches(ref=None, rollout=None, entropies=None, garbage_padding=True), size=st.integers(1, 8))
def test_split_partitions_the_rows_into_views(batch, size):
    """split(k) gives ceil(B / k) micro-batches of <= k rows, in order; concatenating each field gives the
    original; tensors are views (same storage, no copy); absent fields stay None; the gradient of a loss
    on a micro-batch reaches the parent's logprobs leaf."""
    parts = batch.split(size)
    b = batch.shape[0]
    assert len(parts) == math.ceil(b / size)
    assert [p.shape[0] for p in parts] == [min(size, b - i * size) for i in range(len(parts))]
    for name in ("logprobs", "advantages", "completion_mask", *OPTIONAL):
        whole = getattr(batch, name)
        if whole is None:
            assert all(getattr(p, name) is None for p in parts)
            continue
        glued = torch.cat([getattr(p, name) for p in parts])
        assert torch.equal(glued.isnan(), whole.isnan())
        assert torch.equal(torch.nan_to_num(glued.detach()), torch.nan_to_num(whole.detach()))
        assert all(getattr(p, name).untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
                   for p in parts)
    sum(p.logprobs.sum() for p in parts).backward()
    assert torch.equal(batch.logprobs.grad, torch.ones_like(batch.logprobs))


@pytest.mark.parametrize("size", [0, -1])
def test_split_rejects_non_positive_sizes(size):
    batch = PolicyBatch(logprobs=torch.zeros(2, 1, dtype=torch.float64), advantages=torch.zeros(2, dtype=torch.float64),
                        completion_mask=torch.ones(2, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="micro_batch_size"):
        batch.split(size)


# ----------------------------------------------------------------------------------------------- Normalizer
@given(data=st.data())
def test_normalizer_counts_tokens_and_non_empty_sequences(data):
    """from_masks(m_1, ..., m_k) counts N = sum of True entries and S = rows with at least one True entry over
    all masks, as 0-d tensors; from_batch(b) == from_masks(b.completion_mask); it equals the counts of the
    concatenated masks (so per-micro-batch masks give the optimizer-step counts)."""
    t = data.draw(st.integers(1, 6), label="T")
    parts = data.draw(st.lists(masks(t=t), min_size=1, max_size=4))
    n = Normalizer.from_masks(*parts)
    glued = torch.cat(parts)
    assert isinstance(n.num_tokens, torch.Tensor) and n.num_tokens.shape == ()
    assert int(n.num_tokens) == int(glued.sum())
    assert int(n.num_sequences) == sum(int(r.any()) for r in glued)
    batch = data.draw(policy_batches(mask=glued))
    nb = Normalizer.from_batch(batch)
    assert int(nb.num_tokens) == int(n.num_tokens) and int(nb.num_sequences) == int(n.num_sequences)


def test_normalizer_accepts_numbers_and_scalar_tensors():
    n = Normalizer(num_tokens=10, num_sequences=2.0)
    assert n.num_tokens == 10.0 and isinstance(n.num_tokens, float)
    t = Normalizer(num_tokens=torch.tensor([7]), num_sequences=torch.tensor(3))
    assert t.num_tokens.shape == () and int(t.num_tokens) == 7
    Normalizer(num_tokens=0, num_sequences=0)  # an all-masked step is allowed (loss 0)
    counted = Normalizer(num_tokens=np.int64(7), num_sequences=np.float32(3.0))  # numpy's counts (were refused)
    assert (counted.num_tokens, counted.num_sequences) == (7.0, 3.0) and isinstance(counted.num_tokens, float)


@pytest.mark.parametrize("field", ["num_tokens", "num_sequences"])
@pytest.mark.parametrize("value", [-1, -1e-9, math.nan, "4", None, True, torch.zeros(2)])
def test_normalizer_negative_or_bad_counts_raise(field, value):
    """A negative, NaN, non-numeric or non-scalar count is a BatchError naming the count."""
    with pytest.raises(BatchError, match=f"Normalizer.{field}"):
        Normalizer(**{"num_tokens": 1, "num_sequences": 1, field: value})


def test_from_masks_needs_a_mask():
    with pytest.raises(ValueError, match="at least one"):
        Normalizer.from_masks()


def test_normalizer_with_zero_counts_gives_zero_loss():
    """Counts of 0 are clamped to 1: an all-masked batch has loss 0 and zero gradient for every aggregation."""
    lp = torch.full((2, 3), -0.5, dtype=torch.float64, requires_grad=True)
    batch = PolicyBatch(logprobs=lp, advantages=torch.ones(2, dtype=torch.float64),
                        completion_mask=torch.zeros(2, 3, dtype=torch.bool))
    for agg in ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        out = rlzoo.get_loss("dapo", aggregation=agg, max_completion_length=3)(batch)
        assert out.loss == 0
        (g,) = torch.autograd.grad(out.loss, lp)
        assert (g == 0).all()


# ----------------------------------------------------------------------------------------------- LossOutput
def test_loss_output_is_a_frozen_pair():
    out = LossOutput(loss=torch.zeros(()), metrics={"kl": torch.zeros(())})
    assert out.loss.shape == () and set(out.metrics) == {"kl"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.loss = torch.ones(())


def test_public_names():
    """The contract's names are exported from the package."""
    for name in ("PolicyBatch", "Normalizer", "LossOutput", "BatchError", "get_loss", "list_losses",
                 "PolicyLoss", "Registry", "UnknownNameError"):
        assert hasattr(rlzoo, name)
    assert issubclass(BatchError, ValueError)


# ------------------------------------------------------------------------------ log-probs rounded above 0
LOGPROB_FIELDS = ("logprobs", "old_logprobs", "ref_logprobs", "rollout_logprobs")


@pytest.mark.parametrize("field", LOGPROB_FIELDS)
@pytest.mark.parametrize(("dtype", "excess"), [(torch.float32, 1e-7), (torch.float32, 3e-6), (torch.float64, 1e-7),
                                               (torch.bfloat16, 0.0078125), (torch.float16, 0.0009765625)])
def test_log_probs_rounded_above_zero_are_accepted_and_clamped(field, dtype, excess):
    """A log-prob that exceeds 0 by rounding (vLLM's float32 log-probs of a certain token, bf16 arithmetic) is
    accepted up to rlzoo.batch.logprob_tolerance(dtype). The current and old log-probs are read as 0: the
    loss, its gradient and its metrics equal those of the batch holding exactly 0 there, and the token keeps
    its gradient. The reference and sampler log-probs (only in log-ratios) are used as given: the result is
    finite and within the excess (the data moved by it) of the 0 batch."""
    assert excess <= rlzoo.batch.logprob_tolerance(dtype)
    g = torch.Generator().manual_seed(0)
    base = {f: (-torch.rand(2, 3, generator=g, dtype=torch.float64) - 0.1).to(dtype) for f in LOGPROB_FIELDS}
    mask = torch.tensor([[True, True, False], [True, True, True]])

    def run(fields):
        lp = fields["logprobs"].clone().requires_grad_(True)
        batch = PolicyBatch(**{**fields, "logprobs": lp}, advantages=torch.tensor([1.0, -0.5], dtype=dtype),
                            completion_mask=mask)
        out = rlzoo.get_loss("grpo", beta=0.1, is_correction="token_truncate", is_max=2.0)(batch)
        out.loss.backward()
        return out, lp.grad

    rounded, at_zero = dict(base), dict(base)
    rounded[field] = base[field].clone()
    rounded[field][1, 0] = excess
    at_zero[field] = base[field].clone()
    at_zero[field][1, 0] = 0.0
    got, got_grad = run(rounded)
    want, want_grad = run(at_zero)
    if field in ("logprobs", "old_logprobs"):
        assert torch.equal(got.loss, want.loss) and torch.equal(got_grad, want_grad)
        assert all(torch.equal(got.metrics[k], want.metrics[k]) for k in want.metrics)
    else:
        assert torch.isfinite(got.loss) and torch.isfinite(got_grad).all()
        close = {"atol": max(tol(dtype)["atol"], excess), "rtol": tol(dtype)["rtol"]}  # the data moved by `excess`
        torch.testing.assert_close(got.loss, want.loss, **close)
        torch.testing.assert_close(got_grad, want_grad, **close)
    if field == "logprobs":
        assert got_grad[1, 0] != 0


@pytest.mark.parametrize("loss", ["dppo_kl", "dppo_tv"])
def test_rounded_log_probs_keep_probabilities_at_most_one(loss):
    """DPPO reads p = exp(logp) and 1 - p: a current or old log-prob of +1e-7 (float32 rounding) must not make
    1 - p negative (binary KL of a negative number: NaN); read as 0 it gives p = 1 exactly."""
    lp = torch.tensor([[1e-7, -0.5, -1.0]], dtype=torch.float32, requires_grad=True)
    batch = PolicyBatch(logprobs=lp, old_logprobs=torch.tensor([[1e-7, -0.4, -1.2]]), advantages=torch.tensor([1.0]),
                        completion_mask=torch.ones(1, 3, dtype=torch.bool))
    out = rlzoo.get_loss(loss, max_completion_length=3)(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_a_log_prob_beyond_the_rounding_tolerance_still_raises(dtype):
    """Beyond the documented tolerance a positive log-prob is a bug (probabilities or logits passed as
    log-probs): a BatchError naming the field and the tolerance."""
    tolerance = rlzoo.batch.logprob_tolerance(dtype)
    assert tolerance == max(1e-5, 4 * torch.finfo(dtype).eps)
    lp = torch.full((1, 2), -0.5, dtype=dtype)
    lp[0, 1] = 2 * tolerance
    with pytest.raises(BatchError, match=r"logprobs .*rounding tolerance"):
        PolicyBatch(logprobs=lp, advantages=torch.ones(1, dtype=dtype), completion_mask=torch.ones(1, 2, dtype=torch.bool))
