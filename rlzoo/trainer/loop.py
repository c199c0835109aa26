"""The training loop: generate when due, score, compute the loss, step, log, evaluate, checkpoint.

One optimizer step is ``gradient_accumulation_steps`` micro-steps. A generation batch is sampled every
``steps_per_generation * num_iterations`` micro-steps and consumed as ``steps_per_generation`` micro-batches,
``num_iterations`` times (TRL's GRPOTrainer cycle). All micro-batches of an optimizer step are gathered
before the first backward, so the loss of each is normalised by the counts of the whole optimizer-step
batch (:class:`rlzoo.Normalizer`): the accumulated gradient equals the full-batch gradient for every
aggregation.

The loop never looks at the loss's name: it reads ``loss.required_fields()`` to decide whether old,
reference or sampler log-probs and entropies are needed.
"""

import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlzoo.batch import Normalizer, PolicyBatch
from rlzoo.losses import PolicyLoss, get_loss, presets
from rlzoo.trainer.config import TrainConfig, save_config
from rlzoo.trainer.generation import HFGenerator, VLLMGenerator
from rlzoo.trainer.io import atomic_dir, atomic_write_text
from rlzoo.trainer.rollout import Rollout, completion_logprobs

__all__ = ["EvalResult", "Trainer", "evaluate", "greedy_accuracy", "train"]

