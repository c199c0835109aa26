"""``rlzoo plot``'s curves (rlzoo.losses.pictures) are the loss's own behaviour: each picture statement of
DESIGN.md section 3 read off the curves, in float64, against closed forms written from the papers."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from strategies import budget
from tolerances import tol

import rlzoo
from rlzoo.losses import PolicyLoss, PPOClip, SequenceRatio
from rlzoo.losses.pictures import PICTURE_LOSS_KEY, _OneToken, objective_curves, plot_all, plot_objective

F64 = tol(torch.float64)
FAST = {"num": 11}  # 2 x 11 grid points + 1 + bisections: a fraction of a second per sign


def _at(curve, r: float) -> int:
    return int(torch.argmin((curve.ratios - r).abs()))


@given(eps_low=st.floats(0.01, 0.9), eps_high=st.floats(0.01, 1.5), a=st.floats(0.1, 5.0))
@budget(0.25)
def test_ppo_picture_is_the_clip(eps_low, eps_high, a):
    """PPO (Schulman et al. 2017 eq. 7): g = r A inside the clip's open side, 0 where the clip binds; the
    breakpoints are 1 + eps_high (A > 0) and 1 - eps_low (A < 0); A < 0 with r > 1 + eps_high is not clipped
    (g = r A grows with r); the value is the objective (no stop-gradient); clip_ratio/region_mean counts exactly
    the no-gradient ratios, ratio/high_neg_adv_mean exactly A < 0 with r > 1 + eps_high."""
    up, down = objective_curves("ppo", advantage=a, r_max=max(3.0, 1.5 + eps_high), epsilon_low=eps_low,
                                epsilon_high=eps_high, **FAST).curves
    assert up.breakpoints == pytest.approx((1 + eps_high,), rel=1e-9)
    assert down.breakpoints == pytest.approx((1 - eps_low,), rel=1e-9)
    for curve in (up, down):
        r, g = curve.ratios, curve.gradient
        clipped = (r > 1 + eps_high) if curve.advantage > 0 else (r < 1 - eps_low)
        edge = (r - (1 + eps_high if curve.advantage > 0 else 1 - eps_low)).abs() < 1e-6  # the bisection's sides
        keep = ~edge
        torch.testing.assert_close(g[keep & clipped], torch.zeros_like(g[keep & clipped]), **F64)
        torch.testing.assert_close(g[keep & ~clipped], (curve.advantage * r)[keep & ~clipped], **F64)
        torch.testing.assert_close(curve.value, -torch.maximum(-r * curve.advantage,
                                                               -r.clamp(1 - eps_low, 1 + eps_high) * curve.advantage),
                                   **F64)
        assert curve.value_is_objective
        assert torch.equal(curve.flags["clip_ratio/region_mean"][keep], clipped[keep])
    assert torch.equal(down.flags["ratio/high_neg_adv_mean"], down.ratios > 1 + eps_high)
    assert float(down.gradient[-1]) < float(down.gradient[_at(down, 1.0)]) < 0  # grows in size with r


@pytest.mark.parametrize(("name", "options", "cap"), [("ppo", {"dual_clip": 3.0}, 3.0),
                                                       ("two_sided", {"beta": 0.0}, 4.0)])
def test_dual_clip_and_delta_bound_the_open_side(name, options, cap):
    """dual_clip = c (Ye et al. 2020) bounds the A < 0 loss at c |A|; delta (INTELLECT-2) caps the ratio at delta:
    either way J = cap * A and g = 0 beyond r = cap, g = r A between 1 + eps and cap; the default range reaches
    1.2 x cap so that it shows."""
    down = objective_curves(name, **options, **FAST).curves[1]
    assert down.ratios[-1] == pytest.approx(1.2 * cap)
    assert down.breakpoints == pytest.approx((0.8, cap), rel=1e-9)
    beyond = down.ratios > cap * (1 + 1e-6)
    between = (down.ratios > 1.2 + 1e-6) & (down.ratios < cap * (1 - 1e-6))
    assert (down.gradient[beyond] == 0).all()
    torch.testing.assert_close(down.value[beyond], torch.full_like(down.value[beyond], -cap), **F64)
    torch.testing.assert_close(down.gradient[between], -down.ratios[between], **F64)


def test_the_default_range_shows_the_distillation_dual_clip():
    """opd's distillation term is dual-clipped at distillation_clip_ratio_c (3.0): its gradient jumps there, which
    the default range (up to 3.0) drew as a cliff on the picture's right edge; it reaches 1.2 x c now."""
    up = objective_curves("opd", **FAST).curves[0]
    assert up.ratios[-1] == pytest.approx(1.2 * 3.0)
    beyond, before = up.gradient[up.ratios > 3.0 + 1e-6], up.gradient[up.ratios < 3.0 - 1e-6]
    assert len(beyond) > 1 and (beyond == 0).all() and before[-1] < -1.0  # the jump at c, and past it


