"""The trainer: builds the run's components from their config sections (:mod:`rlzoo.trainer.components`) and runs
the training loop.

One optimizer step: the rollout source hands over the step's micro-batches (generating when the cycle says so); one
:class:`rlzoo.Normalizer` holds the counts of the whole step over every rank (one all-reduce), so the accumulated
gradient equals the full-batch gradient for every aggregation and world size; each micro-batch is scored, its loss
computed and backpropagated; the optimizer steps; evaluation, metrics and checkpoints follow when due (the last step's
checkpoint before its evaluation, which may take minutes; that checkpoint carries the step's metrics row, which a
resume writes if a signal, an error or a kill stopped the evaluation). The loop never looks at the loss's name: the
loss says which inputs it needs (``loss.required_fields()``), the estimator which it uses.

Under torchrun every rank runs this loop on its share of the batch; rank 0 alone writes the run directory
(config, metrics, plot, lock), and every rank takes part in checkpoints (DCP).
"""

import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rlzoo.batch import Normalizer
from rlzoo.losses import PolicyLoss
from rlzoo.trainer.adapters import recorded_peft
from rlzoo.trainer.algorithm import build_loss
from rlzoo.trainer.checkpoint import rank_states, rng_state, run_of, set_rng_state
from rlzoo.trainer.components import build_components, build_models, check_loss_inputs
from rlzoo.trainer.config import AlgorithmConfig, ModelConfig, TaskConfig, TrackingConfig, TrainConfig
from rlzoo.trainer.distributed import init_distributed
from rlzoo.trainer.evaluation import EvalResult, evaluate
from rlzoo.trainer.inert_options import warn_inert_options
from rlzoo.trainer.interrupts import GracefulInterrupt, RunInterrupted
from rlzoo.trainer.metrics import LossMetrics, has_row
from rlzoo.trainer.mid_cycle import check_mid_cycle_changes
from rlzoo.trainer.models import recorded_model
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.resume import (
    OPTIMIZER_SETTINGS,
    PYTHON_LOSS,
    PYTHON_REWARDS,
    check_resume,
    check_run_length,
    compare_settings,
    find_checkpoint,
    log_setting_changes,
    loss_summary,
    saved_settings,
)
from rlzoo.trainer.run_config import absolute_paths, resolved_settings
from rlzoo.trainer.run_dir import RunDirectory, default_output_dir, timeline_rows
from rlzoo.trainer.step_batch import OptimizerStepBatch
from rlzoo.trainer.tasks import build_task, check_python_dataset, recorded_task
from rlzoo.trainer.trackers import Trackers

__all__ = ["EvalResult", "Trainer", "build_loss", "evaluate", "train"]

log = logging.getLogger("rlzoo.train")


