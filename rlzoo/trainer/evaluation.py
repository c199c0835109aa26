"""The evaluator: greedy accuracy on the task's held-out set, with a 95 % Wilson interval, and the run's reward
functions on the same greedy completions (TRL's ``eval_reward``)."""

import contextlib
import dataclasses
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from rlzoo.trainer.config import EvalConfig, ModelConfig, RolloutConfig, TaskConfig, TrainConfig
from rlzoo.trainer.distributed import ONE_PROCESS, Distributed
from rlzoo.trainer.generation import HFGenerator
from rlzoo.trainer.parallel import ParallelModel
from rlzoo.trainer.precision import Precision
from rlzoo.trainer.reward_functions import RewardFunctionError, try_rewards
from rlzoo.trainer.tasks import TaskStream, build_task

if TYPE_CHECKING:
    from rlzoo.trainer.rewards import RewardSet

__all__ = ["EvalResult", "EvaluationAbandoned", "Evaluator", "evaluate", "greedy_accuracy", "held_out_rewards",
           "training_rng_untouched", "wilson_interval"]

log = logging.getLogger("rlzoo.train")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Greedy accuracy on the held-out set, and the reward functions' mean rewards of the same completions.

    Attributes:
        accuracy: mean score in [0, 1], None for a task without reference answers (nothing to score);
            ci_low, ci_high: 95 % Wilson interval; n: problems decoded.
        samples: a few (question, completion, score, reference answer) of the first problems.
        rewards: ``eval/reward`` (the mean combined reward: TRL's ``eval_reward``) and ``eval/rewards/NAME/mean``
            per reward function, NaN-ignoring as the training metrics (NaN when none scored), and what the functions
            logged with ``log_metric`` during the evaluation as ``eval/NAME``; empty when evaluated without
            reward functions, or when one failed on a held-out completion of a task with answers.
        reward_error: that failure (the held-out reward is then not logged; accuracy is).
    """

    accuracy: float | None
    ci_low: float
    ci_high: float
    n: int
    samples: tuple[tuple[str, str, float, str | None], ...] = ()
    rewards: Mapping[str, float] = dataclasses.field(default_factory=dict)
    reward_error: str | None = None

    def __str__(self) -> str:
        reward = f"reward {self.rewards['eval/reward']:.3f}" if "eval/reward" in self.rewards else ""
        if self.accuracy is None:
            return f"{self.rewards.get('eval/reward', math.nan):.3f} (n={self.n})"
        accuracy = f"{100 * self.accuracy:.1f}% (95% CI {100 * self.ci_low:.1f}-{100 * self.ci_high:.1f}, n={self.n})"
        return f"{accuracy}, {reward}" if reward else accuracy

    def metrics(self) -> dict[str, float]:
        """``eval/accuracy``, ``eval/ci_low``, ``eval/ci_high`` (for a task with answers) and :attr:`rewards` (the
        metrics.jsonl keys)."""
        if self.accuracy is None:
            return dict(self.rewards)
        return {**self.rewards, "eval/accuracy": self.accuracy, "eval/ci_low": self.ci_low,
                "eval/ci_high": self.ci_high}


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (scores in [0, 1] summed as successes); ``(0, 1)`` for ``n = 0``.

    Source: Wilson (1927), "Probable inference, the law of succession, and statistical inference", JASA 22.
    """
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@torch.no_grad()
def greedy_accuracy(model: torch.nn.Module, tokenizer: Any, task: TaskStream, generator: HFGenerator, *,
                    batch_size: int, limit: int | None = None, dist: Distributed = ONE_PROCESS,
                    progress: bool = False, should_stop: Callable[[], int | None] | None = None,
                    rewards: "RewardSet | None" = None) -> EvalResult:
    """Greedy-decode the task's held-out problems in batches and score them with the task's scorer where it has
    reference answers, and with ``rewards`` when given (:func:`held_out_rewards`; ``progress``: a progress bar over
    the problems, for long evaluations).

    Under torchrun each rank decodes its strided share of the problems and the scores are summed over the
    ranks (every rank returns the same accuracy; the samples are rank 0's). Every rank calls ``generate`` equally
    often: a rank whose share ran out decodes one problem it does not score, since under FSDP2 Hugging Face's
    ``generate`` synchronises the ranks at every decoding step (``synced_gpus``: one all-reduce per token), so
    an uneven number of calls (e.g. 5 problems, 2 ranks, batches of 2) crashed gloo or would hang NCCL.

    Raises:
        EvaluationAbandoned: ``should_stop()`` (asked before every batch, agreed over the ranks) said so, e.g. a
            signal asked the run to stop.
    """
    everything = list(task.eval_items)[:limit]
    items = dist.shard(everything)
    answers = task.task.has_answers
    scores: list[float] = []
    rewarded: list[Tensor] = []  # [n, K] per batch
    reward_error: str | None = None
    samples: list[tuple[str, str, float, str | None]] = []
    bar = _progress_bar(len(items)) if progress and len(items) > batch_size else None
    most = -(-len(everything) // dist.world_size)  # the largest share: every rank asks as often
    for start in range(0, most, batch_size):
        if should_stop is not None and dist.any(should_stop()):
            if bar is not None:
                bar.close()
            raise EvaluationAbandoned
        chunk = items[start:start + batch_size]
        if not chunk:  # a shorter share: still generate (on a problem left unscored), as often as the others do
            generator.generate(model, [task.prompt(tokenizer, everything[0])], 1, greedy=True)
            continue
        if bar is not None:
            bar.update(len(chunk))
        prompts = [task.prompt(tokenizer, item) for item in chunk]
        gen = generator.generate(model, prompts, 1, greedy=True)
        if rewards is not None and reward_error is None:
            lengths = gen.completion_mask.sum(-1).tolist()
            try:  # outside the policy's autocast, as in training (a reward model's own precision)
                with torch.autocast(gen.completion_ids.device.type, enabled=False):
                    rewarded.append(rewards.compute(prompts, gen.texts, chunk, completion_ids=[
                        ids[:k] for ids, k in zip(gen.completion_ids.tolist(), lengths, strict=True)]))
            except RewardFunctionError as err:
                if not answers:  # the reward is all this evaluation measures
                    raise
                reward_error = str(err)  # accuracy goes on; the held-out reward is dropped (agreed below)
        for item, text in zip(chunk, gen.texts, strict=True):
            score = float(task.score(text, item)) if answers else math.nan
            scores.append(score)
            if len(samples) < 3:
                samples.append((task.question(item), text, score, item.answer))
    if bar is not None:
        bar.close()
    totals = dist.reduce_floats({"score": sum(scores) if answers else 0.0, "n": float(len(scores))})
    total, n = totals["score"], int(totals["n"])
    low, high = wilson_interval(total, n)
    reward_metrics = {} if rewards is None else held_out_rewards(rewards, rewarded, dist)
    if rewards is not None:
        reward_error = dist.agreed_error(reward_error)
        if reward_error is not None:  # every rank drops it alike
            reward_metrics = {}
    return EvalResult(accuracy=(total / n if n else math.nan) if answers else None, ci_low=low, ci_high=high, n=n,
                      samples=tuple(samples), rewards=reward_metrics, reward_error=reward_error)


def held_out_rewards(rewards: "RewardSet", scored: list[Float[Tensor, "_ K"]],
                     dist: Distributed = ONE_PROCESS) -> dict[str, float]:
    """The evaluation's reward metrics from each batch's per-function rewards (NaN: a function returned None),
    over every rank of ``dist``: ``eval/reward``, the mean over the completions some function scored of the
    weighted sum of the functions that scored it (the combined reward the training metrics' ``reward`` averages,
    without the overlong shaping), ``eval/rewards/NAME/mean`` per function (NaN-ignoring) and what the functions
    logged with ``log_metric`` during the evaluation, as ``eval/NAME`` (taken from ``rewards``, so that it does not
    join the next training step's row). A mean over no scored completion is NaN.

    TRL 1.16 ``GRPOTrainer`` logs ``eval_reward`` and ``eval_rewards/NAME/mean`` of sampled completions, each the
    mean of its per-batch means; these are of the greedy completions, pooled over all of them (the same for equal
    batches where every completion is scored).

    Raises:
        RewardFunctionError: a function logged a metric named as one of the evaluator's own (``accuracy``,
            ``ci_low``, ``ci_high``, ``reward``, ``rewards/NAME/mean``: ``eval/NAME`` would pose as or replace it).
    """
    k = len(rewards.names)
    table = torch.cat(scored) if scored else torch.empty(0, k)
    scorable = ~torch.isnan(table).all(dim=1)
    combined = (table * torch.tensor(rewards.weights, dtype=table.dtype)).nansum(dim=1)[scorable]
    sums = {"reward": float(combined.double().sum()), "reward_n": float(combined.numel())}
    for j, name in enumerate(rewards.names):
        column = table[:, j][~torch.isnan(table[:, j])]
        sums[f"{name}/sum"], sums[f"{name}/n"] = float(column.double().sum()), float(column.numel())
    sums = dist.reduce_floats(sums)
    logged, _ = rewards.take_logged(dist)  # log_extra columns of evaluation completions are dropped
    rewards.refuse_names(logged, {"accuracy", "ci_low", "ci_high", "reward", *(f"rewards/{n}/mean" for n in rewards.names)},
                         "during an evaluation it is logged as eval/NAME, a key of the held-out evaluation's own")
    metrics = {f"eval/{name}": value for name, value in logged.items()}

    def mean(total: float, count: float) -> float:
        return total / count if count else math.nan

    metrics["eval/reward"] = mean(sums["reward"], sums["reward_n"])
    for name in rewards.names:
        metrics[f"eval/rewards/{name}/mean"] = mean(sums[f"{name}/sum"], sums[f"{name}/n"])
    return metrics


@contextlib.contextmanager
def training_rng_untouched(device: torch.device | str | None = None) -> Iterator[None]:
    """Run the block on a fork of the global random states a checkpoint saves (Python's ``random``, torch's CPU
    generator and that of the CUDA ``device``, default the current one), restored after it: an evaluation, whose
    reward functions may draw (noise, sampling), leaves the training trajectory as it found it, so a run's numbers do
    not depend on ``eval_steps``, and a run extended past its final checkpoint (saved before the final evaluation)
    follows the longer run's trajectory. numpy's global state is neither forked nor checkpointed."""
    state = random.getstate()
    cuda = torch.device(device) if device is not None else torch.device("cuda") if torch.cuda.is_available() else None
    devices = ([cuda.index if cuda.index is not None else torch.cuda.current_device()]
               if cuda is not None and cuda.type == "cuda" else [])
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(state)


class EvaluationAbandoned(Exception):
    """An evaluation stopped before its end (a signal asked the run to stop)."""


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="eval", unit="problem", dynamic_ncols=True, leave=False,
                disable=None)  # on a terminal only: not into a log file (a Slurm log)


class Evaluator:
    """Evaluates the policy before training, every ``eval_steps`` steps and after the last step.

    Nothing is evaluated when the task's held-out set is empty (``eval_size`` 0), or when it has no reference
    answers and no reward functions are given.

    Args:
        config: the evaluation section.
        task: the run's task (its held-out set, prompts and scorer).
        tokenizer: the model's tokenizer.
        generator: greedy decoding (an :class:`~rlzoo.trainer.generation.HFGenerator` without prefix sharing).
        precision: autocast of the forward passes.
        dist: the process group context (each rank evaluates a share of the held-out set).
        progress: show a progress bar over the held-out problems (when they take more than one batch).
        rewards: the run's reward functions, which also score the greedy completions (:func:`held_out_rewards`).
        progress_of_run: sets the functions' ``trainer_state`` to the run's progress before an evaluation
            (:meth:`RolloutSource.sync_progress <rlzoo.trainer.rollouts.RolloutSource.sync_progress>`).
    """

    def __init__(self, config: EvalConfig, *, task: TaskStream, tokenizer: Any, generator: HFGenerator,
                 precision: Precision, dist: Distributed = ONE_PROCESS, progress: bool = False,
                 rewards: "RewardSet | None" = None, progress_of_run: Callable[[], None] | None = None) -> None:
        self.config = config
        self.rewards = rewards
        self.progress_of_run = progress_of_run
        self.progress = progress
        self.task = task
        self.tokenizer = tokenizer
        self.generator = generator
        self.precision = precision
        self.dist = dist
        self.should_stop: Callable[[], int | None] | None = None  # the trainer's signal: abandon an evaluation

    def check_rewards(self) -> None:
        """Warn when no reference answer scores under the answer extraction (:meth:`~rlzoo.trainer.tasks.
        TaskStream.unscorable_answers`). Call the reward functions once on the first held-out problem
        (:func:`~rlzoo.trainer.reward_functions.try_rewards`), after the training check, so that one failing on the
        held-out set (a column it lacks) is known before the step-0 evaluation: for a task with answers the held-out
        reward is then not logged (one warning naming the function; accuracy is), for a task without them (the reward
        is all there is to evaluate) it is an error.

        Raises:
            RewardFunctionError: a function fails on the held-out set of a task without answers (names it).
        """
        unscorable = self.task.unscorable_answers()
        if unscorable is not None and self.dist.is_main:
            log.warning(unscorable)
        if self.rewards is None or not self.task.eval_items:
            return
        failed = None
        try:
            with training_rng_untouched(self.precision.device):
                try_rewards(self.rewards, self.task, self.tokenizer, self.task.eval_items[0])
        except RewardFunctionError as err:
            if not self.task.task.has_answers:
                raise RewardFunctionError(f"on the held-out set, which the reward functions score (eval/reward): "
                                          f"{err}") from err
            failed = str(err)
        failed = self.dist.agreed_error(failed)  # every rank drops them (a rank scoring alone would wait forever)
        if failed is not None:
            if self.dist.is_main:
                log.warning("the held-out reward (eval/reward) is not logged: on the held-out set %s", failed)
            self.rewards = None

    @property
    def enabled(self) -> bool:
        """Whether there is a held-out set to evaluate, with answers or reward functions to score it."""
        return len(self.task.eval_items) > 0 and (self.task.task.has_answers or self.rewards is not None)

    def run(self, model: torch.nn.Module | ParallelModel, limit: int | None = None) -> EvalResult:
        """Greedy accuracy of ``model`` (a Hugging Face model, or a :class:`ParallelModel` whose parameters are
        gathered for the evaluation) on the held-out set (``limit`` problems at most). The run's random state is
        as before (:func:`training_rng_untouched`)."""
        gathered = model.gathered() if isinstance(model, ParallelModel) else contextlib.nullcontext(model)
        with training_rng_untouched(self.precision.device), gathered as whole, self.precision.autocast():
            return greedy_accuracy(whole, self.tokenizer, self.task, self.generator,
                                   batch_size=self.config.eval_batch_size, limit=limit, dist=self.dist,
                                   progress=self.progress, should_stop=self.should_stop, rewards=self.rewards)

    def maybe_run(self, model: torch.nn.Module | ParallelModel, step: int, *,
                  final: bool) -> dict[str, float] | None:
        """The eval metrics when an evaluation is due after optimizer step ``step`` (0: before training),
        ``{}`` when none is due, None when a signal abandoned it (:attr:`should_stop`); logs the result."""
        due = step == 0 or final or (self.config.eval_steps and step % self.config.eval_steps == 0)
        if not (self.enabled and due):
            return {}
        if self.rewards is not None and self.progress_of_run is not None:  # the functions' trainer_state: the run's
            self.progress_of_run()  # progress (global_step, epoch) at this step, as TRL's in evaluation
        try:
            result = self.run(model)
        except EvaluationAbandoned:
            if self.dist.is_main:
                log.warning("step %d held-out evaluation abandoned: the run is stopping", step)
            return None
        if result.reward_error is not None and self.dist.is_main:  # this evaluation's: each tries again, so that a
            # resumed run evaluates as the uninterrupted one did (a checkpoint does not record a failure)
            log.warning("step %d: the held-out reward (eval/reward) is not logged: on the held-out set %s", step,
                        result.reward_error)
        if self.dist.is_main:
            log.info("step %d held-out greedy %s %s", step, "reward" if result.accuracy is None else "accuracy",
                     result)
        return result.metrics()


def evaluate(config: TrainConfig, *, evaluation_only: bool = True, global_step: int = 0,
             inherited_rewards: bool = False) -> EvalResult:
    """Greedy held-out accuracy of ``config.model`` on ``config.task`` (what ``rlzoo eval`` prints): up to
    ``eval_size`` of a data set's rows when ``evaluation_only`` (the task only evaluated), else the held-out set a
    run on the task trains beside (``rlzoo eval --run RUN`` on the run's own task). ``config.reward_funcs`` (none:
    an empty tuple) also score the greedy completions, as in training (:attr:`EvalResult.rewards`); of a task
    without reference answers they are all that is evaluated. A reward function that fails on the first held-out
    problem is, for a task with answers, left out with a warning (accuracy is still evaluated), as the trainer's
    :meth:`Evaluator.check_rewards` does; so are, when ``inherited_rewards`` (a run's, not asked for), reward
    functions that cannot be loaded (a moved file, a package not installed). ``global_step``: the functions'
    ``trainer_state.global_step`` (a checkpoint's step; the epoch is not restored). A checkpoint's adapter loaded
    onto a base that changed since its run started is warned about (:func:`~rlzoo.trainer.model_digest.check_digest`).

    Raises:
        ValueError: ``eval_size`` < 1; a task without reference answers and without reward functions (names
            ``--task.answer_column`` and ``--reward-funcs``) or without held-out rows (a run's held-out split capped
            to 0 rows), checked before the model loads; and the errors of model, task and reward function loading
            (of inherited reward functions: for a task without answers only).
        RewardFunctionError: a reward function fails on the held-out set of a task without answers.
    """
    from pathlib import Path

    from rlzoo.trainer.adapters import is_peft_model
    from rlzoo.trainer.config import RewardConfig
    from rlzoo.trainer.model_digest import check_digest
    from rlzoo.trainer.models import load_model
    from rlzoo.trainer.rewards import build_rewards

    if config.eval_size < 1:
        raise ValueError(f"eval_size must be >= 1 to evaluate, got {config.eval_size}")
    task = build_task(config.section(TaskConfig), evaluation_only=evaluation_only)
    if not task.task.has_answers and not config.reward_funcs:  # nothing to score: NaN over 0 problems is no result
        raise ValueError(f"task {config.task!r} has no reference answers to evaluate against (its answer column is "
                         "unset): pass --task.answer_column COLUMN, or --reward-funcs to score the completions with")
    if not task.eval_items and not evaluation_only and not task.task.has_answers:
        raise ValueError(f"task {config.task!r} has no reference answers, so a run on it holds out no rows of it (only "
                         "a separate --task.eval_split): pass --task.eval_split SPLIT, or --task with the data to "
                         "evaluate")
    if not task.eval_items:  # e.g. a run's held-out split capped to 0 rows of a tiny data set: n=0 is no result
        raise ValueError(f"task {config.task!r} has no held-out rows to evaluate (eval_size {config.eval_size}"
                         + ("" if evaluation_only else "; a run's held-out split takes at most 20 % of its data set's "
                            "rows") + "): pass --eval-size N, or --task with the data to evaluate")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    precision = Precision.resolve(config.section(ModelConfig))
    rewards = None
    if config.reward_funcs:
        try:
            rewards = build_rewards(config.section(RewardConfig), (), task=task, max_steps=config.max_steps,
                                    device=precision.device)
        except (ValueError, ImportError, OSError) as err:
            if not (inherited_rewards and task.task.has_answers):  # asked for, or all this evaluation measures
                raise
            log.warning("the held-out reward is not reported: %s (--reward-funcs none evaluates accuracy only)", err)
        else:
            rewards.trainer_state.global_step = global_step
    model, tokenizer = load_model(config.model, dtype=precision.inference_dtype, device=precision.device)
    model.eval()
    if is_peft_model(model):  # a checkpoint's adapter (CKPT or CKPT/model) on the base it names: the run's own?
        source = Path(config.model)
        check_digest(source if (source / "trainer_state.json").is_file() else source.parent, model,
                     model_name=model.peft_config["default"].base_model_name_or_path, doing="the adapter is evaluated")
    rollout = config.section(RolloutConfig)
    generator = HFGenerator(tokenizer, max_completion_length=rollout.max_completion_length,
                            max_prompt_length=rollout.max_prompt_length, share_prefix=False)
    evaluator = Evaluator(config.section(EvalConfig), task=task, tokenizer=tokenizer, generator=generator,
                          precision=dataclasses.replace(precision, autocast_dtype=None), rewards=rewards)
    evaluator.check_rewards()
    result = evaluator.run(model)
    if result.reward_error is not None:
        log.warning("the held-out reward is not reported: on the held-out set %s", result.reward_error)
    return result
