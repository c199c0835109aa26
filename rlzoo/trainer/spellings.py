"""TRL's spellings of the trainer's options, and where rlzoo keeps each one.

A TRL user writes ``--loss_type dapo``, ``--beta 0.04`` or ``model_name_or_path:`` in a config file; rlzoo
answers with a pointer to its own spelling (``--algorithm dapo``, ``--loss.beta 0.04``, ``--model``) instead of a
bare "unknown option". Names both tools share (``learning_rate``, ``num_generations``, ``report_to``, ...) need
no entry: they are rlzoo's fields too.

Source: the field names of TRL 1.16's ``GRPOConfig`` / ``ModelConfig`` / ``ScriptArguments`` (trl/trainer/
grpo_config.py, trl/trainer/model_config.py, trl/scripts/utils.py).
"""

from collections.abc import Iterable

__all__ = ["TRL_SPELLINGS", "spelling_hint"]

TRL_SPELLINGS: dict[str, tuple[str, str]] = {
    # TRL name: (rlzoo flag, rlzoo config-file key)
    "loss_type": ("--algorithm NAME (a preset: rlzoo list)", "algorithm"),
    "beta": ("--loss.beta", "loss.beta"),
    "epsilon": ("--loss.epsilon_low (and --loss.epsilon_high)", "loss.epsilon_low"),
    "delta": ("--loss.delta", "loss.delta"),
    "scale_rewards": ("--advantage.scale", "advantage_options.scale"),
    "importance_sampling_level": ("--loss.importance_sampling_level", "loss.importance_sampling_level"),
    "lr": ("--learning-rate", "learning_rate"),
    "model_name_or_path": ("--model", "model"),
    "dataset_name": ("--task", "task"),
    "dataset_config": ("--task.name", "task_kwargs.name"),
    "dataset_train_split": ("--task.split", "task_kwargs.split"),
    "reward_model_name_or_path": ("--reward-funcs MODEL", "reward_funcs"),
    "multi_objective_aggregation": ("--multi-reward-aggregation", "multi_reward_aggregation"),
    "use_peft": ("--peft.r 16 (any LoraConfig field turns LoRA on)", "peft"),
    "lora_r": ("--peft.r", "peft.r"),
    "lora_alpha": ("--peft.lora_alpha", "peft.lora_alpha"),
    "lora_dropout": ("--peft.lora_dropout", "peft.lora_dropout"),
    "lora_target_modules": ("--peft.target_modules", "peft.target_modules"),
    "max_completion_len": ("--max-completion-length", "max_completion_length"),
    "logging_dir": ("--output-dir (TensorBoard writes OUTPUT_DIR/tensorboard)", "output_dir"),
    "save_strategy": ("--save-steps", "save_steps"),
    "eval_strategy": ("--eval-steps", "eval_steps"),
    "resume_from_checkpoint": ("--resume", "resume"),
    "bf16": ("--dtype bf16-mixed", "dtype"),
    "fp16": ("--dtype float16", "dtype"),
    "gradient_checkpointing_kwargs": ("--gradient-checkpointing", "gradient_checkpointing"),
    "top_entropy_quantile": ("--loss.top_entropy_quantile", "loss.top_entropy_quantile"),
    "vllm_mode": ("--backend vllm", "backend"),
    "use_vllm": ("--backend vllm", "backend"),
}
"""TRL option name -> (rlzoo's flag, rlzoo's config-file key)."""


def spelling_hint(names: Iterable[str], *, flags: bool) -> str:
    """A sentence pointing each TRL-spelled name of ``names`` to rlzoo's spelling ("" when none is TRL's).

    Args:
        names: unknown option names as the user gave them (``loss_type``, ``loss-type``, ``--lr``).
        flags: word the hint for command-line flags (True) or config-file keys (False).

    Example:
        >>> spelling_hint(["--loss_type", "--beta"], flags=True)
        "TRL's --loss_type is --algorithm NAME (a preset: rlzoo list) in rlzoo; TRL's --beta is --loss.beta in rlzoo"
    """
    parts = []
    for name in names:
        key = name.lstrip("-").split("=", 1)[0].replace("-", "_")
        if key in TRL_SPELLINGS:
            flag, config_key = TRL_SPELLINGS[key]
            parts.append(f"TRL's {name.split('=', 1)[0]} is {flag if flags else config_key} in rlzoo")
    return "; ".join(parts)
