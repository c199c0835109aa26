"""rlzoo losses inside other trainers.

* :mod:`rlzoo.integrations.trl` - :class:`~rlzoo.integrations.trl.GRPOTrainer`, a ``trl.GRPOTrainer`` (TRL 1.16)
  that takes any rlzoo loss (``loss="gmpo"``); it needs ``trl``.
* :mod:`rlzoo.integrations.verl` - :func:`~rlzoo.integrations.verl.register` puts any rlzoo loss into verl
  0.9.1's policy-loss registry (``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``); it imports ``verl``
  only when called.

Neither submodule is imported here, so ``import rlzoo.integrations`` needs neither TRL nor verl. See
docs/integrations.md.
"""

__all__: list[str] = []