def test_cispo_picture_is_the_clipped_detached_weight():
    """CISPO (MiniMax-M1 eq. 4-5): g = sg[clip(r, 0, 5)] A everywhere, never 0 (no token loses its gradient);
    the value -sg[w] A log pi is not the integral of the gradient (dotted in the picture)."""
    for curve in objective_curves("cispo", **FAST).curves:
        torch.testing.assert_close(curve.gradient, curve.ratios.clamp(0.0, 5.0) * curve.advantage, **F64)
        assert not curve.value_is_objective and curve.breakpoints == ()
        assert not curve.no_gradient.any()
        if curve.advantage > 0:  # counted where the weight is capped; for A < 0 the lower bound 0 never binds
            assert torch.equal(curve.flags["clip_ratio/region_mean"], curve.ratios > 5.0)
        else:
            assert "clip_ratio/region_mean" not in curve.flags


def test_sapo_picture_is_a_smooth_gate():
    """SAPO (Gao et al. 2025 eq. 5-6): J = (4 / tau) sigmoid(tau (r - 1)) A, g = r * 4 sigmoid' A: smooth (no
    breakpoint), never 0, REINFORCE's A at r = 1."""
    for curve, tau in zip(objective_curves("sapo", **FAST).curves, (1.0, 1.05), strict=True):
        r, a = curve.ratios, curve.advantage
        s = torch.sigmoid(tau * (r - 1))
        torch.testing.assert_close(curve.value, 4 / tau * s * a, **F64)
        torch.testing.assert_close(curve.gradient, 4 * r * s * (1 - s) * a, **F64)
        assert curve.breakpoints == () and curve.value_is_objective and curve.flags == {}


def test_gspo_at_one_token_is_token_level_ppo():
    """DESIGN section 3: gspo with T == 1 equals token-level PPO with its epsilons: the same curves."""
    gspo = objective_curves("gspo", **FAST)
    ppo = objective_curves("ppo", epsilon_low=3e-4, epsilon_high=4e-4, **FAST)
    assert "sequence ratio = token ratio" in gspo.notes
    for a, b in zip(gspo.curves, ppo.curves, strict=True):
        torch.testing.assert_close(a.ratios, b.ratios, **F64)
        torch.testing.assert_close(a.gradient, b.gradient, **F64)
        torch.testing.assert_close(a.value, b.value, **F64)


def test_the_log_linear_proximal_policy_is_pictured_one_update_behind():
    """rlzoo plot decoupled_ppo --loss.prox_logp_method loglinear failed: the picture had no convention for the
    versions, and gave the old log-probs the loss derives itself. A token sampled one update behind (version 0,
    training version 1) has the sampler's policy as its proximal one: the curves of the recomputed proximal
    policy equal to the sampler's."""
    loglinear = objective_curves("decoupled_ppo", prox_logp_method="loglinear", **FAST)
    recompute = objective_curves("decoupled_ppo", **FAST)
    for a, b in zip(loglinear.curves, recompute.curves, strict=True):
        torch.testing.assert_close(a.gradient, b.gradient, **F64)
        torch.testing.assert_close(a.value, b.value, **F64)


def test_penalty_curves_and_the_integral_of_the_gradient():
    """GRPO's k3 KL with ref = old: the policy term alone is PPO's clip; the full gradient adds
    beta (1/r - 1) (d k3 / d logp with ref = old is 1 - 1/r); the trapezoid integral of the gradient matches
    the value (the k3 value has no stop-gradient) to 1e-3 of its spread."""
    for curve in objective_curves("grpo", num=61).curves:
        assert curve.policy_gradient is not None and curve.value_is_objective
        torch.testing.assert_close(curve.gradient - curve.policy_gradient, 0.04 * (1 / curve.ratios - 1), **F64)
        spread = float(curve.value.max() - curve.value.min())
        assert float((curve.objective - curve.value).abs().max()) < 1e-3 * spread


