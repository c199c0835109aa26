"""Reference tests: ``rlzoo.compat.trl.loss_from_grpo_config`` against TRL 1.16 ``GRPOTrainer._compute_loss``.

TRL (a test dependency) is called for real: a ``GRPOTrainer`` built with ``object.__new__`` (no model, no
dataset) carries the attributes ``_compute_loss`` reads, an identity one-process accelerator, and a
``_get_per_token_logps_and_entropies`` that returns the test's log-probs and entropies. With one process and
no gradient accumulation, ``num_items_in_batch`` is the batch's active-token count.
"""

import dataclasses
import math
import subprocess
import sys
import warnings
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import runtime_type_checker_off
from tolerances import REFERENCE_ATOL, tol

import rlzoo
from rlzoo.compat.trl import (
    GRPO_CONFIG_FIELDS,
    GRPO_LOSS_DEFAULTS,
    LOSS_TYPES,
    VLLM_IS_MODES,
    TRLGRPOLoss,
    batch_from_trl_inputs,
    loss_from_grpo_config,
)
from rlzoo.losses import masked_quantile

trl = pytest.importorskip("trl", reason="TRL (test oracle) is not installed: pip install trl==1.16.0")
from trl import GRPOConfig, GRPOTrainer

F64 = torch.float64


# ------------------------------------------------------------------------------------------ the TRL oracle
class _OneProcess:
    """An accelerator of one process: every collective is the identity."""

    num_processes = 1
    sync_gradients = True
    is_main_process = True

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def _resolved(cfg: dict[str, Any]) -> SimpleNamespace:
    """TRL's ``args``: GRPOConfig's defaults updated with ``cfg`` (as its __post_init__ resolves them)."""
    args = {**GRPO_LOSS_DEFAULTS, **cfg}
    if args["vllm_importance_sampling_cap"] is not None:
        args["vllm_importance_sampling_clip_max"] = args["vllm_importance_sampling_cap"]
    args["steps_per_generation"] = 1
    args["gradient_accumulation_steps"] = 1
    args.setdefault("entropy_target", 0.2)
    return SimpleNamespace(**args)


def trl_trainer(cfg: dict[str, Any], logps: torch.Tensor, entropies: torch.Tensor) -> GRPOTrainer:
    """A ``GRPOTrainer`` with just what ``_compute_loss`` reads, set as ``GRPOTrainer.__init__`` sets it."""
    args = _resolved(cfg)
    trainer = object.__new__(GRPOTrainer)
    trainer.args = args
    trainer.loss_type = args.loss_type
    trainer.importance_sampling_level = args.importance_sampling_level
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.beta = args.beta
    trainer.top_entropy_quantile = args.top_entropy_quantile
    trainer.off_policy_mask_threshold = args.off_policy_mask_threshold
    trainer.use_vllm = args.use_vllm
    trainer.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    trainer.vllm_importance_sampling_mode = args.vllm_importance_sampling_mode
    trainer.vllm_importance_sampling_clip_min = args.vllm_importance_sampling_clip_min
    trainer.vllm_importance_sampling_clip_max = args.vllm_importance_sampling_clip_max
    trainer.max_completion_length = args.max_completion_length
    trainer.entropy_coef = args.entropy_coef
    trainer.use_adaptive_entropy = args.use_adaptive_entropy
    trainer._entropy_bonus_enabled = args.entropy_coef != 0.0 or args.use_adaptive_entropy
    trainer._last_world_entropy = math.inf
    trainer._entropy_window_stats = None
    trainer.aux_loss_enabled = False
    trainer.model = SimpleNamespace(training=True)
    trainer.current_gradient_accumulation_steps = 1
    trainer.accelerator = _OneProcess()
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, entropies, None)
    return trainer


def vllm_is_ratio(
    old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, args: SimpleNamespace
) -> torch.Tensor:
    """The vLLM importance-sampling ratio pi_old / pi_sampler as TRL 1.16 stores it at generation time.

    diff = (old - sampling) on counted tokens (0 elsewhere); token modes: exp(diff) per token ``[B, T]``;
    sequence modes: exp(sum_t diff) ``[B, 1]``; truncate: clamp to [clip_min, clip_max]; mask: 0 outside.
    """
    diff = (old - sampling) * mask
    mode = args.vllm_importance_sampling_mode
    log_rho = diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff
    rho = torch.exp(log_rho)
    lo, hi = args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max
    if mode.endswith("truncate"):
        return torch.clamp(rho, min=lo, max=hi)
    low = -math.inf if lo is None else lo
    high = math.inf if hi is None else hi
    return torch.where((rho < low) | (rho > high), torch.zeros_like(rho), rho)


@dataclasses.dataclass
class Case:
    """One batch of per-token inputs, as TRL's inputs dict plus the current log-probs and entropies."""

    logps: torch.Tensor
    entropies: torch.Tensor
    inputs: dict[str, Any]

    @property
    def mask(self) -> torch.Tensor:
        return self.inputs["completion_mask"].bool()


