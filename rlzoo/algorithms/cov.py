r"""Clip-Cov and KL-Cov: entropy control through the tokens of highest covariance (Cui et al. 2025).

The token covariance ``c_t = (A_t - mean A)(logp_t - mean logp)`` (over the batch's counted tokens) marks
the tokens that drive entropy down. Clip-Cov removes a random few of them from the loss; KL-Cov adds a KL
penalty on the top ones. Both are batch-coupled: the covariance and the choice depend on the whole
(micro-)batch, as in verl.

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-0.1, -3.0, -0.2, -2.5]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([[2.0, -2.0, 1.5, -1.0]], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 4, dtype=torch.bool))
    >>> _ = torch.manual_seed(0)
    >>> rlzoo.get_loss("clip_cov", clip_cov_ratio=0.5)(batch).metrics["clip_cov/removed_mean"].item()  # 2 of 4
    0.5
    >>> rlzoo.get_loss("kl_cov", kl_cov_ratio=0.25)(batch).metrics["kl_cov/penalized_mean"].item()  # top 1 of 4
    0.25
"""

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, Surrogate, clip_metrics, preset
from rlzoo.registry import check_number

__all__ = ["ClipCov", "KLCov", "clip_cov", "kl_cov"]


def _covariance(x: LossInputs) -> Float[Tensor, "B T"]:
    """``(A - mean A)(logp - mean logp)`` per token, means over the batch's counted tokens (logp detached)."""
    adv = x.advantages
    lp = x.logprobs.detach()
    return (adv - x.mean(adv)) * (lp - x.mean(lp))


def _count(ratio: float, mask: Bool[Tensor, "B T"]) -> Float[Tensor, ""]:
    """``max(1, floor(ratio * N))`` in float64, as verl's ``int(ratio * N)`` (a Python float times an int
    tensor would be float32)."""
    return torch.floor(ratio * mask.sum().to(torch.float64)).clamp(min=1)


def _random_subset(candidates: Bool[Tensor, "B T"], count: Float[Tensor, ""]) -> Bool[Tensor, "B T"]:
    """A uniformly random subset of ``min(count, candidates.sum())`` of the True entries (no device sync)."""
    keys = torch.rand(candidates.shape, device=candidates.device)
    keys = torch.where(candidates, keys, torch.full_like(keys, -1.0))
    rank = torch.argsort(torch.argsort(keys.flatten(), descending=True)).view(candidates.shape)
    return candidates & (rank < count)


def _top_count(scores: Float[Tensor, "B T"], valid: Bool[Tensor, "B T"], count: Float[Tensor, ""]) -> Bool[Tensor, "B T"]:
    """The ``count`` valid entries with the largest ``scores`` (ties broken by position; no device sync)."""
    keyed = torch.where(valid, scores, torch.full_like(scores, -math.inf))
    rank = torch.argsort(torch.argsort(keyed.flatten(), descending=True, stable=True), stable=True)
    return valid & (rank.view(scores.shape) < count)


