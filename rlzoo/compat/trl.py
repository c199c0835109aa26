r"""TRL 1.16 ``GRPOConfig`` -> rlzoo loss: :func:`loss_from_grpo_config`, :func:`batch_from_trl_inputs`.

:func:`loss_from_grpo_config` reads the loss-relevant fields of a ``trl.GRPOConfig`` (or of a dict of its
field names) and returns a :class:`TRLGRPOLoss`: an rlzoo :class:`~rlzoo.losses.PolicyLoss` (``.loss``,
built from a preset with :func:`rlzoo.get_loss`) plus TRL's separately-normalised entropy bonus. Given the
same per-token inputs, its loss and gradient equal TRL 1.16 ``GRPOTrainer._compute_loss`` with one
process and no gradient accumulation (``num_items_in_batch`` = the batch's active tokens).

Translation (``eps_high = epsilon_high if epsilon_high is not None else epsilon``, as TRL):

==============================  ===============================================================
GRPOConfig                      rlzoo
==============================  ===============================================================
loss_type="grpo"                ``get_loss("grpo")``: PPO clip, "seq-mean-token-mean"
loss_type="bnpo"                ``get_loss("bnpo")``: PPO clip, "token-mean"
loss_type="dr_grpo"             ``get_loss("dr_grpo", max_completion_length=...)``
loss_type="dapo"                ``get_loss("dapo")``: PPO clip, "token-mean"
loss_type="cispo"               ``get_loss("cispo", epsilon_low=1.0, epsilon_high=eps_high - 1)``
loss_type="sapo"                ``get_loss("sapo", tau_pos=sapo_temperature_pos, tau_neg=...)``
loss_type="luspo"               ``get_loss("luspo")``: PPO clip, "seq-mean-token-sum"
loss_type="vespo"               ``get_loss("vespo", k_pos=vespo_k_pos, ...)``
epsilon, epsilon_high, delta    ``epsilon_low``, ``epsilon_high``, ``delta`` (PPO-clip loss types)
importance_sampling_level       ``importance_sampling_level`` ("token" or "sequence")
beta, use_bias_correction_kl    ``beta``, ``kl_estimator="k3"``, ``use_bias_correction_kl``
top_entropy_quantile            ``top_entropy_quantile`` (:class:`~rlzoo.losses.EntropyMask`)
off_policy_mask_threshold       ``off_policy_mask_threshold`` (:class:`~rlzoo.losses.OffPolicySequenceMask`)
use_vllm and                    ``is_correction=vllm_importance_sampling_mode``,
vllm_importance_sampling_*      ``is_min=..._clip_min``, ``is_max=..._clip_max`` (:class:`~rlzoo.losses.ISCorrection`)
entropy_coef                    :attr:`TRLGRPOLoss.entropy_coef` (token mean of the entropy, outside the policy term)
==============================  ===============================================================

Normalisation: TRL's "grpo", "sapo", "dr_grpo" and "luspo" divide by the number of rows ``B`` (fully masked
rows included), while rlzoo's :meth:`Normalizer.from_batch <rlzoo.Normalizer.from_batch>` counts only rows
with a counted token. :class:`TRLGRPOLoss` therefore defaults to
``Normalizer(num_tokens=completion_mask.sum(), num_sequences=B)``.

Pitfall reproduced from TRL: for ``loss_type="cispo"``, ``epsilon_high`` is the *absolute* cap of the
detached ratio and falls back to ``epsilon`` (0.2) when unset, which caps every ratio at 0.2 (a warning is
issued). Set ``epsilon_high`` explicitly (TRL recommends 5.0, ScaleRL).
"""

import dataclasses
import difflib
import math
import sys
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from rlzoo.batch import BatchError, LossOutput, Normalizer, PolicyBatch
from rlzoo.losses import EntropyMask, KLPenalty, LossInputs, PolicyLoss, get_loss
from rlzoo.registry import UnknownNameError