def make_case(
    cfg: dict[str, Any],
    *,
    seed: int,
    mask: torch.Tensor,
    old: bool,
    per_token_adv: bool,
    drift: float,
    zero_adv: bool,
) -> Case:
    """Random float64 inputs; masked positions hold finite junk (TRL multiplies by the mask, so NaN would leak)."""
    args = _resolved(cfg)
    g = torch.Generator().manual_seed(seed)
    b, t = mask.shape

    def noise(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=F64)

    logps = -torch.empty(b, t, dtype=F64).exponential_(1.0, generator=g)
    # entropies on a 1/16 grid: exact in float32, so TRL's float32 quantile sees the same values
    entropies = torch.randint(0, 64, (b, t), generator=g).to(F64) / 16.0
    adv = noise(b, t) if per_token_adv else noise(b)
    if zero_adv:
        adv = torch.where(torch.rand(adv.shape, generator=g, dtype=F64) < 0.25, 0.0, adv)
    inputs: dict[str, Any] = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "num_items_in_batch": mask.sum(),
    }
    old_lp = torch.clamp(logps + drift * noise(b, t), max=0.0) if old else None
    if old_lp is not None:
        inputs["old_per_token_logps"] = old_lp
    if args.beta != 0.0:
        inputs["ref_per_token_logps"] = torch.clamp(logps + 0.3 * noise(b, t), max=0.0)
    if args.use_vllm:
        anchor = logps if old_lp is None else old_lp
        sampling = torch.clamp(anchor + 0.2 * noise(b, t), max=0.0)
        inputs["sampling_per_token_logps"] = sampling
        if args.vllm_importance_sampling_correction:
            inputs["importance_sampling_ratio"] = vllm_is_ratio(anchor, sampling, mask.to(F64), args)
    return Case(logps=logps, entropies=entropies, inputs=inputs)


