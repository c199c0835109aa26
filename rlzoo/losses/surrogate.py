r"""The policy term's two slots and their shared members: the ratio level (:class:`RatioLevel`: how the log
importance weight ``log w`` is formed from the token log-ratios) and the surrogate (:class:`Surrogate`: the
per-token objective from ``w`` and the advantage), PPO's clipped objective with TRL's clip metrics.

``log_ratio[b, t] = logprobs[b, t] - old_logprobs[b, t]``. A ratio level maps it to ``log_weight`` of shape
``[B, T]`` (sequence-level weights are broadcast over the sequence's tokens); it is selected by the loss option
``importance_sampling_level`` (GMPO's ``geometric`` level lives with GMPO, :mod:`rlzoo.algorithms.gmpo`).

A surrogate maps :class:`~rlzoo.losses.LossInputs` (with ``log_weight`` set by the ratio level) to a per-token
loss ``Float[B, T]`` and a dict of metrics. ``w = exp(log_weight)`` is the importance weight, ``A`` the
advantage. Unless a surrogate folds it in (``folds_is_weight``), the sampler/trainer IS-correction weight
multiplies its per-token loss afterwards, as in verl's ``rollout_is_weights`` and TRL's
``importance_sampling_ratio``.

:class:`PPOClip` is used by ppo, grpo, bnpo, dr_grpo, dapo, gspo, gspo_token, luspo and two_sided; the
surrogates that only one algorithm uses live in that algorithm's file under :mod:`rlzoo.algorithms`.
"""

import abc
import enum
import math
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.losses.base import LossInputs, Metrics, Part, PartOutput
from rlzoo.losses.functional import masked_max, masked_min
from rlzoo.registry import Registry, check_number, warn_caller

__all__ = [
    "OnPolicy",
    "PPOClip",
    "RatioLevel",
    "SequenceRatio",
    "SequenceTokenRatio",
    "Surrogate",
    "TokenRatio",
    "clip_metrics",
    "ratio_levels",
    "surrogates",
]

ratio_levels: Registry[type["RatioLevel"]] = Registry("ratio level (importance_sampling_level)")
surrogates: Registry[type["Surrogate"]] = Registry("surrogate")


# ------------------------------------------------------------------------------------ ratio levels (slot 1)
class RatioLevel(Part, abc.ABC):
    """Slot 1: how the log importance weight ``log w`` is formed from the token log-ratios.

    ``mixes_tokens``: True when ``log w`` at one token depends on the other tokens of its sequence
    (sequence-level ratios), so a per-token advantage does not act on its own token only.
    ``per_sequence``: True when ``log w`` is one value per sequence (broadcast over its tokens), so clip
    decisions with per-sequence advantages are counted once per sequence (:meth:`LossInputs.fraction`).
    """

    registry: ClassVar[Registry[type["RatioLevel"]]] = ratio_levels
    mixes_tokens: ClassVar[bool] = False
    per_sequence: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """``log_weight`` ``Float[B, T]`` (sequence-level weights broadcast over the tokens) and metrics."""


class TokenRatio(RatioLevel, name="token"):
    r"""Token-level ratio (PPO / GRPO): :math:`w_{i,t} = \pi_\theta(o_{i,t}) / \pi_{old}(o_{i,t})`.

    Returns ``log_ratio`` unchanged. References: Schulman et al. 2017, arXiv:1707.06347, eq. (6);
    matches TRL 1.16 ``importance_sampling_level="token"``.
    """

    def __call__(self, x: LossInputs) -> PartOutput:
        return PartOutput(x.log_ratio, {})


class SequenceRatio(RatioLevel, name="sequence"):
    r"""Sequence-level ratio (GSPO): the length-normalised sequence likelihood ratio.

    .. math:: s_i = \exp\Big(\frac{1}{|o_i|}\sum_t \log\frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}\Big)

    one value per sequence, broadcast over its tokens; the gradient flows to every token of the sequence
    through the mean. Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. (7);
    matches TRL 1.16 ``importance_sampling_level="sequence"`` (mean over ``mask.sum().clamp(min=1)``).
    """

    mixes_tokens = True
    per_sequence = True

    def __call__(self, x: LossInputs) -> PartOutput:
        return PartOutput(x.seq_mean(x.log_ratio).expand_as(x.log_ratio), {})


