r"""GMPO: the geometric mean of the token ratios, each clipped in log space first (Zhao et al. 2025).

The sequence's weight is ``exp(mean_t clipped log-ratio)`` and its loss ``-mean_t(A) w``; a token whose
log-ratio left ``[-0.4, 0.4]`` in the direction of ``A`` stops contributing gradient:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    >>> old = lp - torch.tensor([[0.2, 1.0]], dtype=torch.float64)  # log-ratios 0.2 and 1.0 (clipped to 0.4)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=old, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> out = rlzoo.get_loss("gmpo")(batch)
    >>> round(out.loss.item(), 6), out.metrics["clip_ratio/high_mean"].item()  # -exp((0.2 + 0.4) / 2)
    (-1.349859, 0.5)
"""

import torch

from rlzoo.losses import LossInputs, OnPolicy, PartOutput, PolicyLoss, RatioLevel, Surrogate, preset
from rlzoo.registry import check_number

__all__ = ["GMPO", "GeometricRatio", "gmpo"]


class GeometricRatio(RatioLevel, name="geometric"):
    r"""GMPO's ratio level: the geometric mean of token ratios, each clipped in log space (sign-aware, eq. 5).

    .. math::
        \log w_i = \frac{1}{|o_i|}\sum_t \mathrm{sgn}(A)\,\min\big(\mathrm{sgn}(A)\,\ell_{i,t},\;
        \mathrm{sgn}(A)\,\mathrm{clip}(\ell_{i,t}, -\epsilon_{low}, \epsilon_{high})\big),
        \qquad \ell_{i,t} = \log\frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}

    So for A > 0 a token log-ratio above ``epsilon_high`` stops contributing gradient, for A < 0 one below
    ``-epsilon_low`` does. The paper clips to ``(e^{-0.4}, e^{0.4})``; the sign is taken per token, as verl
    (equal to ``sgn(A_i)`` for sequence advantages).

    Args:
        epsilon_low: finite, >= 0, lower clip of the token *log*-ratio (default 0.4).
        epsilon_high: finite, >= 0, upper clip of the token *log*-ratio (default 0.4).

    Metrics: ``clip_ratio/low_mean`` (A < 0 tokens whose log-ratio lies outside ``[-epsilon_low, epsilon_high]``),
    ``clip_ratio/high_mean`` (A > 0 tokens outside it), ``clip_ratio/region_mean`` (both): verl's ``geo_mean``
    ``pg_clipfrac_lower`` / ``pg_clipfrac``, which count a token outside the band on either side, also where the
    sign-aware clip does not bind (A > 0 below ``-epsilon_low``, A < 0 above ``epsilon_high``: such a token keeps its
    gradient), unlike PPO's clip fractions.

    Raises:
        ValueError: naming epsilon_low or epsilon_high when it is < 0, NaN, inf, or not a number.
    """

    mixes_tokens = True
    per_sequence = True
    epsilon_low: float = 0.4
    epsilon_high: float = 0.4

    def check(self) -> None:
        check_number("geometric ratio", "epsilon_low", self.epsilon_low, low=0.0)
        check_number("geometric ratio", "epsilon_high", self.epsilon_high, low=0.0)

    def __call__(self, x: LossInputs) -> PartOutput:
        sign = torch.sign(x.advantages)  # per token, as verl (equal to sgn(A_i) for sequence advantages)
        clamped = torch.clamp(x.log_ratio, -self.epsilon_low, self.epsilon_high)
        token = sign * torch.minimum(sign * x.log_ratio, sign * clamped)
        log_w = x.seq_mean(token).expand_as(x.log_ratio)
        clipped = (x.log_ratio != clamped).detach()
        low = clipped & (x.advantages < 0)
        high = clipped & (x.advantages > 0)
        metrics = {
            "clip_ratio/low_mean": x.mean(low.to(x.log_ratio.dtype)),
            "clip_ratio/high_mean": x.mean(high.to(x.log_ratio.dtype)),
            "clip_ratio/region_mean": x.mean((low | high).to(x.log_ratio.dtype)),
        }
        return PartOutput(log_w, metrics)


class GMPO(Surrogate, name="gmpo"):
    r"""GMPO's objective: the unclipped importance-weighted advantage of the sequence (eq. 5).

    .. math:: \ell_i = -\bar A_i\, w_i,\qquad \bar A_i = \text{masked mean of } A_{i,t}

    Paired with the ``geometric`` ratio level, which clips each token log-ratio before the geometric
    mean, this is GMPO. With a sampler/trainer IS weight, the sequence is weighted by the geometric
    mean of its token IS weights (as verl). No options.
    """

    folds_is_weight = True
    mixes_tokens = True
    on_policy = OnPolicy.MINUS_ADVANTAGE

    def __call__(self, x: LossInputs) -> PartOutput:
        loss = -x.seq_mean(x.advantages) * x.weight
        if x.is_weight is not None:
            loss = loss * torch.exp(x.seq_mean(torch.log(x.is_weight + 1e-10)))
        return PartOutput(loss, {})


@preset(
    "gmpo",
    title="Geometric-Mean Policy Optimization",
    paper="Zhao et al. 2025, Geometric-Mean Policy Optimization",
    arxiv="2507.20673",
    matches="verl loss_mode='geo_mean' with clip_ratio_low=clip_ratio_high=0.4 (verl's default 0.2 is not the paper's)",
    advantage="grpo",
    notes="verl averages over the micro-batch's sequences, ignoring loss_agg_mode; here the aggregation is "
    "seq-mean-token-mean with a Normalizer, so micro-batch splits do not change the result.",
    parts=(GeometricRatio, GMPO),
)
def gmpo() -> PolicyLoss:
    r"""loss = (1/S) sum_i -A_i exp(mean_t sgn(A) min(sgn(A) l_it, sgn(A) clip(l_it, -0.4, 0.4))), l = log w."""
    return PolicyLoss(
        surrogate=GMPO(),
        ratio=GeometricRatio(epsilon_low=0.4, epsilon_high=0.4),
        aggregation="seq-mean-token-mean",
    )