def trl_loss_and_grads(cfg: dict[str, Any], case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL 1.16's loss and its gradients w.r.t. the log-probs and the entropies."""
    logps = case.logps.clone().requires_grad_(True)
    entropies = case.entropies.clone().requires_grad_(True)
    trainer = trl_trainer(cfg, logps, entropies)
    loss = GRPOTrainer._compute_loss(trainer, None, dict(case.inputs))
    g_lp, g_ent = torch.autograd.grad(loss, [logps, entropies], allow_unused=True)
    return (
        loss.detach(),
        torch.zeros_like(logps) if g_lp is None else g_lp,
        torch.zeros_like(entropies) if g_ent is None else g_ent,
    )


def rlzoo_loss_and_grads(loss_fn: TRLGRPOLoss, case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logps = case.logps.clone().requires_grad_(True)
    entropies = case.entropies.clone().requires_grad_(True)
    out = loss_fn(batch_from_trl_inputs(case.inputs, logps, entropies))
    g_lp, g_ent = torch.autograd.grad(out.loss, [logps, entropies], allow_unused=True)
    return (
        out.loss.detach(),
        torch.zeros_like(logps) if g_lp is None else g_lp,
        torch.zeros_like(entropies) if g_ent is None else g_ent,
    )


def build(cfg: dict[str, Any]) -> TRLGRPOLoss:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cispo's cap < 1 warning, the deprecated cap alias
        return loss_from_grpo_config(cfg)


def assert_matches_trl(cfg: dict[str, Any], case: Case) -> None:
    ref = trl_loss_and_grads(cfg, case)
    got = rlzoo_loss_and_grads(build(cfg), case)
    for name, a, b in zip(("loss", "d/dlogprobs", "d/dentropies"), got, ref, strict=True):
        torch.testing.assert_close(
            a, b, atol=REFERENCE_ATOL, rtol=0.0, msg=lambda m, n=name: f"{n}: {m} cfg={cfg}"
        )


def entropy_threshold_agrees(case: Case, q: float) -> bool:
    """TRL takes the quantile in float32; rlzoo in float64. True when both keep the same tokens."""
    mask = case.mask
    if q >= 1.0 or not bool(mask.any()):
        return True
    ent = case.entropies
    t32 = torch.quantile(ent[mask].float(), 1.0 - q)
    t64 = masked_quantile(ent, mask, 1.0 - q)
    return bool(torch.equal((ent >= t32) & mask, (ent >= t64) & mask))


# ------------------------------------------------------------------------------------------------ strategies
@st.composite
def grpo_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A random dict of loss-relevant GRPOConfig fields (missing fields keep TRL's defaults)."""
    loss_type = draw(st.sampled_from(LOSS_TYPES))
    cfg: dict[str, Any] = {"loss_type": loss_type}
    if draw(st.booleans()) or loss_type == "luspo":
        cfg["importance_sampling_level"] = draw(st.sampled_from(("token", "sequence")))
    cfg["epsilon"] = draw(st.sampled_from((0.2, 0.0, 0.05, 0.3)) | st.floats(0.0, 0.9))
    if loss_type == "cispo":
        cfg["epsilon_high"] = draw(st.sampled_from((None, 5.0, 1.2, 0.9)) | st.floats(0.3, 6.0))
    else:
        cfg["epsilon_high"] = draw(st.sampled_from((None, 0.28, 0.0)) | st.floats(0.0, 2.0))
    cfg["delta"] = draw(st.sampled_from((None, 1.1, 4.0)) | st.floats(0.5, 5.0))
    cfg["beta"] = draw(st.sampled_from((0.0, 0.04, 0.5)))
    cfg["use_bias_correction_kl"] = draw(st.booleans())
    cfg["top_entropy_quantile"] = draw(st.sampled_from((1.0, 0.0, 0.25, 0.5, 0.75)) | st.floats(0.01, 0.99))
    cfg["entropy_coef"] = draw(st.sampled_from((0.0, 0.01, -0.3)))
    cfg["off_policy_mask_threshold"] = draw(st.sampled_from((None, 0.0, 0.05, 0.5)) | st.floats(-0.3, 1.0))
    cfg["use_vllm"] = draw(st.booleans())
    cfg["vllm_importance_sampling_correction"] = draw(st.booleans())
    modes = ("token_truncate", "token_mask") if loss_type == "vespo" else VLLM_IS_MODES
    mode = draw(st.sampled_from(modes))
    cfg["vllm_importance_sampling_mode"] = mode
    # Bounds around 1 (TRL's VESPO also reads the ratio at padding, where it is 1: see docs/compat.md).
    lo = draw(st.sampled_from((None, 0.5, 0.9)) | st.floats(0.1, 0.99))
    hi = draw(st.sampled_from((None, 1.1, 3.0)) | st.floats(1.01, 10.0))
    if mode.endswith("truncate") and lo is None and hi is None:
        hi = 2.0
    cfg["vllm_importance_sampling_clip_min"] = lo
    cfg["vllm_importance_sampling_clip_max"] = hi
    # TRL builds the per-token temperatures, k and lambda with torch.where on two Python floats, which rounds
    # them to float32 (rlzoo keeps the batch's float64); values exact in float32 make the two computations
    # the same (VESPO's exp(k log W) amplifies a float32 rounding of k beyond REFERENCE_ATOL). lambda >= 0.25
    # keeps phi(W) = e^lambda W^k e^(-lambda W) below ~1e7, where float64 rounding stays far below
    # REFERENCE_ATOL (a lambda near 0 lets phi reach W^k ~ 1e26); a lambda below the 1e-4 floor is
    # test_vespo_lambda_below_the_floor_is_clamped.
    cfg["sapo_temperature_pos"] = draw(st.floats(0.125, 3.0, width=32))
    cfg["sapo_temperature_neg"] = draw(st.floats(0.125, 3.0, width=32))
    for name in ("vespo_k_pos", "vespo_k_neg"):
        cfg[name] = draw(st.floats(0.0, 5.0, width=32))
    for name in ("vespo_lambda_pos", "vespo_lambda_neg"):
        cfg[name] = draw(st.floats(0.25, 5.0, width=32))
    cfg["max_completion_length"] = draw(st.integers(8, 64))
    return cfg


@st.composite
def cases(draw: st.DrawFn, cfg: dict[str, Any]) -> Case:
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.sampled_from((0, 1, t)) | st.integers(0, t), min_size=b, max_size=b))
    mask = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    if draw(st.booleans()):  # holes inside completions (tool masks)
        holes = torch.tensor(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).view(b, t)
        mask = mask & ~holes
    return make_case(
        cfg,
        seed=draw(st.integers(0, 2**31 - 1)),
        mask=mask,
        old=draw(st.booleans()),
        per_token_adv=draw(st.booleans()),
        drift=draw(st.sampled_from((1e-3, 0.1, 0.5, 1.5))),
        zero_adv=draw(st.booleans()),
    )


# -------------------------------------------------------------------------------------------- reference tests
@settings(max_examples=250, deadline=None)
@given(data=st.data())
def test_loss_and_grad_equal_trl(data: st.DataObject) -> None:
    """For random configs and inputs (masked positions, fully masked rows, on- and off-policy, per-sequence and
    per-token advantages), loss and gradients w.r.t. log-probs and entropies equal TRL 1.16's within 1e-6."""
    cfg = data.draw(grpo_configs(), label="cfg")
    case = data.draw(cases(cfg), label="case")
    assume(entropy_threshold_agrees(case, cfg["top_entropy_quantile"]))
    assert_matches_trl(cfg, case)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(data=st.data())
def test_loss_and_grad_equal_trl_many(data: st.DataObject) -> None:
    """As :func:`test_loss_and_grad_equal_trl`, with many more configs."""
    cfg = data.draw(grpo_configs(), label="cfg")
    case = data.draw(cases(cfg), label="case")
    assume(entropy_threshold_agrees(case, cfg["top_entropy_quantile"]))
    assert_matches_trl(cfg, case)


def _fixed_case(cfg: dict[str, Any], seed: int = 0) -> Case:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    return make_case(cfg, seed=seed, mask=mask, old=True, per_token_adv=False, drift=0.5, zero_adv=False)


@pytest.mark.parametrize("k", [0.0, 1.0, 2.5])
def test_vespo_lambda_below_the_floor_is_clamped(k: float) -> None:
    """lambda = 0 is used as 1e-4 by both. TRL clamps a float32 tensor, so its floor is float32(1e-4), 2.5e-12
    below 1e-4: phi differs by a factor exp(2.5e-12 (W - 1)), about 5e-11 relative for this case's W < 20,
    so the comparison is float64's relative row, not the absolute REFERENCE_ATOL (phi reaches W^k)."""
    cfg = {"loss_type": "vespo", "vespo_k_pos": k, "vespo_k_neg": k, "vespo_lambda_pos": 0.0, "vespo_lambda_neg": 0.0}
    case = _fixed_case(cfg)
    ref = trl_loss_and_grads(cfg, case)
    got = rlzoo_loss_and_grads(build(cfg), case)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, **tol(torch.float64))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_equals_trl_with_defaults(loss_type: str) -> None:
    """Each loss_type with TRL's default options (plus a fully masked row) equals TRL."""
    cfg = {"loss_type": loss_type}
    assert_matches_trl(cfg, _fixed_case(cfg))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_option_at_once_equals_trl(loss_type: str) -> None:
    """KL with bias correction, entropy mask and bonus, OPSM and vLLM IS together equal TRL."""
    cfg = {
        "loss_type": loss_type,
        "beta": 0.1,
        "top_entropy_quantile": 0.5,
        "entropy_coef": 0.05,
        "off_policy_mask_threshold": 0.1,
        "use_vllm": True,
        "vllm_importance_sampling_mode": "token_truncate",
        "vllm_importance_sampling_clip_min": 0.8,
        "epsilon_high": 0.28 if loss_type != "cispo" else 5.0,
        "delta": 1.5,
    }
    assert_matches_trl(cfg, _fixed_case(cfg, seed=3))


