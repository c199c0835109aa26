r"""Surrogates: the per-token policy objective, as a loss to minimise.

Each surrogate maps :class:`~rlzoo.losses.LossInputs` (with ``log_weight`` set by the ratio level) to a
per-token loss ``Float[B, T]`` and a dict of metrics. ``w = exp(log_weight)`` is the importance weight,
``A`` the advantage, ``logp`` the current log-prob. Masked positions are ignored by the aggregation.

Unless a surrogate says otherwise (``handles_is_weight``), the sampler/trainer IS-correction weight
multiplies its per-token loss afterwards, as in verl's ``rollout_is_weights`` and TRL's
``importance_sampling_ratio``.
"""

import dataclasses
import math
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.losses._core import LossInputs, Metrics, Part, check_number, surrogates

__all__ = [
    "CISPO",
    "DRO",
    "GMPO",
    "SAPO",
    "VESPO",
    "ClipCov",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "KLCov",
    "PPOClip",
    "Reinforce",
]

PartOutput = tuple[Float[Tensor, "B T"], Metrics]


def _clip_metrics(x: LossInputs, w: Tensor, low: float, high: float) -> Metrics:
    """TRL's clip metrics: low = (w < low) & (A < 0), high = (w > high) & (A > 0), region = either."""
    w = w.detach()
    is_low = (w < low) & (x.advantages < 0)
    is_high = (w > high) & (x.advantages > 0)
    dtype = x.logprobs.dtype
    return {
        "clip_ratio/low_mean": x.mean(is_low.to(dtype)),
        "clip_ratio/high_mean": x.mean(is_high.to(dtype)),
        "clip_ratio/region_mean": x.mean((is_low | is_high).to(dtype)),
    }


def _seq_metric(x: LossInputs, per_seq: Tensor) -> Tensor:
    """Mean over the sequences that have a counted token, of a ``[B, 1]`` per-sequence quantity."""
    has = (x.lengths > 0).to(per_seq.dtype)
    return (per_seq.squeeze(-1) * has).sum() / has.sum().clamp(min=1)


def _random_subset(candidates: Tensor, count: Tensor) -> Tensor:
    """A uniformly random subset of ``min(count, candidates.sum())`` of the True entries (no device sync)."""
    keys = torch.rand(candidates.shape, device=candidates.device)
    keys = torch.where(candidates, keys, torch.full_like(keys, -1.0))
    rank = torch.argsort(torch.argsort(keys.flatten(), descending=True)).view(candidates.shape)
    return candidates & (rank < count)


def _top_count(scores: Tensor, valid: Tensor, count: Tensor) -> Tensor:
    """The ``count`` valid entries with the largest ``scores`` (ties broken by position; no device sync)."""
    keyed = torch.where(valid, scores, torch.full_like(scores, -math.inf))
    rank = torch.argsort(torch.argsort(keyed.flatten(), descending=True, stable=True), stable=True)
    return valid & (rank.view(scores.shape) < count)


