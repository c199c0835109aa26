"""The trainer's configuration: one small frozen section per component, joined into the flat ``TrainConfig``.

Each component of the trainer is built from its own section (:class:`RolloutConfig` for the rollout source,
:class:`OptimizerConfig` for the optimizer step, ...) and reads no other field; the :class:`~rlzoo.trainer.Trainer`
(the composition root) passes the few values two components share explicitly. ``TrainConfig`` inherits every
section, so the command line and config files keep TRL's flat names (``--learning-rate``, ``learning_rate =``)
and ``config.section(OptimizerConfig)`` cuts one section out of it.

Every field is a flag of ``rlzoo train`` (kebab-case: ``max_steps`` -> ``--max-steps``) and a key of a config
file (TOML, YAML or JSON, ``--config FILE``). The mapping fields take dotted flags: ``--loss.epsilon_high 0.28``,
``--advantage.scale none``, ``--task.max_terms 3``.

Batch terms follow TRL's GRPOConfig: ``per_device_train_batch_size`` completions per micro-step,
``gradient_accumulation_steps`` micro-steps per optimizer step, a generation batch of
``per_device_train_batch_size * steps_per_generation`` completions (``/ num_generations`` prompts) sampled
every ``steps_per_generation * num_iterations`` micro-steps.
"""

import dataclasses
import math
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from rlzoo.trainer.config_files import coerce
from rlzoo.trainer.run_config import (
    AdapterConfig,
    CheckpointConfig,
    EvalConfig,
    RunConfig,
    TrackingConfig,
)
from rlzoo.trainer.section import DottedOptions, OptionalDottedOptions, S, Section

__all__ = [
    "AdapterConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "EvalConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "ScorerConfig",
    "SignalConfig",
    "TaskConfig",
    "TrackingConfig",
    "TrainConfig",
]

DEFAULT_TASK = "chain_sum"
DEFAULT_TASK_KWARGS: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}