class Trainer:
    """Trains a causal LM with a :class:`~rlzoo.losses.PolicyLoss` on a verifiable task.

    Args:
        config: the run's :class:`~rlzoo.trainer.TrainConfig`, or a dict of its fields (checked as a config file's).
        loss: a loss composed in Python; default ``rlzoo.get_loss(config.algorithm, **config.loss)``.
        reward_funcs: extra reward functions, one or a list, added after ``config.reward_funcs``: callables with
            TRL's signature ``fn(prompts, completions, **columns)``, sequence-classification models
            (``PreTrainedModel``), :class:`~rlzoo.trainer.rewards.RewardModel` s, or names as ``--reward-funcs``
            takes them (a built-in, ``module:function``, a reward model's id), as TRL's ``reward_funcs``.
        model, tokenizer: a model object (a ``PreTrainedModel`` or ``PeftModel``) and its tokenizer, instead of
            loading ``config.model``.
        peft_config: a ``peft.LoraConfig`` (or another PEFT config) to train an adapter (instead of ``--peft``).
        train_dataset, eval_dataset: a ``datasets.Dataset`` / ``IterableDataset`` to train on instead of
            ``config.task`` (columns from ``config.task_kwargs``), and its held-out set (default: a seeded split).

    With ``loss`` given, ``config.algorithm`` is ignored (``config.json`` records the loss as built under
    ``resolved_loss``) and the advantage estimator is ``config.advantage`` or, if None, ``grpo``.

    Attributes:
        model, tokenizer: the policy (the Hugging Face model) and its tokenizer.
        policy, reference: the policy and the frozen reference (None unless the loss needs reference log-probs)
            as the ranks hold them (:class:`~rlzoo.trainer.parallel.ParallelModel`: plain, DDP or FSDP2; for an
            adapter run the reference is :class:`~rlzoo.trainer.adapters.AdapterDisabled`).
        teacher: the ``--teacher`` model as the ranks hold it, or None.
        rollouts, scorer, optimizer, evaluator, checkpointer, logger, run_dir, dist: the run's components.
        step: optimizer steps taken.

    Raises:
        UnknownNameError: unknown algorithm, advantage estimator, task or model (lists the valid names).
        ValueError: an invalid combination (e.g. an estimator that needs a value model).
        FileExistsError: a fresh run into an output directory that holds a run (names --resume and --overwrite).
        OSError: an output directory that cannot be written (checked before the model loads).
    """

    def __init__(self, config: TrainConfig | Mapping[str, Any], *, loss: PolicyLoss | None = None,
                 reward_funcs: Callable[..., Any] | str | Sequence[Callable[..., Any] | str] = (), model: Any = None,
                 tokenizer: Any = None, peft_config: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None) -> None:
        import datasets
        from transformers.utils import logging as hf_logging

        self.config = config = TrainConfig.from_dict(absolute_paths(config))  # config.json works anywhere
        if callable(reward_funcs) or isinstance(reward_funcs, str):  # one function, as TRL's reward_funcs takes it
            reward_funcs = [reward_funcs]
        check_python_dataset("train_dataset", train_dataset)  # before anything loads
        check_python_dataset("eval_dataset", eval_dataset)
        torch.set_num_threads(config.num_threads or torch.get_num_threads())  # 0: torch's default
        self.dist = dist = init_distributed(timeout_s=config.distributed_timeout, device=config.device,
                                            shard=config.parallelism == "fsdp")
        self.precision = Precision.resolve(config.section(ModelConfig), local_rank=dist.local_rank)
        self._python_loss = loss is not None  # checkpoints record it: `algorithm` alone would rebuild another
        self.loss_fn, advantage_fn, self.advantage_name = build_loss(
            config.section(AlgorithmConfig), loss, max_completion_length=config.max_completion_length,
            normalize_then_sum=config.multi_reward_aggregation == "normalize_then_sum")
        if dist.is_main:  # --kl-coef without --use-kl-in-reward, --loss.X of a part that is off: warned, run goes on
            warn_inert_options(config, self.loss_fn)
        self.required = self.loss_fn.required_fields()
        score_old = check_loss_inputs(config, self.loss_fn, dist=dist, precision=self.precision)
        output_dir = config.output_dir or dist.broadcast_object(default_output_dir(
            self.loss_fn.name, config.task, python_dataset=train_dataset is not None))
        self.run_dir = RunDirectory(output_dir, overwrite=config.overwrite, resume=config.resume)
        # the data set, model and adapter options a run trains with are what it records (a resume compares them)
        self.config = config = dataclasses.replace(config, task=recorded_task(config.task, train_dataset),
                                                   model=recorded_model(config.model, model), peft=recorded_peft(
                                                       config.peft, peft_config, resuming=config.resume is not None))
        refusal = None
        if dist.is_main:
            try:
                self.run_dir.check()  # before the model loads: an unwritable or occupied directory fails in seconds
                Trackers.check(config.section(TrackingConfig))  # so does a tracker that cannot start
                check_resume(self.run_dir.checkpoints, config, world_size=dist.world_size)  # and a refused resume
            except (OSError, ValueError, ImportError) as err:
                refusal = err
        refusal = dist.broadcast_object(refusal)  # every rank stops with rank 0's refusal: none waits in a collective
        if refusal is not None:
            raise refusal
        hf_logging.disable_progress_bar()  # checkpoint shard bars would interleave with the run's own
        datasets.disable_progress_bars()
        task = build_task(config.section(TaskConfig), train_dataset=train_dataset,  # bad data fails before the
                          eval_dataset=eval_dataset)  # model loads (a hub download, a GGUF conversion)
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        models = build_models(config, self.loss_fn, dist=dist, precision=self.precision, model=model,
                              tokenizer=tokenizer, peft_config=peft_config)
        self.model, self.tokenizer, self.policy = models.model, models.tokenizer, models.policy
        self.reference, self.teacher = models.reference, models.teacher
        parts = build_components(config, models, self.loss_fn, advantage_fn, reward_funcs, dist=dist,
                                 precision=self.precision, run_dir=self.run_dir.path,
                                 checkpoints=self.run_dir.checkpoints, task=task, score_old=score_old)
        self.scorer, self.rollouts, self.evaluator = parts.scorer, parts.rollouts, parts.evaluator
        self.optimizer, self.checkpointer, self.logger = parts.optimizer, parts.checkpointer, parts.logger
        self._python_rewards, self._reward_names = parts.python_rewards, parts.reward_names
        self.step = 0
        self._saved_step, self._trained = -1, False
        self._pending_row: dict[str, Any] | None = None  # the resumed checkpoint's step's row, missing from the file

    @property
    def output_dir(self) -> Path:
        """The run directory."""
        return self.run_dir.path

    # ------------------------------------------------------------------------------------------------ the loop
    def train(self) -> list[dict[str, Any]]:
        """Run to ``max_steps`` (resuming if asked); returns the per-step metrics (also in ``metrics.jsonl``). Raises
        :class:`RunInterrupted` after SIGINT / SIGTERM (the last completed step checkpointed), ``FloatingPointError``
        on a non-finite loss or gradient norm (that step not taken)."""
        with self._session() as interrupt:
            while self.step < self.config.max_steps and not self.dist.any(interrupt.requested):
                started = time.perf_counter()
                batch = self.rollouts.next_optimizer_step()
                fields, normalizer, losses = self._step_counts(batch)
                generated = time.perf_counter()
                for micro_batch, loss_mask, extra, last in batch.micro_steps(fields):
                    with self.policy.accumulating(sync=last):  # DDP all-reduces once, after the last
                        out = self.loss_fn(self.scorer.policy_batch(self.policy.module, micro_batch, loss_mask,
                                                                    **extra), normalizer=normalizer)
                        self.policy.backward(out.loss)
                    losses.add(out, loss_mask)
                row = self.optimizer.step(self.policy.module, loss=losses.reduce(self.dist), step=self.step + 1)
                self.rollouts.sync_weights()
                self.step += 1
                self._finish_step(self._step_metrics(batch, losses, row, started, generated))
        return self.logger.history

    def _finish_step(self, row: dict[str, Any]) -> None:
        """Evaluate, log and checkpoint the step just taken, each when due (the run's last checkpoint first: it
        does not wait for the final evaluation, minutes on a real model, and carries ``row`` for a resume to write
        should a kill stop the evaluation)."""
        final = self.step == self.config.max_steps
        if final:
            self.save_checkpoint(row=row)
        self._log_step(row, final=final)
        if not final and self.checkpointer.due(self.step, final=False):
            self.save_checkpoint(plot=True)

    def _log_step(self, row: dict[str, Any], *, final: bool) -> None:
        """Evaluate when due and append the step's metrics row with the evaluation's. The row is written even when
        the evaluation does not finish (a signal, an error): the step itself is complete. Except the last step's:
        its checkpoint carries the row, and the resume runs the final evaluation (the number a run is read by) and
        writes it, so a preemption during the final evaluation costs that evaluation only."""
        evaluated: dict[str, float] | None = None
        self.logger.announce(row)
        try:
            evaluated = self.evaluator.maybe_run(self.policy, self.step, final=final)
        finally:
            if evaluated is not None or not final:
                self.logger.write(row | (evaluated or {}))

    def _step_counts(self, batch: OptimizerStepBatch) -> tuple[list[dict[str, Any]], Normalizer, LossMetrics]:
        """The step's loss fields per micro-batch, its :class:`~rlzoo.Normalizer` over every rank (the tokens the
        loss counts: minus its rollout rejection) and the metrics accumulator."""
        fields = batch.loss_fields(self.required, world_size=self.dist.world_size)
        counted = batch.counted_masks(self.loss_fn, fields)
        normalizer = self.dist.normalizer(batch.normalizer(fields, counted, world_size=self.dist.world_size))
        return fields, normalizer, LossMetrics()

    def _step_metrics(self, batch: OptimizerStepBatch, losses: LossMetrics, row: dict[str, float], started: float,
                      generated: float) -> dict[str, Any]:
        now = time.perf_counter()
        tokens = self.dist.reduce_floats({"tokens": batch.num_tokens})["tokens"]
        return self.rollouts.add_reward_metrics({  # the reward functions' log_metric names: last, none of these
            "step": self.step, "loss": losses.loss, **self.rollouts.batch_metrics(batch), **row,
            "step_time": now - started, "train_time": now - generated,
            "tokens_per_second": tokens / max(1e-9, now - started), **batch.metrics, **losses.metrics})

    @contextlib.contextmanager
    def _session(self) -> Iterator[GracefulInterrupt]:
        """The run around the loop: lock the directory, start or resume, evaluate at step 0; at the end plot,
        and after a signal checkpoint the last completed step, plot and raise :class:`RunInterrupted`."""
        if self._trained:  # again would skip the directory checks of __init__: --overwrite could delete a run
            raise RuntimeError(f"Trainer.train() runs once, and this Trainer was started (at step {self.step}); train "
                               f"with a new one, e.g. Trainer(rlzoo.trainer.resume.resume_config({str(self.output_dir)!r}"
                               "), ...) with the loss, rewards and data sets given from Python again")
        self._trained, lock, refusal = True, contextlib.ExitStack(), None
        if self.dist.is_main:
            try:
                lock.enter_context(self.run_dir.lock())
                self.run_dir.check()  # again, under the lock: a run may have started here since __init__'s check
            except (OSError, ValueError) as err:
                refusal = err
        refusal = self.dist.broadcast_object(refusal)  # every rank stops with it: none waits in a collective
        if refusal is not None:
            lock.close()
            raise refusal
        with lock, GracefulInterrupt() as interrupt:
            self.evaluator.should_stop = lambda: interrupt.requested  # a signal abandons a running evaluation
            try:
                self._start()
                yield interrupt
                stop = interrupt.agreed(self.dist.any(interrupt.requested))  # none: a later signal only says so
                path = self.save_checkpoint() if stop and self._saved_step != self.step else None
                self.logger.plot()  # after a stop's checkpoint, which the plot must not delay
                if stop:
                    raise RunInterrupted(stop, self.step, str(path or self.checkpointer.path(self.step)))
            finally:
                self.logger.close()

    def _start(self) -> None:
        """Check the rewards, clean up, resume when asked, record the settings, evaluate at step 0 (what touches
        the run directory: rank 0 only)."""
        main = self.dist.is_main
        self.rollouts.check_rewards()  # first: a broken reward leaves the directory as it was (nothing written)
        self.evaluator.check_rewards()
        if main:
            self.run_dir.prepare()
        checkpoint, changes, source_run = None, {}, None
        if self.config.resume:  # None under --resume auto without a checkpoint: a fresh start
            checkpoint = self.dist.broadcast_object(find_checkpoint(self.checkpointer, self.config.resume) if main
                                                    else None)
        if checkpoint is not None:
            changes = self.load_checkpoint(checkpoint)
            source_run = run_of(checkpoint)
            if main and source_run == self.run_dir.path.resolve():
                self.run_dir.abandon_after(self.step)
            elif main:  # a fork: say where it goes (without --output-dir, a new directory, not the checkpoint's run)
                own = (f"; --output-dir {source_run} continues that run instead" if self.config.output_dir is None
                       and source_run.parent.name != "abandoned" else "")
                log.info("resume: checkpoint %s continues as a new run in %s (its metrics up to step %d come along%s)",
                         checkpoint, self.run_dir.path, self.step, own)
        if main:
            previous = timeline_rows(source_run, self.step) if source_run else []
            self.logger.open(self.step, previous=previous, row_due=self._pending_row is not None)
            if checkpoint is None or self.step < self.config.max_steps:  # else --resume auto of a complete run
                resolved = resolved_settings(self.config, self.loss_fn, advantage=self.advantage_name,
                                             precision=self.precision, policy=self.policy, dist=self.dist,
                                             python_loss=self._python_loss, python_rewards=self._python_rewards,
                                             output_dir=self.run_dir.path)
                self.run_dir.write_config(self.config.to_dict(), resolved, start_step=self.step,
                                          resumed_from=str(Path(checkpoint).resolve()) if checkpoint else None, changes=changes,
                                          source=source_run / "config.json" if source_run else None)
            if checkpoint is None or self.step < self.config.max_steps or self._pending_row is not None:  # else said
                if checkpoint is not None:  # complete (--resume auto of a finished run) in check_run_length's line
                    log.info("resumed from %s at step %d", checkpoint, self.step)
                log.info("run dir %s | loss %s | advantage %s | device %s | %d rank(s)", self.run_dir.path,
                         self.loss_fn.name or "custom", self.advantage_name, self.precision, self.dist.world_size)
        self.dist.barrier()
        self._write_missing_row(resumed=checkpoint is not None)

    def _write_missing_row(self, *, resumed: bool) -> None:
        """Write the row of the step the run starts at if ``metrics.jsonl`` lacks it: the step-0 evaluation (of a
        fresh run, or of a resume from a step-0 checkpoint a signal wrote before that evaluation finished), or the
        row the resumed checkpoint carries (a kill during the final evaluation), with that evaluation run now on the
        checkpoint's weights (the training metrics are the interrupted run's, bit for bit)."""
        if self._pending_row is not None:
            row, self._pending_row = self._pending_row, None
            self._log_step(row, final=True)
            return
        main = self.dist.is_main
        if self.step != 0 or resumed and self.dist.broadcast_object(
                any(r.get("step") == 0 for r in self.logger.history) if main else None):
            return
        initial = self.evaluator.maybe_run(self.policy, 0, final=False)
        if initial:
            self.logger.write({"step": 0, **initial})

    # --------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, *, plot: bool = False, row: dict[str, Any] | None = None) -> Path:
        """Checkpoint the run at its current step (and re-plot when ``plot``). ``row``: the step's metrics row
        (training metrics) when the checkpoint precedes its write (:attr:`Checkpoint.row
        <rlzoo.trainer.checkpoint.Checkpoint.row>`).

        Raises:
            OSError: the write failed (disk full names the file); earlier checkpoints are untouched.
        """
        path = self.checkpointer.save(
            self.step, policy=self.policy, optimizer=self.optimizer.optimizer, tokenizer=self.tokenizer,
            settings={**self.config.to_dict(), PYTHON_REWARDS: self._python_rewards,
                      PYTHON_LOSS: self.loss_fn.to_config() if self._python_loss else None},
            shared={"scheduler": self.optimizer.scheduler_state()},
            per_rank={"rollouts": self.rollouts.state_dict(), "rng": rng_state()}, dist=self.dist, row=row)
        self._saved_step = self.step
        if plot:
            self.logger.plot()  # a run that stops later still has its plot up to here
        return path

    def load_checkpoint(self, path: str | os.PathLike[str]) -> dict[str, tuple[Any, Any]]:
        """Restore a checkpoint (weights, optimizer and schedule, generation cycle, task position, RNG) and
        apply the settings that changed since it was written; returns those changes.

        Raises:
            FileNotFoundError: not a checkpoint.
            ValueError: a checkpoint of another model (names the first mismatched tensor), a changed setting
                that cannot be honoured (names it; see :mod:`rlzoo.trainer.resume`), or ``max_steps`` the
                checkpoint has reached (:func:`~rlzoo.trainer.resume.check_run_length`; allowed when the
                checkpoint's step has no metrics row: the run then writes it). A reward function the run
                had as a Python callable and this resume lacks is a change applied with a warning naming it
                (unless ``reward_weights`` weighed it: the weights then no longer match the functions and
                the Trainer refused to build, naming both lists).
        """
        saved = saved_settings(path, self.config)  # paths recorded relative by older versions, ...
        changes = compare_settings(saved, self.config, world_size=self.dist.world_size,  # refusals touch nothing;
                                   log_changes=False)  # the changes are logged once nothing more can refuse
        if saved.get(PYTHON_LOSS) is not None and not self._python_loss and \
                self.loss_fn.to_config() != saved[PYTHON_LOSS]:  # the algorithm's own loss is that loss: honoured
            raise ValueError(
                f"checkpoint {path} was trained with a loss given from Python ({loss_summary(saved[PYTHON_LOSS])}), "
                f"which algorithm {saved.get('algorithm')!r} does not rebuild: pass it again, "
                "Trainer(resume_config(RUN), loss=...)")
        dropped = [name for name in saved.get(PYTHON_REWARDS) or [] if name not in self._reward_names]
        checkpoint = self.checkpointer.load(path, policy=self.policy, optimizer=self.optimizer.optimizer,
                                            dist=self.dist)
        row_missing = checkpoint.row is not None and not self.dist.broadcast_object(  # the same on every rank
            has_row(run_of(checkpoint.path) / "metrics.jsonl", checkpoint.step)
            if self.dist.is_main else None)
        check_run_length(self.config.max_steps, checkpoint.step, path, auto=self.config.resume == "auto",
                         row_missing=row_missing)
        self._pending_row = dict(checkpoint.row) if row_missing and checkpoint.row is not None else None
        self.optimizer.restore(checkpoint.states["scheduler"], completed_steps=checkpoint.step,
                               reschedule=bool(OPTIMIZER_SETTINGS & changes.keys()))
        mid_cycle = bool(checkpoint.states["rollouts"]["buffer"])  # an unfinished generation batch
        if mid_cycle:
            check_mid_cycle_changes(changes, path, written_by=checkpoint.world_size, world_size=self.dist.world_size)
        rollouts, same_world_size = checkpoint.states["rollouts"], checkpoint.world_size == self.dist.world_size
        if not same_world_size and "num_tokens_all_ranks" not in rollouts and self.dist.is_main:
            # written before rank 0's file held every rank's token count: the count is the sum of the ranks' files
            rollouts = {**rollouts, "num_tokens_all_ranks": sum(
                float(state.get("num_tokens", 0.0)) for state in rank_states(path, "rollouts"))}
        self.rollouts.load_state_dict(rollouts, same_world_size=same_world_size)
        set_rng_state(checkpoint.states["rng"])
        self.step = self._saved_step = checkpoint.step
        if self.dist.is_main:  # what changed, once nothing more can refuse the resume
            log_setting_changes(changes, mid_cycle=mid_cycle)
            if dropped:  # a callable is not a setting: compare_settings cannot see it go; a change applied
                log.warning("resume: reward function(s) %s, Python callables of the checkpoint's run, are not given "
                            "now: the run goes on without them (pass them again to keep them)", ", ".join(dropped))
        return changes


def train(config: TrainConfig, **kwargs: Any) -> list[dict[str, Any]]:
    """Build a :class:`Trainer` and run it; returns the per-step metrics (also in ``metrics.jsonl``)."""
    return Trainer(config, **kwargs).train()
