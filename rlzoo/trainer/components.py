"""Building a run's components, each from its own config section: what :class:`rlzoo.trainer.Trainer` assembles
before its loop runs (torchtitan's ``build_*`` functions are the model).

:func:`check_loss_inputs` refuses, before any model loads, what the run cannot give the loss;
:func:`build_models` loads the policy, its reference and the teacher as the ranks hold them;
:func:`build_components` builds the task, rewards, scorer, rollout source, evaluator, optimizer step, checkpointer and
metrics logger.
"""

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlzoo.losses import PolicyLoss, Rejection
from rlzoo.trainer.adapters import AdapterDisabled, is_peft_model
from rlzoo.trainer.checkpoint import Checkpointer
from rlzoo.trainer.config import (
    AdapterConfig,
    CheckpointConfig,
    EvalConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    RewardConfig,
    RolloutConfig,
    ScorerConfig,
    SignalConfig,
    TrackingConfig,
    TrainConfig,
)
from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.evaluation import Evaluator
from rlzoo.trainer.generation import HFGenerator, build_generator
from rlzoo.trainer.metrics import MetricsLogger
from rlzoo.trainer.model_digest import check_digest, weights_digest
from rlzoo.trainer.optim import OptimizerStep
from rlzoo.trainer.parallel import ParallelModel, check_parallelism
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.reference_adapter import fresh_lora
from rlzoo.trainer.resume import find_checkpoint
from rlzoo.trainer.reward_shaping import KLRewardShaping
from rlzoo.trainer.rollouts import RolloutSource
from rlzoo.trainer.run_dir import RunDirectory
from rlzoo.trainer.scorer import Scorer, enable_activation_checkpointing
from rlzoo.trainer.tasks import TaskStream
from rlzoo.trainer.trackers import CompletionLog, Trackers

__all__ = ["TRAINER_FIELDS", "Components", "Models", "build_components", "build_models", "check_loss_inputs", "plot_title"]

log = logging.getLogger("rlzoo.train")

TRAINER_FIELDS = frozenset({"old_logprobs", "ref_logprobs", "rollout_logprobs", "entropies", "teacher_logprobs",
                            "group_index", "rewards", "versions", "current_version"})
"""The optional :class:`~rlzoo.PolicyBatch` fields the trainer can fill (``rollout_logprobs``: the sampler's log-probs
from either backend, ``teacher_logprobs`` with ``--teacher``, ``versions`` / ``current_version``: the optimizer steps
completed before each batch's generation / before the newest one's); a loss that needs another is refused before the model loads."""


def check_loss_inputs(config: TrainConfig, loss_fn: PolicyLoss, *, dist: Distributed,
                      precision: Precision) -> bool:
    """Refuse, before the model loads, what the run cannot give the loss; returns whether the generation batch is
    scored for old log-probs (when the data can be stale, and for a rejection's counts or the IS weights' batch
    mean; never when the loss takes its old policy from the sampler: bypass mode, the log-linear proximal policy).

    Raises:
        ValueError: a field the trainer does not provide (names it and those it provides), a rollout rejection
            with ``prox_logp_method='loglinear'``, a ``kl_horizon`` too small for the adaptive KL controller, and
            the errors of :func:`~rlzoo.trainer.teacher.check_teacher` and
            :func:`~rlzoo.trainer.parallel.check_parallelism`.
    """
    from rlzoo.trainer.teacher import check_teacher

    required = loss_fn.required_fields()
    unknown = sorted(required - TRAINER_FIELDS)
    if unknown:
        raise ValueError(f"this loss needs PolicyBatch.{', '.join(unknown)}, which the trainer does not provide "
                         f"(it provides {', '.join(sorted(TRAINER_FIELDS))}); drop the option that asks for it")
    sampler_is_old = loss_fn.bypass_mode or loss_fn.prox_logp_method == "loglinear"
    rejects = any(isinstance(p, Rejection) for p in loss_fn.parts())
    if rejects and loss_fn.prox_logp_method == "loglinear":
        raise ValueError("a rollout rejection (rollout_rs, m2po) with prox_logp_method='loglinear' judges tokens "
                         "by the current policy, so the step's counts are not known before its forward passes: "
                         "use prox_logp_method='recompute' or drop the rejection")
    check_teacher(config.teacher, "teacher_logprobs" in required)
    check_parallelism(config.section(ParallelConfig), dist=dist, device=precision.device, backend=config.backend)
    rollout_config = config.section(RolloutConfig)
    completions = rollout_config.generation_batch_size * dist.world_size
    if config.use_kl_in_reward and config.kl_ctrl == "adaptive" and config.kl_horizon * 5 <= completions:
        raise ValueError(f"kl_horizon must be > {completions / 5:g} (a fifth of the {completions} completions of a "
                         f"generation batch) for the adaptive KL controller, got {config.kl_horizon}: a smaller "
                         "horizon can drive beta to 0 or below")
    # a rejection's counts and the IS weights' batch mean are taken before the step's forward passes
    return (rollout_config.old_logprobs_needed or rejects or loss_fn.counts_is_weights) and not sampler_is_old