__all__ = [
    "GRPO_CONFIG_FIELDS",
    "GRPO_LOSS_DEFAULTS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "VLLM_IS_MODES",
    "TRLGRPOLoss",
    "batch_from_trl_inputs",
    "completion_mask_from_trl_inputs",
    "loss_from_grpo_config",
]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
"""TRL 1.16 ``GRPOConfig.loss_type`` values that :func:`loss_from_grpo_config` translates (all of them)."""

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""TRL 1.16 ``GRPOConfig.importance_sampling_level`` values."""

VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL 1.16 ``GRPOConfig.vllm_importance_sampling_mode`` values (each is an rlzoo ``is_correction`` mode of the
same name, :mod:`rlzoo.losses.correction`)."""

_PPO_CLIP_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")

GRPO_LOSS_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "loss_type": "dapo",
        "importance_sampling_level": "token",
        "epsilon": 0.2,
        "epsilon_high": None,
        "delta": None,
        "beta": 0.0,
        "use_bias_correction_kl": True,
        "top_entropy_quantile": 1.0,
        "entropy_coef": 0.0,
        "use_adaptive_entropy": False,
        "off_policy_mask_threshold": None,
        "use_vllm": False,
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "sequence_mask",
        "vllm_importance_sampling_clip_max": 3.0,
        "vllm_importance_sampling_clip_min": None,
        "vllm_importance_sampling_cap": None,
        "sapo_temperature_pos": 1.0,
        "sapo_temperature_neg": 1.05,
        "vespo_k_pos": 2.0,
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
        "max_completion_length": 512,
        "router_aux_loss_coef": None,
    }
)
"""The ``GRPOConfig`` fields that change TRL 1.16's loss, with TRL 1.16's defaults (used for missing dict keys;
a test checks them against ``trl.GRPOConfig`` when TRL is installed)."""

# fmt: off
_GRPO_OWN_FIELDS = frozenset(
    (
        "beta", "cache_implementation", "cast_lm_head_to_fp32", "chat_template_kwargs", "delta",
        "disable_dropout", "ds3_gather_for_generation", "entropy_coef", "entropy_coef_delta",
        "entropy_coef_max", "entropy_coef_min", "entropy_target", "epsilon", "epsilon_high",
        "generation_batch_size", "generation_kwargs", "importance_sampling_level", "log_completions",
        "log_completions_hub_repo", "log_multimodal", "log_unique_prompts", "loss_type",
        "mask_truncated_completions", "max_completion_length", "max_tool_calling_iterations", "min_p",
        "model_init_kwargs", "multi_objective_aggregation", "num_completions_to_print", "num_generations",
        "num_generations_eval", "num_iterations", "off_policy_mask_threshold", "pad_to_multiple_of",
        "ref_model_mixup_alpha", "ref_model_sync_steps", "repetition_penalty", "reward_weights",
        "router_aux_loss_coef", "sapo_temperature_neg", "sapo_temperature_pos", "scale_rewards",
        "shuffle_dataset", "steps_per_generation", "sync_ref_model", "temperature", "top_entropy_quantile",
        "top_k", "top_p", "transformers_continuous_batching_config", "trust_remote_code",
        "use_adaptive_entropy", "use_bias_correction_kl", "use_transformers_continuous_batching",
        "use_transformers_paged", "use_vllm", "vespo_k_neg", "vespo_k_pos", "vespo_lambda_neg",
        "vespo_lambda_pos", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization", "vllm_group_port",
        "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode", "vllm_max_model_length", "vllm_mode", "vllm_model_impl",
        "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
        "vllm_structured_outputs_regex", "vllm_tensor_parallel_size",
    )
)
# fmt: on
# fmt: off
_TRAINING_ARGUMENTS_FIELDS = frozenset(
    (
        "accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs", "adam_beta1",
        "adam_beta2", "adam_epsilon", "auto_find_batch_size", "average_tokens_across_devices",
        "batch_eval_metrics", "bf16", "bf16_full_eval", "data_seed", "dataloader_drop_last",
        "dataloader_in_order", "dataloader_multiprocessing_context", "dataloader_num_workers",
        "dataloader_persistent_workers", "dataloader_pin_memory", "dataloader_prefetch_factor", "ddp_backend",
        "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph",
        "ddp_timeout", "debug", "deepspeed", "disable_tqdm", "do_eval", "do_predict", "do_train",
        "enable_jit_checkpoint", "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches",
        "eval_on_start", "eval_steps", "eval_strategy", "eval_use_gather_object", "fp16", "fp16_full_eval",
        "fsdp", "fsdp_config", "full_determinism", "gradient_accumulation_steps", "gradient_checkpointing",
        "gradient_checkpointing_kwargs", "greater_is_better", "hub_always_push", "hub_model_id",
        "hub_private_repo", "hub_revision", "hub_strategy", "hub_token", "ignore_data_skip",
        "include_for_metrics", "include_num_input_tokens_seen", "label_names", "label_smoothing_factor",
        "learning_rate", "length_column_name", "liger_kernel_config", "load_best_model_at_end", "local_rank",
        "log_level", "log_level_replica", "log_on_each_node", "logging_first_step", "logging_nan_inf_filter",
        "logging_steps", "logging_strategy", "lr_scheduler_kwargs", "lr_scheduler_type", "max_grad_norm",
        "max_steps", "metric_for_best_model", "neftune_noise_alpha", "num_train_epochs", "optim",
        "optim_args", "optim_target_modules", "output_dir", "parallelism_config",
        "per_device_eval_batch_size", "per_device_train_batch_size", "prediction_loss_only", "project",
        "push_to_hub", "remove_unused_columns", "report_to", "restore_callback_states_from_checkpoint",
        "resume_from_checkpoint", "run_name", "save_on_each_node", "save_only_model", "save_steps",
        "save_strategy", "save_total_limit", "seed", "skip_memory_metrics", "tf32", "torch_compile",
        "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps", "trackio_bucket_id",
        "trackio_space_id", "trackio_static_space_id", "train_sampling_strategy", "use_cache", "use_cpu",
        "use_liger_kernel", "warmup_steps", "weight_decay",
    )
)
# fmt: on
GRPO_CONFIG_FIELDS: frozenset[str] = _GRPO_OWN_FIELDS | _TRAINING_ARGUMENTS_FIELDS
"""Every field of TRL 1.16's ``GRPOConfig`` (with transformers 5.x ``TrainingArguments``): the keys a dict
config may hold. Fields outside :data:`GRPO_LOSS_DEFAULTS` do not change the loss and are ignored."""


