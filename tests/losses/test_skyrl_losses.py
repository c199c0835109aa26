"""Loss reductions (prompt_mean included), the outlier-token veto and the geometric sequence mask against SkyRL
0.4.0 itself (the oracle, called).

SkyRL installs with ``pip install --no-deps --ignore-requires-python skyrl==0.4.0`` (pure Python; it asks for
Python >= 3.12, the files called here run on 3.11; .ci/run does it); tests/oracles.py imports
skyrl/train/config/config.py and skyrl/backends/skyrl_train/utils/{torch_utils,off_policy_correction_utils,
ppo_utils}.py with the rest of SkyRL stubbed. SkyRL's loss is what its trainer and worker compute: the trainer
scales the advantages by the loss reduction (``ppo_utils.apply_loss_reduction_to_advantages_minibatch``, with the
batch's loss mask), then the worker calls the policy loss (``ppo_utils.ppo_policy_loss``: PPO clip / dual clip,
``apply_off_policy_correction``, then the sum of ``loss * loss_mask`` with the corrected mask). Here one
mini-batch: the batch.

Tolerances: SkyRL exponentiates every ratio in float32 (``torch_utils.safe_exp_delta``), so values and gradients
use the float32 row of tests/tolerances.py; the advantage scaling is float64 and the masks are compared exactly.

The hand-written restatements (test_prompt_mean.py, test_rollout_correction.py) stay: they state the formulas
where SkyRL is absent and cover rlzoo's splitting, which SkyRL has no counterpart for.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from oracles import skyrl
from strategies import budget, loss_and_grads, policy_batches
from tolerances import tol

import rlzoo

F64 = tol(torch.float64)
F32 = tol(torch.float32)  # SkyRL's float32 ratios (module docstring)
REFERENCE_BUDGET = budget(0.5)

# SkyRL loss_reduction -> rlzoo aggregation
REDUCTIONS = {"token_mean": "token-mean", "sequence_mean": "seq-mean-token-mean",
              "seq_mean_token_sum_norm": "seq-mean-token-sum-norm", "prompt_mean": "prompt-mean"}
# (low, high); None: unset. The sampler's ratios drawn here are exp(N(0, 0.2^2)), so every bound and cap bites.
OUTLIER_BOUNDS = [(None, None), (None, 1.3), (0.8, None), (0.7, 1.4), (0.5, 2.0), (0.0, 1.3)]
GEO_BOUNDS = [(None, None), (0.99, 1.01), (0.9, 1.1), (None, 1.05), (0.95, None)]
TIS = [(None, None), ("token", 1.05), ("sequence", 1.2)]


@pytest.fixture(scope="module")
def sk():
    return skyrl()


def _token_adv(batch) -> torch.Tensor:
    adv = batch.advantages
    return adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv


def _prompt_boundaries(group_index: torch.Tensor) -> list[tuple[int, int]]:
    """SkyRL's (start, end) slices of consecutive rows sharing a prompt."""
    out, start = [], 0
    for i in range(1, group_index.numel() + 1):
        if i == group_index.numel() or group_index[i] != group_index[start]:
            out.append((start, i))
            start = i
    return out


def _skyrl_loss(sk, batch, *, reduction="token_mean", dual_clip=None, eps_low=0.2, eps_high=0.2,
                outlier=(None, None), geo=(None, None), tis=(None, None)):
    """(loss, d loss / d logprobs) of SkyRL: advantages scaled by ``reduction``, then ``ppo_policy_loss`` with the
    off-policy correction. Rows are put in prompt order for prompt_mean (SkyRL's layout; the loss is a sum)."""
    b, t = batch.shape
    order = torch.argsort(batch.group_index, stable=True) if reduction == "prompt_mean" else torch.arange(b)
    loss_mask = batch.completion_mask[order].to(torch.float64)
    boundaries = _prompt_boundaries(batch.group_index[order]) if reduction == "prompt_mean" else None
    advantages = sk.ppo_utils.apply_loss_reduction_to_advantages_minibatch(
        _token_adv(batch)[order], loss_mask, reduction, micro_batch_size=b, max_seq_len=t,
        prompt_boundaries=boundaries)
    tis_type, tis_cap = tis
    correction = sk.config.OffPolicyCorrectionConfig(
        tis_ratio_type=tis_type, token_tis_ratio_clip_high=tis_cap or 2.0, sequence_tis_ratio_clip_high=tis_cap or 5.0,
        outlier_token_is_threshold_low=outlier[0], outlier_token_is_threshold_high=outlier[1],
        sequence_mask_metric=None if geo == (None, None) else "geometric",
        geo_mask_low=0.0 if geo[0] is None else geo[0], geo_mask_high=math.inf if geo[1] is None else geo[1])
    config = sk.config.AlgorithmConfig(
        policy_loss_type="regular" if dual_clip is None else "dual_clip", eps_clip_low=eps_low, eps_clip_high=eps_high,
        clip_ratio_c=3.0 if dual_clip is None else dual_clip, loss_reduction=reduction, off_policy_correction=correction)
    lp = batch.logprobs.detach()[order].clone().requires_grad_(True)
    rollout = None if batch.rollout_logprobs is None else batch.rollout_logprobs[order]
    loss, _ = sk.ppo_utils.ppo_policy_loss(lp, batch.old_logprobs[order], advantages, config, loss_mask, rollout)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), torch.empty_like(grad).index_copy_(0, order, grad)


