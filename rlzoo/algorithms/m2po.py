r"""M2PO: a second-moment trust region instead of the clip (Zheng et al. 2025, as AReaL implements it).

Stale data stays informative if only its extreme importance weights are suppressed. M2PO masks the tokens with
the largest squared log-ratio :math:`M_2 = (\log\pi_{prox} - \log\pi_{behav})^2`, the largest first, until the mean
:math:`M_2` of the tokens left is below :math:`\tau_{M_2}` (``m2_threshold``), and does not clip the ratio. Three
tokens agree, one drifted by 1 nat: its :math:`M_2 = 1` alone lifts the mean to 0.25 > 0.04, so it goes:

    >>> import torch, rlzoo
    >>> old = torch.tensor([[-1.0, -0.5, -2.0, -0.2]], dtype=torch.float64)
    >>> behav = old - torch.tensor([[0.0, 0.05, -0.05, 1.0]], dtype=torch.float64)
    >>> mask = torch.ones(1, 4, dtype=torch.bool)
    >>> rlzoo.get_loss("m2po").loss_mask(mask, old_logprobs=old, rollout_logprobs=behav)
    tensor([[ True,  True,  True, False]])
"""

from types import MappingProxyType

import torch

from rlzoo.losses import ISCorrection, LossInputs, PartOutput, PolicyLoss, PPOClip, Rejection, preset
from rlzoo.registry import check_number

__all__ = ["SecondMomentMask", "m2po"]


class SecondMomentMask(Rejection, name="m2po"):
    r"""M2PO's second-moment mask: reject the tokens of largest :math:`M_2` until the rest's mean is below
    :math:`\tau_{M_2}`.

    .. math::
        M_{2,t} = \big(\log\pi_{prox}(o_t) - \log\pi_{behav}(o_t)\big)^2, \qquad
        \text{reject the } k \text{ largest, } k = \min\{k : \mathrm{mean}(M_2 \text{ without the } k \text{ largest}) < \tau_{M_2}\}

    over the counted tokens of the batch the loss is given (batch-coupled); if no such ``k`` leaves a token, all
    but the smallest are rejected. ``pi_prox`` is ``old_logprobs`` (the current policy, detached, in bypass mode)
    and ``pi_behav`` is ``rollout_logprobs``. Ties are broken by position (a stable sort), where AReaL's sort
    order is unspecified. The rejected tokens leave the loss mask and its counts (AReaL divides by the tokens M2PO
    keeps in each micro-batch).

    Args:
        m2_threshold: None (off, default) or the threshold :math:`\tau_{M_2} > 0` (AReaL's ``m2_threshold``; the
            m2po preset and AReaL's example use 0.04).

    Metrics: ``m2po/masked_mean`` (counted tokens rejected), ``m2po/m2_mean`` (the mean :math:`M_2` before
    masking).

    Raises:
        ValueError: naming m2_threshold when it is not a number > 0 (or None).
        BatchError: when called with ``PolicyBatch.rollout_logprobs`` None.

    References:
        Zheng et al. 2025, "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
        LLMs?", arXiv:2510.01161 (M2PO). Matches AReaL ``areal/trainer/ppo/actor.py`` ``_apply_m2po_masking`` /
        ``_get_m2po_loss_mask`` (``actor.m2_threshold``).
    """

    example_options = MappingProxyType({"m2_threshold": 0.04})
    batch_coupled = True
    m2_threshold: float | None = None

    def check(self) -> None:
        check_number("m2po", "m2_threshold", self.m2_threshold, low=0.0, low_open=True, allow_none=True)

    @property
    def active(self) -> bool:
        return self.m2_threshold is not None

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rollout_logprobs"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        assert self.m2_threshold is not None
        m2 = x.sampler_log_ratio("M2PO's second-moment mask (m2_threshold)").square()
        flat_mask = x.mask.flatten()
        values = torch.where(flat_mask, m2.flatten(), torch.full((), -torch.inf, dtype=m2.dtype, device=m2.device))
        order = torch.sort(values, descending=True, stable=True).indices
        ranked = values[order]  # the counted tokens first, largest M2 first
        n = flat_mask.sum()
        position = torch.arange(ranked.numel(), device=m2.device)
        counted = position < n
        suffix_sum = torch.where(counted, ranked, 0.0).flip(0).cumsum(0).flip(0)
        suffix_mean = suffix_sum / (n - position).clamp(min=1).to(m2.dtype)
        below = (suffix_mean < self.m2_threshold) & counted
        first = torch.where(below.any(), below.to(torch.long).argmax(), (n - 1).clamp(min=0))
        keep_ranked = (position >= first) & counted
        keep = torch.zeros_like(flat_mask).scatter(0, order, keep_ranked).view_as(x.mask)
        metrics = {"m2po/masked_mean": x.mean((x.mask & ~keep).to(m2.dtype)), "m2po/m2_mean": x.mean(m2)}
        return PartOutput(keep, metrics)


@preset(
    "m2po",
    title="Second-Moment Trust Policy Optimization (M2PO)",
    paper="Zheng et al. 2025, Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs?",
    arxiv="2510.01161",
    matches="AReaL's M2PO (docs/en/algorithms/m2po.md, examples/math/gsm8k_m2po.yaml): the decoupled loss "
    "(areal/utils/functional/functional.py ppo_actor_loss_fn, use_decoupled_loss=True, rejection_sampling ratio "
    "upper 5 mask) with actor.m2_threshold=0.04 (areal/trainer/ppo/actor.py _apply_m2po_masking), "
    "proximal = old_logprobs, behaviour = rollout_logprobs",
    advantage="grpo",
    notes="No ratio clip (epsilon_low = epsilon_high = inf), as the paper: the M2 mask is the trust region. "
    "AReaL's example sets eps_clip=0.0, which equals no clip at ratio 1 (one update per batch, where its "
    "proximal policy is the trained one) and would stop every later update. AReaL's M2 is between its proximal "
    "and behaviour policies (rlzoo: old_logprobs and rollout_logprobs); the paper writes it between pi_theta "
    "and pi_behav, the same at AReaL's one update per batch. The mask is batch-coupled: AReaL computes it per "
    "micro-batch and divides by the tokens it keeps there; rlzoo counts the kept tokens of the Normalizer "
    "(Normalizer.from_batch(*micro_batches, loss=loss_fn) takes each micro-batch's mask), equal for one "
    "micro-batch. The paper's denominator counts every token (the masked ones too).",
    parts=(SecondMomentMask,),
)
def m2po() -> PolicyLoss:
    r"""loss = -sum_t M_t (pi_prox / pi_behav) (pi_theta / pi_prox) A / N_kept, no clip, token-mean over the tokens
    M_t keeps; M drops the largest (log pi_prox - log pi_behav)^2 until their mean is < tau_M2.

    Defaults: tau_M2 = m2_threshold = 0.04 (AReaL's example), no clip (epsilon_low = epsilon_high = inf), the
    behaviour weight masked above 5 (is_correction = "token_mask", is_max = 5; AReaL's default rejection).
    """
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=float("inf"), epsilon_high=float("inf")),
        is_correction=ISCorrection(is_correction="token_mask", is_min=None, is_max=5.0),
        rejections=(SecondMomentMask(m2_threshold=0.04),),
        aggregation="token-mean",
    )
