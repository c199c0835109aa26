r"""Any rlzoo loss inside TRL 1.16's ``GRPOTrainer``: :class:`GRPOTrainer`.

``rlzoo.integrations.trl.GRPOTrainer`` is ``trl.GRPOTrainer`` with one more argument, ``loss``; generation,
rewards, advantages, reference model, vLLM, logging and checkpoints stay TRL's. Only the loss of each
micro-batch changes: the trainer builds a :class:`~rlzoo.PolicyBatch` from TRL's inputs dict and calls the rlzoo
loss with a :class:`~rlzoo.Normalizer` holding the counts of the whole optimizer step::

    from rlzoo.integrations.trl import GRPOTrainer

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=..., loss="gmpo")

Field map (TRL's ``_generate_and_score_completions`` output -> ``PolicyBatch``, via
:func:`rlzoo.compat.trl.batch_from_trl_inputs`): the current ``per_token_logps`` -> ``logprobs``;
``advantages``; ``completion_mask * tool_mask`` -> ``completion_mask``; ``old_per_token_logps`` ->
``old_logprobs`` (absent: on-policy); ``ref_per_token_logps`` -> ``ref_logprobs`` (TRL computes it when
``GRPOConfig.beta != 0``); ``sampling_per_token_logps`` -> ``rollout_logprobs`` (vLLM; NaN tokens, which vLLM
could not score, take ``old_logprobs`` there, i.e. no correction, as TRL, or the current log-probs when only the
off-policy sequence mask reads them, i.e. no drift, as TRL; both at once: see :func:`_without_nan_sampling`); the entropies TRL's fused LM head
returns -> ``entropies`` (when the loss needs them). Two fields are added to TRL's generation batch, only when
the loss needs them, before TRL shuffles and splits it into micro-batches (so they travel with their rows):
``group_index`` (for ``aggregation="prompt-mean"``), each completion's prompt as TRL groups them for the
advantages (``num_generations`` consecutive rows of the batch gathered over processes: ``global row //
num_generations``), and ``rewards`` (for VAPO's positive-example NLL term), the combined reward as TRL logs it,
the weighted sum of the reward functions (0 where every function returned None, as in ``rlzoo train``). In
bypass mode (``bypass_mode=True``: the sampler's log-probs are the old policy) TRL's ``old_per_token_logps`` are
not passed. Losses that need what TRL does not compute (a teacher's log-probs for ``opd``, policy versions for
``prox_logp_method="loglinear"``) are refused at construction (:func:`resolve_loss`).

Normalisation. For an optimizer step, ``N`` is the number of counted tokens and ``S`` the number of sequences of
its ``gradient_accumulation_steps`` micro-batches on all ``P`` processes (``S`` counts every row, a row without a
counted token included, for every loss: as TRL's grpo, verl's trainer and ``rlzoo train`` divide). The
counted tokens are those of ``loss_fn.loss_mask`` (:meth:`rlzoo.losses.PolicyLoss.loss_mask`): the completion
mask (times TRL's ``tool_mask``) minus the tokens the loss's rollout rejection drops (``rollout_rs``, M2PO),
judged from TRL's old and sampler log-probs. Each micro-batch's loss is ``P * loss_fn(micro_batch,
Normalizer(num_tokens=N, num_sequences=S, ...))``: the micro-batch losses of one process sum, and DDP's gradient
average over processes gives, exactly the loss of the whole optimizer-step batch. The Normalizer also holds the
step's counted tokens per prompt (``group_num_tokens``, prompt-mean) and of the sequences with reward > 0
(``num_positive_tokens``, VAPO) when the loss needs them, and for ``rollout_is_batch_normalize`` the sums of the
IS weights of the whole generation batch (``is_weight_sum`` / ``num_is_weights``, verl's training batch; needs
TRL's old log-probs, else each micro-batch divides by its own mean weight, warned). The counts come from TRL's
buffered generation batch (one all-reduce per generation). They are exact when ``steps_per_generation`` is a multiple of
``gradient_accumulation_steps`` (TRL's default makes them equal); otherwise an optimizer step spans two generation
batches and the counts are estimated as TRL does (the generation batch's count times
``gradient_accumulation_steps / steps_per_generation``), with a warning (prompt-mean, which needs the step's
prompts, is refused there).

With the default loss (:func:`rlzoo.compat.trl.loss_from_grpo_config` of ``args``) training matches TRL 1.16
``GRPOTrainer._compute_loss`` (``trl/trainer/grpo_trainer.py``) for every ``loss_type`` except where TRL's loss is
not the optimizer step's and this one is: ``bnpo`` (TRL divides each micro-batch by its own token count, then by the
accumulation steps) and the entropy bonus (``entropy_coef``: TRL takes a token mean per micro-batch), which differ
when the micro-batches of a step have different token counts, and dapo / cispo / vespo with ``steps_per_generation``
a multiple > 1 of the accumulation steps (TRL divides by the generation batch's average step; warned); and, on
several processes, a batch-coupled part (``top_entropy_quantile``: TRL gathers the processes' entropies; warned).
docs/integrations.md has the table.
"""

import dataclasses
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

try:
    import trl
except ImportError as err:  # pragma: no cover - TRL is a test dependency
    raise ImportError("rlzoo.integrations.trl needs TRL 1.16: pip install trl==1.16.0") from err

from rlzoo.batch import LossOutput, Normalizer
from rlzoo.compat.trl import (
    GRPO_LOSS_DEFAULTS,
    TRLGRPOLoss,
    batch_from_trl_inputs,
    completion_mask_from_trl_inputs,
    loss_from_grpo_config,
)
from rlzoo.losses import OffPolicySequenceMask, PolicyLoss, get_loss
from rlzoo.losses.functional import working_dtype

