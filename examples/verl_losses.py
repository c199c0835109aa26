"""rlzoo losses for verl 0.9.1: importing this module registers them as verl policy losses.

verl imports ``actor_rollout_ref.model.external_lib`` in every worker, so naming this module there makes the
losses available where the actor computes its loss; select one with ``policy_loss.loss_mode``::

    PYTHONPATH=examples:$PYTHONPATH python -m verl.trainer.main_ppo \\
        actor_rollout_ref.model.external_lib=verl_losses \\
        actor_rollout_ref.actor.policy_loss.loss_mode=rlzoo_gmpo \\
        ...

(docs/integrations.md has the whole config snippet.) The options live in the rlzoo loss, not in verl's
``clip_ratio*`` fields; the KL loss, entropy bonus and rollout correction stay verl's (use_kl_loss,
entropy_coeff, algorithm.rollout_correction).
"""

import rlzoo
from rlzoo.integrations.verl import register

# GMPO (arXiv:2507.20673, the paper's clip 0.4), aggregated as the paper (per-sequence mean) whatever loss_agg_mode.
register("rlzoo_gmpo", rlzoo.get_loss("gmpo"), follow_loss_agg_mode=False)
# GSPO proper (sequence ratio, not verl's GSPO-token) with the paper's clip range, aggregated as loss_agg_mode.
register("rlzoo_gspo", rlzoo.get_loss("gspo"))
# INTELLECT-2's two-sided clip; its KL term goes to verl's use_kl_loss instead (beta=0 here).
register("rlzoo_two_sided", rlzoo.get_loss("two_sided", beta=0.0))
# SAPO with TRL's temperatures, any loss_agg_mode.
register("rlzoo_sapo", rlzoo.get_loss("sapo"))