@surrogates.register("ppo_clip")
@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOClip(Part):
    r"""PPO's clipped surrogate with asymmetric range, optional dual clip and INTELLECT-2 delta cap.

    .. math::
        \ell = -\min\big(\tilde w\,A,\; \mathrm{clip}(w, 1-\epsilon_{low}, 1+\epsilon_{high})\,A\big),
        \qquad \tilde w = \min(w, \delta)\ \text{(when delta is set)}

    and, with ``dual_clip = c``, for ``A < 0``: :math:`\ell \leftarrow \min(\ell, -c\,A)`.

    Without ``delta`` or ``dual_clip``, a token with ``A < 0`` and ``w > 1 + epsilon_high`` is *not*
    clipped: its loss and gradient grow with ``w``.

    Args:
        epsilon_low: finite, >= 0, lower clip ``1 - epsilon_low`` (default 0.2).
        epsilon_high: finite, >= 0, upper clip ``1 + epsilon_high`` (default 0.2; DAPO's clip-higher uses
            0.28).
        dual_clip: None (off, default) or a finite ``c > 1``: bounds the loss of ``A < 0`` tokens at
            ``c * |A|``.
        delta: None (off, default) or ``> 0`` (inf is the same as off): caps the unclipped ratio before the
            min (two-sided clipping).

    Metrics: ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean`` (TRL's
    definitions, on the ratio before ``delta``), and ``clip_ratio/dual_mean`` when ``dual_clip`` is set.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number (a string,
            a bool, or None where None is not allowed).

    References:
        Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347, eq. (7);
        Yu et al. 2025, "DAPO", arXiv:2503.14476, eq. (10) (clip-higher);
        Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", arXiv:1912.09729, eq. (5) (dual clip);
        Prime Intellect 2025, "INTELLECT-2", arXiv:2505.07291, sec. 3.3 (delta).
        Matches TRL 1.16 loss_type "grpo"/"bnpo"/"dr_grpo"/"dapo"/"luspo" (``epsilon``, ``epsilon_high``,
        ``delta``) and verl ``loss_mode="vanilla"`` (``clip_ratio_low/high``, ``clip_ratio_c``; verl
        always applies the dual clip, here it is opt-in).
    """

    registry: ClassVar = surrogates
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        check_number("ppo_clip", "epsilon_low", self.epsilon_low, low=0.0)
        check_number("ppo_clip", "epsilon_high", self.epsilon_high, low=0.0)
        check_number("ppo_clip", "dual_clip", self.dual_clip, low=1.0, low_open=True, allow_none=True)
        check_number("ppo_clip", "delta", self.delta, low=0.0, low_open=True, allow_none=True, allow_inf=True)

    def __call__(self, x: LossInputs) -> PartOutput:
        w, adv = x.weight, x.advantages
        clipped = torch.clamp(w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        unclipped = w if self.delta is None else torch.clamp(w, max=self.delta)
        loss = -torch.minimum(unclipped * adv, clipped * adv)
        metrics = _clip_metrics(x, w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        if self.dual_clip is not None:
            bound = -self.dual_clip * adv
            dual = (adv < 0) & (loss > bound)
            loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
            metrics["clip_ratio/dual_mean"] = x.mean(dual.detach().to(loss.dtype))
        return loss, metrics


@surrogates.register("cispo")
@dataclasses.dataclass(frozen=True, kw_only=True)
class CISPO(Part):
    r"""CISPO: a clipped, detached importance weight times the REINFORCE term (every token keeps a gradient).

    .. math:: \ell = -\mathrm{sg}\big[\mathrm{clip}(w, 1-\epsilon_{low}, 1+\epsilon_{high})\big]\,A\,\log\pi_\theta

    Args:
        epsilon_low: finite, >= 0 (default 1.0: lower bound 0, i.e. no lower clip, as the paper).
        epsilon_high: finite, >= -1 (default 4.0: upper bound 5, ScaleRL's ``epsilon_max = 5``), with
            ``1 + epsilon_high >= 1 - epsilon_low``. TRL's ``epsilon_high`` for cispo is the absolute cap,
            i.e. ``1 + epsilon_high`` here; a cap below 1 (``epsilon_high < 0``, e.g. TRL's fallback cap 0.2)
            down-weights every token.

    Metrics: ``clip_ratio/low_mean``, ``clip_ratio/high_mean`` (TRL's ``cispo_clip_ratio``),
    ``clip_ratio/region_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number, or naming
            epsilon_high when the upper bound ``1 + epsilon_high`` is below the lower bound
            ``1 - epsilon_low``.

    References:
        MiniMax 2025, "MiniMax-M1", arXiv:2506.13585, eq. (4)-(5);
        Khatri et al. 2025, "The Art of Scaling RL Compute for LLMs" (ScaleRL), arXiv:2510.13786.
        Matches TRL 1.16 ``loss_type="cispo"`` (with ``epsilon_high = 1 + epsilon_high`` here) and verl
        ``loss_mode="cispo"``.
    """

    registry: ClassVar = surrogates
    epsilon_low: float = 1.0
    epsilon_high: float = 4.0

    def __post_init__(self) -> None:
        check_number("cispo", "epsilon_low", self.epsilon_low, low=0.0)
        check_number("cispo", "epsilon_high", self.epsilon_high, low=-1.0)
        if 1.0 + self.epsilon_high < 1.0 - self.epsilon_low:
            raise ValueError(
                f"cispo: the upper bound 1 + epsilon_high ({1.0 + self.epsilon_high}) must be >= the lower bound "
                f"1 - epsilon_low ({1.0 - self.epsilon_low})"
            )

    def __call__(self, x: LossInputs) -> PartOutput:
        w = x.weight.detach()
        weight = torch.clamp(w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        loss = -weight * x.advantages * x.logprobs
        return loss, _clip_metrics(x, w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)


@surrogates.register("sapo")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SAPO(Part):
    r"""SAPO: a smooth sigmoid gate on the ratio instead of a hard clip.

    .. math::
        \ell = -f_\tau(w)\,A,\qquad f_\tau(w) = \frac{4}{\tau}\,\sigma\big(\tau (w - 1)\big),
        \qquad \tau = \tau_{pos}\ \text{if}\ A > 0\ \text{else}\ \tau_{neg}

    ``f'(1) = 1``, so at ``w = 1`` the gradient is REINFORCE's; the loss value there is ``-2A/tau``.

    Args:
        tau_pos: finite, > 0, gate temperature for ``A > 0`` tokens (default 1.0).
        tau_neg: finite, > 0, gate temperature for ``A <= 0`` tokens (default 1.05).

    Raises:
        ValueError: naming tau_pos or tau_neg when it is <= 0, NaN, inf, or not a number.

    References:
        Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347, eq. (5)-(6).
        Matches TRL 1.16 ``loss_type="sapo"`` (``sapo_temperature_pos/neg``) and verl ``loss_mode="sapo"``.
    """

    registry: ClassVar = surrogates
    tau_pos: float = 1.0
    tau_neg: float = 1.05

    def __post_init__(self) -> None:
        check_number("sapo", "tau_pos", self.tau_pos, low=0.0, low_open=True)
        check_number("sapo", "tau_neg", self.tau_neg, low=0.0, low_open=True)

    def __call__(self, x: LossInputs) -> PartOutput:
        adv = x.advantages
        # in the batch's dtype: torch.where on two Python floats would round tau to float32
        tau = torch.where(adv > 0, adv.new_tensor(self.tau_pos), adv.new_tensor(self.tau_neg))
        gate = torch.sigmoid(tau * (x.weight - 1.0)) * (4.0 / tau)
        return -gate * adv, {}


@surrogates.register("reinforce")
@dataclasses.dataclass(frozen=True, kw_only=True)
class Reinforce(Part):
    r"""REINFORCE / GPG: the plain policy gradient, no ratio and no clipping.

    .. math:: \ell = -A\,\log\pi_\theta(o_t)

    The ratio level is ignored (off-policy data is not re-weighted).

    References:
        Williams 1992, "Simple statistical gradient-following algorithms", eq. (11);
        Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
        arXiv:2504.02546, eq. (6). Matches verl ``loss_mode="gpg"``.
    """

    registry: ClassVar = surrogates

    def __call__(self, x: LossInputs) -> PartOutput:
        return -x.advantages * x.logprobs, {}


@surrogates.register("gmpo")
@dataclasses.dataclass(frozen=True, kw_only=True)
class GMPO(Part):
    r"""GMPO's objective: the unclipped importance-weighted advantage of the sequence.

    .. math:: \ell_i = -\bar A_i\, w_i,\qquad \bar A_i = \text{masked mean of } A_{i,t}

    Paired with the ``geometric`` ratio level, which clips each token log-ratio before the geometric
    mean, this is GMPO. With a sampler/trainer IS weight, the sequence is weighted by the geometric
    mean of its token IS weights (as verl).

    References:
        Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673, eq. (5).
        Matches verl ``loss_mode="geo_mean"`` with ``loss_agg_mode="seq-mean-token-mean"``.
    """

    registry: ClassVar = surrogates
    handles_is_weight: ClassVar[bool] = True

    def __call__(self, x: LossInputs) -> PartOutput:
        loss = -x.seq_mean(x.advantages) * x.weight
        if x.is_weight is not None:
            loss = loss * torch.exp(x.seq_mean(torch.log(x.is_weight + 1e-10)))
        return loss, {}


@surrogates.register("clip_cov")
@dataclasses.dataclass(frozen=True, kw_only=True)
class ClipCov(Part):
    r"""Clip-Cov: PPO clip, plus a random few high-covariance tokens removed from the loss.

    Token covariance :math:`c_t = (A_t - \bar A)(\log\pi_t - \overline{\log\pi})` (means over the
    batch's counted tokens). Among tokens not already clipped by PPO with
    ``clip_cov_lb < c_t < clip_cov_ub``, ``max(1, floor(clip_cov_ratio * N))`` are drawn uniformly at
    random (torch's global RNG) and their loss is set to 0 (no gradient).

    Args:
        epsilon_low, epsilon_high: finite, >= 0, the PPO clip range (default 0.2 / 0.2).
        clip_cov_ratio: in (0, 1], fraction of counted tokens to remove (default 2e-4).
        clip_cov_lb, clip_cov_ub: covariance window, any finite values with ``clip_cov_lb < clip_cov_ub``
            (the covariance may be negative; defaults 1.0, 5.0 as verl).

    Batch-coupled: the covariance and the draw depend on the whole (micro-)batch.
    Metrics: the PPO clip metrics and ``clip_cov/removed_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number, or naming
            clip_cov_ub when ``clip_cov_ub <= clip_cov_lb``.

    References:
        Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
        arXiv:2505.22617, sec. 4 (Clip-Cov). Matches verl ``loss_mode="clip_cov"``.
    """

    registry: ClassVar = surrogates
    batch_coupled: ClassVar[bool] = True
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0

    def __post_init__(self) -> None:
        check_number("clip_cov", "epsilon_low", self.epsilon_low, low=0.0)
        check_number("clip_cov", "epsilon_high", self.epsilon_high, low=0.0)
        check_number("clip_cov", "clip_cov_ratio", self.clip_cov_ratio, low=0.0, low_open=True, high=1.0)
        check_number("clip_cov", "clip_cov_lb", self.clip_cov_lb)
        check_number("clip_cov", "clip_cov_ub", self.clip_cov_ub)
        if self.clip_cov_ub <= self.clip_cov_lb:
            raise ValueError(f"clip_cov: clip_cov_ub ({self.clip_cov_ub}) must be > clip_cov_lb ({self.clip_cov_lb})")

    def __call__(self, x: LossInputs) -> PartOutput:
        w, adv, mask = x.weight, x.advantages, x.mask
        loss1 = -adv * w
        loss2 = -adv * torch.clamp(w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        lp = x.logprobs.detach()
        cov = (adv - x.mean(adv)) * (lp - x.mean(lp))
        clipped_by_ppo = (loss2 > loss1).detach()
        candidates = mask & ~clipped_by_ppo & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)
        # in float64 as verl's int(ratio * N): a Python float times an int tensor would be float32
        count = torch.floor(self.clip_cov_ratio * mask.sum().to(torch.float64)).clamp(min=1)
        removed = _random_subset(candidates, count)
        loss = torch.where(removed, torch.zeros_like(loss1), torch.maximum(loss1, loss2))
        metrics = _clip_metrics(x, w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        metrics["clip_cov/removed_mean"] = x.mean(removed.to(loss.dtype))
        return loss, metrics


@surrogates.register("kl_cov")
@dataclasses.dataclass(frozen=True, kw_only=True)
class KLCov(Part):
    r"""KL-Cov: the unclipped IS objective, plus a KL penalty on the highest-covariance tokens.

    .. math::
        \ell_t = -w_t A_t + \mathbb{1}[t \in \text{top-}k(c)]\; \kappa\,|\log w_t|,\qquad
        k = \max(1, \lfloor \text{kl\_cov\_ratio}\cdot N\rfloor)

    with the token covariance ``c`` of :class:`ClipCov` and ``kappa = ppo_kl_coef``.

    Args:
        kl_cov_ratio: in (0, 1], fraction of counted tokens penalised (default 2e-4, verl's default).
        ppo_kl_coef: finite, >= 0, the penalty coefficient kappa (default 1.0).

    Batch-coupled (top-k over the batch). Metrics: ``kl_cov/penalized_mean``, ``ppo_kl_abs``.

    Raises:
        ValueError: naming kl_cov_ratio or ppo_kl_coef when it is outside its range above, NaN, or not a
            number.

    References:
        Cui et al. 2025, arXiv:2505.22617, sec. 4 (KL-Cov). Matches verl ``loss_mode="kl_cov"``.
    """

    registry: ClassVar = surrogates
    batch_coupled: ClassVar[bool] = True
    kl_cov_ratio: float = 2e-4
    ppo_kl_coef: float = 1.0

    def __post_init__(self) -> None:
        check_number("kl_cov", "kl_cov_ratio", self.kl_cov_ratio, low=0.0, low_open=True, high=1.0)
        check_number("kl_cov", "ppo_kl_coef", self.ppo_kl_coef, low=0.0)

    def __call__(self, x: LossInputs) -> PartOutput:
        w, adv, mask = x.weight, x.advantages, x.mask
        lp = x.logprobs.detach()
        cov = (adv - x.mean(adv)) * (lp - x.mean(lp))
        count = torch.floor(self.kl_cov_ratio * mask.sum().to(torch.float64)).clamp(min=1)  # float64: see ClipCov
        chosen = _top_count(cov, mask, count)
        abs_kl = x.log_ratio.abs()
        loss = -adv * w + torch.where(chosen, self.ppo_kl_coef * abs_kl, torch.zeros_like(abs_kl))
        return loss, {"kl_cov/penalized_mean": x.mean(chosen.to(loss.dtype)), "ppo_kl_abs": x.mean(abs_kl.detach())}


@surrogates.register("vespo")
@dataclasses.dataclass(frozen=True, kw_only=True)
class VESPO(Part):
    r"""VESPO: REINFORCE weighted by a detached gamma-shaped function of the sequence IS ratio.

    .. math::
        \ell_t = -\mathrm{sg}[\varphi(W_i)]\,A\,\log\pi_\theta(o_t),\qquad
        \varphi(W) = e^{\lambda} W^{k} e^{-\lambda W},\qquad
        \log W_i = \sum_t \mathrm{clip}(\ell_{i,t}, -20, 20)\ (+\textstyle\sum_t \log \text{is\_weight})

    (a *sum*, not a mean, of token log-ratios; ``log W`` clamped to ``[log 1e-8, 20]``; ``phi(1) = 1``),
    with ``(k, lambda) = (k_pos, lambda_pos)`` for ``A >= 0`` and ``(k_neg, lambda_neg)`` otherwise. It
    reads the token log-ratio itself (the ratio level does not change it) and folds the sampler IS
    weight into ``W`` instead of multiplying by it.

    Args:
        k_pos, lambda_pos: any finite values, shape and rate for ``A >= 0`` (defaults 2.0, 3.0).
        k_neg, lambda_neg: any finite values, for ``A < 0`` (defaults 3.0, 2.0).

    As in TRL, which does not range-check them either: ``k`` sets how strongly ``W < 1`` is down-weighted,
    ``lambda`` how strongly ``W > 1`` is; a lambda below 1e-4 is used as 1e-4 (clamped at call time).

    Only the token IS-correction modes combine with VESPO: :class:`~rlzoo.losses.PolicyLoss` raises a
    ValueError naming is_correction for a sequence mode.

    Metrics: ``vespo/phi_seq_mean``.

    Raises:
        ValueError: naming the option when it is NaN, inf, or not a number.

    References:
        Shen et al. 2026, "VESPO: Variational Sequence-level Soft Policy Optimization for (Stable)
        Off-Policy LLM Training", arXiv:2602.10693, eq. (17), (20). Matches TRL 1.16 ``loss_type="vespo"``
        (``vespo_k_pos``, ``vespo_lambda_pos``, ``vespo_k_neg``, ``vespo_lambda_neg``).
    """

    registry: ClassVar = surrogates
    handles_is_weight: ClassVar[bool] = True
    # W sums the *token* log IS weights; a sequence weight broadcast over n tokens would count n times (TRL
    # also rejects sequence modes for vespo). PolicyLoss checks this.
    is_correction_modes: ClassVar[tuple[str, ...]] = ("token_truncate", "token_mask")
    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0

    def __post_init__(self) -> None:
        for name in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
            check_number("vespo", name, getattr(self, name))

    def __call__(self, x: LossInputs) -> PartOutput:
        lower = math.log(1e-8)
        with torch.no_grad():
            log_w = x.seq_sum(torch.clamp(x.log_ratio, -20.0, 20.0))
            if x.is_weight is not None:
                log_w = log_w + x.seq_sum(torch.clamp(torch.log(x.is_weight), lower, 20.0))
            log_w = torch.clamp(log_w, lower, 20.0).expand_as(x.log_ratio)
            nonneg = x.advantages >= 0
            k = torch.where(nonneg, log_w.new_tensor(self.k_pos), log_w.new_tensor(self.k_neg))
            lam = torch.where(nonneg, log_w.new_tensor(self.lambda_pos), log_w.new_tensor(self.lambda_neg))
            lam = lam.clamp(min=1e-4)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        loss = -phi * x.advantages * x.logprobs
        return loss, {"vespo/phi_seq_mean": _seq_metric(x, x.seq_mean(phi))}


@dataclasses.dataclass(frozen=True, kw_only=True)
class _DPPO(Part):
    """Shared body of the DPPO binary-divergence masks."""

    registry: ClassVar = surrogates
    epsilon_low: float
    epsilon_high: float
    clip_ratio_c: float = 20.0
    _kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_number(self._kind, "epsilon_low", self.epsilon_low, low=0.0)
        check_number(self._kind, "epsilon_high", self.epsilon_high, low=0.0)
        check_number(self._kind, "clip_ratio_c", self.clip_ratio_c, low=0.0, low_open=True, allow_inf=True)

    def _valid(self, p: Tensor, old_p: Tensor, x: LossInputs) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, x: LossInputs) -> PartOutput:
        w = x.weight
        truncated = torch.clamp(w, max=self.clip_ratio_c).detach()
        with torch.no_grad():
            p = torch.exp(x.logprobs.detach())
            old_p = torch.exp(x.old_logprobs)
            valid = self._valid(p, old_p, x)
        dtype = x.logprobs.dtype
        loss = -x.advantages * truncated * x.logprobs * valid.to(dtype)
        metrics = {
            "dppo/masked_mean": x.mean((~valid).to(dtype)),
            "dppo/truncated_mean": x.mean(((w.detach() > self.clip_ratio_c) & valid).to(dtype)),
        }
        return loss, metrics


@surrogates.register("dppo_tv")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DPPOBinaryTV(_DPPO):
    r"""DPPO-Binary-TV: REINFORCE with a truncated detached ratio, masked outside a TV trust region.

    .. math::
        \ell_t = -A\,\mathrm{sg}[\min(w, c)]\,\log\pi_\theta\;\cdot
        \mathbb{1}\big[A > 0:\ p - p_{old} \le \epsilon_{high};\ A \le 0:\ p - p_{old} \ge -\epsilon_{low}\big]

    where ``p = exp(logp)``: the binary total-variation divergence of the sampled token's probability.

    Args:
        epsilon_low, epsilon_high: finite, >= 0, TV thresholds in probability units (default 0.2 / 0.2,
            verl's ``clip_ratio``; the paper and the ``dppo_tv`` preset use 0.15).
        clip_ratio_c: > 0 (inf: no truncation), truncation C of the detached IS ratio (default 20.0, verl's
            fallback; the paper's scaling runs and the preset use 5).

    Metrics: ``dppo/masked_mean`` (tokens outside the region), ``dppo/truncated_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number.

    References:
        Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879,
        eq. (12)-(13), (23). Matches verl ``loss_mode="dppo_tv"``.
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    _kind: ClassVar[str] = "dppo_tv"

    def _valid(self, p: Tensor, old_p: Tensor, x: LossInputs) -> Tensor:
        return torch.where(x.advantages > 0, (p - old_p) <= self.epsilon_high, (p - old_p) >= -self.epsilon_low)


@surrogates.register("dppo_kl")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DPPOBinaryKL(_DPPO):
    r"""DPPO-Binary-KL: as :class:`DPPOBinaryTV` with the binary KL divergence as the trust region.

    .. math::
        D = p_{old}\log\frac{p_{old}}{p} + (1-p_{old})\log\frac{1-p_{old}+10^{-8}}{1-p+10^{-8}}

    kept if ``A > 0`` and (``D <= epsilon_high`` or ``p <= p_old``), or ``A <= 0`` and
    (``D <= epsilon_low`` or ``p >= p_old``).

    Args:
        epsilon_low, epsilon_high: finite, >= 0, KL thresholds in nats (default 0.2 / 0.2 as verl; the
            paper and the ``dppo_kl`` preset use 0.05).
        clip_ratio_c: > 0 (inf: no truncation), truncation C of the detached IS ratio (default 20.0;
            preset 5).

    Metrics: ``dppo/masked_mean`` (tokens outside the region), ``dppo/truncated_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number.

    References:
        Qi et al. 2026, arXiv:2602.04879, eq. (12), (14). Matches verl ``loss_mode="dppo_kl"``.
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    _kind: ClassVar[str] = "dppo_kl"

    def _valid(self, p: Tensor, old_p: Tensor, x: LossInputs) -> Tensor:
        kl = old_p * (x.old_logprobs - x.logprobs.detach()) + (1 - old_p) * torch.log(
            (1.0 - old_p + 1e-8) / (1.0 - p + 1e-8)
        )
        pos = (kl <= self.epsilon_high) | (p <= old_p)
        neg = (kl <= self.epsilon_low) | (p >= old_p)
        return torch.where(x.advantages > 0, pos, neg)


@surrogates.register("dro")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DRO(Part):
    r"""DRO: REINFORCE with a quadratic penalty on the log-ratio to the sampling policy.

    .. math:: \ell_t = -\big(A\,\log\pi_\theta(o_t) - \tfrac{\beta_{dro}}{2}\,\ell_t^2\big),
        \qquad \ell_t = \log\pi_\theta(o_t) - \log\pi_{old}(o_t)

    Args:
        dro_beta: finite, > 0, the penalty coefficient (default 0.05, the verl/Tinker example value; verl
            requires it, no paper value is confirmed).

    Metrics: ``ppo_kl`` (masked mean of ``-log_ratio``).

    Raises:
        ValueError: naming dro_beta when it is <= 0, NaN, inf, or not a number.

    References:
        Kimi Team 2025, "Kimi k1.5", arXiv:2501.12599, sec. 2.3.2 (the log-ratio-squared surrogate);
        Richemond et al. 2024, "Offline Regularised RL for LLM Alignment", arXiv:2405.19107 (the name).
        Matches verl ``loss_mode="dro"`` (``policy_loss.dro_beta``).
    """

    registry: ClassVar = surrogates
    dro_beta: float = 0.05

    def __post_init__(self) -> None:
        check_number("dro", "dro_beta", self.dro_beta, low=0.0, low_open=True)

    def __call__(self, x: LossInputs) -> PartOutput:
        lr = x.log_ratio
        loss = -(x.advantages * x.logprobs - 0.5 * self.dro_beta * lr.square())
        return loss, {"ppo_kl": x.mean(-lr.detach())}
