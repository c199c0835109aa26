"""The optimizer step: AdamW, the learning-rate schedule, gradient clipping and the non-finite guard."""

import math
from collections.abc import Mapping
from typing import Any

import torch

from rlzoo.trainer.config import OptimizerConfig

__all__ = ["OptimizerStep"]

_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class OptimizerStep:
    """AdamW over the trainable parameters with transformers' warmup + constant / linear / cosine schedule.

    Args:
        config: the optimizer section.
        model: the policy as the ranks hold it (``ParallelModel.module``: under FSDP2 its parameters are the
            shards); only parameters with ``requires_grad`` are optimized.
        max_steps: the run's length in optimizer steps (the schedule's horizon).

    Attributes:
        optimizer: ``torch.optim.AdamW``.
        scheduler: a ``torch.optim.lr_scheduler.LambdaLR`` from ``transformers.get_scheduler``.
    """

    def __init__(self, config: OptimizerConfig, model: torch.nn.Module, *, max_steps: int) -> None:
        self.config = config
        self.max_steps = max_steps
        trained = [p for p in model.parameters() if p.requires_grad]
        if any(p.dtype == torch.float16 for p in trained):
            raise ValueError("--dtype float16 trains float16 parameters, which AdamW cannot update (its eps 1e-8 is 0 "
                             "in float16: the first step makes the weights inf or NaN); use --dtype bf16-mixed (a GPU), "
                             "bfloat16 or float32, or train a LoRA adapter (--peft.r N: peft keeps it in float32)")
        self.optimizer = torch.optim.AdamW(
            trained, lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2), weight_decay=config.weight_decay,
        )
        self.scheduler = self._schedule(completed_steps=0)

    def _schedule(self, completed_steps: int) -> Any:
        """A scheduler positioned after ``completed_steps`` optimizer steps (its rate is the next step's)."""
        from transformers import get_scheduler

        extra = {} if completed_steps == 0 else {"scheduler_specific_kwargs": {"last_epoch": completed_steps - 1}}
        return get_scheduler(_SCHEDULES[self.config.lr_scheduler], self.optimizer,
                             num_warmup_steps=self.config.warmup_steps, num_training_steps=max(1, self.max_steps),
                             **extra)

    def step(self, model: torch.nn.Module, *, loss: float, step: int) -> dict[str, float]:
        """Clip the accumulated gradients, take the optimizer and schedule steps, zero the gradients.

        Args:
            model: the policy whose gradients were accumulated.
            loss: the step's loss (checked for finiteness with the gradient norm).
            step: the number of the step being taken (1-based; for the error message).

        Returns:
            ``grad_norm`` (before clipping) and ``learning_rate`` (the rate this step used).

        Raises:
            FloatingPointError: the loss or the gradient norm is not finite; the step is not taken (the model is
                unchanged) and the gradients are dropped.
        """
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        grad_norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)  # FSDP2: a DTensor
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"step {step}: the loss ({loss}) or the gradient norm ({grad_norm}) is not finite; "
                "the optimizer step was not taken and the model is unchanged. Lower --learning-rate, check the "
                "loss options (e.g. a huge clip bound), or, in bf16 or fp16 (--dtype), use --dtype float32; resume "
                "from the last checkpoint, if the run saved one, with --resume latest (else start again)"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "learning_rate": lr}

    def scheduler_state(self) -> dict[str, Any]:
        """The schedule's state (for checkpoints; the optimizer's own state is saved with the model, sharded)."""
        return self.scheduler.state_dict()

    def restore(self, scheduler_state: Mapping[str, Any], *, completed_steps: int, reschedule: bool = False) -> None:
        """After a checkpoint's optimizer state (AdamW moments) was loaded: restore its schedule, or apply this
        config's settings.

        Args:
            scheduler_state: from :meth:`scheduler_state`.
            completed_steps: optimizer steps the checkpoint had taken.
            reschedule: the settings changed since the checkpoint: this config's learning rate, betas and
                weight decay are put in the restored optimizer, and the schedule is rebuilt from this config
                (schedule, warmup, horizon) at ``completed_steps``; else the saved schedule is restored as is.
        """
        if not reschedule:
            self.scheduler.load_state_dict(scheduler_state)
            return
        for group in self.optimizer.param_groups:
            group.update(lr=self.config.learning_rate, initial_lr=self.config.learning_rate,
                         betas=(self.config.adam_beta1, self.config.adam_beta2), weight_decay=self.config.weight_decay)
        self.scheduler = self._schedule(completed_steps)