def test_the_reference_comparison_has_power() -> None:
    """The comparison detects a wrong translation: 'grpo' is not 'bnpo', and rlzoo's own default
    Normalizer (which skips fully masked rows) is not TRL's grpo denominator B."""
    cfg = {"loss_type": "grpo"}
    case = _fixed_case(cfg)
    trl_loss = trl_loss_and_grads(cfg, case)[0]
    assert not torch.allclose(
        rlzoo_loss_and_grads(build({"loss_type": "bnpo"}), case)[0], trl_loss, atol=1e-6
    )
    loss_fn = build(cfg)
    batch = batch_from_trl_inputs(case.inputs, case.logps.clone(), case.entropies)
    own = loss_fn.loss(batch).loss  # the PolicyLoss with Normalizer.from_batch: S = 3 rows, TRL divides by 4
    torch.testing.assert_close(own * 3 / 4, trl_loss, atol=REFERENCE_ATOL, rtol=0.0)


@pytest.mark.parametrize(
    "fields",
    [
        {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.04},
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        {
            "loss_type": "cispo",
            "epsilon_high": 5.0,
            "use_vllm": True,
            "vllm_importance_sampling_cap": 2.0,
            "vllm_importance_sampling_mode": "token_truncate",
        },
        {
            "loss_type": "vespo",
            "use_vllm": True,
            "vllm_importance_sampling_mode": "token_mask",
            "vllm_importance_sampling_clip_min": 0.5,
        },
        {
            "loss_type": "dr_grpo",
            "max_completion_length": 32,
            "top_entropy_quantile": 0.2,
            "entropy_coef": 0.01,
        },
    ],
)
def test_grpo_config_instance_equals_dict_and_trl(fields: dict[str, Any], tmp_path) -> None:
    """A real trl.GRPOConfig translates like the dict of its fields, and equals TRL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, **fields)
    from_config = build(config)
    from_dict = build(fields)
    assert from_config.loss.to_config() == from_dict.loss.to_config()
    assert from_config.entropy_coef == from_dict.entropy_coef
    trl_cfg = {name: getattr(config, name) for name in GRPO_LOSS_DEFAULTS}
    case = _fixed_case(trl_cfg, seed=1)
    ref = trl_loss_and_grads(trl_cfg, case)
    got = rlzoo_loss_and_grads(from_config, case)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=REFERENCE_ATOL, rtol=0.0)


# ------------------------------------------------------------------------------------------------ the config
def test_hard_coded_defaults_and_fields_equal_trl() -> None:
    """GRPO_LOSS_DEFAULTS are GRPOConfig 1.16's defaults; GRPO_CONFIG_FIELDS are its fields."""
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    assert GRPO_CONFIG_FIELDS == set(fields)
    for name, default in GRPO_LOSS_DEFAULTS.items():
        assert fields[name].default == default, name


def test_exposes_the_policy_loss() -> None:
    loss_fn = build(
        {"loss_type": "cispo", "epsilon_high": 5.0, "beta": 0.04, "off_policy_mask_threshold": 0.5}
    )
    assert isinstance(loss_fn.loss, rlzoo.PolicyLoss)
    assert loss_fn.loss.name == "cispo"
    assert loss_fn.loss.surrogate.options() == {"epsilon_low": 1.0, "epsilon_high": 4.0}
    assert loss_fn.required_fields() == {"ref_logprobs"}
    assert "kl(beta=0.04, kl_estimator='k3', use_bias_correction_kl=True)" in loss_fn.describe()