__all__ = ["GRPOTrainer", "resolve_loss"]

TRL_VERSION = "1.16"
"""The TRL release whose ``GRPOTrainer`` internals (inputs dict, buffer, fused LM head) this module reads."""

# Model inputs TRL 1.16's _compute_loss forwards from the inputs dict (multimodal and token-type fields).
_FORWARD_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)
# GRPOConfig loss fields the trainer, not the loss, honours: the MoE auxiliary loss (added as TRL adds it) and
# the deprecated IS cap (GRPOConfig.__post_init__ already copied it to vllm_importance_sampling_clip_max).
_TRAINER_FIELDS = ("router_aux_loss_coef", "vllm_importance_sampling_cap")
# GRPOConfig loss fields that still matter with an explicit loss (what TRL computes, the loss's length); the
# other loss fields are TRL's loss's own, unused then (resolve_loss warns when one is not at its default).
_STILL_READ = frozenset({*_TRAINER_FIELDS, "beta", "use_vllm", "vllm_importance_sampling_correction",
                         "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                         "vllm_importance_sampling_clip_min", "max_completion_length"})
# TRL loss types normalised by the generation batch's token count (rescaled to one accumulation window), whose
# logged policy_loss is a micro-batch's share of the step's loss (the others log a micro-batch's own loss).
_GENERATION_NORMALISED = ("dapo", "cispo", "vespo")
# Metrics TRL already logs once per generation batch (rlzoo would log them again per micro-batch).
_GENERATION_METRICS = "sampling/"
# How a metric is reduced over processes (row of _log_loss_metrics' reductions); others: token-weighted mean,
# or max / min for names ending in /max or _max, /min or _min (TRL's clip_ratio/high_max, clip_ratio/low_min).
_METRIC_REDUCTION = {"policy_loss": 3, "aux_loss": 4}
# Keys this trainer adds to TRL's generation batch (rlzoo-prefixed: TRL's own keys stay untouched).
_GROUP_INDEX_KEY = "rlzoo_group_index"
_REWARDS_KEY = "rlzoo_rewards"
# PolicyBatch fields the TRL path can fill (each under its condition, checked by resolve_loss).
_PROVIDED_FIELDS = frozenset({"ref_logprobs", "rollout_logprobs", "entropies", "group_index", "rewards"})
# Columns of a slice's counts before the per-prompt token counts.
_SCALAR_COUNTS = 3  # tokens, rows, tokens of rows with reward > 0


def resolve_loss(
    loss: "PolicyLoss | TRLGRPOLoss | str | None", args: Any, *, has_rollout_func: bool = False
) -> PolicyLoss | TRLGRPOLoss:
    """The loss :class:`GRPOTrainer` calls, checked against what TRL will compute under ``args``.

    Args:
        loss: an rlzoo :class:`~rlzoo.losses.PolicyLoss`, a preset name (``rlzoo.list_losses()``), a
            :class:`~rlzoo.compat.trl.TRLGRPOLoss`, or None: :func:`rlzoo.compat.trl.loss_from_grpo_config`
            of ``args`` (TRL's own loss). A loss without ``max_completion_length`` gets
            ``args.max_completion_length`` (used by the "seq-mean-token-sum-norm" aggregation only).
        args: the ``trl.GRPOConfig``.
        has_rollout_func: True when the trainer has a ``rollout_func`` (it may return sampler log-probs).

    Returns:
        The loss.

    Warns:
        UserWarning: an explicit loss while ``GRPOConfig`` loss fields it replaces (``loss_type``, ``epsilon``,
            ``importance_sampling_level``, ``entropy_coef``, ``top_entropy_quantile``, ...) are not at TRL's defaults
            (names them: they are not used); an explicit loss without a KL penalty while ``GRPOConfig.beta != 0``
            (TRL computes reference log-probs for nothing); an explicit loss with a KL penalty whose ``beta`` is not
            ``GRPOConfig.beta`` (the loss's weighs the KL); an explicit loss without a sampler correction while
            ``use_vllm`` and ``vllm_importance_sampling_correction`` (TRL's default) ask for one (none is applied).

    Raises:
        TypeError: ``loss`` is of another type.
        UnknownNameError: an unknown preset name (lists the presets).
        ValueError: the loss needs what TRL will not compute (``loss.required_fields()`` against what this path
            fills), naming the ``GRPOConfig`` field to set where one exists: ``ref_logprobs`` (a KL penalty) with
            ``beta=0``; ``rollout_logprobs`` (an IS correction, a rollout rejection, bypass mode) without
            ``use_vllm`` or a ``rollout_func``; a rollout rejection (outside bypass mode) when TRL computes no old
            log-probs (its counted tokens must be known before the forward pass); ``group_index``
            ("prompt-mean") when ``steps_per_generation`` is not a multiple of ``gradient_accumulation_steps``;
            ``teacher_logprobs`` (``opd``: TRL has no teacher); any other field TRL cannot provide (``versions``
            and ``current_version`` for ``prox_logp_method="loglinear"``); ``use_adaptive_entropy=True`` (TRL's
            controller is trainer state no rlzoo loss runs). Also any error of
            :func:`~rlzoo.compat.trl.loss_from_grpo_config`.
    """
    if loss is None:
        fields = {name: getattr(args, name) for name in GRPO_LOSS_DEFAULTS if name not in _TRAINER_FIELDS}
        resolved: PolicyLoss | TRLGRPOLoss = loss_from_grpo_config(fields)
    elif isinstance(loss, str):
        resolved = get_loss(loss)
    elif isinstance(loss, (PolicyLoss, TRLGRPOLoss)):
        resolved = loss
    else:
        raise TypeError(
            "GRPOTrainer(loss=...) takes an rlzoo PolicyLoss, a preset name (rlzoo.list_losses()), a "
            f"rlzoo.compat.trl.TRLGRPOLoss or None, got {type(loss).__name__}"
        )
    if isinstance(resolved, PolicyLoss) and resolved.max_completion_length is None:
        resolved = resolved.with_options(max_completion_length=args.max_completion_length)

    policy = resolved.loss if isinstance(resolved, TRLGRPOLoss) else resolved
    name = policy.called

    def fix(options: str) -> str:  # the call that gives the user's loss these options, keeping its others
        if isinstance(loss, str):
            return f"rlzoo.get_loss({loss!r}, {options})"
        if isinstance(loss, TRLGRPOLoss):
            return f"dataclasses.replace(loss, loss=loss.loss.with_options({options}))"
        return f"loss.with_options({options})"

    needed = resolved.required_fields()
    ignored = {field: getattr(args, field) for field, default in GRPO_LOSS_DEFAULTS.items()
               if field not in _STILL_READ and getattr(args, field) != default}
    if loss is not None and ignored.get("use_adaptive_entropy"):  # the controller is TRL's trainer state: not run
        raise ValueError(
            "GRPOConfig.use_adaptive_entropy=True is not supported: TRL's adaptive entropy controller is trainer "
            f"state, not a loss, and {name} does not run it; set use_adaptive_entropy=False and give the loss "
            f"a fixed entropy_coef: {fix('entropy_coef=...')}"
        )
    if loss is not None and ignored and isinstance(resolved, PolicyLoss):  # a TRLGRPOLoss is built from them
        warnings.warn(
            f"GRPOTrainer(loss={repr(policy.name) if policy.name else '...'}) replaces TRL's loss, so these "
            "GRPOConfig loss settings are not used: " + ", ".join(f"{field}={value!r}" for field, value in ignored.items())
            + f" (give them to the rlzoo loss, e.g. {fix('...')}; "
            + (f"`rlzoo explain {policy.name}` lists" if policy.name else "loss.options() lists")
            + " its options), or pass no loss to train TRL's own",
            UserWarning,
            stacklevel=3,
        )
    if "teacher_logprobs" in needed:
        raise ValueError(
            f"{name} needs a teacher's log-probs, which TRL's GRPOTrainer does not compute; use "
            f"rlzoo train --algorithm {policy.name or 'opd'} --teacher MODEL (docs/trainer.md)"
        )
    missing = sorted(needed - _PROVIDED_FIELDS)  # first: no GRPOConfig setting helps
    if missing:
        uses = sorted({use for field in missing for use in policy.needed_by(field)})
        raise ValueError(
            f"{name} needs PolicyBatch.{', PolicyBatch.'.join(missing)} (for {', '.join(uses)}), which TRL's "
            "GRPOTrainer does not provide; train it with rlzoo train, or use the loss without "
            + ("it" if len(uses) == 1 else "them")
        )
    own_beta = policy.options().get("beta")  # the KL penalty's weight (0 / None: no KL penalty)
    if "ref_logprobs" in needed and args.beta == 0:
        if not own_beta:  # a part of the user's reads the reference, not a KL penalty
            raise ValueError(
                f"{name} needs reference log-probs (for {', '.join(policy.needed_by('ref_logprobs'))}), but "
                "GRPOConfig.beta=0.0, so TRL loads no reference model: set GRPOConfig(beta=...) to any non-zero value "
                "(TRL then computes ref_per_token_logps; the loss does not read GRPOConfig.beta)"
            )
        raise ValueError(
            f"{name} has a KL penalty (beta={own_beta}) and needs reference log-probs, but GRPOConfig.beta=0.0, "
            f"so TRL loads no reference model: set GRPOConfig(beta={own_beta}) (any non-zero value makes TRL compute "
            f"ref_per_token_logps; the loss's own beta weights the KL), or drop the penalty: "
            f"{fix('beta=0.0')}"
        )
    if loss is not None and own_beta and "ref_logprobs" in needed and args.beta not in (0, own_beta):
        warnings.warn(
            f"GRPOConfig.beta={args.beta} only makes TRL compute reference log-probs: the KL penalty is weighted by "
            f"the loss's own beta={own_beta} ({name}); give it yours: {fix(f'beta={args.beta}')}",
            UserWarning,
            stacklevel=3,
        )
    if loss is not None and "ref_logprobs" not in needed and args.beta != 0:
        warnings.warn(
            f"GRPOConfig.beta={args.beta} makes TRL load a reference model and compute its log-probs every generation, "
            f"but {name} has no KL penalty, so they are unused: set GRPOConfig(beta=0.0) to save that time "
            "and memory",
            UserWarning,
            stacklevel=3,
        )
    if (loss is not None and args.use_vllm and args.vllm_importance_sampling_correction
            and "rollout_logprobs" not in needed):
        clip_max = args.vllm_importance_sampling_clip_max
        bound = "" if clip_max is None else f", is_max={clip_max}"
        warnings.warn(
            f"GRPOConfig(use_vllm=True, vllm_importance_sampling_correction=True) asks for TRL's correction of the "
            f"vLLM sampler's drift ({args.vllm_importance_sampling_mode!r}), but {name} has none, so no "
            f"correction is applied: give the loss one, e.g. "
            f"{fix(f'is_correction={args.vllm_importance_sampling_mode!r}{bound}')}, or set "
            "vllm_importance_sampling_correction=False",
            UserWarning,
            stacklevel=3,
        )
    if "rollout_logprobs" in needed and not (args.use_vllm or has_rollout_func):
        uses = policy.needed_by("rollout_logprobs")
        raise ValueError(
            f"{name} needs the sampler's log-probs for {', '.join(uses)}, which TRL has only from vLLM: set "
            "GRPOConfig(use_vllm=True) (or pass a rollout_func that returns logprobs), or use the loss without "
            + ("it" if len(uses) == 1 else "them")
        )
    rejections = [p.describe() for p in policy.rejections if p.active]
    if rejections and not policy.bypass_mode and not _trl_computes_old_logprobs(args):
        raise ValueError(
            f"{name} rejects tokens ({', '.join(rejections)}) by comparing the old log-probs with the "
            "sampler's, and the optimizer step's token counts need them before the forward pass, but TRL computes "
            "no old log-probs under this GRPOConfig: set GRPOConfig(vllm_importance_sampling_correction=True) with "
            "use_vllm=True (TRL then computes them; the rlzoo loss, not TRL's IS ratio, is used), or num_iterations "
            "> 1, or give the loss bypass_mode=True (rejection on the policy term only, verl's bypass mode)"
        )
    if "group_index" in needed and args.steps_per_generation % args.gradient_accumulation_steps != 0:
        uses = policy.needed_by("group_index")
        raise ValueError(
            f"{name} needs each completion's prompt (group_index) for {', '.join(uses)}, known only within "
            f"one generation batch, but GRPOConfig.steps_per_generation="
            f"{args.steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}, so an optimizer step spans two: set steps_per_generation to a "
            "multiple of it (TRL's default makes them equal)"
        )
    return resolved


def _trl_computes_old_logprobs(args: Any) -> bool:
    """Whether TRL 1.16 computes ``old_per_token_logps`` at generation time under ``args`` (a ``GRPOConfig``).

    As ``GRPOTrainer._generate_and_score_completions``: when an optimizer step does not end each generation cycle
    (``gradient_accumulation_steps`` not a multiple of ``steps_per_generation * num_iterations``), or with vLLM's
    importance-sampling correction on (``use_vllm`` and ``vllm_importance_sampling_correction``).
    """
    generate_every = args.steps_per_generation * args.num_iterations
    return bool(
        args.gradient_accumulation_steps % generate_every != 0
        or (args.use_vllm and args.vllm_importance_sampling_correction)
    )


@dataclasses.dataclass(frozen=True)
class _StepCounts:
    """Counts of an optimizer step (or a slice of one) over all processes."""

    tokens: float
    rows: float  # every row, a row without a counted token included (the seq-mean divisor, as TRL and verl)
    positive_tokens: float  # tokens of the rows with reward > 0 (0 without rewards)
    group_tokens: Tensor | None = None  # Int[G]: counted tokens per prompt id (None without group ids)


class GRPOTrainer(trl.GRPOTrainer):
    r"""``trl.GRPOTrainer`` (TRL 1.16) whose loss is any rlzoo loss.

    Every argument of ``trl.GRPOTrainer`` is passed through unchanged, plus:

    Args:
        loss: keyword-only. An rlzoo :class:`~rlzoo.losses.PolicyLoss` (``rlzoo.get_loss("gmpo",
            epsilon_low=0.3)``, or composed from parts), a preset name (``"gmpo"``), a
            :class:`~rlzoo.compat.trl.TRLGRPOLoss`, or None (default): TRL's own loss for ``args``,
            ``rlzoo.compat.trl.loss_from_grpo_config(args)``. With an explicit loss the loss fields of
            ``GRPOConfig`` (``loss_type``, ``epsilon``, ``importance_sampling_level``, ...) are not used, except
            ``beta`` (whether TRL computes reference log-probs) and ``use_vllm`` /
            ``vllm_importance_sampling_correction`` (whether it has sampler and old log-probs).

    Attributes:
        loss_fn: the resolved loss (:func:`resolve_loss`).

    Per micro-batch the loss is ``P * loss_fn(batch, Normalizer(N, S, ...))`` with the optimizer step's counts of
    the tokens the loss counts (see the module docstring), plus TRL's MoE auxiliary loss when TRL enables it. When
    the loss needs them, each completion's prompt id (``group_index``) and combined reward (``rewards``) are added
    to TRL's generation batch (keys ``rlzoo_group_index``, ``rlzoo_rewards``; the rewards are read from TRL's
    ``_calculate_rewards``). Metrics go to TRL's logger under the
    loss's names (TRL's: ``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``,
    ``clip_ratio/low_min``, ``clip_ratio/high_max``, ``kl``, ``entropy``, ``cispo_clip_ratio`` (the default loss;
    ``loss="cispo"`` logs that fraction as ``clip_ratio/high_mean``),
    ``vespo/phi_seq_mean``, ``policy_loss``; plus rlzoo's ``ratio/*`` and the parts' own): a token-weighted mean
    over processes (``*/max`` and ``*_max``: the max, ``*/min`` and ``*_min``: the min);
    ``sampling/*`` is left to TRL, which logs it per generation batch.

    Raises:
        TypeError, UnknownNameError, ValueError: from :func:`resolve_loss`, at construction: e.g. a KL penalty
            with ``GRPOConfig.beta=0`` (names ``beta``), an IS correction without vLLM (names ``use_vllm``),
            ``opd`` (TRL has no teacher), any PolicyBatch field TRL cannot provide (names it).

    Example (a tiny model, see docs/integrations.md for a full script)::

        trainer = GRPOTrainer(model="path/to/model", reward_funcs=reward, args=GRPOConfig(...),
                              train_dataset=dataset, loss=rlzoo.get_loss("gmpo"))
        trainer.train()
    """

    def __init__(self, *args: Any, loss: "PolicyLoss | TRLGRPOLoss | str | None" = None, **kwargs: Any) -> None:
        try:  # TRL's own arguments, wherever they were passed
            given = inspect.signature(trl.GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        except TypeError:
            given = {}  # let TRL raise its own error below
        config = given.get("args")
        has_rollout_func = given.get("rollout_func") is not None
        # With a config, refuse an impossible loss before TRL loads the model; TRL builds a default one otherwise.
        early = None if config is None else resolve_loss(loss, config, has_rollout_func=has_rollout_func)
        if not trl.__version__.startswith(TRL_VERSION + "."):
            warnings.warn(
                f"rlzoo.integrations.trl was written against TRL {TRL_VERSION} internals; TRL {trl.__version__} is "
                "installed: check the loss against plain trl.GRPOTrainer (tests/integrations/test_trl.py)",
                UserWarning,
                stacklevel=2,
            )
        super().__init__(*args, **kwargs)
        self.loss_fn: PolicyLoss | TRLGRPOLoss = (
            early if early is not None else resolve_loss(loss, self.args, has_rollout_func=has_rollout_func)
        )
        self._counted_buffer: list | None = None
        self._slice_totals: Tensor | None = None  # [steps_per_generation, 3 (+ prompt ids)], summed over processes
        self._slice_scalars: list[list[float]] = []  # their first 3 columns, on the host
        self._rewards_per_func: Tensor | None = None
        policy = self.loss_fn.loss if isinstance(self.loss_fn, TRLGRPOLoss) else self.loss_fn
        self._sampler_needed_by = (policy.needed_by("rollout_logprobs")
                                   if "rollout_logprobs" in self.loss_fn.required_fields() else [])
        # rollout_is_batch_normalize: the generation batch's IS weight sums, counted when TRL has old log-probs
        self._counts_is_weights = policy.counts_is_weights and _trl_computes_old_logprobs(self.args)
        self._is_weight_totals: Tensor | None = None  # Float[2], the buffered generation batch's, over processes
        coupled = policy.coupled_parts(is_weight_sums=self._counts_is_weights)
        if coupled and self.accelerator.num_processes > 1:
            warnings.warn(
                f"{policy.called} has batch-coupled parts ({', '.join(p.describe() for p in coupled)}) "
                f"whose statistics are taken over each process's micro-batch, not over the "
                f"{self.accelerator.num_processes} processes' (TRL's top_entropy_quantile gathers the processes' "
                "entropies): with one process it equals TRL; here the update differs from TRL's",
                UserWarning,
                stacklevel=2,
            )
        elif policy.counts_is_weights and not self._counts_is_weights and self.args.steps_per_generation > 1:
            warnings.warn(
                f"{policy.called} normalises its IS weights over the batch "
                "(rollout_is_batch_normalize), but TRL computes no old log-probs under this GRPOConfig, so the weights "
                "are known only in the forward pass and each micro-batch divides by its own mean weight, not the "
                "generation batch's (verl's): set GRPOConfig(vllm_importance_sampling_correction=True) with "
                "use_vllm=True, or num_iterations > 1, for the generation batch's mean",
                UserWarning,
                stacklevel=2,
            )
        spans = self.args.steps_per_generation // self.args.gradient_accumulation_steps
        if (isinstance(self.loss_fn, TRLGRPOLoss) and self.loss_fn.loss_type in _GENERATION_NORMALISED
                and self.args.steps_per_generation % self.args.gradient_accumulation_steps == 0 and spans > 1):
            warnings.warn(
                f"GRPOConfig.steps_per_generation={self.args.steps_per_generation} spans {spans} optimizer steps: "
                f"TRL's loss_type={self.loss_fn.loss_type!r} divides every step by the generation batch's average "
                "step token count, the rlzoo default loss by the step's own count (exact for the step; "
                "docs/integrations.md), so the updates differ from plain TRL's. Set steps_per_generation="
                f"{self.args.gradient_accumulation_steps} (TRL's default) to train as TRL",
                UserWarning,
                stacklevel=2,
            )
        ga, processes = self.args.gradient_accumulation_steps, self.accelerator.num_processes
        if isinstance(self.loss_fn, TRLGRPOLoss) and (ga > 1 or processes > 1):
            own = [f"loss_type={self.loss_fn.loss_type!r}"] if self.loss_fn.loss_type == "bnpo" else []
            own += [f"entropy_coef={self.loss_fn.entropy_coef} (its entropy bonus)"] if self.loss_fn.entropy_coef else []
            if own:
                warnings.warn(
                    f"TRL's {' and '.join(own)} divides each micro-batch by its own token count, the rlzoo default "
                    "loss by the optimizer step's (exact for the step; docs/integrations.md), so with "
                    f"gradient_accumulation_steps={ga} on {processes} process(es) the updates differ from plain TRL's "
                    "wherever micro-batches differ in length. Set gradient_accumulation_steps=1 on one process to "
                    "train as TRL",
                    UserWarning,
                    stacklevel=2,
                )
        if self.args.steps_per_generation % self.args.gradient_accumulation_steps != 0:
            warnings.warn(
                f"GRPOConfig.steps_per_generation={self.args.steps_per_generation} is not a multiple of "
                f"gradient_accumulation_steps={self.args.gradient_accumulation_steps}: an optimizer step spans two "
                "generation batches, so its token counts are estimated (as TRL does) and the rlzoo loss is not "
                "exactly the optimizer step's",
                UserWarning,
                stacklevel=2,
            )

    # ---------------------------------------------------------------------------------------- rollout fields
    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Tensor:
        """TRL's ``_calculate_rewards`` (``Float[P * B, F]``, every process's rows, one column per reward
        function), kept for :meth:`_generate_and_score_completions`."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        """TRL's generation batch, plus the per-completion fields the loss needs that TRL does not return.

        ``rlzoo_group_index`` (``Int[B]``, for "prompt-mean"): the prompt of each completion as TRL groups them for
        the advantages: ``num_generations`` consecutive rows of the batch gathered over processes, whose rows
        ``[p * B, (p + 1) * B)`` are process ``p``'s (TRL's ``process_slice``), so the ids agree across processes.
        ``rlzoo_rewards`` (``Float[B]``, for VAPO): the weighted sum of the reward functions (TRL's logged
        ``reward``; 0 where every function returned None). Added before TRL shuffles and splits the batch, so
        they stay with their rows.
        """
        needed = self.loss_fn.required_fields()
        self._rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        rows = int(output["advantages"].shape[0])
        device = output["advantages"].device
        start = self.accelerator.process_index * rows
        if "group_index" in needed:
            group = self.num_generations if self.model.training else self.num_generations_eval
            output[_GROUP_INDEX_KEY] = torch.arange(start, start + rows, device=device) // group
        if "rewards" in needed:
            if self._rewards_per_func is None:
                raise RuntimeError(
                    f"TRL {trl.__version__}'s GRPOTrainer did not call _calculate_rewards, from which the rewards the "
                    f"loss needs are read (written against TRL {TRL_VERSION})"
                )
            per_func = self._rewards_per_func[start : start + rows]
            weights = self.reward_weights.to(device=per_func.device, dtype=per_func.dtype)
            output[_REWARDS_KEY] = (per_func * weights).nansum(dim=1).to(device)
        return output

    # ------------------------------------------------------------------------------------------------ counts
    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        """TRL's ``_prepare_inputs``; after a new generation, count every slice of its buffer once."""
        inputs = super()._prepare_inputs(generation_batch)
        if inputs.get("sampling_per_token_logps") is None and self._sampler_needed_by:
            policy = self.loss_fn.loss if isinstance(self.loss_fn, TRLGRPOLoss) else self.loss_fn
            raise ValueError(
                f"{policy.called} needs the sampler's log-probs (for "
                f"{', '.join(self._sampler_needed_by)}), but TRL's batch has none: "
                + ("vLLM returned none" if self.args.use_vllm else "the rollout_func returned no 'logprobs' (return "
                   "the sampler's per-token log-probs of each completion under 'logprobs')"))
        if self.model.training and self._buffered_inputs is not self._counted_buffer:
            self._slice_totals = self._count_slices(self._buffered_inputs)
            self._slice_scalars = self._slice_totals[:, :_SCALAR_COUNTS].tolist()  # the one device sync
            self._is_weight_totals = self._is_weight_sums(self._buffered_inputs)
            self._counted_buffer = self._buffered_inputs
        return inputs

    def _is_weight_sums(self, slices: list[Mapping[str, Any]]) -> Tensor | None:
        """``Float[2]``: ``(sum, number)`` of the rollout IS weights of ``slices`` (a generation batch's, or one
        evaluation batch) on all processes (one all-reduce), from TRL's old and sampler log-probs over the
        completion mask before any rejection (:meth:`rlzoo.losses.PolicyLoss.is_weight_sums`); None unless the
        loss normalises its IS weights over the batch and TRL computed old log-probs."""
        if not self._counts_is_weights or any(s.get("old_per_token_logps") is None for s in slices):
            return None
        policy = self.loss_fn.loss if isinstance(self.loss_fn, TRLGRPOLoss) else self.loss_fn
        local = []
        for inputs in slices:
            old = inputs["old_per_token_logps"]
            sampling = _without_nan_sampling(inputs, old).get("sampling_per_token_logps")
            local.append(policy.is_weight_sums(completion_mask_from_trl_inputs(inputs), old_logprobs=old,
                                               rollout_logprobs=sampling))
        return self.accelerator.reduce(torch.stack(local).sum(0), reduction="sum")

    def _count_slices(self, slices: list[Mapping[str, Any]]) -> Tensor:
        """``[len(slices), 3 + G]``: each micro-batch slice's counts (:meth:`_local_counts`) summed over processes
        (one all-reduce)."""
        num_groups = self._num_groups(slices, sum(int(s["completion_mask"].shape[0]) for s in slices))
        local = torch.stack([self._local_counts(s, num_groups) for s in slices])
        return self.accelerator.reduce(local, reduction="sum")

    def _num_groups(self, slices: list[Mapping[str, Any]], rows: int) -> int | None:
        """Prompt ids of a generation batch of ``rows`` rows per process (None when the batch has none)."""
        if _GROUP_INDEX_KEY not in slices[0]:
            return None
        group = self.num_generations if self.model.training else self.num_generations_eval
        return -(-self.accelerator.num_processes * rows // group)

    def _local_counts(self, inputs: Mapping[str, Any], num_groups: int | None) -> Tensor:
        """This process's counts of one micro-batch, over the tokens the loss counts (:meth:`_counted_mask`):
        ``[tokens, rows, tokens of rows with reward > 0, tokens of prompt 0, ...]``."""
        lengths = self._counted_mask(inputs, completion_mask_from_trl_inputs(inputs)).sum(-1)
        rewards = inputs.get(_REWARDS_KEY)
        positive = lengths.new_zeros(()) if rewards is None else torch.where(rewards > 0, lengths, 0).sum()
        rows = torch.full((), lengths.shape[0], dtype=lengths.dtype, device=lengths.device)
        scalars = torch.stack([lengths.sum(), rows, positive])
        if num_groups is None:
            return scalars
        per_group = lengths.new_zeros(num_groups).index_add(0, inputs[_GROUP_INDEX_KEY].long(), lengths)
        return torch.cat([scalars, per_group])

    def _counted_mask(self, inputs: Mapping[str, Any], mask: Tensor) -> Tensor:
        """``mask`` minus the tokens the loss's rollout rejection drops (``PolicyLoss.loss_mask``, verl's modified
        response mask), judged from TRL's old and sampler log-probs as the loss will see them (NaN sampler
        log-probs read as the old ones, :func:`_without_nan_sampling`); ``mask`` itself without a rejection."""
        policy = self.loss_fn.loss if isinstance(self.loss_fn, TRLGRPOLoss) else self.loss_fn
        old, sampling = inputs.get("old_per_token_logps"), inputs.get("sampling_per_token_logps")
        if old is not None and sampling is not None:
            sampling = torch.where(torch.isnan(sampling), old, sampling)
        return policy.loss_mask(mask, old_logprobs=old, rollout_logprobs=sampling)

    def _step_counts(self, inputs: Mapping[str, Any]) -> _StepCounts:
        """Counts of the optimizer step the current micro-batch belongs to (train), or of the batch (eval)."""
        if not self.model.training:  # evaluation: one batch, no accumulation
            rows = int(inputs["completion_mask"].shape[0])
            totals = self.accelerator.reduce(self._local_counts(inputs, self._num_groups([inputs], rows)),
                                             reduction="sum")
            return self._as_step_counts(totals[:_SCALAR_COUNTS].tolist(), totals)
        assert self._slice_totals is not None  # counted by _prepare_inputs
        ga, n = self.current_gradient_accumulation_steps, len(self._slice_scalars)
        if n % ga == 0:  # the window's micro-batches are consecutive slices of this generation batch
            start = self._step % n - self._step % ga
            window = self._slice_scalars[start : start + ga]
            return self._as_step_counts([sum(column) for column in zip(*window, strict=True)],
                                        self._slice_totals[start : start + ga].sum(0))
        # The step spans two generation batches: TRL's estimate (prompt ids are refused here, by resolve_loss).
        scale = ga / n
        return self._as_step_counts([scale * sum(column) for column in zip(*self._slice_scalars, strict=True)], None)

    @staticmethod
    def _as_step_counts(scalars: list[float], totals: Tensor | None) -> _StepCounts:
        groups = None if totals is None or totals.shape[-1] == _SCALAR_COUNTS else totals[_SCALAR_COUNTS:]
        tokens, rows, positive = scalars
        return _StepCounts(tokens=tokens, rows=rows, positive_tokens=positive, group_tokens=groups)

    def _normalizer(self, inputs: Mapping[str, Any]) -> Normalizer:
        counts = self._step_counts(inputs)
        is_sums = self._is_weight_totals if self.model.training else self._is_weight_sums([inputs])
        return Normalizer(
            num_tokens=counts.tokens,
            num_sequences=counts.rows,
            group_num_tokens=counts.group_tokens,
            num_positive_tokens=counts.positive_tokens if _REWARDS_KEY in inputs else None,
            is_weight_sum=None if is_sums is None else is_sums[0],
            num_is_weights=None if is_sums is None else is_sums[1],
        )

    # -------------------------------------------------------------------------------------------------- loss
    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Tensor:
        """The rlzoo loss of one micro-batch, scaled for TRL's gradient accumulation and data parallelism.

        Args:
            model: the (wrapped) policy.
            inputs: the micro-batch TRL's ``_prepare_inputs`` returns.
            return_outputs: must be False (as in TRL).
            num_items_in_batch: ignored: the counts come from the buffered generation batch.

        Returns:
            0-d loss tensor: ``num_processes * loss_fn(batch, normalizer).loss`` (+ TRL's MoE auxiliary loss).

        Raises:
            ValueError: ``return_outputs=True``.
            BatchError: TRL's inputs hold NaN/inf (or a positive log-prob) at a counted position.
        """
        if return_outputs:
            raise ValueError("GRPOTrainer.compute_loss does not support return_outputs=True (as TRL's)")
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _FORWARD_KEYS},
        )
        needed = self.loss_fn.required_fields()
        policy = self.loss_fn.loss if isinstance(self.loss_fn, TRLGRPOLoss) else self.loss_fn
        source = _without_nan_sampling(inputs, logps, policy)
        if policy.bypass_mode and "old_per_token_logps" in source:  # the sampler's log-probs are the old policy
            source = {key: value for key, value in source.items() if key != "old_per_token_logps"}
        extra = {field: inputs[key] for field, key in (("group_index", _GROUP_INDEX_KEY), ("rewards", _REWARDS_KEY))
                 if field in needed and key in inputs}
        batch = batch_from_trl_inputs(source, logps, entropies if "entropies" in needed else None,
                                      check_values=not extra)
        if extra:  # checked once, with the added fields
            batch = dataclasses.replace(batch, **extra, check_values=True)
        out = self.loss_fn(batch, self._normalizer(inputs))
        loss = out.loss * self.accelerator.num_processes
        training = self.model.training
        accumulation = self.current_gradient_accumulation_steps if training else 1
        if self.aux_loss_enabled:  # as TRL: scaled for accumulation only (DDP averages it over processes)
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
        self._log_loss_metrics(out, batch.completion_mask, entropies, aux_loss, accumulation)
        return loss

    def _log_loss_metrics(
        self,
        out: LossOutput,
        mask: Tensor,
        entropies: Tensor,
        aux_loss: Tensor | None,
        accumulation: int,
    ) -> None:
        """Append the loss's metrics to TRL's ``_metrics`` (one gather, one device sync): over processes, means
        weighted by each process's tokens of the metric (its completion tokens, ``mask``, or the loss's count in
        ``out.metric_tokens``: under a rollout rejection the policy term's metrics are over the kept tokens;
        ``entropy`` over every completion token, as TRL logs it), extremes over the processes that have such a
        token (a process whose tokens were all rejected reports placeholder 0s for the policy term's); an extreme
        no process has a token for is NaN, which TRL's ``log`` leaves out of its average (as TRL's ``nanmin`` of
        a micro-batch without a completion token)."""
        mode = "train" if self.model.training else "eval"
        metrics = {k: v for k, v in out.metrics.items() if not k.startswith(_GENERATION_METRICS)}
        # TRL's policy_loss: a micro-batch's share of the step's loss for the loss types it normalises by the
        # generation batch, else the micro-batch's own loss (the share times the accumulation steps)
        generation_normalised = (isinstance(self.loss_fn, TRLGRPOLoss)
                                 and self.loss_fn.loss_type in _GENERATION_NORMALISED)
        share = 1 if generation_normalised else accumulation
        with torch.no_grad():
            tokens = mask.sum()
            # TRL logs the entropy of every completion token whatever the loss (its fused LM head returns it).
            entropy = entropies.detach().to(working_dtype(entropies.dtype))  # an fp16 sum overflows at 65504
            metrics["entropy"] = torch.where(mask, entropy, 0.0).sum() / tokens.clamp(min=1)
            own_tokens = {k: v for k, v in out.metric_tokens.items() if k != "entropy"}  # entropy: TRL's, above
            if aux_loss is not None:
                metrics["aux_loss"] = aux_loss.detach()
            names = sorted(metrics)
            local = torch.stack([metrics[k].to(torch.float32).reshape(()) for k in names]
                                + [own_tokens.get(k, tokens).to(torch.float32).reshape(()) for k in names])
            rows = self.accelerator.gather(local.unsqueeze(0))  # [num_processes, 2 * len(names)]
            values, weight = rows[:, : len(names)], rows[:, len(names) :]
            # a process without a token for an extreme reports a placeholder (0): skipped, as nanmin
            has = weight > 0
            highest = torch.where(has, values, -torch.inf).amax(0)
            lowest = torch.where(has, values, torch.inf).amin(0)
            reductions = torch.stack([
                (values * weight).sum(0) / weight.sum(0).clamp(min=1),  # token-weighted mean (TRL's global mean)
                torch.where(has.any(0), highest, torch.nan),
                torch.where(has.any(0), lowest, torch.nan),
                values.sum(0) * share,  # policy_loss as TRL logs it for the loss type
                values.mean(0),  # aux_loss, as TRL
            ]).tolist()  # the one device sync
        for i, name in enumerate(names):
            kind = _METRIC_REDUCTION.get(name) or (1 if name.endswith(("/max", "_max")) else
                                                   2 if name.endswith(("/min", "_min")) else 0)
            self._metrics[mode][name].append(reductions[kind][i])
        if (
            isinstance(self.loss_fn, TRLGRPOLoss)
            and self.loss_fn.entropy_coef != 0.0
            and mode == "train"
            and self.accelerator.sync_gradients
        ):
            self._metrics[mode]["entropy_coef"].append(self.loss_fn.entropy_coef)


def _without_nan_sampling(inputs: Mapping[str, Any], logps: Tensor, loss: Any = None) -> Mapping[str, Any]:
    """``inputs`` with NaN sampler log-probs (tokens vLLM could not score) replaced by the old log-probs, or by the
    current ones (``logps``, detached) when only ``loss``'s off-policy sequence mask reads the sampler's.

    TRL takes no evidence from those tokens: an IS ratio of 1 (no correction) and no drift in its off-policy
    sequence mask. With the old log-probs there (the current ones when TRL computed none: on-policy) rlzoo's IS
    ratio ``exp(old - sampler)`` is 1 too; with the current ones the mask's drift ``sampler - current`` is 0. A
    loss with both (``vllm_importance_sampling_correction`` and ``off_policy_mask_threshold``) gets the old
    log-probs: its mask counts the drift ``old - current`` at those tokens, which TRL counts as 0 (different only
    after the first iteration over a generation batch).
    """
    sampling = inputs.get("sampling_per_token_logps")
    if sampling is None:
        return inputs
    old = inputs.get("old_per_token_logps")
    fill = old if old is not None and not _only_the_mask_reads_the_sampler(loss) else logps
    return {**inputs, "sampling_per_token_logps": torch.where(torch.isnan(sampling), fill.detach(), sampling)}


def _only_the_mask_reads_the_sampler(loss: Any) -> bool:
    """The sampler's log-probs reach ``loss`` (a :class:`PolicyLoss`; False for another loss) only through its
    off-policy sequence mask (no IS correction, rejection, bypass mode or proximal policy reads them)."""
    if not isinstance(loss, PolicyLoss):
        return False
    parts = loss.parts()
    return (any(isinstance(p, OffPolicySequenceMask) for p in parts) and not loss.off_policy
            and not any("rollout_logprobs" in p.required_fields() for p in parts))
