r"""VAPO: value-based PPO for long chain-of-thought, its loss side (Yue et al. 2025): clip-higher, a token-level
loss, and a negative log-likelihood term on the correct answers.

The NLL term is a mean over the tokens of the positive examples (reward > 0), whatever the policy term's
aggregation: with one correct completion of 2 tokens and one wrong one, at ratio 1 (``-A`` per token), the loss
is the token mean of ``-A`` plus ``mu`` times the correct answer's mean NLL:

    >>> import torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -3.0], [-0.5, -0.5]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(2, 2, dtype=torch.bool),
    ...                           rewards=torch.tensor([1.0, 0.0], dtype=torch.float64))
    >>> rlzoo.get_loss("vapo")(batch).loss.item()  # (-1 - 1 + 1 + 1) / 4 + 0.1 * (1 + 3) / 2
    0.2
"""

from types import MappingProxyType

import torch

from rlzoo.losses import LossInputs, PartOutput, Penalty, PolicyLoss, PPOClip, preset
from rlzoo.losses.functional import require
from rlzoo.registry import check_number

__all__ = ["PositiveNLL", "vapo"]


class PositiveNLL(Penalty, name="positive_nll"):
    r"""VAPO's positive-example LM loss: the NLL of the correct answers, averaged over their tokens.

    .. math::
        \mathcal{L}_{NLL} = -\frac{1}{\sum_{o_i \in \mathcal{T}} |o_i|}\sum_{o_i \in \mathcal{T}}\sum_t
        \log\pi_\theta(o_{i,t}), \qquad \mathcal{L} = \mathcal{L}_{PPO} + \mu\,\mathcal{L}_{NLL}

    with :math:`\mathcal{T}` the sequences whose reward (``PolicyBatch.rewards``) is > 0 (VAPO's correct answers
    under a verifier's 0/1 or -1/1 reward; give partial credit as 0 to exclude it). The denominator is the
    positive tokens of the whole optimizer-step batch (``Normalizer.num_positive_tokens``), so the term is exact
    under micro-batching, and does not follow the loss's aggregation (``aggregated`` False: the pipeline adds
    the term's sum). A batch without a positive token adds 0.

    Args:
        positive_nll_coef: :math:`\mu`, finite, >= 0 (default 0.0: off; VAPO's 0.1).

    Metrics: ``positive_nll`` (the mean NLL of the batch's positive tokens), ``positive_nll/fraction`` (the
    fraction of counted tokens that are positive).

    Raises:
        ValueError: naming positive_nll_coef when it is negative, NaN, inf or not a number; when called with a
            Normalizer that has no num_positive_tokens (build it with ``Normalizer.from_batch`` or
            ``Normalizer.from_masks(..., rewards=[...])``).
        BatchError: when called with ``PolicyBatch.rewards`` None while positive_nll_coef > 0.

    References:
        Yue et al. 2025, "VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks",
        arXiv:2504.05118, the positive-example LM loss (mu = 0.1). No reference implementation is public; the
        term is checked against its definition (tests/losses/test_frontier_presets.py).
    """

    example_options = MappingProxyType({"positive_nll_coef": 0.1})
    aggregated = False
    positive_nll_coef: float = 0.0

    def check(self) -> None:
        check_number("positive nll", "positive_nll_coef", self.positive_nll_coef, low=0.0)

    @property
    def active(self) -> bool:
        return self.positive_nll_coef != 0.0

    def required_fields(self) -> frozenset[str]:
        return frozenset({"rewards"}) if self.active else frozenset()

    def __call__(self, x: LossInputs) -> PartOutput:
        rewards = require(x.rewards, "rewards", f"the positive-example NLL term (positive_nll_coef={self.positive_nll_coef})")
        count = None if x.normalizer is None else x.normalizer.num_positive_tokens
        if count is None:
            raise ValueError(
                "positive_nll needs Normalizer.num_positive_tokens: build the normalizer with "
                "Normalizer.from_batch(...) or Normalizer.from_masks(..., rewards=[...])"
            )
        positive = (rewards > 0).unsqueeze(-1) & x.mask
        nll = torch.where(positive, -x.logprobs, torch.zeros((), dtype=x.logprobs.dtype, device=x.logprobs.device))
        denominator = count.clamp(min=1) if isinstance(count, torch.Tensor) else max(float(count), 1.0)
        term = self.positive_nll_coef * nll / denominator
        with torch.no_grad():
            metrics = {
                "positive_nll": nll.sum() / positive.sum().clamp(min=1),
                "positive_nll/fraction": x.mean(positive.to(nll.dtype)),
            }
        return PartOutput(term, metrics)


@preset(
    "vapo",
    title="Value-model-based Augmented PPO (loss side: clip-higher, token-level loss, positive-example NLL)",
    paper="Yue et al. 2025, VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks",
    arxiv="2504.05118",
    matches="no public reference implementation: PPO clip as verl loss_mode='vanilla' with clip_ratio_low=0.2, "
    "clip_ratio_high=0.28, loss_agg_mode='token-mean', plus the NLL term checked against the paper's definition",
    advantage="grpo",
    notes="The paper's advantages are GAE from a pretrained value model with decoupled lambdas (critic 1.0, policy "
    "length-adaptive 1 - 1/(alpha l), alpha = 0.05) and group sampling; those are advantage-side settings "
    "(rlzoo.get_advantage('gae', lam_critic=1.0, length_adaptive_alpha=0.05) and rlzoo.advantages.value_loss with a "
    "critic). rlzoo's trainer has no critic, so "
    "it uses group-normalised advantages. Needs PolicyBatch.rewards (reward > 0 = a correct answer).",
    parts=(PositiveNLL,),
)
def vapo() -> PolicyLoss:
    r"""loss = sum_it -min(w A, clip(w, 1-eps_low, 1+eps_high) A) / N_tokens
               + mu * sum_{i: R_i > 0} sum_t -logp / N_positive_tokens.

    Defaults: eps_low = 0.2, eps_high = 0.28 (clip-higher), token-mean, mu = positive_nll_coef = 0.1.
    """
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.28),
        penalties=(PositiveNLL(positive_nll_coef=0.1),),
        aggregation="token-mean",
    )
