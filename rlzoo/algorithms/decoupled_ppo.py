r"""Decoupled PPO (AReaL): PPO's trust region around a proximal policy, the off-policy correction a separate
behaviour importance weight (Fu et al. 2025).

Three policies: the behaviour policy that generated the tokens, possibly many updates ago
(``rollout_logprobs``: :math:`\pi_{behav}`), the proximal policy, one update behind the trained one
(``old_logprobs``: :math:`\pi_{prox}`, recomputed by the trainer), and :math:`\pi_\theta`. The clip acts on
:math:`\pi_\theta/\pi_{prox}`; the weight :math:`\pi_{prox}/\pi_{behav}` corrects the staleness and is masked
above 5. A token whose weight is 10 drops out of the loss but still counts in the token mean:

    >>> import math, torch, rlzoo
    >>> lp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    >>> behav = lp - torch.tensor([[math.log(2.0), math.log(10.0)]], dtype=torch.float64)
    >>> batch = rlzoo.PolicyBatch(logprobs=lp, old_logprobs=lp, rollout_logprobs=behav,
    ...                           advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 2, dtype=torch.bool))
    >>> rlzoo.get_loss("decoupled_ppo")(batch).loss.item()  # (-2 A + 0) / 2
    -1.0

Without recomputing the proximal policy (``prox_logp_method="loglinear"``, A-3PO), it is interpolated from the
versions: a token generated at version 3, trained at version 5, gets ``alpha = (4 - 3) / (5 - 3) = 0.5``, so
:math:`\log\pi_{prox} = \log\pi_{behav} + 0.5\,(\log\pi_\theta - \log\pi_{behav})`:

    >>> stale = rlzoo.PolicyBatch(logprobs=lp[:, :1], rollout_logprobs=lp[:, :1] - 1.0, versions=torch.tensor([3]),
    ...                           current_version=5, advantages=torch.tensor([1.0], dtype=torch.float64),
    ...                           completion_mask=torch.ones(1, 1, dtype=torch.bool))
    >>> out = rlzoo.get_loss("decoupled_ppo", prox_logp_method="loglinear")(stale)
    >>> round(out.loss.item(), 6) == round(-1.2 * math.exp(0.5), 6)  # -clip(e^0.5, 0.8, 1.2) A * e^0.5
    True
"""

from rlzoo.losses import ISCorrection, PolicyLoss, PPOClip, preset

__all__ = ["decoupled_ppo"]


@preset(
    "decoupled_ppo",
    title="Decoupled PPO: trust region at a proximal policy, behaviour importance weight (AReaL)",
    paper="Fu et al. 2025, AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning",
    arxiv="2505.24298",
    matches="AReaL areal/utils/functional/functional.py ppo_actor_loss_fn with use_decoupled_loss=True, "
    "eps_clip=0.2, c_clip=None and its default rejection_sampling (level='token', action='mask', metric='ratio', "
    "upper=5.0): proximal_logprobs = old_logprobs, old_logprobs (behaviour) = rollout_logprobs; "
    "prox_logp_method='loglinear' is areal/trainer/ppo/actor.py compute_prox_logp_approximations (A-3PO, "
    "arXiv:2512.06547)",
    advantage="grpo",
    notes="Inputs: old_logprobs are the proximal policy (AReaL's recompute_logprob / prox_logp, scored with the "
    "trainer's weights before its update; rlzoo train scores them once per generation batch, with the weights that "
    "sampled it), rollout_logprobs the behaviour policy (the sampler's, AReaL's inference logprobs). With "
    "prox_logp_method='loglinear' pass old_logprobs=None, versions "
    "(the version that generated each sequence or token) and current_version. Denominator: AReaL divides by the "
    "tokens before its rejection, so a masked weight keeps its token in the count (an IS weight of 0, rlzoo's "
    "is_correction='token_mask'); verl's rollout_rs would remove it from the counts. AReaL computes the behaviour "
    "log-ratio in float32. dual_clip=c is AReaL's c_clip; is_correction / is_min / is_max set AReaL's "
    "rejection_sampling at token level. sequence_mask / sequence_truncate are TRL's (the product of a sequence's "
    "token ratios is both the test and the weight); AReaL's level='sequence' weights a kept sequence by the "
    "geometric mean of its ratios whatever agg (with agg='sum' it keeps the same sequences as sequence_mask), which "
    "no rlzoo option reproduces (tests/losses/test_areal_losses.py pins the difference).",
)
def decoupled_ppo() -> PolicyLoss:
    r"""loss = -(pi_prox / pi_behav) min(u A, clip(u, 1-eps, 1+eps) A), u = pi_theta / pi_prox, token-mean;
    the weight pi_prox / pi_behav is 0 above 5 (the token still counts).

    Defaults: eps = 0.2 (epsilon_low = epsilon_high), is_correction = "token_mask" with is_max = 5 (AReaL's
    behave_imp_weight cap), prox_logp_method = "recompute".
    """
    return PolicyLoss(
        surrogate=PPOClip(epsilon_low=0.2, epsilon_high=0.2),
        is_correction=ISCorrection(is_correction="token_mask", is_min=None, is_max=5.0),
        aggregation="token-mean",
    )