@pytest.mark.parametrize("name", rlzoo.list_losses())
def test_every_preset_at_ratio_one_is_reinforce_and_counts_no_clip(name):
    """Why clip_ratio is 0 at num_iterations = 1: at r = 1 every preset's gradient is REINFORCE's A (each
    surrogate's declared on-policy promise) and none of its clip metrics counts the token (the one-token batch
    the pictures are made of; DESIGN section 3, first iteration)."""
    loss = rlzoo.get_loss(name)
    if loss.aggregation.needs_max_completion_length:
        loss = loss.with_options(max_completion_length=1)
    if "positive_nll_coef" in loss.options():  # VAPO's NLL term is not 0 at r = 1: the policy term alone
        loss = loss.with_options(positive_nll_coef=0.0)
    for a in (1.5, -1.5):
        _, g, metrics = _OneToken(loss, a, 0.2, {})(1.0)
        assert g == pytest.approx(a, rel=1e-12)
        counted = {k: v for k, v in metrics.items() if k.startswith("clip_ratio/") or k == "ratio/high_neg_adv_mean"}
        assert all(v == 0.0 for v in counted.values()), counted


def test_custom_loss_and_conventions():
    """A loss object plots too (labelled by its surrogate); a field without a convention is a clear error;
    seq-mean-token-sum-norm gets max_completion_length = 1; bad arguments name themselves."""
    loss = PolicyLoss(surrogate=PPOClip(epsilon_high=0.5), ratio=SequenceRatio(), aggregation="seq-mean-token-sum-norm")
    pic = objective_curves(loss, **FAST)
    assert pic.label == "custom loss" and "max_completion_length = 1" in pic.notes
    assert pic.curves[0].breakpoints == pytest.approx((1.5,), rel=1e-9)
    with pytest.raises(ValueError, match="overrides"):
        objective_curves(loss, epsilon_high=0.3)
    with pytest.raises(ValueError, match="old_prob"):
        objective_curves("ppo", old_prob=1.5)
    lowered = objective_curves("ppo", old_prob=0.5, r_max=4.0, num=11)  # r * p_old <= 1: lowered, and said so
    assert lowered.old_prob == 0.25 and "p_old = 1/r_max = 0.25" in lowered.notes
    with pytest.raises(ValueError, match="r_max"):
        objective_curves("ppo", r_max=0.5)
    with pytest.raises(rlzoo.UnknownNameError, match="dapo"):
        objective_curves("not-a-loss")
    assert objective_curves("kl_cov", **FAST).notes == ("batch-coupled part: a batch of this one token",)
    assert "ref_logprobs = old_logprobs" in objective_curves("grpo", **FAST).notes


def test_plot_writes_a_png(tmp_path):
    """plot_objective writes a PNG atomically (no temporary file left); plot_all names files after presets."""
    path = plot_objective("dapo", tmp_path / "dapo.png", epsilon_high=0.3, **FAST)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    from PIL import Image

    with Image.open(path) as image:
        assert image.size == (1050, 740) and image.mode == "P"
        assert image.text[PICTURE_LOSS_KEY] == repr(rlzoo.get_loss("dapo", epsilon_high=0.3))  # the loss drawn
        assert "epsilon_high=0.3" in image.text[PICTURE_LOSS_KEY]
    small = plot_objective("dapo", tmp_path / "small.png", dpi=72, **FAST)
    with Image.open(small) as image:
        assert image.size == (756, 532)  # 10.5 x 7.4 inches at 72 dpi, rounded down
    with pytest.raises(ValueError, match="dpi"):
        plot_objective("dapo", tmp_path / "x.png", dpi=0, **FAST)
    small.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dapo.png"]
    out = plot_all(tmp_path / "all", names=["ppo", "two_sided"], **FAST)
    assert [p.name for p in out] == ["ppo.png", "two_sided.png"] and all(p.is_file() for p in out)