@dataclasses.dataclass(frozen=True)
class Models:
    """The run's models as the ranks hold them.

    Attributes:
        model, tokenizer: the policy (the Hugging Face model, or a ``PeftModel``) and its tokenizer.
        policy: the policy wrapped for the ranks (:class:`~rlzoo.trainer.parallel.ParallelModel`).
        reference: the frozen reference (a ``ParallelModel``, :class:`~rlzoo.trainer.adapters.AdapterDisabled` for
            an adapter run), or None when nothing needs it.
        teacher: the ``--teacher`` model (a ``ParallelModel``), or None.
        digest: :func:`~rlzoo.trainer.model_digest.weights_digest` of the policy as loaded (before training).
    """

    model: Any
    tokenizer: Any
    policy: ParallelModel
    reference: Any
    teacher: ParallelModel | None
    digest: dict[str, str] | None = None


def build_models(config: TrainConfig, loss_fn: PolicyLoss, *, dist: Distributed, precision: Precision,
                 model: Any, tokenizer: Any, peft_config: Any) -> Models:
    """The policy (and its tokenizer), the reference and the teacher, as the ranks hold them.

    Raises:
        The errors of :func:`~rlzoo.trainer.adapters.build_policy` and :func:`~rlzoo.trainer.teacher.load_teacher`.
    """
    from rlzoo.trainer.adapters import build_policy
    from rlzoo.trainer.teacher import load_teacher

    parallel = config.section(ParallelConfig)
    policy_model, tokenizer, reference = build_policy(  # dropout off: the first ratio is exactly 1
        config.section(ModelConfig), config.section(AdapterConfig), dtype=precision.param_dtype,
        device=precision.device, model=model,
        needs_reference="ref_logprobs" in loss_fn.required_fields() or config.use_kl_in_reward,
        tokenizer=tokenizer, peft_config=peft_config)
    copied = isinstance(reference, AdapterDisabled) and reference.adapter is not None  # the reference: a copy
    digest = weights_digest(policy_model, adapter=copied)  # the base as loaded: a resume onto a changed one is said
    if config.resume is not None and config.output_dir is not None:
        try:
            found = find_checkpoint(Checkpointer(CheckpointConfig(), RunDirectory(config.output_dir).checkpoints),
                                    config.resume)
        except FileNotFoundError:
            found = None  # the trainer says so
        if found is not None:  # its digest goes on into this segment's checkpoints: the model the run started from
            digest = check_digest(found, policy_model, model_name=config.model, doing="the run goes on",
                                  reference_copy=copied, warn=dist.is_main) or digest
    trained = is_peft_model(policy_model) and peft_config is None and config.peft is None  # its own adapter trains on
    if (trained and isinstance(reference, AdapterDisabled) and reference.adapter is None  # not LoRA: not copied
            and config.resume in (None, "auto") and dist.is_main and not fresh_lora(policy_model)):
        log.warning("model %s carries an adapter trained already, which is not LoRA (or is AdaLoRA): the reference "
                    "is the model with the adapter disabled, its base model, not this starting policy, so the KL starts "
                    "above 0 (a LoRA adapter is copied as the reference, as TRL 1.16 does); for a reference equal to "
                    "it, merge it first (rlzoo export CHECKPOINT OUTPUT) and train on OUTPUT", config.model)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(policy_model)
    if loss_fn.batch_coupled and dist.is_main and (dist.enabled or config.gradient_accumulation_steps > 1):
        log.warning("loss %s uses statistics of the batch it is given (%s): each micro-batch of "
                    "per_device_train_batch_size completions%s computes them on its own (as TRL's top_entropy_quantile "
                    "in one process, and verl's rollout_is_batch_normalize in bypass mode)",
                    loss_fn.name or "custom", ", ".join(p.describe() for p in loss_fn.coupled_parts()),
                    ", on each rank," if dist.enabled else "")
    policy = ParallelModel(policy_model, dist=dist, config=parallel, precision=precision)
    if isinstance(reference, AdapterDisabled):  # the policy with its adapter off (or a copy on): no second model
        reference = dataclasses.replace(reference, module=policy.module)
    else:
        reference = reference and ParallelModel(reference, dist=dist, config=parallel, precision=precision,
                                                trainable=False)
    teacher = config.teacher and ParallelModel(
        load_teacher(config.teacher, tokenizer=tokenizer, dtype=precision.param_dtype, device=precision.device,
                     vocab_size=policy_model.get_output_embeddings().weight.shape[0]),
        dist=dist, config=parallel, precision=precision, trainable=False)
    return Models(model=policy_model, tokenizer=tokenizer, policy=policy, reference=reference, teacher=teacher,
                  digest=digest)


