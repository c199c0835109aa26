r"""Penalties: per-token terms added to the policy loss before aggregation (KL to the reference, entropy).

KL estimators follow Schulman's note "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html),
with :math:`\delta = \log\pi_\theta - \log\pi_{ref}` per token:

* ``k1``  = :math:`\delta`                       (unbiased, high variance; can be negative)
* ``k2``  = :math:`\tfrac12\delta^2`             (biased value; its gradient is the KL's gradient)
* ``k3``  = :math:`e^{-\delta} + \delta - 1`     (unbiased, low variance, >= 0; GRPO's choice)
* ``abs`` = :math:`|\delta|`
* ``k1+`` / ``k3+``: straight-through, the *value* of k1 / k3 with the *gradient* of k2.
* ``low_var_kl`` / ``low_var_kl+``: verl 0.9.1's k3 (and its straight-through), clamped: the log-ratio
  :math:`-\delta` to [-20, 20] before the exponential, the estimate to [-10, 10]. verl's ``kl_loss_type`` "k3"
  and "low_var_kl" are this one estimator (``verl.trainer.ppo.core_algos.kl_penalty_forward``); rlzoo's "k3"
  is TRL's, unclamped (TRL 1.16 ``GRPOTrainer._compute_loss``). The two agree while the estimate stays
  below 10 and ``|delta| <= 20``.
"""

import abc
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.losses.base import LossInputs, Part, PartOutput
from rlzoo.losses.functional import require
from rlzoo.registry import Registry, check_number, choice

__all__ = ["EntropyBonus", "KLPenalty", "Penalty", "kl_estimate", "kl_estimators", "penalties"]

penalties: Registry[type["Penalty"]] = Registry("penalty")
kl_estimators: Registry[Any] = Registry("KL estimator (kl_estimator)")