# ---------------------------------------------------------------------------------------------------- the loss
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class TRLGRPOLoss:
    r"""TRL 1.16 ``GRPOTrainer``'s loss as an rlzoo loss: the policy :class:`~rlzoo.losses.PolicyLoss` plus
    TRL's entropy bonus.

    .. math::
        L = L_{\text{policy}}(\texttt{loss}) - c\,\frac{\sum_{it} H_{it}\, m^{eff}_{it}}{\max(1, \sum_{it} m^{eff}_{it})},
        \qquad m^{eff} = \text{completion mask} \wedge \text{entropy mask (if top_entropy_quantile < 1)}

    Build it with :func:`loss_from_grpo_config`.

    Attributes:
        loss: the policy term (clip/CISPO/SAPO/VESPO surrogate, IS correction, masks, KL penalty and TRL's
            aggregation), an ordinary rlzoo :class:`~rlzoo.losses.PolicyLoss` to inspect or compose.
        loss_type: TRL's ``loss_type``.
        entropy_coef: ``c``; 0 disables the entropy bonus. TRL takes the entropy's token mean over the tokens the
            policy term acts on, whatever the ``loss_type`` normalisation (not rlzoo's
            :class:`~rlzoo.losses.EntropyBonus`, which is aggregated like the policy term).
        settings: the resolved loss-relevant ``GRPOConfig`` values it was built from.
    """

    loss: PolicyLoss
    loss_type: str
    entropy_coef: float = 0.0
    settings: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def required_fields(self) -> frozenset[str]:
        """Optional :class:`~rlzoo.PolicyBatch` fields needed (``ref_logprobs`` when beta > 0, ``entropies``, ...)."""
        extra = frozenset({"entropies"}) if self.entropy_coef != 0.0 else frozenset()
        return self.loss.required_fields() | extra

    @property
    def batch_coupled(self) -> bool:
        """True when the entropy quantile couples sequences (micro-batch splits change the result)."""
        return self.loss.batch_coupled

    def describe(self) -> str:
        """The policy loss's parts, one per line, plus the entropy bonus."""
        lines = [f"TRL 1.16 GRPOConfig(loss_type={self.loss_type!r})", self.loss.describe()]
        if self.entropy_coef != 0.0:
            lines.append(f"entropy bonus: -{self.entropy_coef} * token-mean(entropy) over the policy tokens")
        return "\n".join(lines)

    def __call__(self, batch: PolicyBatch, normalizer: Normalizer | None = None) -> LossOutput:
        """TRL's loss of one batch.

        Args:
            batch: a :class:`~rlzoo.PolicyBatch` with ``logprobs`` ``Float[B, T]`` (TRL's ``per_token_logps``),
                ``advantages`` ``Float[B]`` or ``Float[B, T]``, ``completion_mask`` ``Bool[B, T]``, and as needed
                ``old_logprobs`` (``old_per_token_logps``), ``ref_logprobs`` (``ref_per_token_logps``),
                ``rollout_logprobs`` (``sampling_per_token_logps``, the vLLM log-probs) and ``entropies``.
                :func:`batch_from_trl_inputs` builds it from TRL's inputs dict.
            normalizer: counts of the whole optimizer-step batch. Default:
                ``Normalizer(num_tokens=completion_mask.sum(), num_sequences=B)``: TRL's denominators with one
                process and no gradient accumulation (every row counts, even a fully masked one). When given,
                the entropy bonus is divided by ``normalizer.num_tokens`` times the share of this batch's tokens
                that the entropy mask (``top_entropy_quantile``) keeps (1 without it): without an entropy mask
                micro-batch losses sum to the full-batch loss, and a normalizer of the batch's own counts gives
                TRL's mean over the kept tokens (TRL averages each micro-batch over its own kept tokens; the
                entropy mask itself is per micro-batch, see :attr:`batch_coupled`).

        Returns:
            :class:`~rlzoo.LossOutput`: 0-d loss (differentiable w.r.t. ``logprobs`` and ``entropies``) and the
            metrics of :attr:`loss`, plus ``cispo_clip_ratio`` for cispo and ``policy_loss`` when the entropy
            bonus is on (TRL's names).

        Raises:
            TypeError: ``batch`` is not a :class:`~rlzoo.PolicyBatch`.
            BatchError: a field the loss needs is None (names the field).
        """
        if not isinstance(batch, PolicyBatch):
            raise TypeError(f"a loss takes a rlzoo.PolicyBatch, got {type(batch).__name__}")
        local = normalizer is None
        if normalizer is None:
            normalizer = Normalizer(num_tokens=batch.completion_mask.sum(), num_sequences=batch.shape[0])
        out = self.loss(batch, normalizer)
        metrics, tokens = dict(out.metrics), dict(out.metric_tokens)  # (tokens: a composed loss's rejection)
        if self.loss_type == "cispo" and "clip_ratio/high_mean" in metrics:
            metrics["cispo_clip_ratio"] = metrics["clip_ratio/high_mean"]
            if "clip_ratio/high_mean" in tokens:
                tokens["cispo_clip_ratio"] = tokens["clip_ratio/high_mean"]
        if self.entropy_coef == 0.0:
            return LossOutput(loss=out.loss, metrics=metrics, metric_tokens=tokens)
        if batch.entropies is None:
            raise BatchError(
                f"the entropy bonus (GRPOConfig.entropy_coef={self.entropy_coef}) needs PolicyBatch.entropies; it is None"
            )
        x = LossInputs.from_batch(batch)
        effective = x.mask
        entropy_mask = next((p for p in self.loss.weights if isinstance(p, EntropyMask) and p.active), None)
        if entropy_mask is not None:
            effective = effective & (entropy_mask(x)[0] > 0)
        entropies = x.entropies
        assert entropies is not None  # checked above
        total = torch.where(
            effective, entropies, torch.zeros((), dtype=entropies.dtype, device=entropies.device)
        ).sum()
        kept = effective.sum().to(total.dtype)
        if local:
            count: Tensor | float = kept.clamp(min=1)
        else:  # the step's tokens, times the share of this micro-batch's the entropy mask keeps (1 without one)
            n = normalizer.num_tokens
            share = kept / x.mask.sum().clamp(min=1).to(total.dtype)
            count = (n.to(total.dtype) if isinstance(n, Tensor) else float(n)) * share
            count = count.clamp(min=1) if isinstance(count, Tensor) else max(count, 1.0)
        loss = out.loss - self.entropy_coef * (total / count)
        metrics["policy_loss"] = out.loss.detach()
        return LossOutput(loss=loss, metrics=metrics, metric_tokens=tokens)