@dataclasses.dataclass(frozen=True)
class Components:
    """The run's components besides its models.

    Attributes:
        scorer, rollouts, evaluator, optimizer, checkpointer, logger: see :class:`rlzoo.trainer.Trainer`.
        python_rewards: the names of the reward functions given as Python callables (a checkpoint records them).
        reward_names: every reward function's name, in order.
    """

    scorer: Scorer
    rollouts: RolloutSource
    evaluator: Evaluator
    optimizer: OptimizerStep
    checkpointer: Checkpointer
    logger: MetricsLogger
    python_rewards: list[str]
    reward_names: list[str]


def build_components(config: TrainConfig, models: Models, loss_fn: PolicyLoss, advantage_fn: Any,
                     reward_funcs: Sequence[Callable[..., list[float | None]] | str], *, dist: Distributed,
                     precision: Precision, run_dir: Path, checkpoints: Path, task: TaskStream,
                     score_old: bool) -> Components:
    """The rewards, scorer, rollout source, evaluator, optimizer step, checkpointer and metrics logger over
    ``task`` (built before the models load: :func:`~rlzoo.trainer.tasks.build_task`), each from its own config
    section.

    Raises:
        The errors of :func:`~rlzoo.trainer.rewards.build_rewards`.
    """
    from rlzoo.trainer.rewards import build_rewards

    required = loss_fn.required_fields()
    twice = [spec for spec in reward_funcs if isinstance(spec, str) and spec in config.reward_funcs]
    if twice and dist.is_main:  # TRL's reward_funcs=["accuracy", fn] over the default reward_funcs ("accuracy",)
        log.warning("reward function(s) %s are named both in TrainConfig.reward_funcs %s and in Trainer(reward_funcs="
                    "...): each counts twice (the second as NAME_2); TrainConfig(reward_funcs=()) keeps only Trainer's",
                    ", ".join(map(repr, twice)), tuple(config.reward_funcs))
    rewards = build_rewards(config.section(RewardConfig), reward_funcs, task=task, max_steps=config.max_steps,
                            device=precision.device)
    # the TrainerState fields transformers.Trainer sets when training starts (TRL passes its Trainer's state):
    # "only on the main process" in a reward function reads is_world_process_zero
    state = rewards.trainer_state
    state.is_world_process_zero, state.is_local_process_zero = dist.is_main, dist.local_rank == 0
    whole_run = max(config.max_steps, 1)  # 0 (at the end only) is no interval: a schedule's step % 0 would raise
    state.logging_steps = 1
    state.eval_steps, state.save_steps = config.eval_steps or whole_run, config.save_steps or whole_run
    state.train_batch_size = config.per_device_train_batch_size
    trackers = (Trackers(config.section(TrackingConfig), output_dir=run_dir, settings=config.to_dict())
                if dist.is_main else None)
    completion_log = CompletionLog(run_dir, tokenizer=models.tokenizer, reward_names=rewards.names,
                                   trackers=trackers, dist=dist) if config.log_completions else None
    if completion_log is not None:
        rewards.table_columns = frozenset({*CompletionLog.OWN_COLUMNS, *rewards.names})
    rollout_config = config.section(RolloutConfig)
    scorer = Scorer(config.section(ScorerConfig), precision=precision, temperature=config.temperature,
                    micro_batch_size=config.per_device_train_batch_size,
                    gradient_checkpointing=config.gradient_checkpointing, with_entropy="entropies" in required,
                    share_prefix=(config.share_prompt_prefix and not config.gradient_checkpointing
                                  and not models.policy.sharded))
    generator = build_generator(rollout_config, models.model, models.tokenizer, share_prefix=scorer.share_prefix,
                                seed=config.seed, precision=precision, rollout_logprobs="rollout_logprobs" in required)
    reference = models.reference
    rollouts = RolloutSource(
        rollout_config, config.section(RewardConfig), task=task, rewards=rewards, advantage_fn=advantage_fn,
        scorer=scorer, generator=generator, tokenizer=models.tokenizer, policy=models.policy,
        reference=reference if isinstance(reference, AdapterDisabled) else reference and reference.module,
        precision=precision, seed=config.seed, dist=dist, completion_log=completion_log,
        teacher=models.teacher and models.teacher.module,
        kl_reward=KLRewardShaping(config.section(SignalConfig)) if config.use_kl_in_reward else None,
        old_logprobs=score_old, loss=loss_fn)
    eval_generator = HFGenerator(models.tokenizer, max_completion_length=config.max_completion_length,
                                 max_prompt_length=config.max_prompt_length, share_prefix=False)
    evaluator = Evaluator(config.section(EvalConfig), task=task, tokenizer=models.tokenizer,
                          generator=eval_generator, precision=precision, dist=dist,
                          progress=config.progress and dist.is_main, rewards=rewards, progress_of_run=rollouts.sync_progress)
    optimizer = OptimizerStep(config.section(OptimizerConfig), models.policy.module, max_steps=config.max_steps)
    logger = MetricsLogger(run_dir, max_steps=config.max_steps, progress=config.progress, writes=dist.is_main,
                           trackers=trackers, title=plot_title(config, loss_fn, task.task.name,
                                                               adapter=is_peft_model(models.model)))
    return Components(scorer=scorer, rollouts=rollouts, evaluator=evaluator, optimizer=optimizer,
                      checkpointer=Checkpointer(config.section(CheckpointConfig), checkpoints,
                                                model_digest=models.digest), logger=logger,
                      python_rewards=list(rewards.names[len(config.reward_funcs):]),
                      reward_names=list(rewards.names))


def plot_title(config: TrainConfig, loss_fn: PolicyLoss, task: str, *, adapter: bool = False) -> str:
    """The plot's title: loss, task and model (`` + LoRA`` when ``adapter``: an adapter trains, from --peft or a
    ``peft_config``); a local file or directory by its name, not its whole path."""
    def short(name: str) -> str:
        return Path(name).name if ("/" in name or "\\" in name) and Path(name).exists() else name

    suffix = " + LoRA" if adapter or config.peft is not None else ""
    return f"{loss_fn.name or 'custom loss'} on {short(task)} - {short(config.model)}{suffix}"
