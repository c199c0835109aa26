"""The trainer's configuration: one frozen dataclass, one docstring line per field.

Every field is a command-line flag of ``rlzoo train`` (kebab-case: ``max_steps`` -> ``--max-steps``) and a
key of a config file (TOML or YAML, ``--config FILE``). The dict fields take dotted flags:
``--loss.epsilon_high 0.28``, ``--advantage.scale none``, ``--task.max_terms 3``.

Batch terms follow TRL's GRPOConfig: ``per_device_train_batch_size`` completions per micro-step,
``gradient_accumulation_steps`` micro-steps per optimizer step, a generation batch of
``per_device_train_batch_size * steps_per_generation`` completions (``/ num_generations`` prompts) sampled
every ``steps_per_generation * num_iterations`` micro-steps.
"""

import dataclasses
import json
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import tomllib
import tyro

__all__ = ["TrainConfig", "load_config_file", "save_config"]

DEFAULT_TASK = "chain_sum"
DEFAULT_TASK_KWARGS: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}

# Mapping options are given as dotted flags (--loss.epsilon_high 0.28), parsed by rlzoo.cli, not by tyro.
DottedOptions = Annotated[Mapping[str, Any], tyro.conf.Suppress]
OptionalDottedOptions = Annotated[Mapping[str, Any] | None, tyro.conf.Suppress]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training run. Defaults are the built-in job: GRPO on SmolLM2-135M-Instruct, chain_sum, CPU-sized."""

    # --- what to train
    model: str = "smollm2-135m"
    """Model: a Hugging Face id (local cache only) or directory, a .gguf file, 'smollm2-135m' or 'tiny-random'."""
    algorithm: str = "grpo"
    """Loss preset (see `rlzoo list`)."""
    loss: DottedOptions = dataclasses.field(default_factory=dict)
    """Loss option overrides, e.g. --loss.epsilon_high 0.28 (see `rlzoo explain ALGORITHM`)."""
    advantage: str | None = None
    """Advantage estimator (see `rlzoo list`); default: the preset's recommended one."""
    advantage_options: DottedOptions = dataclasses.field(default_factory=dict)
    """Advantage estimator options, e.g. --advantage.scale none."""

    # --- task and rewards
    task: str = DEFAULT_TASK
    """Task: a reasoning-gym data set name, or a .jsonl file with prompt and answer columns."""
    task_kwargs: OptionalDottedOptions = None
    """Data set options, e.g. --task.max_terms 3; None: the built-in job's (2 one-digit terms) for chain_sum."""
    answer_extraction: str = "last_number"
    """How a completion becomes an answer for the scorer: last_number, first_number, full, first_line, tag."""
    system_prompt: str | None = None
    """System message for the chat template (None: the template's default)."""
    eval_size: int = 200
    """Held-out evaluation problems (fixed seed, disjoint from training)."""
    eval_steps: int = 10
    """Evaluate every N optimizer steps, besides before and after training (0: only those two)."""
    eval_batch_size: int = 200
    """Prompts per greedy evaluation batch."""
    exclude_eval_questions: bool = False
    """Never train on a question that is in the held-out set (small procedural tasks repeat problems)."""
    train_seed: int = 1
    """Seed of the training problem stream."""
    eval_seed: int = 1000
    """Seed of the held-out evaluation set."""
    reward_funcs: tuple[str, ...] = ("accuracy",)
    """Reward functions: 'accuracy', 'format', or 'module:function' with TRL's signature."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward function (default: all 1)."""
    multi_reward_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """How several rewards combine before the advantage (TRL's multi_objective_aggregation)."""

    # --- generation
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
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_completion_length without EOS from the loss (DAPO overlong filtering)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts."""
    max_sampling_rounds: int = 4
    """Cap on generation rounds per generation batch under dynamic sampling."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment buffer L_cache in tokens (0: off)."""
    overlong_penalty: float = 1.0
    """Penalty at max_completion_length for the soft overlong punishment."""
    vllm_gpu_memory_utilization: float = 0.3
    """vLLM colocated engine's GPU memory share."""

    # --- optimisation
    max_steps: int = 20
    """Optimizer steps."""
    per_device_train_batch_size: int = 32
    """Completions per micro-step (TRL's per_device_train_batch_size)."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step."""
    steps_per_generation: int | None = None
    """Micro-steps covered by one generation batch (None: gradient_accumulation_steps)."""
    num_iterations: int = 1
    """Passes over each generation batch (mu in the GRPO paper)."""
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
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    logprobs_backend: Literal["fused", "plain"] = "fused"
    """Log-probs from hidden states with rlzoo.kernels.fused_linear_logprobs (no [N, V] logits), or plain logits."""
    log_entropy: bool = True
    """Compute per-token entropies for the `entropy` metric even when the loss does not need them."""
    share_prompt_prefix: bool = True
    """Run each prompt once per group and reuse its KV cache for the group's completions (exact)."""

    # --- run
    seed: int = 0
    """Seed of model sampling and shuffling."""
    device: str = "auto"
    """'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: Literal["auto", "float32", "bf16-mixed", "bfloat16", "float16"] = "auto"
    """Precision. auto = bf16-mixed on GPU, float32 on CPU. bf16-mixed: float32 weights and optimizer state,
    forward passes under bfloat16 autocast (as transformers' Trainer with bf16=True). bfloat16 / float16: the
    parameters themselves in that dtype (half the memory; AdamW updates smaller than the dtype's resolution
    are lost)."""
    num_threads: int | None = None
    """CPU threads for torch (None: torch's default)."""
    output_dir: str | None = None
    """Run directory (None: runs/ALGORITHM-TASK-TIMESTAMP)."""
    save_steps: int = 10
    """Checkpoint every N optimizer steps (and at the end); 0: only at the end."""
    save_total_limit: int = 2
    """Keep this many most recent checkpoints."""
    resume: str | None = None
    """Resume: 'latest' (the output dir's newest checkpoint) or a checkpoint directory."""
    progress: bool = True
    """Show a live progress bar."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = _coerce(field.name, getattr(self, field.name), hints[field.name])
            object.__setattr__(self, field.name, value)
        checks = [
            ("num_generations", self.num_generations >= 2, ">= 2"),
            ("max_completion_length", self.max_completion_length >= 1, ">= 1"),
            ("max_steps", self.max_steps >= 0, ">= 0"),
            ("per_device_train_batch_size", self.per_device_train_batch_size >= 1, ">= 1"),
            ("gradient_accumulation_steps", self.gradient_accumulation_steps >= 1, ">= 1"),
            ("num_iterations", self.num_iterations >= 1, ">= 1"),
            ("learning_rate", self.learning_rate >= 0, ">= 0"),
            ("temperature", self.temperature > 0, "> 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k >= 0, ">= 0"),
            ("eval_size", self.eval_size >= 0, ">= 0"),
            ("eval_steps", self.eval_steps >= 0, ">= 0"),
            ("eval_batch_size", self.eval_batch_size >= 1, ">= 1"),
            ("save_steps", self.save_steps >= 0, ">= 0"),
            ("save_total_limit", self.save_total_limit >= 1, ">= 1"),
            ("max_sampling_rounds", self.max_sampling_rounds >= 1, ">= 1"),
            ("overlong_buffer", 0 <= self.overlong_buffer < self.max_completion_length, "in [0, max_completion_length)"),
            ("max_grad_norm", self.max_grad_norm >= 0, ">= 0"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ValueError(f"{name} must be {want}, got {getattr(self, name)!r}")
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise ValueError(f"steps_per_generation must be >= 1, got {self.steps_per_generation}")
        if self.generation_batch_size % self.num_generations != 0:
            raise ValueError(
                f"the generation batch (per_device_train_batch_size * steps_per_generation = "
                f"{self.generation_batch_size}) must be divisible by num_generations ({self.num_generations})"
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} entries but there are {len(self.reward_funcs)} "
                f"reward_funcs {list(self.reward_funcs)}"
            )
        if self.resume is not None and self.resume != "latest" and not Path(self.resume).is_dir():
            raise ValueError(f"resume must be 'latest' or a checkpoint directory, got {self.resume!r}")

    @property
    def resolved_task_kwargs(self) -> dict[str, Any]:
        """``task_kwargs``, or the built-in job's kwargs when unset and the task is the default one."""
        if self.task_kwargs is not None:
            return dict(self.task_kwargs)
        return dict(DEFAULT_TASK_KWARGS) if self.task == DEFAULT_TASK else {}

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
        """Build from a dict (e.g. a config file); unknown keys raise naming them and listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid keys: {', '.join(sorted(names))}")
        hints = typing.get_type_hints(cls)
        return cls(**{key: _coerce(key, value, hints[key]) for key, value in data.items()})


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the field's annotation (config files and the Python API bypass the CLI's
    parser): ints and numeric strings become floats where a float is expected (YAML 1.1 reads ``1e-4`` as a
    string), lists become tuples.

    Raises:
        ValueError: the value does not fit, naming the field, the expected type and the valid choices.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return _coerce(name, value, args[0])
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(name, value, arg)
            except ValueError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, args))}; got {value!r}")
        return value
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{name} must be a number, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        hint_text = {"advantage": " (estimator options go in advantage_options / --advantage.NAME)",
                     "task": " (data set options go in task_kwargs / --task.NAME)"}.get(name, "")
        raise ValueError(f"{name} must be a string, got {value!r}{hint_text}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {value!r}")
        return tuple(_coerce(name, v, args[0]) for v in value)
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping of options, got {value!r}")
        return value
    return value


_YAML11_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def yaml_numbers(value: Any) -> Any:
    """Read the numbers YAML 1.1 leaves as strings (``1e-3``, ``5E4``: exponent without a dot) as floats,
    recursively through mappings and lists; everything else is returned unchanged. Never raises.

    Source: YAML 1.2's core-schema float rule (PyYAML implements YAML 1.1, whose float needs a dot).
    """
    if isinstance(value, str) and _YAML11_FLOAT.match(value):
        return float(value)
    if isinstance(value, Mapping):
        return {k: yaml_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_numbers(v) for v in value]
    return value


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML (.toml) or YAML (.yaml/.yml) config file into a dict.

    Raises:
        ValueError: unknown extension or a file that is not a mapping.
        FileNotFoundError: missing file.
    """
    path = Path(path)
    if path.suffix == ".toml":
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        with path.open() as fh:
            data = yaml_numbers(yaml.safe_load(fh) or {})
    elif path.suffix == ".json":
        data = json.loads(path.read_text())
    else:
        raise ValueError(f"config file must be .toml, .yaml/.yml or .json, got {path.name!r}")
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of options, got {type(data).__name__}")
    return data


def save_config(config: TrainConfig, path: str | os.PathLike[str], extra: Mapping[str, Any] | None = None) -> None:
    """Write the resolved config as JSON, atomically."""
    from rlzoo.trainer.io import atomic_write_text

    payload = config.to_dict()
    if extra:
        payload = {**payload, **extra}
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")
