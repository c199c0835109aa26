"""decoupled_ppo, the log-linear proximal policy and m2po against AReaL 1.0.4 itself (the oracle, called).

AReaL installs with ``pip install --no-deps areal==1.0.4`` (pure Python; .ci/run does it); tests/oracles.py
imports the files these tests call (areal/api/cli_args.py for the configs, areal/utils/functional/functional.py,
areal/trainer/ppo/actor.py and what they need of AReaL) with the rest of AReaL stubbed. The function called is the one AReaL's actor calls
for its loss, ``actor.grpo_loss_fn`` (proximal log-probs resolved by ``_resolve_proximal_logp``, the M2PO mask of
``_apply_m2po_masking``, then ``functional.ppo_actor_loss_fn``), with ``use_decoupled_loss=True``: AReaL's
``input_data["logprobs"]`` (the behaviour policy) is rlzoo's ``rollout_logprobs`` and ``prox_logp`` rlzoo's
``old_logprobs``.

Tolerances: AReaL computes the behaviour importance weight in float32 (``apply_rejection_sampling`` upcasts the
log-ratio with ``.float()``) and the log-linear interpolation factor in float32 (``versions.float()``), so a
comparison that goes through either uses the float32 row of tests/tolerances.py; the others are float64.

The hand-written restatements in test_frontier_presets.py stay: they state the formulas where AReaL is absent.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from oracles import areal
from strategies import budget, fresh, loss_and_grads, policy_batches
from tolerances import tol

import rlzoo

F64 = tol(torch.float64)
F32 = tol(torch.float32)  # AReaL's float32 steps (module docstring)
REFERENCE_BUDGET = budget(0.5)


@pytest.fixture(scope="module")
def ar():
    return areal()


def _token_adv(batch) -> torch.Tensor:
    adv = batch.advantages
    return adv.unsqueeze(-1).expand(batch.shape) if adv.ndim == 1 else adv


def _areal_loss(ar, batch, *, prox, eps_clip=0.2, eps_clip_higher=None, c_clip=None, rejection=None,
                m2_threshold=None, prox_logp_method="recompute"):
    """(loss, d loss / d logprobs) of AReaL's ``grpo_loss_fn`` (decoupled) on ``batch`` (float64 inputs)."""
    lp = batch.logprobs.detach().clone().requires_grad_(True)
    input_data = {"logprobs": batch.rollout_logprobs, "advantages": _token_adv(batch),
                  "loss_mask": batch.completion_mask, "prox_logp": prox}
    if batch.versions is not None:
        v = batch.versions
        input_data["versions"] = v if v.ndim == 2 else v.unsqueeze(-1).expand(batch.shape)
    loss = ar.actor.grpo_loss_fn(
        lp, torch.zeros(batch.shape), input_data, eps_clip=eps_clip, eps_clip_higher=eps_clip_higher,
        c_clip=c_clip, rejection_sampling=rejection, m2_threshold=m2_threshold, current_version=batch.current_version,
        prox_logp_method=prox_logp_method, use_decoupled_loss=True)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


# rlzoo is_correction (token level) -> AReaL rejection_sampling action
_ACTIONS = {"token_mask": "mask", "token_truncate": "clamp"}


@st.composite
def decoupled_options(draw):
    """decoupled_ppo options with an AReaL counterpart: epsilons (eps_clip, eps_clip_higher), dual_clip (c_clip),
    and the behaviour weight at token level: masked or truncated to [is_min, is_max], or none."""
    options = {"epsilon_low": draw(st.sampled_from((0.2, 0.1))),
               "epsilon_high": draw(st.sampled_from((None, 0.28))),
               "dual_clip": draw(st.sampled_from((None, 3.0))),
               "is_correction": draw(st.sampled_from((None, "token_mask", "token_truncate")))}
    if options["is_correction"] is not None:
        options["is_min"] = draw(st.sampled_from((None, 0.5, 0.9)))
        options["is_max"] = draw(st.sampled_from((5.0, 2.0, 1.1) if options["is_min"] is None else (5.0, 1.1, None)))
    return options


def _areal_kwargs(ar, options):
    high = options["epsilon_high"]
    rejection = None
    if options["is_correction"] is not None:
        upper = math.inf if options["is_max"] is None else options["is_max"]
        rejection = ar.cli_args.RejectionSamplingConfig(level="token", action=_ACTIONS[options["is_correction"]],
                                                        metric="ratio", upper=upper, lower=options["is_min"])
    return {"eps_clip": options["epsilon_low"], "eps_clip_higher": high, "c_clip": options["dual_clip"],
            "rejection": rejection}


def _rlzoo_kwargs(options):
    out = {k: v for k, v in options.items() if k != "epsilon_high"}
    out["epsilon_high"] = options["epsilon_low"] if options["epsilon_high"] is None else options["epsilon_high"]
    return out


# ------------------------------------------------------------------------------------------ decoupled_ppo
@given(batch=policy_batches(old=True, rollout=True, log_ratio_scale=0.5), options=decoupled_options())
def test_decoupled_ppo_is_areal_grpo_loss_fn(ar, batch, options):
    """decoupled_ppo (eps, eps_high, dual_clip, token-level behaviour weight masked / truncated to [is_min, is_max]
    or none) == AReaL grpo_loss_fn(use_decoupled_loss=True) with eps_clip, eps_clip_higher, c_clip and
    RejectionSamplingConfig(level="token", action="mask" / "clamp", metric="ratio", upper, lower), value and
    gradient; the defaults are AReaL's defaults (eps_clip 0.2, the default RejectionSamplingConfig)."""
    want, want_grad = _areal_loss(ar, batch, prox=batch.old_logprobs, **_areal_kwargs(ar, options))
    out, grad, _ = loss_and_grads(rlzoo.get_loss("decoupled_ppo", **_rlzoo_kwargs(options)), batch)
    tolerance = F64 if options["is_correction"] is None else F32
    torch.testing.assert_close(out.loss.detach(), want, **tolerance)
    torch.testing.assert_close(grad, want_grad, **tolerance)

    default, default_grad = _areal_loss(ar, batch, prox=batch.old_logprobs,
                                        rejection=ar.cli_args.RejectionSamplingConfig())
    out, grad, _ = loss_and_grads(rlzoo.get_loss("decoupled_ppo"), batch)
    torch.testing.assert_close(out.loss.detach(), default, **F32)
    torch.testing.assert_close(grad, default_grad, **F32)


