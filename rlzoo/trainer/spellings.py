"""TRL's spellings of the trainer's options, and where rlzoo keeps each one.

A TRL user writes ``--loss_type dapo``, ``--beta 0.04`` or ``model_name_or_path:`` in a config file; rlzoo
answers with a pointer to its own spelling (``--algorithm dapo``, ``--loss.beta 0.04``, ``--model``) instead of a
bare "unknown option". Names both tools share (``learning_rate``, ``num_generations``, ``report_to``, ...) need
no entry: they are rlzoo's fields too.

Source: the field names of TRL 1.16's ``GRPOConfig`` / ``ModelConfig`` / ``ScriptArguments`` (trl/trainer/
grpo_config.py, trl/trainer/model_config.py, trl/scripts/utils.py).
"""

from collections.abc import Collection, Iterable

__all__ = ["TRL_SPELLINGS", "option_home", "spelling_hint"]

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
    "dataset_test_split": ("--task.eval_split", "task_kwargs.eval_split"),
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
    "lr_scheduler_type": ("--lr-scheduler", "lr_scheduler"),
    "per_device_eval_batch_size": ("--eval-batch-size", "eval_batch_size"),
    "generation_batch_size": ("--steps-per-generation N (a generation batch: --per-device-train-batch-size x N)",
                              "steps_per_generation"),
    "warmup_ratio": ("--warmup-steps N (a count: the ratio times --max-steps)", "warmup_steps"),
    "num_train_epochs": ("--max-steps N (optimizer steps; trainer_state.epoch reports the passes)", "max_steps"),
    "logging_steps": ("", "every step is logged to metrics.jsonl and the trackers"),
    "sync_ref_model": ("", "the reference model stays the initial policy"),
    "vllm_mode": ("--backend vllm", "backend"),
    "use_vllm": ("--backend vllm", "backend"),
    # GRPOConfig's loss fields that rlzoo's loss options spell differently (rlzoo.compat.trl's table)
    "sapo_temperature_pos": ("--loss.tau_pos", "loss.tau_pos"),
    "sapo_temperature_neg": ("--loss.tau_neg", "loss.tau_neg"),
    "vespo_k_pos": ("--loss.k_pos", "loss.k_pos"),
    "vespo_k_neg": ("--loss.k_neg", "loss.k_neg"),
    "vespo_lambda_pos": ("--loss.lambda_pos", "loss.lambda_pos"),
    "vespo_lambda_neg": ("--loss.lambda_neg", "loss.lambda_neg"),
    "vllm_importance_sampling_correction": ("--loss.is_correction MODE (with --backend vllm)", "loss.is_correction"),
    "vllm_importance_sampling_mode": ("--loss.is_correction", "loss.is_correction"),
    "vllm_importance_sampling_clip_min": ("--loss.is_min", "loss.is_min"),
    "vllm_importance_sampling_clip_max": ("--loss.is_max", "loss.is_max"),
    "vllm_importance_sampling_cap": ("--loss.is_max", "loss.is_max"),
}
"""TRL option name -> (rlzoo's flag, rlzoo's config-file key), or ``("", why)`` for one rlzoo has no counterpart of.
TRL's loss fields that keep their name
(``epsilon_high``, ``use_bias_correction_kl``, ``off_policy_mask_threshold``...) and rlzoo's own loss and advantage
options given as plain flags are found by :func:`option_home`."""


_TABLES = {"loss": "loss", "advantage": "advantage_options", "advantage_options": "advantage_options",
           "task": "task_kwargs", "task_kwargs": "task_kwargs", "peft": "peft"}
"""The dotted flags' prefixes (and the tables' own names) -> the config file's table of their options."""


def option_home(key: str) -> tuple[str, str] | None:
    """Where a plain ``--NAME`` that is a loss or advantage option lives: ``("--loss.NAME", "loss.NAME")`` for an
    option of a registered loss part (``epsilon_high``, ``kl_estimator``, ``rollout_is``...),
    ``("--advantage.NAME", "advantage_options.NAME")`` for one of a registered advantage estimator, else None."""
    from rlzoo.advantages import AdvantageEstimator
    from rlzoo.losses.composition import SLOTS

    if any(key in cls.option_names() for slot in SLOTS for cls in slot.base.registry.values()):
        return f"--loss.{key}", f"loss.{key}"
    if any(key in cls.option_names() for cls in AdvantageEstimator.registry.values()):
        return f"--advantage.{key}", f"advantage_options.{key}"
    return None


def spelling_hint(names: Iterable[str], *, flags: bool, fields: Collection[str] | None = None) -> str:
    """A sentence pointing each TRL-spelled name of ``names`` to rlzoo's spelling ("" when none is TRL's).

    Args:
        names: unknown option names as the user gave them (``loss_type``, ``loss-type``, ``--lr``).
        flags: word the hint for command-line flags (True) or config-file keys (False).
        fields: the fields of the command the names were given to (None: rlzoo train's, all): a name whose rlzoo
            spelling is not one of them gets no hint (rlzoo eval has no --learning-rate, nor loss options).

    Example:
        >>> spelling_hint(["--loss_type", "--beta"], flags=True)
        "TRL's --loss_type is --algorithm NAME (a preset: rlzoo list) in rlzoo; TRL's --beta is --loss.beta in rlzoo"
        >>> spelling_hint(["--epsilon_high=0.28", "--mean_level"], flags=True)
        '--epsilon_high is a loss option: --loss.epsilon_high; --mean_level is an advantage option: --advantage.mean_level'
        >>> spelling_hint(["task.prompt_column"], flags=False)
        "task.prompt_column is a dotted flag's option: in a config file it is 'prompt_column' in the table \
'task_kwargs' (task_kwargs: {prompt_column: ...})"
    """
    parts = []
    for name in names:
        key = name.lstrip("-").split("=", 1)[0].replace("-", "_")
        given = name.split("=", 1)[0]
        home = TRL_SPELLINGS.get(key) or option_home(key)
        if fields is not None and home is not None and home[0] and home[1].split(".")[0] not in fields:
            continue  # the command has no such option (rlzoo eval: no --learning-rate, no loss options)
        if key in TRL_SPELLINGS:
            flag, config_key = TRL_SPELLINGS[key]
            parts.append(f"TRL's {given} has no counterpart in rlzoo ({config_key})" if not flag else
                         f"TRL's {given} is {flag if flags else config_key} in rlzoo")
        elif not flags and key.partition(".")[0] in _TABLES and key.partition(".")[2]:  # `task.split: x` in a file
            prefix, _, option = key.partition(".")
            parts.append(f"{given} is a dotted flag's option: in a config file it is {option!r} in the table "
                         f"{_TABLES[prefix]!r} ({_TABLES[prefix]}: {{{option}: ...}})")
        elif (home := option_home(key)) is not None:
            section = "an advantage" if home[0].startswith("--advantage") else "a loss"
            parts.append(f"{given} is {section} option: {home[0] if flags else home[1]}")
    return "; ".join(parts)