def _rlzoo_options(*, reduction="token_mean", dual_clip=None, eps_low=0.2, eps_high=0.2, outlier=(None, None),
                   geo=(None, None), tis=(None, None), t=None):
    options = {"aggregation": REDUCTIONS[reduction], "epsilon_low": eps_low, "epsilon_high": eps_high,
               "dual_clip": dual_clip}
    if reduction == "seq_mean_token_sum_norm":
        options["max_completion_length"] = t
    for name, value in (("outlier_token_is_threshold_low", outlier[0]), ("outlier_token_is_threshold_high", outlier[1]),
                        ("geo_mask_low", geo[0]), ("geo_mask_high", geo[1])):
        if value is not None:
            options[name] = value
    if tis[0] is not None:
        options.update(rollout_is=tis[0], rollout_is_threshold=tis[1])
    return options


# ------------------------------------------------------------------------------------------ loss reductions
@REFERENCE_BUDGET
@given(batch=policy_batches(old=True, groups=True, min_len=1, log_ratio_scale=0.5),
       reduction=st.sampled_from(sorted(REDUCTIONS)), dual_clip=st.sampled_from((None, 3.0)),
       eps=st.sampled_from(((0.2, 0.2), (0.2, 0.28))))
def test_aggregations_are_skyrl_loss_reductions(sk, batch, reduction, dual_clip, eps):
    """ppo with aggregation token-mean / seq-mean-token-mean / seq-mean-token-sum-norm (max_completion_length =
    SkyRL's max_seq_len) / prompt-mean == SkyRL loss_reduction token_mean / sequence_mean /
    seq_mean_token_sum_norm / prompt_mean (its per-mini-batch advantage scaling, then the summed regular or
    dual-clip PPO loss), value and gradient; prompt groups contiguous or shuffled (SkyRL gets them in prompt
    order). Every row counts a token: SkyRL's sequence and prompt counts include empty ones (see below)."""
    kw = {"reduction": reduction, "dual_clip": dual_clip, "eps_low": eps[0], "eps_high": eps[1]}
    want, want_grad = _skyrl_loss(sk, batch, **kw)
    out, grad, _ = loss_and_grads(rlzoo.get_loss("ppo", **_rlzoo_options(**kw, t=batch.shape[1])), batch)
    torch.testing.assert_close(out.loss.detach(), want, **F32)
    torch.testing.assert_close(grad, want_grad, **F32)


@REFERENCE_BUDGET
@given(batch=policy_batches(old=True, groups=True, min_len=1, log_ratio_scale=0.5))
def test_prompt_mean_advantage_weights_are_skyrl(sk, batch):
    """The per-token weights w of prompt-mean == SkyRL's prompt_mean scaling of advantages of ones,
    1 / (num_prompts * tokens_in_prompt), in float64 (no ratio involved): at ratio 1 with A = -1 everywhere
    rlzoo's loss is sum_t w_t and its gradient w.r.t. the log-probs is w."""
    order = torch.argsort(batch.group_index, stable=True)
    mask = batch.completion_mask[order]
    ones = torch.ones(batch.shape, dtype=torch.float64)
    want = sk.ppo_utils.apply_loss_reduction_to_advantages_minibatch(
        ones, mask.to(torch.float64), "prompt_mean", micro_batch_size=batch.shape[0], max_seq_len=batch.shape[1],
        prompt_boundaries=_prompt_boundaries(batch.group_index[order]))
    loss_fn = rlzoo.get_loss("ppo", aggregation="prompt-mean")
    on_policy = rlzoo.PolicyBatch(logprobs=batch.logprobs.detach()[order].clone().requires_grad_(True),
                                  advantages=-ones, completion_mask=mask, group_index=batch.group_index[order])
    out = loss_fn(on_policy)  # ratio 1: the loss is sum_t w_t * A_t = sum_t w_t
    (grad,) = torch.autograd.grad(out.loss, on_policy.logprobs)  # d/dlogp of -A r = w_t at ratio 1
    torch.testing.assert_close(grad, torch.where(mask, want, 0.0), **F64)
    torch.testing.assert_close(out.loss.detach(), want[mask].sum(), **F64)