@dataclasses.dataclass(frozen=True, kw_only=True)
class AlgorithmConfig(Section):
    """The loss and the advantage estimator."""

    algorithm: str = "grpo"
    """Loss preset (see rlzoo list; case-insensitive)."""
    loss: DottedOptions = dataclasses.field(default_factory=dict)
    """Loss option overrides, e.g. --loss.epsilon_high 0.28 (see rlzoo explain ALGORITHM)."""
    advantage: str | None = None
    """Advantage estimator (see rlzoo list); default: the preset's recommended one."""
    advantage_options: DottedOptions = dataclasses.field(default_factory=dict)
    """Advantage estimator options, e.g. --advantage.scale none."""

    def __post_init__(self) -> None:
        super().__post_init__()
        from rlzoo.advantages import advantage_estimators
        from rlzoo.losses import presets

        # the registered spelling (--algorithm DAPO trains dapo): recorded and compared on resume as such
        object.__setattr__(self, "algorithm", presets.canonical(self.algorithm))
        if self.advantage is not None:
            object.__setattr__(self, "advantage", advantage_estimators.canonical(self.advantage))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(Section):
    """The policy model, where it runs and in which precision."""

    model: str = "smollm2-135m"
    """Model: a Hugging Face hub id (downloaded when online) or directory (a full model or a PEFT adapter), a .gguf
    file, 'smollm2-135m' or 'tiny-random'."""
    device: str = "auto"
    """'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: Literal["auto", "float32", "bf16-mixed", "bfloat16", "float16"] = "auto"
    """Precision. auto = bf16-mixed on GPU, float32 on CPU. bf16-mixed: float32 weights and optimizer state,
    forward passes under bfloat16 autocast (as transformers' Trainer with bf16=True). bfloat16 / float16: the
    parameters themselves in that dtype (half the memory; AdamW updates smaller than the dtype's resolution
    are lost); float16 only for a LoRA adapter's frozen base or evaluation (AdamW's eps is 0 in float16)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    num_threads: int | None = None
    """CPU threads for torch (None: torch's default)."""

    def checks(self) -> list[tuple[str, bool, str]]:
        return [("num_threads", self.num_threads is None or self.num_threads >= 1, ">= 1"), *super().checks()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelConfig(Section):
    """Data parallelism under torchrun (``torchrun --nproc_per_node N -m rlzoo train ...``); ignored in one process."""

    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """ddp: each rank holds the whole model (DDP); fsdp: parameters, gradients, optimizer state sharded (FSDP2)."""
    fsdp_cpu_offload: bool = False
    """fsdp: keep the sharded parameters, gradients and optimizer state in CPU memory (FSDP2 CPUOffloadPolicy)."""
    distributed_timeout: int = 600
    """Seconds a collective may wait for the other ranks (a dead or stuck rank fails the job; it must outlast rank 0's
    own writes); one process without torchrun has no collectives (a warning says so when it is set)."""

    def checks(self) -> list[tuple[str, bool, str]]:
        ok = 1 <= self.distributed_timeout <= 86_400_000  # timedelta and the store's timeout overflow beyond
        return [("distributed_timeout", ok, "in [1, 86400000] (1000 days)"), *super().checks()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskConfig(Section):
    """The problems: training stream, held-out set, prompts and answer extraction."""

    task: str = DEFAULT_TASK
    """Task: a reasoning-gym data set name, a .jsonl/.json/.csv/.tsv/.parquet file, a save_to_disk directory or a
    hub data set id (see rlzoo tasks)."""
    task_kwargs: OptionalDottedOptions = None
    """Data set options, e.g. --task.max_terms 3 (reasoning-gym), --task.split test or --task.answer_column
    solution (files and hub data sets); for chain_sum laid over the built-in job's (2 one-digit terms)."""
    answer_extraction: str = "last_number"
    """How a completion becomes an answer for the scorer: last_number, first_number, full, first_line, tag."""
    system_prompt: str | None = None
    """System message of built-in tasks' prompts and of data sets' conversational ones (None: template default)."""
    eval_size: int = 200
    """Held-out evaluation problems (fixed seed, disjoint from training)."""
    exclude_eval_questions: bool = False
    """Never train on a question that is in the held-out set (small procedural tasks repeat problems)."""
    train_seed: int = 1
    """Seed of the training problem stream."""
    eval_seed: int = 1000
    """Seed of the held-out evaluation set."""

    def checks(self) -> list[tuple[str, bool, str]]:
        return [("eval_size", self.eval_size >= 0, ">= 0"), *super().checks()]

    @property
    def resolved_task_kwargs(self) -> dict[str, Any]:
        """``task_kwargs``, laid over the built-in job's (:data:`DEFAULT_TASK_KWARGS`) when the task is the default
        one (``--task.max_terms 3`` keeps the other built-in options, not reasoning-gym's)."""
        defaults = DEFAULT_TASK_KWARGS if self.task == DEFAULT_TASK else {}
        return {**defaults, **(self.task_kwargs or {})}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig(Section):
    """Reward functions, their combination and DAPO's soft overlong punishment."""

    reward_funcs: tuple[str, ...] = ("accuracy",)
    """Reward functions: 'accuracy', 'format', TRL's names (think_format_reward, ...), 'pkg.module.function',
    'module:function', 'file.py:function' with TRL's signature, or a reward model (hub id or directory)."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward function (default: all 1): those of reward_funcs, then those of the Python callables
    given as Trainer(config, reward_funcs=[...])."""
    multi_reward_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """How several rewards combine before the advantage (TRL's multi_objective_aggregation)."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment buffer L_cache in tokens (0: off)."""
    overlong_penalty: float = 1.0
    """Penalty at max_completion_length for the soft overlong punishment."""

    def checks(self) -> list[tuple[str, bool, str]]:
        # more weights than names: the rest weigh the Python callables of Trainer(reward_funcs=...), which the
        # config does not hold; build_rewards checks the total
        weights_ok = self.reward_weights is None or len(self.reward_weights) >= len(self.reward_funcs)
        return [
            ("overlong_buffer", self.overlong_buffer >= 0, ">= 0"),
            ("overlong_penalty", math.isfinite(self.overlong_penalty), "finite"),
            ("reward_weights", weights_ok, (f"one weight per reward function ({len(self.reward_funcs)}: "
             f"{list(self.reward_funcs)}, then one per Python callable given to Trainer(reward_funcs=...))")),
            *super().checks(),
        ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig(Section):
    """Sampling and the generation cycle: what a generation batch is and how it is consumed."""

    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend: Hugging Face generate, or vLLM (GPU, optional extra)."""
    num_generations: int = 8
    """Completions per prompt (the group size G)."""
    max_completion_length: int = 32
    """Maximum completion tokens."""
    max_prompt_length: int | None = None
    """Truncate prompts (from the left) to this many tokens (None: no limit)."""
    temperature: float = 1.0
    """Sampling temperature (also divides the logits when scoring log-probs, as TRL)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    vllm_gpu_memory_utilization: float = 0.3
    """vLLM colocated engine's GPU memory share."""
    per_device_train_batch_size: int = 32
    """Completions per micro-step on each rank (TRL's per_device_train_batch_size; the global batch is this x ranks
    x gradient_accumulation_steps)."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step."""
    steps_per_generation: int | None = None
    """Micro-steps covered by one generation batch (None: gradient_accumulation_steps)."""
    num_iterations: int = 1
    """Passes over each generation batch (mu in the GRPO paper)."""
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_completion_length without EOS from the loss (DAPO overlong filtering)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts."""
    max_sampling_rounds: int = 4
    """Cap on generation rounds per generation batch under dynamic sampling."""

    def checks(self) -> list[tuple[str, bool, str]]:
        spg_ok = self.steps_per_generation is None or self.steps_per_generation >= 1
        return [
            ("num_generations", self.num_generations >= 2, ">= 2"),
            ("max_completion_length", self.max_completion_length >= 1, ">= 1"),
            ("per_device_train_batch_size", self.per_device_train_batch_size >= 1, ">= 1"),
            ("gradient_accumulation_steps", self.gradient_accumulation_steps >= 1, ">= 1"),
            ("num_iterations", self.num_iterations >= 1, ">= 1"),
            ("temperature", 0 < self.temperature < math.inf, "> 0 and finite"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("max_sampling_rounds", self.max_sampling_rounds >= 1, ">= 1"),
            ("steps_per_generation", spg_ok, ">= 1"),
            ("max_prompt_length", self.max_prompt_length is None or self.max_prompt_length >= 1, ">= 1"),
            ("per_device_train_batch_size", self.num_generations < 1  # reported as num_generations above
             or self.generation_batch_size % self.num_generations == 0,
             (f"such that each rank's generation batch (per_device_train_batch_size x steps_per_generation = "
              f"{self.per_device_train_batch_size} x {self.effective_steps_per_generation} completions) holds whole "
              f"groups of num_generations ({self.num_generations})")),
            *super().checks(),
        ]

    @property
    def effective_steps_per_generation(self) -> int:
        """``steps_per_generation``, defaulting to ``gradient_accumulation_steps`` (TRL's default)."""
        return self.steps_per_generation or self.gradient_accumulation_steps

    @property
    def generation_batch_size(self) -> int:
        """Completions per generation batch."""
        return self.per_device_train_batch_size * self.effective_steps_per_generation

    @property
    def prompts_per_generation(self) -> int:
        """Prompts per generation batch."""
        return self.generation_batch_size // self.num_generations

    @property
    def old_logprobs_needed(self) -> bool:
        """Whether data can be stale when a micro-step uses it (an optimizer step happened since generation).

        The generation batch is consumed over ``steps_per_generation * num_iterations`` micro-steps; when that
        period divides ``gradient_accumulation_steps``, every generation batch is used up within one optimizer
        step and the old policy is the current one (old_logprobs=None, ratio exactly 1), as TRL decides.
        """
        period = self.effective_steps_per_generation * self.num_iterations
        return self.gradient_accumulation_steps % period != 0 or self.backend == "vllm"


VERL_KL_PENALTIES: Mapping[str, str] = MappingProxyType({
    "kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "low_var_kl", "k3": "low_var_kl"})
"""verl 0.9.1's ``algorithm.kl_penalty`` names -> the rlzoo KL estimator with the same meaning (``kl_penalty_forward``:
its "k3" is the clamped ``low_var_kl``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SignalConfig(Section):
    """What is scored at generation time besides the policy: a teacher (on-policy distillation) and the KL in the
    reward (verl's ``algorithm.use_kl_in_reward`` / ``algorithm.kl_ctrl``; rlzoo/trainer/reward_shaping.py)."""

    teacher: str | None = None
    """A frozen teacher model (same specs as --model; it must share the policy's tokenizer) scored at generation
    time into teacher_logprobs (--algorithm opd, or --loss.distillation_loss_coef > 0)."""
    use_kl_in_reward: bool = False
    """Fold a per-token KL penalty to the reference into the rewards before the advantage (verl's name)."""
    kl_ctrl: Literal["fixed", "adaptive"] = "fixed"
    """The KL-in-reward coefficient's controller (verl's kl_ctrl.type): fixed, or adaptive (Ziegler et al.)."""
    kl_coef: float = 0.001
    """The (initial) KL-in-reward coefficient (verl's kl_ctrl.kl_coef)."""
    target_kl: float = 0.1
    """The adaptive controller's target KL (verl's kl_ctrl.target_kl)."""
    kl_horizon: int = 10000
    """The adaptive controller's horizon in completions (verl's kl_ctrl.horizon)."""
    kl_penalty: str = "k1"
    """The KL-in-reward estimator, verl's algorithm.kl_penalty with its meanings: kl or k1, abs, mse or k2,
    low_var_kl or k3 (both clamped to [-10, 10] as in verl; the loss's kl_estimator k3 is TRL's, unclamped)."""

    def checks(self) -> list[tuple[str, bool, str]]:
        return [
            ("kl_coef", math.isfinite(self.kl_coef) and self.kl_coef >= 0, "finite and >= 0"),
            ("target_kl", math.isfinite(self.target_kl) and self.target_kl > 0, "finite and > 0"),
            ("kl_horizon", self.kl_horizon > 0, "> 0"),
            ("kl_penalty", self.kl_penalty in VERL_KL_PENALTIES, "one of " + ", ".join(map(repr, VERL_KL_PENALTIES))),
            *super().checks(),
        ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScorerConfig(Section):
    """How log-probs and entropies of completions are computed."""

    logprobs_backend: Literal["fused", "plain"] = "fused"
    """Log-probs from hidden states with rlzoo.kernels.fused_linear_logprobs (no [N, V] logits), or plain logits."""
    log_entropy: bool = True
    """Compute per-token entropies for the entropy metric even when the loss does not need them."""
    share_prompt_prefix: bool = True
    """Run each prompt once per group and reuse its KV cache for the group's completions (exact)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(Section):
    """AdamW, its schedule and gradient clipping."""

    learning_rate: float = 2e-5
    """AdamW peak learning rate."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0: off)."""

    def checks(self) -> list[tuple[str, bool, str]]:
        return [
            ("learning_rate", 0 <= self.learning_rate < math.inf, ">= 0 and finite"),
            ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
            ("weight_decay", 0 <= self.weight_decay < math.inf, ">= 0 and finite"),
            ("adam_beta1", 0 <= self.adam_beta1 < 1, "in [0, 1)"),
            ("adam_beta2", 0 <= self.adam_beta2 < 1, "in [0, 1)"),
            ("max_grad_norm", self.max_grad_norm >= 0, ">= 0"),
            *super().checks(),
        ]


# Bases are listed last-first: dataclasses collect inherited fields from the end of the MRO, so --help lists
# the algorithm and model first, as before the split.
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig(TrackingConfig, RunConfig, CheckpointConfig, EvalConfig, OptimizerConfig, SignalConfig,
                  ScorerConfig, RolloutConfig, RewardConfig, TaskConfig, AdapterConfig, ParallelConfig, ModelConfig, AlgorithmConfig):
    """A training run. Defaults are the built-in job: GRPO on SmolLM2-135M-Instruct, chain_sum, CPU-sized."""

    def checks(self) -> list[tuple[str, bool, str]]:
        # after the sections' own checks: max_completion_length 0 is reported as itself, not as overlong_buffer
        overlong_ok = self.overlong_buffer < self.max_completion_length
        return [*super().checks(), ("overlong_buffer", overlong_ok,
                                    f"in [0, max_completion_length) = [0, {self.max_completion_length})")]

    def section(self, cls: type[S]) -> S:
        """The section ``cls`` of this config (its fields, with this config's values)."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (mappings and tuples converted)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        """Build from a dict (e.g. a config file); unknown keys raise naming them and listing the valid ones.

        Raises:
            ValueError: unknown keys, or the errors of :class:`Section`.
        """
        from rlzoo.trainer.spellings import spelling_hint

        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            from rlzoo.registry import close_names

            hint = spelling_hint(unknown, flags=False)
            close = {key: close_names(str(key), names, n=1, cutoff=0.75) for key in unknown}
            meant = "; ".join(f"{key!r}: did you mean {match[0]!r}?" for key, match in close.items() if match)
            raise ValueError(f"unknown config keys {unknown}" + (f" ({hint})" if hint else "")
                             + (f" ({meant})" if meant else "") + f"; valid keys: {', '.join(sorted(names))}")
        hints = typing.get_type_hints(cls)
        return cls(**{key: coerce(key, value, hints[key]) for key, value in data.items()})