class SequenceTokenRatio(RatioLevel, name="sequence_token"):
    r"""GSPO-token: the value of the sequence ratio with a per-token gradient.

    .. math:: \log s_{i,t} = \log\pi_\theta(o_{i,t}) - \mathrm{sg}[\log\pi_\theta(o_{i,t})] + \mathrm{sg}[\log s_i]

    Equal in value to :class:`SequenceRatio`; its gradient at token t is that of ``logprobs[t]`` only,
    scaled by ``s_i`` (lets per-token advantages act per token). Zheng et al. 2025, arXiv:2507.18071,
    eq. (13).

    Args:
        max_log_ratio: None (off, default: the paper's ratio) or a real number: ``log s_{i,t}`` is clamped above
            at it (``torch.clamp(..., max=max_log_ratio)``; no gradient where clamped). verl 0.9.1's ``gspo``
            clamps at 10 for numerical stability: with ``max_log_ratio=10.0`` this matches verl
            ``policy_loss.loss_mode="gspo"`` at any drift (without it, where a sequence's mean log-ratio exceeds 10).

    Raises:
        ValueError: ``max_log_ratio`` NaN, infinite or not a number.
    """

    per_sequence = True
    max_log_ratio: float | None = None

    def check(self) -> None:
        check_number("sequence_token", "max_log_ratio", self.max_log_ratio, allow_none=True)

    def __call__(self, x: LossInputs) -> PartOutput:
        seq = x.seq_mean(x.log_ratio).detach()
        log_weight = x.logprobs - x.logprobs.detach() + seq
        if self.max_log_ratio is not None:
            log_weight = torch.clamp(log_weight, max=self.max_log_ratio)
        return PartOutput(log_weight, {})


# -------------------------------------------------------------------------------------- surrogates (slot 3)
class OnPolicy(enum.Enum):
    """What a surrogate promises at ratio 1 (first iteration, ``old_logprobs`` None), per token.

    The zoo-wide conformance suite checks the promise for every registered surrogate.
    """

    UNDECLARED = "undeclared"
    """Nothing is promised (the default for user surrogates)."""
    REINFORCE_GRADIENT = "grad = -A"
    """The gradient w.r.t. logp is REINFORCE's ``-A``; the value is the part's own (SAPO: ``-2A / tau``)."""
    MINUS_ADVANTAGE = "-A"
    """Value ``-A`` and gradient ``-A``: a ratio times the advantage (PPO clip family)."""
    MINUS_ADVANTAGE_LOGP = "-A logp"
    """Value ``-A logp`` and gradient ``-A``: a detached weight (1 at ratio 1) times REINFORCE (CISPO)."""


class Surrogate(Part, abc.ABC):
    """Slot 3: the per-token policy objective, as a loss to minimise, from ``x.weight`` and ``x.advantages``.

    Capabilities:

    * ``folds_is_weight`` - True when it consumes ``x.is_weight`` itself instead of having its per-token loss
      multiplied by it (VESPO, GMPO).
    * ``sequence_is_weight`` - False when it cannot take a sequence-level IS weight (VESPO sums token
      log-weights): the pipeline then rejects sequence-level corrections.
    * ``mixes_tokens`` - True when its value at a token reads other tokens of the sequence (GMPO's
      sequence-mean advantage).
    * ``uses_ratio`` - False when it ignores the importance weight ``x.weight`` (REINFORCE): in bypass mode
      the ratio of any other surrogate already is ``pi_theta / pi_sampler``, so the rollout IS weight is not
      applied to it (reported only), as verl's ``bypass_mode`` with ``loss_type="ppo_clip"``; a surrogate that
      ignores the ratio gets it, as verl's ``loss_type="reinforce"``.
    * ``reads_ratio_level`` - False when it never reads the ratio level's weight (REINFORCE; VESPO and DRO read the
      token log-ratio themselves): a loss then warns at any level but ``token``, which changes nothing but the
      ``ratio/*`` metrics (TRL 1.16 warns so for ``loss_type="vespo"``), unless a KL penalty with
      ``use_bias_correction_kl`` reads it.
    * ``on_policy`` - what it promises at ratio 1 (:class:`OnPolicy`).
    """

    registry: ClassVar[Registry[type["Surrogate"]]] = surrogates
    folds_is_weight: ClassVar[bool] = False
    sequence_is_weight: ClassVar[bool] = True
    mixes_tokens: ClassVar[bool] = False
    uses_ratio: ClassVar[bool] = True
    reads_ratio_level: ClassVar[bool] = True
    on_policy: ClassVar[OnPolicy] = OnPolicy.UNDECLARED

    @abc.abstractmethod
    def __call__(self, x: LossInputs) -> PartOutput:
        """Per-token loss ``Float[B, T]`` (values at masked positions are ignored) and metrics."""


def clip_metrics(x: LossInputs, w: Float[Tensor, "B T"], low: float, high: float) -> Metrics:
    """TRL's clip metrics: the fractions (:meth:`LossInputs.fraction`: per sequence for a sequence-level ratio
    with per-sequence advantages, as TRL, else per counted token) of ``clip_ratio/low_mean`` =
    ``(w < low) & (A < 0)``, ``clip_ratio/high_mean`` = ``(w > high) & (A > 0)``, ``clip_ratio/region_mean`` =
    either; and ``clip_ratio/low_min`` / ``clip_ratio/high_max``, the least / greatest per-sequence fraction of
    low- / high-clipped tokens over the sequences with a counted token (0 when there is none), all in [0, 1].
    Matches TRL 1.16 ``GRPOTrainer._compute_loss``'s logged metrics (one process, no fully masked row; over
    processes TRL takes the min / max of every process's sequences, as a min / max merge of these does)."""
    w = w.detach()
    is_low = (w < low) & (x.advantages < 0)
    is_high = (w > high) & (x.advantages > 0)
    rows = (x.lengths > 0).unsqueeze(-1)
    return {
        "clip_ratio/low_mean": x.fraction(is_low),
        "clip_ratio/high_mean": x.fraction(is_high),
        "clip_ratio/region_mean": x.fraction(is_low | is_high),
        "clip_ratio/low_min": masked_min(x.seq_mean(is_low.to(w.dtype)), rows),
        "clip_ratio/high_max": masked_max(x.seq_mean(is_high.to(w.dtype)), rows),
    }


