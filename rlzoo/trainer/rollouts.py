"""The rollout source: the generation cycle and its buffer, rewards and their combination, DAPO's dynamic
sampling and overlong shaping, advantages, and the old / reference log-probs computed at generation time.

The cycle is TRL's GRPOTrainer's: a generation batch of ``prompts_per_generation * num_generations``
completions is sampled every ``steps_per_generation * num_iterations`` micro-steps and consumed as
``steps_per_generation`` micro-batches (whole groups, shuffled), ``num_iterations`` times.

Under torchrun every rank draws the same global list of prompts (``prompts_per_generation`` per rank) from the
task stream and generates its own consecutive share of the groups, so whole groups stay on one rank. Each
group is sampled from its own random stream, seeded by the run seed, the generation round and the group's
global index (:class:`~rlzoo.trainer.sampling.GroupSeededSampling`): a run's completions do not depend on the
number of ranks. Dynamic sampling's choice of kept groups and, when a generation batch spans several optimizer
steps, its shuffle into micro-batches are made over the whole batch (:mod:`rlzoo.trainer.group_shares`).
Advantages are computed on the rewards gathered from every rank (exact for batch-level scaling too) and each rank
keeps its own rows.
"""

import functools
import logging
import math
import time
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from rlzoo.batch import BatchError
from rlzoo.losses import PolicyLoss
from rlzoo.trainer.advantage_inputs import batch_advantages
from rlzoo.trainer.config import RewardConfig, RolloutConfig
from rlzoo.trainer.distributed import ONE_PROCESS, Distributed
from rlzoo.trainer.generation import Generated, HFGenerator, VLLMGenerator
from rlzoo.trainer.group_shares import Group, GroupKey, assemble, select_groups, split_generation_batch
from rlzoo.trainer.parallel import ParallelModel
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.reward_functions import try_rewards
from rlzoo.trainer.reward_shaping import KLRewardShaping, overlong_penalty, scorable, shape_rewards
from rlzoo.trainer.rewards import RewardSet
from rlzoo.trainer.rollout import Rollout, check_restored_batch
from rlzoo.trainer.scorer import Scorer
from rlzoo.trainer.step_batch import OptimizerStepBatch
from rlzoo.trainer.tasks import TaskItem, TaskStream
from rlzoo.trainer.tasks.base import derive_seed
from rlzoo.trainer.trackers import CompletionLog

__all__ = ["RolloutSource"]

log = logging.getLogger("rlzoo.train")