def test_cispo_cap_falls_back_to_epsilon_and_warns() -> None:
    """TRL's pitfall, reproduced: epsilon_high None -> cap = epsilon = 0.2, i.e. rlzoo epsilon_high = -0.8."""
    with pytest.warns(UserWarning, match="epsilon_high"):
        loss_fn = loss_from_grpo_config({"loss_type": "cispo"})
    assert loss_fn.loss.surrogate.epsilon_high == pytest.approx(-0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_from_grpo_config({"loss_type": "cispo", "epsilon_high": 5.0})


def test_deprecated_cap_is_clip_max() -> None:
    with pytest.warns(FutureWarning, match="vllm_importance_sampling_cap"):
        loss_fn = loss_from_grpo_config({"use_vllm": True, "vllm_importance_sampling_cap": 2.5})
    assert loss_fn.loss.is_correction.is_max == 2.5
    assert loss_fn.loss.is_correction.is_correction == "sequence_mask"


def test_vllm_correction_needs_use_vllm() -> None:
    """As TRL: the IS correction applies only with use_vllm=True."""
    assert build({"vllm_importance_sampling_correction": True}).loss.is_correction is None
    assert build({"use_vllm": True, "vllm_importance_sampling_correction": False}).loss.is_correction is None


@pytest.mark.parametrize(
    ("fields", "error", "names"),
    [
        ({"loss_typ": "grpo"}, KeyError, "loss_typ"),
        ({"loss_type": "gspo"}, ValueError, "loss_type"),
        ({"importance_sampling_level": "sequence_token"}, ValueError, "importance_sampling_level"),
        ({"use_adaptive_entropy": True}, ValueError, "use_adaptive_entropy"),
        ({"router_aux_loss_coef": 0.01}, ValueError, "router_aux_loss_coef"),
        ({"loss_type": "vespo", "use_vllm": True}, ValueError, "vllm_importance_sampling_mode"),
        (
            {"use_vllm": True, "vllm_importance_sampling_mode": "token_clip"},
            ValueError,
            "vllm_importance_sampling_mode",
        ),
        (
            {
                "use_vllm": True,
                "vllm_importance_sampling_mode": "token_truncate",
                "vllm_importance_sampling_clip_max": None,
            },
            ValueError,
            "clip_min",
        ),
        ({"vllm_importance_sampling_clip_min": 3.0}, ValueError, "vllm_importance_sampling_clip_min"),
        ({"loss_type": "dr_grpo", "max_completion_length": None}, ValueError, "max_completion_length"),
        ({"top_entropy_quantile": 1.5}, ValueError, "top_entropy_quantile"),
        ({"epsilon": -0.1}, ValueError, "epsilon"),
        ({"delta": 0.0}, ValueError, "delta"),
        ({"beta": -1.0}, ValueError, "beta"),
        ({"sapo_temperature_neg": 0.0}, ValueError, "sapo_temperature_neg"),
        ({"entropy_coef": math.nan}, ValueError, "entropy_coef"),
        ({"use_bias_correction_kl": "yes"}, ValueError, "use_bias_correction_kl"),
    ],
)
def test_fields_it_cannot_honour_raise_naming_the_field(
    fields: dict[str, Any], error: type, names: str
) -> None:
    with pytest.raises(error, match=names):
        loss_from_grpo_config(fields)


def test_unknown_loss_type_lists_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match="'grpo', 'bnpo', 'dr_grpo', 'dapo', 'cispo', 'sapo', 'luspo', 'vespo'"
    ):
        loss_from_grpo_config({"loss_type": "ppo"})


def test_unknown_key_suggests_the_field() -> None:
    with pytest.raises(KeyError, match="did you mean 'epsilon_high'"):
        loss_from_grpo_config({"epsilon_hi": 0.28})


def test_other_types_raise() -> None:
    with pytest.raises(TypeError, match="GRPOConfig or a dict"):
        loss_from_grpo_config(SimpleNamespace(loss_type="grpo"))


def test_trainer_side_fields_are_accepted() -> None:
    loss_fn = build(
        {
            "num_iterations": 4,
            "steps_per_generation": 2,
            "scale_rewards": "none",
            "learning_rate": 1e-6,
            "mask_truncated_completions": True,
            "num_generations": 16,
        }
    )
    assert loss_fn.loss.to_config() == build({}).loss.to_config()