class ClipCov(Surrogate, name="clip_cov"):
    r"""Clip-Cov: PPO clip, plus a random few high-covariance tokens removed from the loss (sec. 4).

    Among tokens not already clipped by PPO with ``clip_cov_lb < c_t < clip_cov_ub``,
    ``max(1, floor(clip_cov_ratio * N))`` are drawn uniformly at random (torch's global RNG) and their loss is
    set to 0 (no gradient).

    Args:
        epsilon_low, epsilon_high: finite, >= 0, the PPO clip range (default 0.2 / 0.2).
        clip_cov_ratio: in (0, 1], fraction of counted tokens to remove (default 2e-4).
        clip_cov_lb, clip_cov_ub: covariance window, any finite values with ``clip_cov_lb < clip_cov_ub``
            (the covariance may be negative; defaults 1.0, 5.0 as verl).

    Metrics: the PPO clip metrics and ``clip_cov/removed_mean``.

    Raises:
        ValueError: naming the option when it is outside its range above, NaN, or not a number, or naming
            clip_cov_ub when ``clip_cov_ub <= clip_cov_lb``.
    """

    batch_coupled = True
    on_policy = OnPolicy.MINUS_ADVANTAGE
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0

    def check(self) -> None:
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
        cov = _covariance(x)
        clipped_by_ppo = (loss2 > loss1).detach()
        candidates = mask & ~clipped_by_ppo & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)
        removed = _random_subset(candidates, _count(self.clip_cov_ratio, mask))
        loss = torch.where(removed, torch.zeros_like(loss1), torch.maximum(loss1, loss2))
        metrics = clip_metrics(x, w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        metrics["clip_cov/removed_mean"] = x.mean(removed.to(loss.dtype))
        return PartOutput(loss, metrics)


class KLCov(Surrogate, name="kl_cov"):
    r"""KL-Cov: the unclipped IS objective, plus a KL penalty on the highest-covariance tokens (sec. 4).

    .. math::
        \ell_t = -w_t A_t + \mathbb{1}[t \in \text{top-}k(c)]\; \kappa\,|\log w_t|,\qquad
        k = \max(1, \lfloor \text{kl\_cov\_ratio}\cdot N\rfloor)

    with the token covariance ``c`` of :class:`ClipCov` and ``kappa = ppo_kl_coef``.

    Args:
        kl_cov_ratio: in (0, 1], fraction of counted tokens penalised (default 2e-4, verl's default).
        ppo_kl_coef: finite, >= 0, the penalty coefficient kappa (default 1.0).

    Metrics: ``kl_cov/penalized_mean``, ``ppo_kl_abs``.

    Raises:
        ValueError: naming kl_cov_ratio or ppo_kl_coef when it is outside its range above, NaN, or not a
            number.
    """

    batch_coupled = True
    on_policy = OnPolicy.MINUS_ADVANTAGE
    kl_cov_ratio: float = 2e-4
    ppo_kl_coef: float = 1.0

    def check(self) -> None:
        check_number("kl_cov", "kl_cov_ratio", self.kl_cov_ratio, low=0.0, low_open=True, high=1.0)
        check_number("kl_cov", "ppo_kl_coef", self.ppo_kl_coef, low=0.0)

    def __call__(self, x: LossInputs) -> PartOutput:
        w, adv = x.weight, x.advantages
        chosen = _top_count(_covariance(x), x.mask, _count(self.kl_cov_ratio, x.mask))
        abs_kl = x.log_ratio.abs()
        loss = -adv * w + torch.where(chosen, self.ppo_kl_coef * abs_kl, torch.zeros_like(abs_kl))
        metrics = {"kl_cov/penalized_mean": x.mean(chosen.to(loss.dtype)), "ppo_kl_abs": x.mean(abs_kl.detach())}
        return PartOutput(loss, metrics)


@preset(
    "clip_cov",
    title="Clip-Cov (entropy control by clipping high-covariance tokens)",
    paper="Cui et al. 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arxiv="2505.22617",
    matches="verl loss_mode='clip_cov' (clip_cov_ratio=2e-4, clip_cov_lb=1, clip_cov_ub=5)",
    advantage="grpo",
    parts=(ClipCov,),
)
def clip_cov() -> PolicyLoss:
    r"""PPO clip loss with the loss of floor(r N) random tokens with lb < cov < ub set to 0; token-mean.

    Defaults: eps_low = eps_high = 0.2, r = clip_cov_ratio = 2e-4, lb = clip_cov_lb = 1, ub = clip_cov_ub = 5.
    """
    return PolicyLoss(surrogate=ClipCov(), aggregation="token-mean")


@preset(
    "kl_cov",
    title="KL-Cov (entropy control by a KL penalty on high-covariance tokens)",
    paper="Cui et al. 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    arxiv="2505.22617",
    matches="verl loss_mode='kl_cov' (kl_cov_ratio=2e-4, ppo_kl_coef=1; verl's yaml ships 0.1)",
    advantage="grpo",
    notes="The paper uses k=2e-3 for Qwen2.5-7B and 2e-4 for 32B, with beta=1 (sec. 4.3).",
    parts=(KLCov,),
)
def kl_cov() -> PolicyLoss:
    r"""loss = -w A + ppo_kl_coef |log w| on the top-k covariance tokens; token-mean.

    Defaults: k = max(1, floor(kl_cov_ratio N)) with kl_cov_ratio = 2e-4, ppo_kl_coef = 1.
    """
    return PolicyLoss(surrogate=KLCov(), aggregation="token-mean")