log = logging.getLogger("rlzoo.train")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Greedy accuracy on the held-out set.

    Attributes:
        accuracy: mean score in [0, 1]; ci_low, ci_high: 95 % Wilson interval; n: problems scored.
        samples: a few (question, completion, score) triples for the log.
    """

    accuracy: float
    ci_low: float
    ci_high: float
    n: int
    samples: tuple[tuple[str, str, float], ...] = ()

    def __str__(self) -> str:
        return f"{100 * self.accuracy:.1f}% (95% CI {100 * self.ci_low:.1f}-{100 * self.ci_high:.1f}, n={self.n})"


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (scores in [0, 1] summed as successes)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available; use --device cpu or auto")
    return device


def _resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """``(parameter dtype, autocast dtype or None)`` of a ``TrainConfig.dtype`` on ``device``."""
    if name == "auto":
        name = "bf16-mixed" if device.type == "cuda" else "float32"
    if name == "bf16-mixed":
        return torch.float32, torch.bfloat16
    return getattr(torch, name), None


def _inference_dtype(name: str, device: torch.device) -> torch.dtype:
    """Parameter dtype for evaluation only (no optimizer): mixed precision loads the weights in bf16."""
    param, autocast = _resolve_precision(name, device)
    return autocast or param


def _enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Turn on transformers' activation (gradient) checkpointing, non-reentrant, and zero every dropout.

    transformers checkpoints a layer only in train mode, so the trainer switches the model to train mode for
    the differentiated forward pass (:meth:`Trainer._training_forward`); dropout must then be zero for the
    log-probs to equal the eval-mode ones (ratio exactly 1 on the first iteration). TRL does the same with
    ``disable_dropout``; attention dropout rates held as module attributes (``attention_dropout``) are zeroed too.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # transformers < 5.2x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def _merge_metrics(total: dict[str, float], metrics: dict[str, Any], share: float) -> None:
    """Fold one micro-batch's loss metrics into the step's: ``*/min`` and ``*/max`` by min / max, the others
    token-weighted (``share`` = the micro-batch's fraction of the step's counted tokens)."""
    for key, value in metrics.items():
        value = float(value)
        if key.endswith("/min"):
            total[key] = min(total.get(key, math.inf), value)
        elif key.endswith("/max"):
            total[key] = max(total.get(key, -math.inf), value)
        else:
            total[key] = total.get(key, 0.0) + share * value


class Trainer:
    """Trains a causal LM with a :class:`~rlzoo.losses.PolicyLoss` on a verifiable task.

    Args:
        config: the run's :class:`~rlzoo.trainer.TrainConfig`.
        loss: a loss composed in Python; default ``rlzoo.get_loss(config.algorithm, **config.loss)``.
        reward_funcs: extra reward callables with TRL's signature ``fn(prompts, completions, **columns)``,
            added after ``config.reward_funcs``.

    With ``loss`` given, ``config.algorithm`` is ignored (``config.json`` records the loss as built under
    ``resolved_loss``) and the advantage estimator is ``config.advantage`` or, if None, ``grpo``.

    Raises:
        UnknownNameError: unknown algorithm, advantage estimator, task or model (lists the valid names).
        ValueError: an invalid combination (e.g. an estimator that needs a value model).
    """

    def __init__(self, config: TrainConfig, *, loss: PolicyLoss | None = None,
                 reward_funcs: Sequence[Callable[..., list[float | None]]] = ()) -> None:
        from rlzoo.advantages import get_advantage
        from rlzoo.trainer.models import load_model
        from rlzoo.trainer.rewards import RewardSet
        from rlzoo.trainer.tasks import make_task

        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = _resolve_device(config.device)
        self.dtype, self.autocast_dtype = _resolve_precision(config.dtype, self.device)

        # The loss and the advantage estimator (from the preset's card unless overridden).
        if loss is None:
            card = presets.get(config.algorithm)
            overrides = {"max_completion_length": config.max_completion_length, **config.loss}
            loss = get_loss(config.algorithm, **overrides)
            advantage_name, advantage_options = card.advantage, dict(card.advantage_options)
        else:
            if config.loss:
                loss = loss.with_options(**config.loss)
            if loss.max_completion_length is None:
                loss = loss.with_options(max_completion_length=config.max_completion_length)
            advantage_name, advantage_options = "grpo", {}
        if config.advantage is not None:
            advantage_name, advantage_options = config.advantage, {}
        advantage_options.update(config.advantage_options)
        self.loss_fn = loss
        self.output_dir = Path(config.output_dir or self._default_output_dir())
        self.advantage_name = advantage_name
        self.advantage_fn = get_advantage(advantage_name, **advantage_options)
        unsupported = set(self.advantage_fn.needs) - {"completion_mask"}
        if unsupported:
            from rlzoo.advantages import advantage_estimators

            usable = [n for n, cls in advantage_estimators.items() if cls._needs <= {"completion_mask"}]
            raise ValueError(
                f"advantage estimator {advantage_name!r} needs {sorted(unsupported)}, which the trainer does not "
                f"provide (no value model / token rewards); choose one of {', '.join(usable)}"
            )
        required = self.loss_fn.required_fields()
        if "rollout_logprobs" in required and config.backend != "vllm":
            raise ValueError(
                "this loss needs rollout_logprobs (sampler log-probs, e.g. is_correction), which only the vllm "
                "backend provides; use --backend vllm or drop the option"
            )

        # Model, reference model, task, rewards, generator.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # checkpoint shard bars would interleave with the run's own
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        self.model, self.tokenizer = load_model(config.model, dtype=self.dtype, device=self.device)
        self.model.eval()  # dropout off: the ratio must be exactly 1 on the first iteration
        if config.gradient_checkpointing:
            _enable_activation_checkpointing(self.model)
        self.share_prefix = config.share_prompt_prefix and not config.gradient_checkpointing
        self.ref_model = None
        if "ref_logprobs" in required:
            self.ref_model = copy.deepcopy(self.model).requires_grad_(False)
        self.task = make_task(
            config.task, config.resolved_task_kwargs, train_seed=config.train_seed, eval_seed=config.eval_seed,
            eval_size=config.eval_size, answer_extraction=config.answer_extraction,
            exclude_eval_questions=config.exclude_eval_questions,
        )
        self.rewards = RewardSet(
            list(config.reward_funcs) + list(reward_funcs), weights=config.reward_weights, task=self.task,
        )
        if config.backend == "vllm":
            self.generator = VLLMGenerator(
                self.model, self.tokenizer, max_completion_length=config.max_completion_length,
                temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                gpu_memory_utilization=config.vllm_gpu_memory_utilization, seed=config.seed,
                max_prompt_length=config.max_prompt_length, dtype=self.autocast_dtype or self.dtype,
            )
        else:
            self.generator = HFGenerator(
                self.tokenizer, max_completion_length=config.max_completion_length, temperature=config.temperature,
                top_p=config.top_p, top_k=config.top_k, max_prompt_length=config.max_prompt_length,
                share_prefix=self.share_prefix,
            )
        self.eval_generator = HFGenerator(
            self.tokenizer, max_completion_length=config.max_completion_length,
            max_prompt_length=config.max_prompt_length, share_prefix=False,
        )

        # Optimizer and schedule.
        from transformers import get_scheduler

        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2), weight_decay=config.weight_decay,
        )
        schedule = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[config.lr_scheduler]
        self.scheduler = get_scheduler(schedule, self.optimizer, num_warmup_steps=config.warmup_steps,
                                       num_training_steps=max(1, config.max_steps))

        # Loop state (all of it goes into checkpoints).
        self.step = 0
        self.micro_step = 0
        self.buffer: list[Rollout] = []
        self.shuffle_generator = torch.Generator().manual_seed(config.seed)
        self.history: list[dict[str, Any]] = []
        self.with_entropy = "entropies" in required or config.log_entropy

    # --------------------------------------------------------------------------------------------- helpers
    def _default_output_dir(self) -> str:
        task = Path(self.config.task).stem if self.config.task.endswith(".jsonl") else self.config.task
        name = self.loss_fn.name or "custom"
        return os.path.join("runs", f"{name}-{task}-{time.strftime('%Y%m%d-%H%M%S')}")

    def _logprobs(self, model: torch.nn.Module, r: Rollout, *, with_entropy: bool = False):
        return completion_logprobs(
            model, prompt_ids=r.prompt_ids, prompt_mask=r.prompt_mask, group_index=r.group_index,
            completion_ids=r.completion_ids, completion_mask=r.completion_mask,
            temperature=self.config.temperature, share_prefix=self.share_prefix,
            fused=self.config.logprobs_backend == "fused", with_entropy=with_entropy,
        )

    def _loss_mask(self, rollout: Rollout) -> torch.Tensor:
        """Tokens the loss counts: the completion mask, minus truncated completions when asked (DAPO)."""
        if self.config.mask_truncated_completions:
            return rollout.completion_mask & ~rollout.is_truncated[:, None]
        return rollout.completion_mask

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around forward passes in mixed precision (fp32 weights); a no-op otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def _training_forward(self) -> Any:
        """With gradient checkpointing, the model is in train mode for the forward pass that is
        differentiated (transformers only checkpoints in train mode; dropout was zeroed at start)."""
        if not self.config.gradient_checkpointing:
            yield
            return
        self.model.train()
        try:
            yield
        finally:
            self.model.eval()

    @torch.no_grad()
    def _score_logprobs(self, model: torch.nn.Module, rollout: Rollout) -> torch.Tensor:
        """Log-probs of a whole generation batch without gradients, one micro-batch at a time."""
        size = self.config.per_device_train_batch_size
        with self._autocast():
            parts = [self._logprobs(model, rollout.select(torch.arange(i, min(i + size, rollout.num_completions))))[0]
                     for i in range(0, rollout.num_completions, size)]
        width = rollout.completion_ids.shape[1]
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts])

    # ------------------------------------------------------------------------------------------ generation
    def generate_batch(self) -> tuple[Rollout, dict[str, float]]:
        """Sample, score and compute advantages for one generation batch (with DAPO dynamic sampling)."""
        cfg, g = self.config, self.config.num_generations
        need = cfg.prompts_per_generation
        kept: list[tuple[Any, Any, torch.Tensor, torch.Tensor]] = []
        dropped: list[tuple[Any, Any, torch.Tensor, torch.Tensor]] = []
        rounds, t0 = 0, time.perf_counter()
        while len(kept) < need and rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            rounds += 1
            items = self.task.next_train(need)
            prompts = [self.task.prompt(self.tokenizer, item, system_prompt=cfg.system_prompt) for item in items]
            with self._autocast():
                gen = self.generator.generate(self.model, prompts, g)
            lengths = gen.completion_mask.sum(-1).tolist()  # the mask is a prefix of each row
            completion_ids = [row[:n] for row, n in zip(gen.completion_ids.tolist(), lengths, strict=True)]
            values = self.rewards.compute(prompts=[p for p in prompts for _ in range(g)], completions=gen.texts,
                                          items=[item for item in items for _ in range(g)],
                                          completion_ids=completion_ids)
            reward = self._combine(values, gen)
            for i in range(len(items)):
                sl = slice(i * g, (i + 1) * g)
                group = (gen, i, values[sl], reward[sl])
                if cfg.dynamic_sampling and bool(torch.all(reward[sl] == reward[sl][0])):
                    dropped.append(group)
                else:
                    kept.append(group)
        if len(kept) < need:  # dynamic sampling gave up: fill with zero-variance groups (zero advantage)
            log.warning("dynamic sampling kept %d/%d groups after %d rounds; filling with zero-variance groups",
                        len(kept), need, rounds)
            kept += dropped[: need - len(kept)]
        rollout = self._assemble(kept[:need])
        extra = {"completion_mask": rollout.completion_mask} if "completion_mask" in self.advantage_fn.accepts else {}
        rollout.advantages = self.advantage_fn(rollout.reward, group_size=g, **extra).to(torch.float32)
        gen_time = time.perf_counter() - t0
        if cfg.old_logprobs_needed:
            rollout.old_logprobs = self._score_logprobs(self.model, rollout)
        if self.ref_model is not None:
            rollout.ref_logprobs = self._score_logprobs(self.ref_model, rollout)
        stats = {"generation_time": gen_time}
        if cfg.dynamic_sampling:
            stats.update({"dynamic_sampling/rounds": float(rounds),
                          "dynamic_sampling/groups_dropped": float(len(dropped))})
        return rollout, stats

    def _combine(self, values: torch.Tensor, gen) -> torch.Tensor:
        """Combined reward ``[N]`` from per-function rewards ``[N, K]`` (+ DAPO's soft overlong punishment)."""
        from rlzoo.advantages import combine_rewards

        cfg = self.config
        unscorable = torch.isnan(values).all(dim=1)
        if cfg.multi_reward_aggregation == "normalize_then_sum" and bool(torch.isnan(values).any()):
            raise ValueError("a reward function returned None; multi_reward_aggregation='normalize_then_sum' "
                             "needs every reward of every completion")
        if bool(unscorable.any()):  # TRL: every function returned None; such completions get reward 0 here
            log.warning("%d completions were unscorable (every reward function returned None): reward 0",
                        int(unscorable.sum()))
        values = torch.nan_to_num(values, nan=0.0)
        reward = combine_rewards(values, weights=self.rewards.weights, mode=cfg.multi_reward_aggregation,
                                 group_size=cfg.num_generations)
        if cfg.overlong_buffer > 0:
            lengths = gen.completion_mask.sum(-1).to(reward.dtype)
            start = cfg.max_completion_length - cfg.overlong_buffer
            penalty = ((start - lengths) / cfg.overlong_buffer).clamp(max=0.0, min=-1.0) * cfg.overlong_penalty
            reward = reward + penalty
        return reward

    def _assemble(self, groups: list[tuple[Any, int, torch.Tensor, torch.Tensor]]) -> Rollout:
        """Concatenate kept groups (possibly from several generation rounds) into one rollout."""
        g = self.config.num_generations
        width_p = max(gen.prompt_ids.shape[1] for gen, *_ in groups)
        width_c = max(gen.completion_ids.shape[1] for gen, *_ in groups)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        def left(x: torch.Tensor, width: int, value: int | bool) -> torch.Tensor:
            return torch.nn.functional.pad(x, (width - x.shape[-1], 0), value=value)

        def right(x: torch.Tensor, width: int, value: float | bool) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)

        prompt_ids, prompt_mask, comp_ids, comp_mask, trunc, texts, values, rewards, rollout_lp = ([] for _ in range(9))
        for gen, i, vals, rew in groups:
            prompt_ids.append(left(gen.prompt_ids[i], width_p, pad))
            prompt_mask.append(left(gen.prompt_mask[i], width_p, False))
            sl = slice(i * g, (i + 1) * g)
            comp_ids.append(right(gen.completion_ids[sl], width_c, pad))
            comp_mask.append(right(gen.completion_mask[sl], width_c, False))
            trunc.append(gen.is_truncated[sl])
            texts += gen.texts[sl]
            values.append(vals)
            rewards.append(rew)
            if gen.rollout_logprobs is not None:
                rollout_lp.append(right(gen.rollout_logprobs[sl], width_c, 0.0))
        n_prompts = len(groups)
        return Rollout(
            prompt_ids=torch.stack(prompt_ids), prompt_mask=torch.stack(prompt_mask),
            group_index=torch.arange(n_prompts, device=self.device).repeat_interleave(g),
            completion_ids=torch.cat(comp_ids), completion_mask=torch.cat(comp_mask),
            is_truncated=torch.cat(trunc), rewards=torch.cat(values), reward=torch.cat(rewards),
            advantages=torch.zeros(n_prompts * g), texts=texts,
            rollout_logprobs=torch.cat(rollout_lp) if rollout_lp else None,
        )

    # ------------------------------------------------------------------------------------------- training
    def _micro_batches(self) -> tuple[list[Rollout], dict[str, float]]:
        """The micro-batches of the next optimizer step, generating new batches when the cycle says so."""
        cfg = self.config
        spg = cfg.effective_steps_per_generation
        period = spg * cfg.num_iterations
        out, stats = [], {}
        for _ in range(cfg.gradient_accumulation_steps):
            if self.micro_step % period == 0 or not self.buffer:
                rollout, stats = self.generate_batch()
                self.buffer = rollout.split(spg, generator=self.shuffle_generator, group_size=cfg.num_generations)
            out.append(self.buffer[self.micro_step % spg])
            self.micro_step += 1
        return out, stats

    def train_step(self) -> dict[str, Any]:
        """One optimizer step; returns its metrics."""
        t0 = time.perf_counter()
        micro_batches, gen_stats = self._micro_batches()
        t1 = time.perf_counter()
        loss_masks = [self._loss_mask(mb) for mb in micro_batches]
        normalizer = Normalizer.from_masks(*loss_masks)
        metrics_sum: dict[str, float] = {}
        loss_total = 0.0
        for mb, loss_mask in zip(micro_batches, loss_masks, strict=True):
            with self._autocast(), self._training_forward():
                logprobs, entropies = self._logprobs(self.model, mb, with_entropy=self.with_entropy)
            batch = PolicyBatch(
                logprobs=logprobs, advantages=mb.advantages, completion_mask=loss_mask,
                old_logprobs=mb.old_logprobs, ref_logprobs=mb.ref_logprobs, rollout_logprobs=mb.rollout_logprobs,
                entropies=entropies,
            )
            out = self.loss_fn(batch, normalizer=normalizer)
            out.loss.backward()
            loss_total += float(out.loss.detach())
            share = float(loss_mask.sum()) / max(1.0, float(normalizer.num_tokens))
            _merge_metrics(metrics_sum, out.metrics, share)
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not (math.isfinite(loss_total) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"step {self.step + 1}: the loss ({loss_total}) or the gradient norm ({grad_norm}) is not finite; "
                "the optimizer step was not taken and the model is unchanged. Lower --learning-rate, check the "
                "loss options (e.g. a huge clip bound), or use --dtype float32; resume from the last checkpoint "
                "with --resume latest"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.generator.sync_weights(self.model)
        self.step += 1
        t2 = time.perf_counter()

        reward = torch.cat([mb.reward for mb in micro_batches])
        lengths = torch.cat([mb.completion_mask.sum(-1) for mb in micro_batches]).float()
        truncated = torch.cat([mb.is_truncated for mb in micro_batches]).float()
        g = self.config.num_generations
        grouped = reward.view(-1, g) if reward.numel() % g == 0 else reward.view(1, -1)
        tokens = float(sum(mb.completion_mask.sum() + mb.prompt_mask.sum() for mb in micro_batches))
        metrics: dict[str, Any] = {
            "step": self.step,
            "loss": loss_total,
            "reward": float(reward.mean()),
            "reward_std": float(reward.std()) if reward.numel() > 1 else 0.0,
            "frac_reward_zero_std": float((grouped.std(-1) == 0).float().mean()) if grouped.shape[1] > 1 else 1.0,
            "completions/mean_length": float(lengths.mean()),
            "completions/min_length": float(lengths.min()),
            "completions/max_length": float(lengths.max()),
            "completions/clipped_ratio": float(truncated.mean()),
            "grad_norm": grad_norm,  # before clipping
            "learning_rate": lr,
            "step_time": t2 - t0,
            "generation_time": gen_stats.get("generation_time", 0.0),
            "train_time": t2 - t1,
            "tokens_per_second": tokens / max(1e-9, t2 - t0),
        }
        for name, column in zip(self.rewards.names, torch.cat([mb.rewards for mb in micro_batches]).T, strict=True):
            metrics[f"rewards/{name}/mean"] = float(torch.nanmean(column))
        metrics.update({k: v for k, v in gen_stats.items() if k != "generation_time"})
        metrics.update(metrics_sum)
        return metrics

    # ---------------------------------------------------------------------------------------------- eval
    def evaluate(self, limit: int | None = None) -> EvalResult:
        """Greedy accuracy on the held-out set (``limit`` problems at most)."""
        with self._autocast():
            return greedy_accuracy(self.model, self.tokenizer, self.task, self.eval_generator,
                                   batch_size=self.config.eval_batch_size, system_prompt=self.config.system_prompt,
                                   limit=limit)

    # --------------------------------------------------------------------------------------------- loop
    def train(self) -> list[dict[str, Any]]:
        """Run to ``max_steps`` (resuming if asked); returns the per-step metrics."""
        from rlzoo.trainer.metrics import MetricsLog

        cfg = self.config
        if cfg.resume:
            self.load_checkpoint(self._find_checkpoint(cfg.resume))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.output_dir / "config.json",
                    extra={"resolved_loss": self.loss_fn.to_config(), "resolved_advantage": self.advantage_name,
                           "resolved_task_kwargs": cfg.resolved_task_kwargs,
                           "resolved_steps_per_generation": cfg.effective_steps_per_generation,
                           "resolved_device": str(self.device),
                           "resolved_dtype": str(self.dtype).removeprefix("torch."),
                           "resolved_autocast_dtype": (str(self.autocast_dtype).removeprefix("torch.")
                                                       if self.autocast_dtype else None),
                           "output_dir": str(self.output_dir)})
        metrics_log = MetricsLog(self.output_dir, self.history)
        precision = str(self.dtype).removeprefix("torch.") + (" + bf16 autocast" if self.autocast_dtype else "")
        log.info("run dir %s | loss %s | advantage %s | device %s %s", self.output_dir,
                 self.loss_fn.name or "custom", self.advantage_name, self.device, precision)
        if self.step == 0 and cfg.eval_size > 0:
            result = self.evaluate()
            log.info("step 0 held-out greedy accuracy %s", result)
            metrics_log.add({"step": 0, "eval/accuracy": result.accuracy, "eval/ci_low": result.ci_low,
                             "eval/ci_high": result.ci_high})
        bar, redirect = None, contextlib.nullcontext()
        if cfg.progress:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            bar = tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True)
            redirect = logging_redirect_tqdm()  # the root logger: records print once, above the bar
        last_acc = next((m["eval/accuracy"] for m in reversed(self.history) if "eval/accuracy" in m), None)
        with redirect:
            while self.step < cfg.max_steps:
                last_acc = self._step_and_log(metrics_log, bar, last_acc)
        if bar is not None:
            bar.close()
        metrics_log.plot()
        return self.history

    def _step_and_log(self, metrics_log: Any, bar: Any, last_acc: float | None) -> float | None:
        """One optimizer step, then evaluation / metrics / checkpoint / progress as due."""
        cfg = self.config
        metrics = self.train_step()
        final = self.step == cfg.max_steps
        if cfg.eval_size > 0 and (final or (cfg.eval_steps and self.step % cfg.eval_steps == 0)):
            result = self.evaluate()
            metrics.update({"eval/accuracy": result.accuracy, "eval/ci_low": result.ci_low,
                            "eval/ci_high": result.ci_high})
            last_acc = result.accuracy
            log.info("step %d held-out greedy accuracy %s", self.step, result)
        metrics_log.add(metrics)
        if final or (cfg.save_steps and self.step % cfg.save_steps == 0):
            self.save_checkpoint()
            if not final:  # train() plots at the end
                metrics_log.plot()  # a run that stops later still has its plot up to here
        log.info("step %d/%d loss %+.4f reward %.3f len %.1f %.1fs", self.step, cfg.max_steps, metrics["loss"],
                 metrics["reward"], metrics["completions/mean_length"], metrics["step_time"])
        if bar is not None:
            postfix = {"reward": f"{metrics['reward']:.3f}", "step_s": f"{metrics['step_time']:.1f}"}
            if last_acc is not None:
                postfix["acc"] = f"{100 * last_acc:.1f}%"
            bar.set_postfix(postfix)
            bar.update(1)
        return last_acc

    # ------------------------------------------------------------------------------------------ checkpoints
    def _checkpoint_dir(self, step: int) -> Path:
        return self.output_dir / "checkpoints" / f"step-{step:06d}"

    def _find_checkpoint(self, resume: str) -> Path:
        if resume != "latest":
            return Path(resume)
        root = self.output_dir / "checkpoints"
        found = sorted(p for p in root.glob("step-*") if p.is_dir()) if root.is_dir() else []
        if not found:
            raise FileNotFoundError(f"--resume latest: no checkpoint under {root}; pass --output-dir of the run")
        return found[-1]

    def save_checkpoint(self) -> Path:
        """Write model, optimizer, scheduler, RNG and loop state atomically; prune old checkpoints."""
        from rlzoo.trainer.models import save_pretrained_atomic

        path = self._checkpoint_dir(self.step)
        with atomic_dir(path) as tmp:
            save_pretrained_atomic(self.model, self.tokenizer, tmp / "model")
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                       tmp / "optimizer.pt")
            torch.save({
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "python": random.getstate(),
                "shuffle": self.shuffle_generator.get_state(),
            }, tmp / "rng.pt")
            torch.save({"buffer": [r.state_dict() for r in self.buffer]}, tmp / "buffer.pt")
            state = {"step": self.step, "micro_step": self.micro_step, "task": self.task.state_dict(),
                     "history": self.history}
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
        checkpoints = sorted(p for p in path.parent.glob("step-*") if p.is_dir())
        for old in checkpoints[: -self.config.save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore everything :meth:`save_checkpoint` wrote (the reference model stays the initial one)."""
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{path} is not an rlzoo checkpoint (no trainer_state.json)")
        weights = {}
        for shard in sorted((path / "model").glob("*.safetensors")):
            weights.update(load_file(str(shard), device=str(self.device)))
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if k not in self._tied_parameter_names()]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
        opt = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        random.setstate(rng["python"])
        self.shuffle_generator.set_state(rng["shuffle"])
        buffer = torch.load(path / "buffer.pt", map_location=self.device, weights_only=False)["buffer"]
        self.buffer = [Rollout(**state) for state in buffer]
        state = json.loads((path / "trainer_state.json").read_text())
        self.step, self.micro_step = state["step"], state["micro_step"]
        self.task.load_state_dict(state["task"])
        self.history = [m for m in state["history"] if m.get("step", 0) <= self.step]
        log.info("resumed from %s at step %d", path, self.step)

    def _tied_parameter_names(self) -> set[str]:
        keys = getattr(self.model, "_tied_weights_keys", None) or []
        return set(keys if isinstance(keys, (list, tuple, set)) else keys.keys())


@torch.no_grad()
def greedy_accuracy(model: torch.nn.Module, tokenizer: Any, task: Any, generator: HFGenerator, *, batch_size: int,
                    system_prompt: str | None = None, limit: int | None = None) -> EvalResult:
    """Greedy-decode the task's held-out problems in batches and score them with the task's scorer."""
    items = list(task.eval_items)[:limit]
    scores: list[float] = []
    samples: list[tuple[str, str, float]] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        prompts = [task.prompt(tokenizer, item, system_prompt=system_prompt) for item in chunk]
        gen = generator.generate(model, prompts, 1, greedy=True)
        for item, text in zip(chunk, gen.texts, strict=True):
            score = float(task.score(text, item))
            scores.append(score)
            if len(samples) < 3:
                samples.append((task.question(item), text, score))
    n = len(scores)
    low, high = wilson_interval(sum(scores), n)
    return EvalResult(accuracy=sum(scores) / n if n else float("nan"), ci_low=low, ci_high=high, n=n,
                      samples=tuple(samples))


def evaluate(config: TrainConfig) -> EvalResult:
    """Greedy held-out accuracy of ``config.model`` on ``config.task`` (what ``rlzoo eval`` prints)."""
    from rlzoo.trainer.models import load_model
    from rlzoo.trainer.tasks import make_task

    if config.eval_size < 1:
        raise ValueError(f"eval_size must be >= 1 to evaluate, got {config.eval_size}")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = _resolve_device(config.device)
    model, tokenizer = load_model(config.model, dtype=_inference_dtype(config.dtype, device), device=device)
    model.eval()
    task = make_task(config.task, config.resolved_task_kwargs, train_seed=config.train_seed,
                     eval_seed=config.eval_seed, eval_size=config.eval_size,
                     answer_extraction=config.answer_extraction,
                     exclude_eval_questions=config.exclude_eval_questions)
    generator = HFGenerator(tokenizer, max_completion_length=config.max_completion_length,
                            max_prompt_length=config.max_prompt_length, share_prefix=False)
    return greedy_accuracy(model, tokenizer, task, generator, batch_size=config.eval_batch_size,
                           system_prompt=config.system_prompt)


def train(config: TrainConfig, **kwargs: Any) -> list[dict[str, Any]]:
    """Build a :class:`Trainer` and run it; returns the per-step metrics (also in ``metrics.jsonl``)."""
    return Trainer(config, **kwargs).train()


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Atomic JSON write."""
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")