def _warn_low_delta(delta: float | None, epsilon_high: float) -> None:
    """Warn when ``delta`` (two-sided clipping) is at most ``1 + epsilon_high`` (finite) or at most 1: the capped
    ratio then bounds A > 0 tokens below the upper clip, with no gradient above ``delta`` (none at all at ``delta <
    1``, even on-policy). TRL 1.16 takes such values and recommends ``delta > 1 + epsilon``; the loss is unchanged."""
    if delta is not None and (delta <= 1 or delta <= 1 + epsilon_high < math.inf):
        warn_caller(f"ppo_clip: delta={delta} <= 1 + epsilon_high = {1.0 + epsilon_high:g} caps the ratio of A > 0 "
                    "tokens below the upper clip (no gradient above delta; at delta < 1 none even on-policy): "
                    "delta is meant to be > 1 + epsilon_high")


class PPOClip(Surrogate, name="ppo_clip"):
    r"""PPO's clipped surrogate with asymmetric range, optional dual clip and INTELLECT-2 delta cap.

    .. math::
        \ell = -\min\big(\tilde w\,A,\; \mathrm{clip}(w, 1-\epsilon_{low}, 1+\epsilon_{high})\,A\big),
        \qquad \tilde w = \min(w, \delta)\ \text{(when delta is set)}

    and, with ``dual_clip = c``, for ``A < 0``: :math:`\ell \leftarrow \min(\ell, -c\,A)`.

    Without ``delta`` or ``dual_clip``, a token with ``A < 0`` and ``w > 1 + epsilon_high`` is *not*
    clipped: its loss and gradient grow with ``w``.

    Args:
        epsilon_low: >= 0, lower clip ``1 - epsilon_low`` (default 0.2; inf: no lower clip).
        epsilon_high: >= 0, upper clip ``1 + epsilon_high`` (default 0.2; DAPO's clip-higher uses 0.28; inf: no
            upper clip, so ``epsilon_low = epsilon_high = inf`` is the unclipped ``-w A``, M2PO's).
        dual_clip: None (off, default) or a finite ``c > 1``: bounds the loss of ``A < 0`` tokens at
            ``c * |A|``.
        delta: None (off, default) or ``> 0`` (inf is the same as off): caps the unclipped ratio before the
            min (two-sided clipping); meant to be ``> 1 + epsilon_high`` (TRL's advice), a warning below that.

    Metrics: ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean`` (TRL's
    definitions, on the ratio before ``delta``: counted once per sequence for a sequence-level ratio with
    per-sequence advantages, else per token; :func:`clip_metrics`), and ``clip_ratio/dual_mean`` when
    ``dual_clip`` is set (counted the same way); ``ratio/high_neg_adv_mean``: the fraction, counted the same
    way, of ``(w > 1 + epsilon_high) & (A < 0)``, the side the clip leaves open (loss and gradient grow with
    ``w`` unless ``dual_clip`` or ``delta`` bound them).

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

    on_policy = OnPolicy.MINUS_ADVANTAGE
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = None
    delta: float | None = None

    def check(self) -> None:
        check_number("ppo_clip", "epsilon_low", self.epsilon_low, low=0.0, allow_inf=True)
        check_number("ppo_clip", "epsilon_high", self.epsilon_high, low=0.0, allow_inf=True)
        check_number("ppo_clip", "dual_clip", self.dual_clip, low=1.0, low_open=True, allow_none=True)
        check_number("ppo_clip", "delta", self.delta, low=0.0, low_open=True, allow_none=True, allow_inf=True)
        _warn_low_delta(self.delta, self.epsilon_high)

    def __call__(self, x: LossInputs) -> PartOutput:
        w, adv = x.weight, x.advantages
        clipped = torch.clamp(w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        unclipped = w if self.delta is None else torch.clamp(w, max=self.delta)
        loss = -torch.minimum(unclipped * adv, clipped * adv)
        metrics = clip_metrics(x, w, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        metrics["ratio/high_neg_adv_mean"] = x.fraction((w.detach() > 1.0 + self.epsilon_high) & (adv < 0))
        if self.dual_clip is not None:
            bound = -self.dual_clip * adv
            dual = (adv < 0) & (loss > bound)
            loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
            metrics["clip_ratio/dual_mean"] = x.fraction(dual.detach())
        return PartOutput(loss, metrics)