# ------------------------------------------------------------------------------------------------- the config
def _config_values(cfg: Any) -> tuple[dict[str, Any], bool]:
    """The loss-relevant values of ``cfg`` and whether it was a dict (missing keys take TRL's defaults)."""
    if isinstance(cfg, Mapping):
        for key in cfg:
            if not isinstance(key, str) or key not in GRPO_CONFIG_FIELDS:
                close = difflib.get_close_matches(str(key), sorted(GRPO_CONFIG_FIELDS), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise UnknownNameError(f"unknown GRPOConfig field {key!r} in the config dict{hint}")
        return {name: cfg.get(name, default) for name, default in GRPO_LOSS_DEFAULTS.items()}, True
    trl_module = sys.modules.get("trl")  # a GRPOConfig instance means trl is already imported
    grpo_config = getattr(trl_module, "GRPOConfig", None) if trl_module is not None else None
    if grpo_config is None or not isinstance(cfg, grpo_config):
        raise TypeError(
            f"loss_from_grpo_config takes a trl.GRPOConfig or a dict of its field names, got {type(cfg).__name__}"
        )
    return {name: getattr(cfg, name) for name in GRPO_LOSS_DEFAULTS}, False


def _number(
    field: str,
    value: Any,
    *,
    low: float | None = None,
    low_open: bool = False,
    allow_none: bool = False,
    allow_inf: bool = False,
) -> None:
    """Raise ``ValueError`` naming ``GRPOConfig.field`` unless ``value`` is a real number in range."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"GRPOConfig.{field} must be a number{' or None' if allow_none else ''}, got {value!r}"
        )
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"GRPOConfig.{field} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"GRPOConfig.{field} must be {'>' if low_open else '>='} {low}, got {value}")


def _choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UnknownNameError(
            f"GRPOConfig.{field}={value!r} is not supported; valid values: {', '.join(map(repr, choices))}"
        )


def _flag(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"GRPOConfig.{field} must be a bool, got {value!r}")


def _resolve(values: dict[str, Any], from_dict: bool) -> dict[str, Any]:
    """Validate the loss-relevant values and resolve them as ``GRPOConfig.__post_init__`` / ``GRPOTrainer`` do."""
    v = dict(values)
    _choice("loss_type", v["loss_type"], LOSS_TYPES)
    _choice("importance_sampling_level", v["importance_sampling_level"], IMPORTANCE_SAMPLING_LEVELS)
    for flag in (
        "use_bias_correction_kl",
        "use_adaptive_entropy",
        "use_vllm",
        "vllm_importance_sampling_correction",
    ):
        _flag(flag, v[flag])
    if v["use_adaptive_entropy"]:
        raise ValueError(
            "GRPOConfig.use_adaptive_entropy=True is not supported: TRL's adaptive entropy controller is trainer "
            "state updated at optimizer-step boundaries (entropy_target, entropy_coef_delta/min/max), not a loss. "
            "Use a fixed entropy_coef."
        )
    aux = v["router_aux_loss_coef"]
    if aux is not None and aux != 0:
        raise ValueError(
            f"GRPOConfig.router_aux_loss_coef={aux!r} is not supported: the MoE load-balancing loss is a model "
            "output, not part of the policy loss; add router_aux_loss_coef * aux_loss to the loss yourself"
        )
    _number("epsilon", v["epsilon"], low=0.0)
    _number("epsilon_high", v["epsilon_high"], low=0.0, allow_none=True, allow_inf=True)
    _number("delta", v["delta"], low=0.0, low_open=True, allow_none=True, allow_inf=True)
    _number("beta", v["beta"], low=0.0)
    _number("entropy_coef", v["entropy_coef"])
    q = v["top_entropy_quantile"]
    _number("top_entropy_quantile", q, low=0.0)
    if q > 1.0:
        raise ValueError(f"GRPOConfig.top_entropy_quantile must be in [0, 1], got {q}")
    _number("off_policy_mask_threshold", v["off_policy_mask_threshold"], allow_none=True, allow_inf=True)
    for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
        _number(name, v[name], low=0.0, low_open=True)
    for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        _number(name, v[name])
    mcl = v["max_completion_length"]
    if v["loss_type"] == "dr_grpo" and (isinstance(mcl, bool) or not isinstance(mcl, int) or mcl < 1):
        raise ValueError(
            f"GRPOConfig.max_completion_length must be a positive int for loss_type='dr_grpo' (its constant "
            f"normaliser), got {mcl!r}"
        )

    # GRPOConfig.__post_init__: the deprecated cap is an alias of clip_max; bounds must be consistent.
    cap = v["vllm_importance_sampling_cap"]
    if cap is not None:
        if from_dict:
            warnings.warn(
                "GRPOConfig.vllm_importance_sampling_cap is deprecated (TRL 1.16); it sets "
                "vllm_importance_sampling_clip_max",
                FutureWarning,
                stacklevel=3,
            )
        v["vllm_importance_sampling_clip_max"] = cap
    lo, hi = v["vllm_importance_sampling_clip_min"], v["vllm_importance_sampling_clip_max"]
    _number("vllm_importance_sampling_clip_min", lo, low=0.0, allow_none=True)
    _number("vllm_importance_sampling_clip_max", hi, low=0.0, low_open=True, allow_none=True, allow_inf=True)
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(
            f"GRPOConfig.vllm_importance_sampling_clip_min ({lo}) must be less than "
            f"vllm_importance_sampling_clip_max ({hi})"
        )
    if v["use_vllm"] and v["vllm_importance_sampling_correction"]:
        mode = v["vllm_importance_sampling_mode"]
        _choice("vllm_importance_sampling_mode", mode, VLLM_IS_MODES)
        if mode.endswith("truncate") and lo is None and hi is None:
            raise ValueError(
                "GRPOConfig: a *_truncate vllm_importance_sampling_mode needs vllm_importance_sampling_clip_min or "
                "vllm_importance_sampling_clip_max"
            )
        if v["loss_type"] == "vespo" and mode not in ("token_truncate", "token_mask"):
            raise ValueError(
                f"GRPOConfig.vllm_importance_sampling_mode={mode!r} is not supported with loss_type='vespo' (as in "
                "TRL): use 'token_truncate' or 'token_mask'"
            )

    # GRPOTrainer.__init__: epsilon_high falls back to epsilon.
    v["epsilon_high"] = v["epsilon"] if v["epsilon_high"] is None else v["epsilon_high"]
    return v


def loss_from_grpo_config(cfg: Any) -> TRLGRPOLoss:
    """The rlzoo loss equal to TRL 1.16 ``GRPOTrainer._compute_loss`` for a ``GRPOConfig``.

    Matches TRL 1.16 ``GRPOTrainer._compute_loss`` (``trl/trainer/grpo_trainer.py``) with one process and no
    gradient accumulation (``num_items_in_batch`` = the batch's active tokens), in value and gradient w.r.t.
    the log-probs and entropies; its vLLM importance-sampling ratio is recomputed from ``old_logprobs`` and
    ``rollout_logprobs`` exactly as ``_generate_and_score_completions`` computes it. See the module docstring
    for the field-by-field translation and docs/compat.md for every option.

    Args:
        cfg: a ``trl.GRPOConfig``, or a dict of its field names (missing fields take TRL 1.16's defaults,
            :data:`GRPO_LOSS_DEFAULTS`; TRL need not be installed). Only the loss-relevant fields are read;
            trainer-side fields (``num_iterations``, ``steps_per_generation``, ``scale_rewards``,
            ``mask_truncated_completions``, ...) are accepted and ignored.

    Returns:
        :class:`TRLGRPOLoss`; ``.loss`` is the underlying :class:`~rlzoo.losses.PolicyLoss` (named after
        the preset it was built from).

    Raises:
        TypeError: ``cfg`` is neither a dict nor a ``trl.GRPOConfig``.
        UnknownNameError: (``KeyError`` and ``ValueError``) an unknown dict key, or a ``loss_type``,
            ``importance_sampling_level`` or ``vllm_importance_sampling_mode`` value TRL 1.16 does not
            define (lists the valid values).
        ValueError: a field it cannot honour (``use_adaptive_entropy=True``, a non-zero
            ``router_aux_loss_coef``), or an invalid value; the message names the ``GRPOConfig`` field.

    Warns:
        UserWarning: ``loss_type="cispo"`` with an absolute cap ``epsilon_high`` (or its fallback ``epsilon``)
            below 1, which down-weights every token (TRL's default 0.2 does).
        FutureWarning: a dict with the deprecated ``vllm_importance_sampling_cap`` (as TRL).

    Example:
        >>> import torch, rlzoo
        >>> from rlzoo.compat.trl import loss_from_grpo_config
        >>> loss_fn = loss_from_grpo_config({"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.04})
        >>> print(loss_fn.loss.describe())
        ratio level:   token()
        surrogate:     ppo_clip(epsilon_low=0.2, epsilon_high=0.28, dual_clip=None, delta=None)
        penalty:       kl(beta=0.04, kl_estimator='k3', use_bias_correction_kl=True)
        aggregation:   token-mean
        >>> lp = -torch.rand(2, 3, dtype=torch.float64, requires_grad=True)
        >>> batch = rlzoo.PolicyBatch(logprobs=lp, advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
        ...                           completion_mask=torch.ones(2, 3, dtype=torch.bool), ref_logprobs=lp.detach())
        >>> float(loss_fn(batch).loss.detach())  # on-policy, ref == policy: the token mean of -A
        0.0
    """
    values, from_dict = _config_values(cfg)
    v = _resolve(values, from_dict)
    loss_type = v["loss_type"]
    options: dict[str, Any] = {"importance_sampling_level": v["importance_sampling_level"]}
    # TRL's beta is always its k3 KL: set on a KLPenalty part, never resolved by the option's name (a registered
    # part of the user's that declares beta too made that ambiguous, and every preset without a KL part failed)
    kl = {"beta": float(v["beta"]), "kl_estimator": "k3", "use_bias_correction_kl": v["use_bias_correction_kl"]}
    if loss_type in _PPO_CLIP_TYPES:
        options.update(
            epsilon_low=float(v["epsilon"]), epsilon_high=float(v["epsilon_high"]), delta=v["delta"]
        )
    elif loss_type == "cispo":
        cap = float(v["epsilon_high"])
        if cap < 1.0:
            warnings.warn(
                f"GRPOConfig(loss_type='cispo'): epsilon_high is CISPO's absolute ratio cap and resolves to {cap} "
                "(epsilon_high, or epsilon when epsilon_high is None), so every token's weight is at most "
                f"{cap} < 1. TRL 1.16 does the same; set epsilon_high explicitly (TRL recommends 5.0).",
                UserWarning,
                stacklevel=2,
            )
        options.update(epsilon_low=1.0, epsilon_high=cap - 1.0)
    elif loss_type == "sapo":
        options.update(tau_pos=float(v["sapo_temperature_pos"]), tau_neg=float(v["sapo_temperature_neg"]))
    else:  # vespo
        options.update(
            k_pos=float(v["vespo_k_pos"]),
            lambda_pos=float(v["vespo_lambda_pos"]),
            k_neg=float(v["vespo_k_neg"]),
            lambda_neg=float(v["vespo_lambda_neg"]),
        )
    if v["top_entropy_quantile"] < 1.0:
        options["top_entropy_quantile"] = float(v["top_entropy_quantile"])
    if v["off_policy_mask_threshold"] is not None:
        options["off_policy_mask_threshold"] = float(v["off_policy_mask_threshold"])
    if v["use_vllm"] and v["vllm_importance_sampling_correction"]:
        lo, hi = v["vllm_importance_sampling_clip_min"], v["vllm_importance_sampling_clip_max"]
        options.update(
            is_correction=v["vllm_importance_sampling_mode"],
            is_min=None if lo is None else float(lo),
            is_max=None if hi is None else float(hi),
        )
    if loss_type == "dr_grpo":
        options["max_completion_length"] = v["max_completion_length"]
    policy = get_loss(loss_type, **options)
    if kl["beta"] != 0.0 and not any(isinstance(part, KLPenalty) for part in policy.penalties):
        policy = dataclasses.replace(policy, penalties=(*policy.penalties, KLPenalty()))
    policy = policy.with_options(**kl)
    return TRLGRPOLoss(
        loss=policy,
        loss_type=loss_type,
        entropy_coef=float(v["entropy_coef"]),
        settings=MappingProxyType(v),
    )


def completion_mask_from_trl_inputs(inputs: Mapping[str, Any]) -> Bool[Tensor, "B T"]:
    """The completion tokens of TRL 1.16 ``GRPOTrainer``'s inputs dict: ``completion_mask`` times ``tool_mask``
    (environment tokens of a ``rollout_func``'s ``env_mask``) when present, as bool (what TRL's loss counts).

    Raises:
        KeyError: no ``completion_mask``.
    """
    mask = inputs["completion_mask"]
    if inputs.get("tool_mask") is not None:
        mask = mask * inputs["tool_mask"]
    return mask.bool()


def batch_from_trl_inputs(
    inputs: Mapping[str, Any],
    per_token_logps: Float[Tensor, "B T"],
    entropies: Float[Tensor, "B T"] | None = None,
    *,
    check_values: bool = True,
) -> PolicyBatch:
    """A :class:`~rlzoo.PolicyBatch` from TRL 1.16 ``GRPOTrainer``'s inputs dict and the current log-probs.

    Field map: ``per_token_logps`` -> ``logprobs``; ``inputs["advantages"]`` (``Float[B]`` or ``Float[B, T]``)
    -> ``advantages``; ``completion_mask`` (times ``tool_mask`` when present) -> ``completion_mask`` (as bool);
    ``old_per_token_logps`` -> ``old_logprobs``; ``ref_per_token_logps`` -> ``ref_logprobs``;
    ``sampling_per_token_logps`` (vLLM) -> ``rollout_logprobs``. ``importance_sampling_ratio`` and
    ``num_items_in_batch`` are not read: the loss recomputes the ratio from old and sampling log-probs, and
    takes counts from its :class:`~rlzoo.Normalizer`.

    Args:
        inputs: the dict ``GRPOTrainer._prepare_inputs`` returns.
        per_token_logps: ``Float[B, T]`` current log-probs (carry the gradient).
        entropies: ``Float[B, T]`` per-token entropies, or None.
        check_values: as :class:`~rlzoo.PolicyBatch`. TRL maps NaN sampling log-probs (tokens vLLM could not
            score) to "no correction"; rlzoo rejects NaN at counted positions instead.

    Returns:
        The :class:`~rlzoo.PolicyBatch`.

    Raises:
        BatchError: a required key (``completion_mask``, ``advantages``) is missing, or a field is invalid.
    """
    for key in ("completion_mask", "advantages"):
        if key not in inputs:
            raise BatchError(f"the TRL inputs dict has no {key!r}")
    return PolicyBatch(
        logprobs=per_token_logps,
        advantages=inputs["advantages"],
        completion_mask=completion_mask_from_trl_inputs(inputs),
        old_logprobs=inputs.get("old_per_token_logps"),
        ref_logprobs=inputs.get("ref_per_token_logps"),
        rollout_logprobs=inputs.get("sampling_per_token_logps"),
        entropies=entropies,
        check_values=check_values,
    )