def test_empty_rows_and_prompts_are_counted_by_skyrl(sk):
    """The documented difference: SkyRL's num_prompts (prompt_mean) and batch size (sequence_mean) count a prompt
    or row whose tokens are all masked, rlzoo's do not (such a prompt or row is inert, as in verl). Two prompts
    with tokens and one without: SkyRL's prompt_mean is 2/3 of rlzoo's; three rows of four with tokens: its
    sequence_mean is 3/4 of rlzoo's seq-mean-token-mean."""
    mask = torch.tensor([[True, True], [True, False], [True, False], [False, False]])
    batch = rlzoo.PolicyBatch(logprobs=torch.full((4, 2), -1.0, dtype=torch.float64, requires_grad=True),
                              old_logprobs=torch.full((4, 2), -1.0, dtype=torch.float64),
                              advantages=torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64),
                              completion_mask=mask, group_index=torch.tensor([0, 0, 1, 2]))
    want, _ = _skyrl_loss(sk, batch, reduction="prompt_mean")
    ours = rlzoo.get_loss("ppo", aggregation="prompt-mean")(batch).loss.detach()
    torch.testing.assert_close(ours, torch.tensor((-(1.0 + 1.0 - 2.0) / 3 - 0.5) / 2, dtype=torch.float64), **F64)
    torch.testing.assert_close(want, ours * 2 / 3, **F32)
    want, _ = _skyrl_loss(sk, batch, reduction="sequence_mean")
    ours = rlzoo.get_loss("ppo", aggregation="seq-mean-token-mean")(batch).loss.detach()
    torch.testing.assert_close(ours, torch.tensor((-(1.0 + 1.0) / 2 + 2.0 - 0.5) / 3, dtype=torch.float64), **F64)
    torch.testing.assert_close(want, ours * 3 / 4, **F32)


# ------------------------------------------------------------------------------ off-policy correction masks
@REFERENCE_BUDGET
@given(batch=policy_batches(old=True, rollout=True, min_counted=1, log_ratio_scale=0.5),
       outlier=st.sampled_from(OUTLIER_BOUNDS), geo=st.sampled_from(GEO_BOUNDS))
def test_outlier_veto_and_geo_mask_are_skyrl(sk, batch, outlier, geo):
    """The weights of the outlier-token veto and the geometric sequence mask == SkyRL
    compute_outlier_token_mask / compute_sequence_mask("geometric") on every row with a counted token (exactly;
    an unset SkyRL geo bound is 0 / inf here, SkyRL always sets both)."""
    mask = batch.completion_mask
    rows = mask.any(-1)
    x = rlzoo.losses.LossInputs.from_batch(batch)
    loss_mask = mask.to(torch.float64)
    if outlier != (None, None):
        config = sk.config.OffPolicyCorrectionConfig(outlier_token_is_threshold_low=outlier[0],
                                                     outlier_token_is_threshold_high=outlier[1])
        want, _ = sk.off_policy.compute_outlier_token_mask(batch.old_logprobs, batch.rollout_logprobs, loss_mask,
                                                           config)
        (part,) = [p for p in rlzoo.get_loss("ppo", **_rlzoo_options(outlier=outlier)).weights if p.active]
        got, _ = part(x)
        assert torch.equal(got[rows, :1], want[rows].to(got.dtype))
    if geo != (None, None):
        config = sk.config.OffPolicyCorrectionConfig(geo_mask_low=0.0 if geo[0] is None else geo[0],
                                                     geo_mask_high=math.inf if geo[1] is None else geo[1])
        want, _ = sk.off_policy.compute_sequence_mask(batch.old_logprobs, batch.rollout_logprobs, loss_mask,
                                                      "geometric", config)
        (part,) = [p for p in rlzoo.get_loss("ppo", **_rlzoo_options(geo=geo)).weights if p.active]
        got, _ = part(x)
        assert torch.equal(got[rows, :1], want[rows].to(got.dtype))


@given(batch=policy_batches(old=True, rollout=True, groups=True, min_len=1, log_ratio_scale=0.5),
       outlier=st.sampled_from(OUTLIER_BOUNDS), geo=st.sampled_from(GEO_BOUNDS), tis=st.sampled_from(TIS),
       reduction=st.sampled_from(("token_mean", "prompt_mean")))
def test_off_policy_corrected_loss_is_skyrl(sk, batch, outlier, geo, tis, reduction):
    """ppo with the outlier-token veto, the geometric sequence mask and verl-named truncated IS (rollout_is token /
    sequence with rollout_is_threshold = SkyRL's token_tis_ratio_clip_high / sequence_tis_ratio_clip_high), in any
    combination, token-mean or prompt-mean == SkyRL ppo_policy_loss with that off_policy_correction after its
    advantage scaling, value and gradient: the masked sequences keep counting in the denominators in both."""
    kw = {"reduction": reduction, "outlier": outlier, "geo": geo, "tis": tis}
    want, want_grad = _skyrl_loss(sk, batch, **kw)
    out, grad, _ = loss_and_grads(rlzoo.get_loss("ppo", **_rlzoo_options(**kw)), batch)
    torch.testing.assert_close(out.loss.detach(), want, **F32)
    torch.testing.assert_close(grad, want_grad, **F32)
