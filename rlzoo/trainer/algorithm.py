"""The run's algorithm: its loss (a preset with overrides, or a loss composed in Python) and its advantage
estimator, checked against what the trainer can give the estimator."""

import logging
from typing import Any

from rlzoo.losses import PolicyLoss, get_loss, presets
from rlzoo.registry import UnknownNameError
from rlzoo.trainer.config import AlgorithmConfig

log = logging.getLogger("rlzoo.train")

__all__ = ["TRAINER_INPUTS", "build_loss"]

TRAINER_INPUTS = frozenset({"completion_mask", "old_logprobs", "sum_pi_squared"})
"""The optional advantage inputs the trainer scores at generation time (``token_rewards`` only come from the KL in
the reward, so an estimator cannot need them)."""


def build_loss(config: AlgorithmConfig, loss: PolicyLoss | None, *, max_completion_length: int,
               normalize_then_sum: bool = False) -> tuple[PolicyLoss, Any, str]:
    """The run's loss and advantage estimator: ``(loss, estimator, estimator name)``.

    Without ``loss``, the preset ``config.algorithm`` with ``config.loss`` overrides and the preset's
    recommended estimator; with a loss composed in Python, ``config.loss`` overrides its options and the
    estimator is ``grpo``. ``config.advantage`` / ``advantage_options`` override the estimator (a ``scale`` of
    True / False is TRL's ``scale_rewards``: "group" / "none"). The loss gets the run's ``max_completion_length``
    unless it sets its own. With ``normalize_then_sum`` (the rewards were normalised per group before their sum,
    ``--multi-reward-aggregation normalize_then_sum``) a ``grpo`` estimator without a ``scale`` option scales over
    the batch, as TRL 1.16 normalises that sum (``scale="batch"``, logged; TRL ignores ``scale_rewards`` there).

    Raises:
        UnknownNameError: unknown preset or estimator (lists the valid names).
        ValueError: an estimator that needs inputs the trainer does not provide (a value model, token
            rewards); names the usable ones.
    """
    from rlzoo.advantages import advantage_estimators, get_advantage

    if loss is None:
        if config.algorithm not in presets:  # a preset of the user's registers when its module is imported
            try:
                presets.get(config.algorithm)
            except UnknownNameError as err:
                raise UnknownNameError(
                    f"{err}. A preset of your own is known in the process that imported its module: import it, "
                    "then build the Trainer (or call rlzoo.cli.main([...]) from that script)") from None
        card = presets.get(config.algorithm)
        loss = get_loss(config.algorithm, **{"max_completion_length": max_completion_length, **config.loss})
        advantage_name, advantage_options = card.advantage, dict(card.advantage_options)
    else:
        if config.algorithm != AlgorithmConfig.algorithm:
            log.warning("the loss given from Python replaces algorithm %r (its options in config.loss still apply "
                        "to it)", config.algorithm)
        if config.loss:
            loss = loss.with_options(**config.loss)
        if loss.max_completion_length is None:
            loss = loss.with_options(max_completion_length=max_completion_length)
        advantage_name, advantage_options = "grpo", {}
    if config.advantage is not None:
        advantage_name, advantage_options = config.advantage, {}
    advantage_options.update(config.advantage_options)
    if isinstance(advantage_options.get("scale"), bool):  # TRL's scale_rewards True / False (GRPOConfig)
        advantage_options["scale"] = "group" if advantage_options["scale"] else "none"
    if normalize_then_sum and advantage_name == "grpo" and "scale" not in advantage_options:
        advantage_options["scale"] = "batch"
        log.info("advantages: grpo with scale='batch' (TRL's normalisation of a normalize_then_sum reward; "
                 "--advantage.scale group re-normalises each group)")
    estimator = get_advantage(advantage_name, **advantage_options)
    unsupported = set(estimator.needs) - TRAINER_INPUTS
    if unsupported:
        usable = [n for n, cls in advantage_estimators.items() if cls.needs <= TRAINER_INPUTS]
        missing = "; ".join(f"{name}: {_NOT_PROVIDED.get(name, 'not computed by the trainer')}"
                            for name in sorted(unsupported))
        raise ValueError(
            f"advantage estimator {advantage_name!r} needs what the trainer does not provide ({missing}); choose one "
            f"of {', '.join(usable)}"
        )
    return loss, estimator, advantage_name


_NOT_PROVIDED = {  # an estimator input the trainer cannot give, and why
    "values": "a value model's per-token values (the trainer trains no critic)",
    "baseline_rewards": "the reward of a greedy completion per prompt (ReMax's baseline rollout; not sampled)",
}