@REFERENCE_BUDGET
@given(batch=policy_batches(old=False, rollout=True, versions=True, log_ratio_scale=0.5))
def test_loglinear_proximal_policy_is_areal(ar, batch):
    """rlzoo.losses.loglinear_proximal_logprobs == AReaL compute_prox_logp_approximations(method="loglinear")
    (per-sequence versions broadcast to AReaL's per-token layout); decoupled_ppo(prox_logp_method="loglinear")
    == grpo_loss_fn(prox_logp=None, prox_logp_method="loglinear", versions, current_version), value and
    gradient (the proximal log-probs are detached in both)."""
    lp = batch.logprobs.detach()
    v = batch.versions if batch.versions.ndim == 2 else batch.versions.unsqueeze(-1).expand(batch.shape)
    want = ar.actor.compute_prox_logp_approximations(old_logp=batch.rollout_logprobs, logprobs=lp, versions=v,
                                                     current_version=batch.current_version,
                                                     method="loglinear")["loglinear"]
    got = rlzoo.losses.loglinear_proximal_logprobs(batch.rollout_logprobs, lp, batch.versions, batch.current_version)
    torch.testing.assert_close(got, want, **F32)

    want_loss, want_grad = _areal_loss(ar, batch, prox=None, rejection=ar.cli_args.RejectionSamplingConfig(),
                                       prox_logp_method="loglinear")
    out, grad, _ = loss_and_grads(rlzoo.get_loss("decoupled_ppo", prox_logp_method="loglinear"), batch)
    torch.testing.assert_close(out.loss.detach(), want_loss, **F32)
    torch.testing.assert_close(grad, want_grad, **F32)


# ----------------------------------------------------------------------------------------------------- m2po
@REFERENCE_BUDGET
@given(batch=policy_batches(old=True, rollout=True, log_ratio_scale=0.5, min_counted=1, certain_tokens=False),
       tau=st.sampled_from([0.001, 0.01, 0.04, 0.2]))
def test_m2po_is_areal(ar, batch, tau):
    """m2po's kept tokens == AReaL _apply_m2po_masking(old_logp=behaviour, prox_logp=proximal, loss_mask, tau)
    (no ties: AReaL's sort is not stable, so certain tokens, whose M2 can tie at 0, are left out), and the m2po
    loss == grpo_loss_fn(m2_threshold=tau, no clip, the default rejection_sampling), value and gradient."""
    mask = batch.completion_mask
    loss_fn = rlzoo.get_loss("m2po", m2_threshold=tau)
    keep = loss_fn.loss_mask(mask, old_logprobs=batch.old_logprobs, rollout_logprobs=batch.rollout_logprobs)
    want_keep = ar.actor._apply_m2po_masking(batch.rollout_logprobs, batch.old_logprobs, mask, tau)
    assert torch.equal(keep, want_keep)

    want, want_grad = _areal_loss(ar, batch, prox=batch.old_logprobs, eps_clip=math.inf, m2_threshold=tau,
                                  rejection=ar.cli_args.RejectionSamplingConfig())
    out, grad, _ = loss_and_grads(loss_fn, fresh(batch))
    torch.testing.assert_close(out.loss.detach(), want, **F32)
    torch.testing.assert_close(grad, want_grad, **F32)


# ---------------------------------------------------------------- where rlzoo's options are not AReaL's
def test_sequence_level_is_correction_is_not_areal_sequence_rejection(ar):
    """rlzoo's is_correction="sequence_mask" weights a kept sequence by the product of its token ratios (TRL's
    sequence mode); AReaL's RejectionSamplingConfig(level="sequence", metric="ratio") keeps the same sequences
    with agg="sum" (the product against [lower, upper]) but weights them by the geometric mean. One sequence of
    two tokens with ratios 2 and 1/1.5 (product 4/3, geometric mean sqrt(4/3)), A = 1, u = 1: rlzoo -4/3,
    AReaL -sqrt(4/3), both per token-mean over 2 tokens."""
    lp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    behav = lp - torch.tensor([[math.log(2.0), -math.log(1.5)]], dtype=torch.float64)
    batch = rlzoo.PolicyBatch(logprobs=lp.clone().requires_grad_(True), old_logprobs=lp, rollout_logprobs=behav,
                              advantages=torch.tensor([1.0], dtype=torch.float64),
                              completion_mask=torch.ones(1, 2, dtype=torch.bool))
    ours = rlzoo.get_loss("decoupled_ppo", is_correction="sequence_mask", is_max=5.0)(batch).loss.detach()
    theirs, _ = _areal_loss(ar, batch, prox=lp, rejection=ar.cli_args.RejectionSamplingConfig(
        level="sequence", action="mask", metric="ratio", agg="sum", upper=5.0))
    assert float(ours) == pytest.approx(-4 / 3, rel=1e-12)
    assert float(theirs) == pytest.approx(-math.sqrt(4 / 3), rel=1e-6)