def test_dict_needs_no_trl() -> None:
    """A dict config works with TRL unimportable (and does not import it)."""
    code = (
        "import sys; sys.modules['trl'] = None\n"
        "from rlzoo.compat.trl import loss_from_grpo_config\n"
        "f = loss_from_grpo_config({'loss_type': 'grpo', 'beta': 0.04})\n"
        "assert f.loss.name == 'grpo'\n"
        "assert sys.modules['trl'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------- the batch
def test_entropy_bonus_needs_entropies() -> None:
    loss_fn = build({"entropy_coef": 0.01})
    lp = -torch.rand(2, 3, dtype=F64)
    batch = rlzoo.PolicyBatch(
        logprobs=lp, advantages=torch.ones(2, dtype=F64), completion_mask=torch.ones(2, 3, dtype=torch.bool)
    )
    with pytest.raises(rlzoo.BatchError, match="entropies"):
        loss_fn(batch)


def test_batch_from_trl_inputs_needs_the_mask() -> None:
    with pytest.raises(rlzoo.BatchError, match="completion_mask"):
        batch_from_trl_inputs({"advantages": torch.zeros(2, dtype=F64)}, -torch.rand(2, 3, dtype=F64))


def test_batch_from_trl_inputs_applies_the_tool_mask() -> None:
    mask = torch.ones(2, 3, dtype=torch.long)
    tool = torch.tensor([[1, 0, 1], [1, 1, 1]])
    batch = batch_from_trl_inputs(
        {"completion_mask": mask, "advantages": torch.zeros(2, dtype=F64), "tool_mask": tool},
        -torch.rand(2, 3, dtype=F64),
    )
    assert torch.equal(batch.completion_mask, tool.bool())


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_normalizer_of_the_batchs_own_counts_changes_nothing(data: st.DataObject) -> None:
    """Passing Normalizer(num_tokens=mask.sum(), num_sequences=B) (what the TRL integration passes with one
    process and one micro-batch) gives the loss without one, TRL's, also with an entropy mask: the bonus was
    divided by all tokens instead of the kept ones (half the bonus at top_entropy_quantile=0.5)."""
    cfg = data.draw(grpo_configs(), label="cfg")
    cfg["entropy_coef"] = data.draw(st.sampled_from((0.0, 0.1, -0.3)), label="entropy_coef")
    case = data.draw(cases(cfg), label="case")
    loss_fn = build(cfg)
    batch = batch_from_trl_inputs(case.inputs, case.logps, case.entropies)
    own = rlzoo.Normalizer(num_tokens=batch.completion_mask.sum(), num_sequences=batch.shape[0])
    torch.testing.assert_close(loss_fn(batch, normalizer=own).loss, loss_fn(batch).loss, atol=REFERENCE_ATOL, rtol=0.0)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_micro_batches_with_a_normalizer_sum_to_the_full_loss(data: st.DataObject) -> None:
    """With the full batch's Normalizer(num_tokens=mask.sum(), num_sequences=B), summing micro-batch losses
    gives the full-batch loss and gradient (no entropy quantile: it couples sequences)."""
    cfg = data.draw(grpo_configs(), label="cfg")
    cfg["top_entropy_quantile"] = 1.0
    case = data.draw(cases(cfg), label="case")
    loss_fn = build(cfg)
    full, g_full, ge_full = rlzoo_loss_and_grads(loss_fn, case)
    logps = case.logps.clone().requires_grad_(True)
    ent = case.entropies.clone().requires_grad_(True)
    batch = batch_from_trl_inputs(case.inputs, logps, ent)
    norm = rlzoo.Normalizer(num_tokens=batch.completion_mask.sum(), num_sequences=batch.shape[0])
    size = data.draw(st.integers(1, batch.shape[0]), label="micro_batch_size")
    total = sum(loss_fn(mb, normalizer=norm).loss for mb in batch.split(size))
    g_lp, g_ent = torch.autograd.grad(total, [logps, ent], allow_unused=True)
    torch.testing.assert_close(total.detach(), full, atol=REFERENCE_ATOL, rtol=0.0)
    torch.testing.assert_close(
        torch.zeros_like(logps) if g_lp is None else g_lp, g_full, atol=REFERENCE_ATOL, rtol=0.0
    )
    torch.testing.assert_close(
        torch.zeros_like(ent) if g_ent is None else g_ent, ge_full, atol=REFERENCE_ATOL, rtol=0.0
    )


# ------------------------------------------------------------------------------------------------ the docs
DOCS = __import__("pathlib").Path(__file__).resolve().parents[2] / "docs" / "compat.md"
TRL_DOCUMENTED = (
    *GRPO_LOSS_DEFAULTS,
    "entropy_coef_min",
    "entropy_coef_max",
    "entropy_coef_delta",
    "entropy_target",
    "scale_rewards",
    "multi_objective_aggregation",
    "reward_weights",
    "mask_truncated_completions",
    "num_iterations",
    "steps_per_generation",
    "num_generations",
    "generation_batch_size",
    "gradient_accumulation_steps",
    *(f'loss_type="{t}"' for t in LOSS_TYPES),
    *(f'"{m}"' for m in VLLM_IS_MODES),
)
VERL_DOCUMENTED = (
    "loss_agg_mode",
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "full",
    "k1+",
    "k3+",
    "low_var_kl+",
    "k2+",
    "mse+",
    "abs+",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_scale_factor",
    "entropy_coeff",
    "use_kl_loss",
    "kl_loss_coef",
    "kl_loss_type",
    "rollout_is",
    "rollout_rs",
    "rollout_is_batch_normalize",
)


def test_docs_map_every_trl_and_verl_option() -> None:
    """docs/compat.md names every TRL loss option and every verl loss_mode / adv_estimator (from verl itself
    when it is installed) in backticks."""
    text = DOCS.read_text()
    names = list(TRL_DOCUMENTED) + list(VERL_DOCUMENTED)
    try:
        from oracles import verl_core_algos

        core_algos = verl_core_algos()
        names += list(core_algos.POLICY_LOSS_REGISTRY) + [e.value for e in core_algos.AdvantageEstimator]
    except pytest.skip.Exception:
        pass
    missing = [
        name
        for name in names
        if f"`{name}`" not in text
        and f"`{name} " not in text
        and f"`{name}=" not in text
        and f"`{name}(" not in text
    ]
    assert not missing, f"docs/compat.md does not map: {missing}"


def test_parts_accept_what_trl_accepts() -> None:
    """The part ranges widened for TRL: a CISPO cap below 1 (but >= the lower bound), truncation with only a
    lower bound, and top_entropy_quantile 0 (keep the highest-entropy token)."""
    from rlzoo.algorithms.cispo import CISPO
    from rlzoo.losses import EntropyMask, ISCorrection

    assert CISPO(epsilon_low=1.0, epsilon_high=-0.8).epsilon_high == -0.8
    with pytest.raises(ValueError, match="epsilon_high"):
        CISPO(epsilon_low=0.2, epsilon_high=-0.5)  # upper bound 0.5 < lower bound 0.8
    with pytest.raises(ValueError, match="epsilon_high"):
        CISPO(epsilon_low=1.0, epsilon_high=-1.5)  # a negative cap
    assert ISCorrection(is_correction="token_truncate", is_min=0.5, is_max=None).active
    with pytest.raises(ValueError, match="is_max or is_min"):
        ISCorrection(is_correction="sequence_truncate", is_min=None, is_max=None)
    ent = torch.tensor([[0.5, 2.0, 1.0], [2.0, 0.1, 3.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    x = rlzoo.losses.LossInputs.from_batch(
        rlzoo.PolicyBatch(
            logprobs=-torch.ones(2, 3, dtype=F64),
            advantages=torch.ones(2, dtype=F64),
            completion_mask=mask,
            entropies=ent,
        )
    )
    kept, _ = EntropyMask(top_entropy_quantile=0.0)(x)
    assert torch.equal(kept.bool(), torch.tensor([[False, True, False], [True, False, False]]))


# --------------------------------------------------------------------------------------------- metrics
def trl_metrics(cfg: dict[str, Any], case: Case) -> dict[str, float]:
    """The metrics TRL 1.16's ``_compute_loss`` logs for one batch (its ``_metrics["train"]``)."""
    trainer = trl_trainer(cfg, case.logps.clone(), case.entropies.clone())
    GRPOTrainer._compute_loss(trainer, None, dict(case.inputs))
    return {key: values[-1] for key, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("per_token_adv", [False, True])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), loss_type=st.sampled_from(["grpo", "bnpo", "dapo", "luspo", "cispo"]))
def test_clip_metrics_equal_trl(level: str, per_token_adv: bool, seed: int, loss_type: str) -> None:
    """clip_ratio/{low,high,region}_mean, low_min, high_max (and cispo_clip_ratio) equal TRL's logged values, for both
    importance-sampling levels: with the sequence level and per-sequence advantages TRL counts each sequence
    once (its indicator is [B, 1]), otherwise each token. (No fully masked row: TRL counts those in the
    denominator of its per-sequence mean, rlzoo does not.)"""
    cfg = {"loss_type": loss_type, "importance_sampling_level": level, "epsilon": 0.05,
           "epsilon_high": 1.05 if loss_type == "cispo" else 0.08}
    mask = torch.arange(6)[None, :] < torch.tensor([[6], [1], [3], [5], [2]])
    case = make_case(cfg, seed=seed, mask=mask, old=True, per_token_adv=per_token_adv, drift=0.3, zero_adv=True)
    ref = trl_metrics(cfg, case)
    got = build(cfg)(batch_from_trl_inputs(case.inputs, case.logps, case.entropies)).metrics
    keys = ["cispo_clip_ratio"] if loss_type == "cispo" else [
        "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
        "clip_ratio/high_max"]
    for key in keys:
        assert got[key].item() == pytest.approx(ref[key], abs=REFERENCE_ATOL), key


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vespo_phi_metric_equals_trl(per_token_adv: bool, seed: int) -> None:
    """vespo/phi_seq_mean is TRL's: over every sequence (a fully masked one counts phi = 1) with one advantage per
    sequence, over the counted tokens with per-token advantages. It was the mean over the non-empty sequences."""
    cfg = {"loss_type": "vespo"}
    mask = torch.arange(6)[None, :] < torch.tensor([[6], [0], [3], [5], [2]])
    case = make_case(cfg, seed=seed, mask=mask, old=True, per_token_adv=per_token_adv, drift=0.3, zero_adv=False)
    ref = trl_metrics(cfg, case)["vespo/phi_seq_mean"]
    got = build(cfg)(batch_from_trl_inputs(case.inputs, case.logps, case.entropies)).metrics["vespo/phi_seq_mean"]
    assert got.item() == pytest.approx(ref, abs=REFERENCE_ATOL)


# -------------------------------------------------------------------------------- the cards' TRL claims
@pytest.mark.parametrize("name", rlzoo.list_losses())
def test_cards_state_where_they_leave_trls_kl_default(name: str) -> None:
    """A card claiming TRL for a preset with a KL penalty says which use_bias_correction_kl it uses when that
    differs from TRL 1.16's default (True: the k3 estimate times the ratio), and attributes verl's k3 clamp
    to both of verl's names ("k3" and "low_var_kl" are one clamped estimator)."""
    card = rlzoo.losses.presets.get(name)
    kl = [p for p in rlzoo.get_loss(name).penalties if isinstance(p, rlzoo.losses.KLPenalty) and p.active]
    if "TRL" not in card.matches or not kl:
        return
    if kl[0].use_bias_correction_kl != GRPO_LOSS_DEFAULTS["use_bias_correction_kl"]:
        assert f"use_bias_correction_kl={kl[0].use_bias_correction_kl}" in card.matches
    assert "'low_var_kl' also clamps" not in card.matches


@pytest.mark.parametrize(
    ("name", "cfg"),
    [("grpo", {"loss_type": "grpo", "beta": 0.04}),
     ("two_sided", {"loss_type": "grpo", "delta": 4.0, "beta": 0.001})],
)
@pytest.mark.parametrize("bias_correction", [False, True])
def test_kl_presets_equal_trl_as_their_cards_say(name: str, cfg: dict[str, Any], bias_correction: bool) -> None:
    """get_loss(name) equals TRL 1.16 with use_bias_correction_kl=False, as the card says; with
    use_bias_correction_kl=True (TRL's default) it equals TRL's default. No fully masked row: TRL's "grpo"
    divides by every row, the preset by the rows with a counted token."""
    cfg = {**cfg, "use_bias_correction_kl": bias_correction}
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    case = make_case(cfg, seed=1, mask=mask, old=True, per_token_adv=False, drift=0.4, zero_adv=False)
    ref = trl_loss_and_grads(cfg, case)
    loss_fn = rlzoo.get_loss(name) if not bias_correction else rlzoo.get_loss(name, use_bias_correction_kl=True)
    logps = case.logps.clone().requires_grad_(True)
    out = loss_fn(batch_from_trl_inputs(case.inputs, logps, case.entropies))
    (grad,) = torch.autograd.grad(out.loss, logps)
    torch.testing.assert_close(out.loss.detach(), ref[0], atol=REFERENCE_ATOL, rtol=0.0)
    torch.testing.assert_close(grad, ref[1], atol=REFERENCE_ATOL, rtol=0.0)


def test_a_composed_rollout_rejection_keeps_its_metric_tokens_through_the_trl_loss():
    """TRLGRPOLoss passes on the inner loss's LossOutput.metric_tokens (the policy term's metrics are over the kept
    tokens under a rollout rejection), which the TRL integration weights its metrics by; it dropped them."""
    trl_loss = build({"loss_type": "cispo"})
    rejecting = dataclasses.replace(trl_loss, loss=trl_loss.loss.with_options(rollout_rs="token_k1",
                                                                             rollout_rs_threshold="0.8_1.25"))
    g = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 4, generator=g, dtype=F64) - 0.1
    rollout = logprobs.clone()
    rollout[0] -= 1.0  # the first sequence's tokens are rejected
    batch = rlzoo.PolicyBatch(logprobs=logprobs, old_logprobs=logprobs, rollout_logprobs=rollout,
                              advantages=torch.tensor([1.0, -1.0, 0.5], dtype=F64),
                              completion_mask=torch.ones(3, 4, dtype=torch.bool))
    out = rejecting(batch)
    assert float(out.metric_tokens["ratio/mean"]) == 8.0  # of 12
    assert out.metric_tokens["cispo_clip_ratio"] is out.metric_tokens["clip_ratio/high_mean"]


def test_normalizer_from_batch_with_a_trl_loss_says_what_to_pass() -> None:
    """Normalizer.from_batch(batch, loss=loss_fn), as the README spells it for a PolicyLoss, raised AttributeError
    ('TRLGRPOLoss' object has no attribute 'loss_mask') for a TRL user's loss: a ValueError says what to pass."""
    loss_fn = build({"loss_type": "dapo"})
    batch = rlzoo.PolicyBatch(logprobs=-torch.rand(2, 3, dtype=F64), advantages=torch.ones(2, dtype=F64),
                              completion_mask=torch.ones(2, 3, dtype=torch.bool))
    with runtime_type_checker_off(), pytest.raises(ValueError, match=r"^Normalizer.from_batch: loss must be an rlzoo "
                                                                    r"PolicyLoss \(it has loss_mask\), got TRLGRPOLoss; "
                                                                    r"it wraps one in .loss: from_batch\(..., "
                                                                    r"loss=loss_fn.loss\)"):
        rlzoo.Normalizer.from_batch(batch, loss=loss_fn)
    assert int(rlzoo.Normalizer.from_batch(batch, loss=loss_fn.loss).num_tokens) == 6


def test_trls_beta_is_its_k3_kl_whatever_else_declares_beta():
    """A registered part of the user's that declares ``beta`` too (composing.md's custom penalty) made TRL's
    ``beta`` ambiguous inside ``loss_from_grpo_config``: every loss type whose preset holds no KL part (dapo, TRL's
    default, cispo, sapo, vespo) failed with beta != 0, advising dataclasses.replace. TRL's beta is always its k3 KL:
    the same loss as without the user's part."""
    from rlzoo.losses import PartOutput, Penalty, penalties

    want = {(t, beta): loss_from_grpo_config({"loss_type": t, "beta": beta}).loss
            for t in ("dapo", "cispo", "sapo", "grpo") for beta in (0.0, 0.04)}
    with penalties.scoped():

        class MyKL(Penalty, name="my_squared_kl"):
            """beta * (logp - ref)^2 per token (a test part)."""

            beta: float = 0.0

            @property
            def active(self) -> bool:
                return self.beta != 0.0

            def __call__(self, x):
                return PartOutput(self.beta * (x.logprobs - x.ref_logprobs).square(), {})

        for (loss_type, beta), loss in want.items():
            assert loss_from_grpo_config({"loss_type": loss_type, "beta": beta}).loss == loss, (loss_type, beta)