class Penalty(Part, abc.ABC):
    """Slot 5: a per-token term added to the policy loss after the token weights (so they do not mask it).

    ``aggregated``: True (default) when the term is aggregated like the policy term (the loss's aggregation);
    False when the term is already normalised by counts of its own (read from ``x.normalizer``) and the
    pipeline adds its sum over counted tokens (VAPO's NLL term, a mean over positive tokens).
    """

    registry: ClassVar[Registry[type["Penalty"]]] = penalties
    aggregated: ClassVar[bool] = True

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Term ``Float[B, T]`` and metrics."""

KLFn = Callable[[Tensor, Tensor], Tensor]


def _k1(logp: Tensor, ref: Tensor) -> Tensor:
    return logp - ref


def _k2(logp: Tensor, ref: Tensor) -> Tensor:
    return 0.5 * (logp - ref).square()


def _k3(logp: Tensor, ref: Tensor) -> Tensor:
    d = ref - logp
    # expm1(d) - d, not exp(d) - d - 1: no cancellation for small d, and >= 0 exactly (expm1(d) >= d after rounding)
    return torch.expm1(d) - d


def _abs(logp: Tensor, ref: Tensor) -> Tensor:
    return (logp - ref).abs()


def _low_var_kl(logp: Tensor, ref: Tensor) -> Tensor:
    """verl's clamped k3: ``clamp(e^d - d - 1, -10, 10)`` with ``d = clamp(ref - logp, -20, 20)``."""
    d = torch.clamp(ref - logp, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


def _straight_through(value_fn: KLFn) -> KLFn:
    def estimator(logp: Tensor, ref: Tensor) -> Tensor:
        grad_term = _k2(logp, ref)
        return grad_term - grad_term.detach() + value_fn(logp, ref).detach()

    return estimator


for _name, _fn in (("k1", _k1), ("k2", _k2), ("k3", _k3), ("abs", _abs),
                   ("k1+", _straight_through(_k1)), ("k3+", _straight_through(_k3)),
                   ("low_var_kl", _low_var_kl), ("low_var_kl+", _straight_through(_low_var_kl))):
    kl_estimators.register(_name)(_fn)


def kl_estimate(
    logprobs: Float[Tensor, "B T"], ref_logprobs: Float[Tensor, "B T"], kl_estimator: str = "k3"
) -> Float[Tensor, "B T"]:
    """Per-token estimate of KL(pi_theta || pi_ref) from log-probs of the sampled tokens.

    Args:
        logprobs: ``Float[B, T]`` current policy log-probs (nats), may carry a gradient.
        ref_logprobs: ``Float[B, T]`` reference log-probs (nats).
        kl_estimator: one of ``rlzoo.losses.kl_estimators.names()``: "k1", "k2", "k3", "abs", "k1+", "k3+",
            "low_var_kl", "low_var_kl+".

    Returns:
        ``Float[B, T]`` in nats. "k3" is not clamped (TRL); "low_var_kl" is verl's k3, clamped to [-10, 10]
        (verl's "k3" and "low_var_kl" are both that one; see the module docstring).

    Raises:
        UnknownNameError: for an unknown estimator name, listing the valid ones.
    """
    return kl_estimators.get(kl_estimator)(logprobs, ref_logprobs)


class KLPenalty(Penalty, name="kl"):
    r"""KL-to-reference penalty :math:`\beta\,\hat{D}_{KL}` added per token (GRPO's in-loss KL).

    With ``use_bias_correction_kl`` the estimate is multiplied by the importance weight
    :math:`w = \pi_\theta/\pi_{old}` (with its gradient), which makes k3 an unbiased estimate of the KL
    under off-policy data (DeepSeek-V3.2).

    Args:
        beta: finite, >= 0, the coefficient (default 0.0: disables the penalty and the need for
            ``ref_logprobs``).
        kl_estimator: "k1", "k2", "k3" (default; TRL's, unclamped), "abs", "k1+", "k3+", "low_var_kl",
            "low_var_kl+" (verl's clamped k3, which verl calls "k3" too).
        use_bias_correction_kl: a bool: multiply the estimate by ``w`` (default False).

    Metrics: ``kl`` (masked mean of the per-token estimate, after the bias correction).

    Raises:
        ValueError: on construction, naming the option: beta < 0, NaN, inf or not a number; an unknown
            kl_estimator (the message lists the estimators); a non-bool use_bias_correction_kl.
        BatchError: when called with ``PolicyBatch.ref_logprobs`` None while ``beta != 0``.

    References:
        Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. (3)-(4) (k3 in the loss);
        DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv:2512.02556, sec. 3.1 (bias correction).
        Matches TRL 1.16 ``beta`` / ``use_bias_correction_kl`` (TRL always uses the unclamped k3; its
        ``use_bias_correction_kl`` defaults to True, this part's to False) and verl ``use_kl_loss``,
        ``kl_loss_coef``, ``kl_loss_type`` (verl's "k3" / "low_var_kl" is ``kl_estimator="low_var_kl"``).
    """

    example_options = MappingProxyType({"beta": 0.04})
    beta: float = 0.0
    kl_estimator: str = choice("k3", kl_estimators)
    use_bias_correction_kl: bool = False

    def check(self) -> None:
        check_number("kl penalty", "beta", self.beta, low=0.0)
        if not isinstance(self.use_bias_correction_kl, bool):
            raise ValueError(f"kl penalty: use_bias_correction_kl must be a bool, got {self.use_bias_correction_kl!r}")

    @property
    def active(self) -> bool:
        return self.beta != 0.0

    def required_fields(self) -> frozenset[str]:
        return frozenset({"ref_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        ref = require(x.ref_logprobs, "ref_logprobs", f"the KL penalty (beta={self.beta})")
        kl = kl_estimate(x.logprobs, ref, self.kl_estimator)
        if self.use_bias_correction_kl:
            kl = kl * x.weight
        return PartOutput(self.beta * kl, {"kl": x.mean(kl.detach())})


class EntropyBonus(Penalty, name="entropy"):
    r"""Entropy bonus :math:`-c\,H_t` added per token (maximises entropy for ``c > 0``).

    Needs ``PolicyBatch.entropies`` that carry a gradient (rlzoo's kernels return one).
    Aggregated like the policy term (verl's ``entropy_coeff``). TRL instead takes a token mean of it over the
    tokens its entropy mask keeps (:class:`rlzoo.compat.trl.TRLGRPOLoss` reproduces that); the two coincide under
    "token-mean" without ``top_entropy_quantile``.

    Args:
        entropy_coef: the coefficient c, any finite value (default 0.0: disabled; negative values penalise
            entropy).

    Raises:
        ValueError: naming entropy_coef when it is NaN, inf, or not a number.
        BatchError: when called with ``PolicyBatch.entropies`` None while ``entropy_coef != 0``.

    References: Williams & Peng 1991; verl ``actor.entropy_coeff``; TRL 1.16 ``entropy_coef``.
    """

    example_options = MappingProxyType({"entropy_coef": 0.01})
    entropy_coef: float = 0.0

    def check(self) -> None:
        check_number("entropy bonus", "entropy_coef", self.entropy_coef)

    @property
    def active(self) -> bool:
        return self.entropy_coef != 0.0

    def required_fields(self) -> frozenset[str]:
        return frozenset({"entropies"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        entropies = require(x.entropies, "entropies", f"the entropy bonus (entropy_coef={self.entropy_coef})")
        return PartOutput(-self.entropy_coef * entropies, {})
