"""One optimizer step's micro-batches and what the loss gets from them besides the scored log-probs: the fields
derived from the rollout (group ids, rewards, versions), the tokens the loss counts and the step's counts; and the
step's reward and length metrics over every rank."""

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import LossMasker, Normalizer
from rlzoo.trainer.distributed import Distributed
from rlzoo.trainer.reward_shaping import scorable
from rlzoo.trainer.rewards import nanstd
from rlzoo.trainer.rollout import Rollout

__all__ = ["OptimizerStepBatch"]


@dataclasses.dataclass(frozen=True)
class OptimizerStepBatch:
    """The micro-batches of one optimizer step.

    Attributes:
        micro_batches: ``gradient_accumulation_steps`` slices of generation batches.
        loss_masks: the tokens each micro-batch's loss counts (its completion mask, minus truncated
            completions under ``mask_truncated_completions``).
        metrics: ``generation_time`` (0 when no batch was generated for this step) and, when one was, the
            dynamic-sampling counts.
        group_offsets: per micro-batch, the prompts of the step's earlier generation batches (0 unless the step
            spans two), added to its prompt ids by :meth:`loss_fields`.
        num_groups: prompts per rank of the step's generation batches (every prompt id < ``num_groups * world_size``).
        is_weight_sums: ``Float[2]``, the loss's :meth:`~rlzoo.losses.PolicyLoss.is_weight_sums` over this rank's
            share of the whole generation batches the step draws from (verl normalises the IS weights over its
            training batch), or None.
    """

    micro_batches: list[Rollout]
    loss_masks: list[Bool[Tensor, "N C"]]
    metrics: dict[str, float]
    group_offsets: list[int] = dataclasses.field(default_factory=list)
    num_groups: int = 0
    is_weight_sums: Float[Tensor, "2"] | None = None

    def loss_fields(self, required: frozenset[str], *, world_size: int) -> list[dict[str, Any]]:
        """Per micro-batch, the :class:`~rlzoo.PolicyBatch` fields the loss ``required`` that come from the
        rollout: ``group_index`` (prompt ids unique over the step's micro-batches and ranks:
        ``offset * world_size + prompt`` with ``prompt`` the global prompt index in its generation batch, for
        "prompt-mean"), ``rewards`` (the combined reward, for
        VAPO's positive-example NLL term), ``versions`` (each completion's :attr:`Rollout.version`) and
        ``current_version`` (the newest of the step's batch versions: the weights the sampler last had, AReaL's
        ``current_version``, fixed until the next generation with new weights), for the log-linear proximal policy.
        In the synchronous loop every micro-batch's version is then ``current_version`` (alpha = 0)."""
        fields: list[dict[str, Any]] = []
        current = max(mb.version for mb in self.micro_batches)
        for mb, offset in zip(self.micro_batches, self.group_offsets, strict=True):
            row: dict[str, Any] = {}
            if "group_index" in required:
                prompt = mb.group_index if mb.prompt_id is None else mb.prompt_id
                row["group_index"] = prompt + offset * world_size
            if "rewards" in required:
                row["rewards"] = mb.reward
            if "versions" in required:
                row["versions"] = torch.full((mb.num_completions,), mb.version, device=mb.completion_ids.device)
            if "current_version" in required:
                row["current_version"] = current
            fields.append(row)
        return fields

    def micro_steps(self, fields: list[dict[str, Any]]) -> Iterator[tuple[Rollout, Bool[Tensor, "N C"],
                                                                           dict[str, Any], bool]]:
        """``(micro_batch, loss_mask, its fields, is the step's last)`` for each micro-batch, in order (``fields``:
        :meth:`loss_fields`)."""
        last = len(self.micro_batches) - 1
        for i, row in enumerate(zip(self.micro_batches, self.loss_masks, fields, strict=True)):
            yield (*row, i == last)

    def counted_masks(self, loss: LossMasker, fields: list[dict[str, Any]]) -> list[Bool[Tensor, "N C"]]:
        """Per micro-batch, the tokens ``loss`` counts: :attr:`loss_masks` minus the tokens its rollout rejection
        drops (:meth:`rlzoo.losses.PolicyLoss.loss_mask`, verl's modified response mask), judged from the old and
        the sampler's log-probs stored with the rollout; :attr:`loss_masks` themselves without a rejection."""
        return [loss.loss_mask(mask, old_logprobs=mb.old_logprobs, rollout_logprobs=mb.rollout_logprobs,
                               versions=f.get("versions"), current_version=f.get("current_version"))
                for mb, mask, f in zip(self.micro_batches, self.loss_masks, fields, strict=True)]

    def normalizer(self, fields: list[dict[str, Any]], masks: list[Bool[Tensor, "N C"]], *,
                   world_size: int) -> Normalizer:
        """This rank's counts of the step (:meth:`rlzoo.Normalizer.from_masks` over ``masks``, the
        :meth:`counted_masks`, with the group and positive-reward counts when ``fields`` (:meth:`loss_fields`)
        hold their inputs, and :attr:`is_weight_sums`); sum them over the ranks
        (:meth:`~rlzoo.trainer.distributed.Distributed.normalizer`).

        ``num_sequences`` is every row, a row without a counted token (truncated under
        ``mask_truncated_completions``, rejected whole by a rollout rejection) included as 0: the seq-mean
        aggregations divide by the batch's rows as TRL 1.16's grpo / dr_grpo (``.mean()`` over the micro-batch)
        and verl 0.9.1's trainer (``global_batch_size`` = ``ppo_mini_batch_size * rollout.n``) do."""
        groups = [f["group_index"] for f in fields] if fields and "group_index" in fields[0] else None
        rewards = [f["rewards"] for f in fields] if fields and "rewards" in fields[0] else None
        normalizer = Normalizer.from_masks(*masks, group_index=groups, rewards=rewards,
                                           num_groups=self.num_groups * world_size if groups is not None else None)
        rows = torch.tensor(sum(m.shape[0] for m in masks), device=masks[0].device)
        normalizer = dataclasses.replace(normalizer, num_sequences=rows)
        if self.is_weight_sums is None:
            return normalizer
        total, number = self.is_weight_sums.to(masks[0].device).unbind()
        return dataclasses.replace(normalizer, is_weight_sum=total, num_is_weights=number)

    @property
    def num_tokens(self) -> float:
        """Prompt + completion tokens processed by this step."""
        return float(sum(mb.completion_mask.sum() + mb.prompt_mask.sum() for mb in self.micro_batches))

    def step_metrics(self, *, dist: Distributed, reward_names: Sequence[str], num_tokens: float,
                     reward_weights: Sequence[float] | None = None, overlong: Callable[[Tensor], Tensor] | None = None,
                     combined_is_sum: bool = True) -> dict[str, float]:
        """Rewards and completion lengths of a step's completions over every rank (names as TRL logs them).

        The ranks' completions are gathered in one all-gather and put in the order one process holds them (micro-batch
        by micro-batch: when a generation batch spans several steps, rank ``r`` holds the ``r``-th slice of each
        micro-batch), so the statistics are those of one process. ``reward`` and ``reward_std`` are TRL 1.16's: of
        the weighted sum of the reward functions' values (a None adds nothing; unscorable completions, every
        function None, are left out: NaN when none is left, as TRL; ``reward_std`` is 0 with one, as before, where
        TRL's nanstd gives NaN), plus the overlong penalty (a reward function in TRL), before GDPO's normalisation
        and the KL in the reward. Under ``sum_then_normalize`` it is the combined reward the batch was generated
        with (a batch restored mid-cycle after a change of ``reward_weights`` keeps its weights, as its advantages
        do); under ``normalize_then_sum`` it is recomputed with ``reward_weights``.
        ``frac_reward_zero_std`` is the fraction of the step's prompt groups without a learning signal: whose
        scored completions' combined rewards are all equal, or fewer than two (as dynamic sampling judges them;
        TRL's metric for groups of scored completions), each group found by its global prompt id (the loss's
        ``group_index``), whichever ranks and micro-batches hold its completions. Every rank must call it (it
        all-gathers).

        Args:
            dist: the process group context (one process: the statistics of this batch alone).
            reward_names: the reward functions' names, one per column of each micro-batch's ``rewards`` ``[N, K]``
                (``rewards/NAME/mean`` and ``rewards/NAME/std``, NaN-skipping as TRL's).
            num_tokens: this rank's prompt + completion tokens so far in the run; the metric is their sum over ranks.
            reward_weights: one weight per reward function (TRL's ``reward_weights``; normalize_then_sum only);
                None: all 1.
            overlong: the overlong penalty of completions of the given lengths (tokens), or None (normalize_then_sum
                only).
            combined_is_sum: the micro-batches' combined ``reward`` is the weighted sum plus the penalty
                (``sum_then_normalize``), so ``reward`` is logged from it; else (``normalize_then_sum``) from
                ``reward_weights`` and ``overlong``.

        Returns:
            ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``completions/*`` lengths (tokens) and clipped
            ratio, ``num_tokens``, and per reward function ``rewards/NAME/mean`` and ``rewards/NAME/std``.

        Raises:
            ValueError: ``reward_names`` does not name every column of the micro-batches' ``rewards``.
        """
        micro_batches, parts = self.micro_batches, []
        fields = self.loss_fields(frozenset({"group_index"}), world_size=dist.world_size)
        for k, (mb, field) in enumerate(zip(micro_batches, fields, strict=True)):  # one row per completion, float64
            columns = (mb.reward, mb.completion_mask.sum(-1), mb.is_truncated, torch.full_like(mb.reward, k),
                       field["group_index"])
            parts.append(torch.cat([torch.stack([c.double() for c in columns], 1), mb.rewards.double()], 1))
        rows = dist.all_gather(torch.cat(parts))
        rows = rows[torch.sort(rows[:, 3], stable=True).indices]  # one process's order: micro-batch by micro-batch
        values = rows[:, 5:].to(micro_batches[0].rewards.dtype).contiguous()  # [N, K], NaN: a function's None
        scored = scorable(values)
        reward = rows[:, 0].to(micro_batches[0].reward.dtype)
        lengths, truncated = rows[:, 1].float(), rows[:, 2].float()
        if combined_is_sum:  # what shape_rewards computed: the weighted sum (a None adds nothing) + the penalty
            total = reward[scored]
        else:
            weights = torch.ones(values.shape[1]) if reward_weights is None else torch.tensor(reward_weights)
            total = torch.nan_to_num(values, nan=0.0) @ weights.to(values)
            total = (total if overlong is None else total + overlong(lengths.to(total.dtype)))[scored]
        groups = torch.unique(rows[:, 4], return_inverse=True)[1]
        lowest = reward.new_full((int(groups.max()) + 1,), math.inf).scatter_reduce(
            0, groups, torch.where(scored, reward, math.inf), "amin")
        highest = reward.new_full(lowest.shape, -math.inf).scatter_reduce(
            0, groups, torch.where(scored, reward, -math.inf), "amax")
        few = groups.new_zeros(lowest.shape).scatter_add(0, groups, scored.long()) < 2  # scored per group
        metrics = {
            "reward": float(total.mean()) if total.numel() else math.nan,  # TRL's nanmean
            "reward_std": float(total.std()) if total.numel() > 1 else 0.0 if total.numel() else math.nan,
            "frac_reward_zero_std": float(((lowest == highest) | few).float().mean()),
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(truncated.mean()),
            "num_tokens": dist.reduce_floats({"num_tokens": num_tokens})["num_tokens"],
        }
        terminated = lengths[truncated == 0] if bool((truncated == 0).any()) else torch.zeros(1)  # TRL: 0 if none
        for stat in ("mean", "min", "max"):
            metrics[f"completions/{stat}_terminated_length"] = float(getattr(terminated, stat)())
        for name, column in zip(reward_names, values.T, strict=True):
            metrics[f"rewards/{name}/mean"] = float(torch.nanmean(column))
            metrics[f"rewards/{name}/std"] = float(nanstd(column))
        return metrics