class RolloutSource:
    """Produces the micro-batches of each optimizer step, generating a new batch when the cycle says so.

    Args:
        config: the rollout section (sampling, group size, the cycle, dynamic sampling, truncation masking).
        reward_config: the reward section (combination, overlong shaping).
        task: the task stream (prompts, training items, scorer).
        rewards: the reward functions.
        advantage_fn: an advantage estimator (``rlzoo.get_advantage``).
        scorer: computes old / reference log-probs at generation time.
        generator: the sampling backend (:func:`~rlzoo.trainer.generation.build_generator`).
        tokenizer: the model's tokenizer.
        policy: the trained model (sampled from with its parameters gathered; scored for old log-probs when
            they are needed).
        reference: what reference log-probs are scored with (a :class:`~rlzoo.trainer.scorer.LogProbModule`,
            possibly wrapped, or :class:`~rlzoo.trainer.adapters.AdapterDisabled`), when the loss needs them, else
            None.
        precision: autocast of the generation forward passes.
        seed: the run seed (micro-batch shuffling, and with the round and group index each group's sampling).
        dist: the process group context (this rank's share of each generation batch).
        completion_log: records each generation batch's completions table (``--log-completions``), or None.
        teacher: what teacher log-probs are scored with (``--teacher``: a frozen model's
            :class:`~rlzoo.trainer.scorer.LogProbModule`, possibly wrapped), when the loss needs them, else None.
        kl_reward: the KL-in-reward shaping (``--use-kl-in-reward``), or None.
        old_logprobs: score the old log-probs at generation time (default ``config.old_logprobs_needed``); the
            trainer also asks for them when the loss rejects tokens (its counts are known before the step) and
            never when the loss takes its old policy from the sampler (``bypass_mode``, the log-linear proximal
            policy), where ``old_logprobs`` must stay None.
        loss: the loss trained, whose :meth:`~rlzoo.losses.PolicyLoss.is_weight_sums` are taken over each whole
            generation batch (``rollout_is_batch_normalize``: verl normalises the IS weights over its training
            batch, whichever optimizer step uses them), or None.

    Old, reference and teacher log-probs (and, when the estimator needs them, the sampling policy's log-probs and
    ``sum_pi_squared``) are scored before the advantage, which may use them (KL in the reward, the optimal token
    baseline).
    """

    def __init__(self, config: RolloutConfig, reward_config: RewardConfig, *, task: TaskStream, rewards: RewardSet,
                 advantage_fn: Any, scorer: Scorer, generator: HFGenerator | VLLMGenerator, tokenizer: Any,
                 policy: ParallelModel, reference: Any, precision: Precision, seed: int,
                 dist: Distributed = ONE_PROCESS, completion_log: CompletionLog | None = None, teacher: Any = None,
                 kl_reward: KLRewardShaping | None = None, old_logprobs: bool | None = None,
                 loss: PolicyLoss | None = None) -> None:
        self.config = config
        self.loss = loss
        self._buffer_sums: Tensor | None = None  # is_weight_sums of this rank's share of the buffer's batch
        self.score_old = config.old_logprobs_needed if old_logprobs is None else old_logprobs
        self.reward_config = reward_config
        self.task = task
        self.rewards = rewards
        self.advantage_fn = advantage_fn
        self.scorer = scorer
        self.generator = generator
        self.tokenizer = tokenizer
        self.policy = policy
        self.reference = reference
        self.precision = precision
        self.seed = seed
        self.dist = dist
        self.completion_log = completion_log
        self.teacher = teacher
        self.kl_reward = kl_reward
        self.micro_step = 0
        self.round = 0  # generation rounds so far (each group's sampling seed depends on it)
        self.num_tokens = 0.0  # prompt + completion tokens generated so far on this rank (TRL's num_tokens)
        self.buffer: list[Rollout] = []
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.reward_metrics: dict[str, float] = {}  # the step's log_metric values (add_reward_metrics)

    def check_rewards(self) -> None:
        """Call every reward function once on the first training problem (its reference answer as the completion;
        :func:`~rlzoo.trainer.reward_functions.try_rewards`), so that a broken reward fails before the run's first
        evaluation and generation.

        Raises:
            RewardFunctionError: a function raised or returned a bad value (names it).
        """
        self.sync_progress()
        if self.dist.is_main:  # the run's reward functions: config.reward_funcs', then the Python callables
            log.info("rewards: %s", ", ".join(f"{name} (weight {weight:g})" for name, weight
                                              in zip(self.rewards.names, self.rewards.weights, strict=True)))
        try_rewards(self.rewards, self.task, self.tokenizer, self.task.sample_item())

    def generate(self) -> tuple[Rollout, dict[str, float]]:
        """Sample, score and compute advantages for one generation batch (with DAPO dynamic sampling).

        Returns:
            the rollout and its statistics (``generation_time``; ``dynamic_sampling/*`` when enabled); what the reward
            functions logged with ``log_metric`` is in :attr:`reward_metrics`.

        Raises:
            RewardFunctionError: a reward function failed (names it).
        """
        cfg, g = self.config, self.config.num_generations
        need, rank, world = cfg.prompts_per_generation, self.dist.rank, self.dist.world_size
        kept: list[tuple[GroupKey, Group]] = []
        dropped: list[tuple[GroupKey, Group]] = []
        columns: dict[str, None] = {}  # the log_extra columns, in the order they were first logged
        rounds, t0 = 0, time.perf_counter()
        self.sync_progress()
        with self.policy.gathered() as model:
            while rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
                if rounds and self.dist.reduce_floats({"kept": float(len(kept))})["kept"] >= need * world:
                    break  # the kept groups of every rank fill the global batch
                rounds += 1
                items = self.task.next_train(need * world)[rank * need:(rank + 1) * need]
                columns.update(dict.fromkeys(self._keep(model, items, self.round, rank * need, kept, dropped)))
                self.round += 1
        num_kept = self.dist.reduce_floats({"kept": float(len(kept))})["kept"] if world > 1 else len(kept)
        if num_kept < need * world:  # dynamic sampling gave up: fill with zero-variance groups (zero advantage)
            log.warning("dynamic sampling kept %d/%d groups after %d rounds; filling with zero-variance groups",
                        num_kept, need * world, rounds)
        share = select_groups(kept, dropped, need=need, dist=self.dist)
        rollout = assemble([group for _, group, _ in share], pad_token_id=self._pad_token_id, device=self.precision.device)
        rollout.prompt_id = rollout.group_index + rank * need  # the global prompt index (group ids of the loss)
        rollout.version = self.micro_step // cfg.gradient_accumulation_steps  # the sampler's weights: steps completed
        stats = {"generation_time": time.perf_counter() - t0}
        self.num_tokens += float(rollout.prompt_mask[rollout.group_index].sum() + rollout.completion_mask.sum())
        self.reward_metrics, _ = self.rewards.take_logged(self.dist)  # TRL's log_metric (log_extra: with each group)
        sampling = self._score(rollout)
        rollout.advantages, kl_metrics = batch_advantages(self.advantage_fn, rollout, sampling, dist=self.dist,
                                                          group_size=g, kl_reward=self.kl_reward)
        stats.update(kl_metrics)
        if self.completion_log is not None:  # the log_extra values came with their groups, from any rank
            columns.update(dict.fromkeys(c for _, group, _ in share for c in group[4]))
            extra = {c: [v for _, group, _ in share for v in group[4].get(c, [None] * g)] for c in columns}
            self.completion_log.record(self.rewards.trainer_state.global_step + 1, rollout, extra=extra)
        if cfg.dynamic_sampling:
            stats.update({"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/groups_dropped":
                          self.dist.reduce_floats({"dropped": float(len(dropped))})["dropped"]})
        return rollout, stats

    def _keep(self, model: torch.nn.Module, items: list[TaskItem], round_index: int, first: int,
              kept: list[tuple[GroupKey, Group]], dropped: list[tuple[GroupKey, Group]]) -> list[str]:
        """Sample ``items`` (global group indices from ``first``; one seed per group from the round and that index)
        and sort their groups into kept and dropped (dynamic sampling drops a group without signal: fewer than two
        scored completions, or their combined rewards all equal), each with the values the reward functions logged
        for its completions with ``log_extra`` (so that they follow the group to the rank that trains on it).
        Returns the ``log_extra`` columns logged."""
        g = self.config.num_generations
        seeds = [derive_seed("sample", self.seed, round_index, first + i) for i in range(len(items))]
        gen, values, reward = self._sample(model, items, seeds)
        logged = self.rewards.take_extra()  # one value per completion of this round (fewer: None for the rest)
        for i in range(len(items)):
            sl = slice(i * g, (i + 1) * g)
            extra = {c: [v[j] if j < len(v) else None for j in range(i * g, (i + 1) * g)] for c, v in logged.items()}
            group = ((round_index, first + i), (gen, i, values[sl], reward[sl], extra))
            scored = reward[sl][scorable(values[sl])]  # the unscorable ones count in no baseline
            no_signal = scored.numel() < 2 or bool(torch.all(scored == scored[0]))
            if self.config.dynamic_sampling and no_signal:
                dropped.append(group)
            else:
                kept.append(group)
        return list(logged)

    def _score(self, rollout: Rollout) -> dict[str, Tensor]:
        """Score the generation batch without gradients: old log-probs when the data can be stale, reference and
        teacher log-probs when asked, and what the advantage needs from the sampling policy (its log-probs for the
        KL in the reward and the optimal token baseline, ``sum_pi_squared`` for the latter, in the same pass).
        Returns the sampling policy's ``{"old_logprobs": ..., "sum_pi_squared": ...}`` that were scored."""
        wanted = self.advantage_fn.needs | self.advantage_fn.accepts
        sampling: dict[str, Tensor] = {}
        if "sum_pi_squared" in wanted:
            sampling["old_logprobs"], sampling["sum_pi_squared"] = self.scorer.generation_stats(self.policy.module,
                                                                                               rollout)
        elif self.score_old or self.kl_reward is not None or "old_logprobs" in wanted:
            sampling["old_logprobs"] = self.scorer.generation_logprobs(self.policy.module, rollout)
        if self.score_old:
            rollout.old_logprobs = sampling["old_logprobs"]
        if self.reference is not None:
            rollout.ref_logprobs = self.scorer.generation_logprobs(self.reference, rollout)
        if self.teacher is not None:
            rollout.teacher_logprobs = self.scorer.generation_logprobs(self.teacher, rollout)
        return sampling

    def _sample(self, model: torch.nn.Module, items: list[TaskItem],
                seeds: list[int]) -> tuple[Generated, Tensor, Tensor]:
        """Completions of ``items``, their per-function rewards ``[N, K]`` and combined reward ``[N]``."""
        g = self.config.num_generations
        prompts = [self.task.prompt(self.tokenizer, item) for item in items]
        with self.precision.autocast():
            gen = self.generator.generate(model, prompts, g, seeds=seeds)
        lengths = gen.completion_mask.sum(-1).tolist()  # the mask is a prefix of each row
        completion_ids = [row[:n] for row, n in zip(gen.completion_ids.tolist(), lengths, strict=True)]
        values = self.rewards.compute(prompts=[p for p in prompts for _ in range(g)], completions=gen.texts,
                                      items=[item for item in items for _ in range(g)],
                                      completion_ids=completion_ids).to(gen.completion_mask.device)
        reward = shape_rewards(values, gen.completion_mask, config=self.reward_config, weights=self.rewards.weights,
                               group_size=g, max_completion_length=self.config.max_completion_length)
        return gen, values, reward

    def loss_mask(self, micro_batch: Rollout) -> Bool[Tensor, "N C"]:
        """The tokens the loss counts: the completion mask, minus truncated completions when asked (DAPO)."""
        if self.config.mask_truncated_completions:
            return micro_batch.completion_mask & ~micro_batch.is_truncated[:, None]
        return micro_batch.completion_mask

    def next_optimizer_step(self) -> OptimizerStepBatch:
        """The micro-batches of the next optimizer step, generating new batches when the cycle says so.

        Raises:
            RewardFunctionError: from :meth:`generate`.
            BatchError: a new generation batch's IS weight sums are NaN (:meth:`_is_weight_sums`).
        """
        cfg = self.config
        spg = cfg.effective_steps_per_generation
        period = spg * cfg.num_iterations
        micro_batches: list[Rollout] = []
        offsets: list[int] = []  # per micro-batch: the prompts of the step's earlier generation batches
        stats: dict[str, float] = {}
        offset = 0
        sums: list[Tensor | None] = [self._buffer_sums] if self.buffer else []  # of the batches the step draws from
        self.reward_metrics = {}  # a step that generates nothing logs none
        for _ in range(cfg.gradient_accumulation_steps):
            if self.micro_step % period == 0 or not self.buffer:
                if micro_batches:  # the step spans two generation batches: the new one's prompts get new ids
                    offset += cfg.prompts_per_generation
                else:  # the step starts a new one: the previous one is not drawn from
                    sums = []
                rollout, stats = self.generate()
                self.buffer = split_generation_batch(
                    rollout, spg, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                    generator=self.shuffle_generator, group_size=cfg.num_generations,
                    pad_token_id=self._pad_token_id, dist=self.dist)
                self._buffer_sums = self._is_weight_sums(self.buffer)
                sums.append(self._buffer_sums)
            micro_batches.append(self.buffer[self.micro_step % spg])
            offsets.append(offset)
            self.micro_step += 1
        return OptimizerStepBatch(micro_batches=micro_batches, loss_masks=[self.loss_mask(mb) for mb in micro_batches],
                                  metrics={"generation_time": 0.0, **stats}, group_offsets=offsets,
                                  num_groups=offset + cfg.prompts_per_generation,
                                  is_weight_sums=sum(sums) if sums and all(s is not None for s in sums) else None)

    def add_reward_metrics(self, row: dict[str, Any]) -> dict[str, Any]:
        """The step's metrics ``row`` with what the reward functions logged with ``log_metric`` for its generation
        batch (:attr:`reward_metrics`: none when the step generated none), as TRL logs them with the step's metrics.

        Raises:
            RewardFunctionError: a logged name is one of the trainer's (a key of ``row``, ``step``, ``eval/*``;
                names the function: :meth:`~rlzoo.trainer.rewards.RewardSet.add_logged`).
        """
        return self.rewards.add_logged(row, self.reward_metrics)

    def sync_progress(self) -> None:
        """Give the reward functions' ``trainer_state`` the run's progress before they are called (here, and by the
        evaluator before it scores the held-out set)
        (:meth:`~rlzoo.trainer.rewards.RewardSet.set_progress`): the optimizer steps taken, the training rows drawn
        from the task so far (every rank draws the global batch) and, for the epochs the run plans, the rows its
        generation batches draw (``prompts_per_generation`` per rank each, one every ``steps_per_generation *
        num_iterations`` micro-steps)."""
        cfg = self.config
        period = cfg.effective_steps_per_generation * cfg.num_iterations
        batches = math.ceil(self.rewards.trainer_state.max_steps * cfg.gradient_accumulation_steps / period)
        self.rewards.set_progress(global_step=self.micro_step // cfg.gradient_accumulation_steps,
                                  rows_drawn=self.task.position, train_rows=self.task.task.num_train_rows,
                                  rows_per_run=batches * cfg.prompts_per_generation * self.dist.world_size)

    def _is_weight_sums(self, buffer: list[Rollout]) -> Tensor | None:
        """The loss's :meth:`~rlzoo.losses.PolicyLoss.is_weight_sums` over this rank's share of a whole generation
        batch (every micro-batch of ``buffer``, before rejection), or None when the loss counts none.

        Raises:
            BatchError: a counted token's old or sampler log-prob is NaN (the sums are not finite; masked
                positions are ignored).
        """
        if self.loss is None or not buffer:
            return None
        parts = [self.loss.is_weight_sums(self.loss_mask(mb), old_logprobs=mb.old_logprobs,
                                          rollout_logprobs=mb.rollout_logprobs) for mb in buffer]
        if any(p is None for p in parts):
            return None
        total: Tensor = sum(parts)  # type: ignore[assignment]
        if not bool(torch.isfinite(total).all()):  # a later micro-batch's NaN would unnormalise this step silently
            raise BatchError("the generation batch's rollout IS weights are NaN (rollout_is_batch_normalize): "
                             "old_logprobs or rollout_logprobs hold NaN at a counted token")
        return total

    @property
    def _pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def batch_metrics(self, batch: OptimizerStepBatch) -> dict[str, float]:
        """The step's reward and length metrics over every rank (:meth:`OptimizerStepBatch.step_metrics`), with the
        run's ``num_tokens`` so far."""
        overlong = functools.partial(overlong_penalty, config=self.reward_config,
                                     max_completion_length=self.config.max_completion_length)
        return batch.step_metrics(dist=self.dist, reward_names=self.rewards.names, num_tokens=self.num_tokens,
                                  reward_weights=self.rewards.weights, overlong=overlong,
                                  combined_is_sum=self.reward_config.multi_reward_aggregation == "sum_then_normalize")

    def sync_weights(self) -> None:
        """Give the sampler the policy's new weights (after an optimizer step; a no-op for Hugging Face
        generation, which samples from the policy itself)."""
        if isinstance(self.generator, VLLMGenerator):
            with self.policy.gathered() as model:
                self.generator.sync_weights(model)

    def state_dict(self) -> dict[str, Any]:
        """The cycle's position and generation round, its unfinished generation batch (this rank's rows), the
        shuffling RNG, the task position, the token count and the KL-in-reward controller's coefficient."""
        period = self.config.effective_steps_per_generation * self.config.num_iterations
        unfinished = self.buffer if self.micro_step % period else []  # a used-up batch is not needed to resume
        state = {"micro_step": self.micro_step, "round": self.round, "buffer": [r.state_dict() for r in unfinished],
                 "shuffle": self.shuffle_generator.get_state(), "task": self.task.state_dict(),
                 "num_tokens": self.num_tokens, "global_prompt_ids": True,
                 "num_tokens_all_ranks": self.dist.reduce_floats({"n": self.num_tokens})["n"]}
        if self.kl_reward is not None:
            state["kl_ctrl"] = self.kl_reward.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, same_world_size: bool = True) -> None:
        """Restore :meth:`state_dict` (``same_world_size`` False: written by another number of ranks, from rank 0's
        file; the token count of all its ranks goes to rank 0).

        Raises:
            BatchError: the restored generation batch's IS weight sums are NaN (:meth:`_is_weight_sums`).
            ValueError: the task state is from another training stream; or the restored generation batch lacks
                reference, teacher, old or sampler log-probs the loss now needs (names the field and what to do).
        """
        self.task.load_state_dict(state["task"], warn=self.dist.is_main)
        cfg = self.config
        period = cfg.effective_steps_per_generation * cfg.num_iterations
        generated_at = state["micro_step"] - state["micro_step"] % period  # the unfinished batch's micro-step
        device = self.precision.device  # checkpoints load on the CPU
        buffer = [Rollout(**{"version": generated_at // cfg.gradient_accumulation_steps,  # older: no version
                             **{k: v.to(device) if isinstance(v, Tensor) else v for k, v in r.items()}})
                  for r in state["buffer"]]
        check_restored_batch(buffer, old=self.score_old, ref=self.reference is not None,
                             teacher=self.teacher is not None, rollout=self.generator.rollout_logprobs)
        if not self.score_old:  # the loss takes its old policy from the sampler (bypass / loglinear): none given
            for r in buffer:
                r.old_logprobs = None
        if self.kl_reward is not None and "kl_ctrl" in state:
            self.kl_reward.load_state_dict(state["kl_ctrl"])
        if not state.get("global_prompt_ids"):  # written before prompt ids were global: this rank's prompts
            for r in buffer:
                r.prompt_id = (r.group_index if r.prompt_id is None else r.prompt_id) + self.dist.rank * cfg.prompts_per_generation
        self.buffer = buffer
        self._buffer_sums = self._is_weight_sums(buffer)  # the whole batch is kept, so its sums are recomputed
        self.micro_step = state["micro_step"]
        self.round = state["round"]
        self.num_tokens = state.get("num_tokens", 0.0)
        if not same_world_size:  # rank 0's file: the count of every rank that wrote it, summed once
            self.num_tokens = state.get("num_tokens_all_ranks", self.num_tokens) if self.dist.is_main else 0.0
        self.shuffle_generator.set_state(state["shuffle"])
